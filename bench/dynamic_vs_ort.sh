#!/bin/bash
# Dynamic quantization, slimquant vs ONNX Runtime (docs/quantization.md, "Dynamic mode"):
#   speed:   our `quantize --mode dynamic` file run by slimquant and by ONNX Runtime (the latest
#            onnxruntime-node, 1.30.0), and the ORT-style dynamic file (below) run by ONNX Runtime,
#            one thread, batch 1 and 32, median CPU time of RUNS runs, the best of ROUNDS
#            interleaved rounds (build/slimquant_latency, compare_runtimes.js's ORT timing worker:
#            graph optimizations all);
#   quality: argmax agreement and max |logit diff| against FP32 on the first N Fashion-MNIST test
#            images of ours (slimquant runtime) and of the ORT-style dynamic file
#            (bench/ort_style_quantize.py --mode dynamic: what quantize_dynamic writes, its defaults)
#            run by ONNX Runtime 1.30.0.
#
#   bench/dynamic_vs_ort.sh [--build DIR] [--runs 50] [--rounds 3] [--images 256] [--models vit_small,resnet_small,mobilenetv2_small]
#
# A --models entry ending in .onnx is a file taking Fashion-MNIST images [N, 1, 28, 28], e.g. the
# recurrent model of bench/export_recurrent.py (an LSTM, which the ORT-style file turns into
# com.microsoft DynamicQuantizeLSTM and ours keeps float).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$ROOT/build RUNS=50 ROUNDS=3 IMAGES=256 MODELS=vit_small,resnet_small,mobilenetv2_small
while [ $# -gt 0 ]; do
  case $1 in
    --build) BUILD=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --images) IMAGES=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    *) echo "dynamic_vs_ort.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
export OMP_NUM_THREADS=1 NODE_PATH=$ROOT/bench/node_modules
PY=/usr/bin/python3
WORK=$(mktemp -d /tmp/dynamic_vs_ort.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
$PY - "$ROOT" "$WORK/images.npy" "$IMAGES" <<'PY'
import importlib.util, os, sys
import numpy as np
root, out, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
spec = importlib.util.spec_from_file_location("osq", os.path.join(root, "bench/ort_style_quantize.py"))
osq = importlib.util.module_from_spec(spec)
spec.loader.exec_module(osq)
path = os.path.join(osq.FASHION_MNIST_DIR, "t10k-images-idx3-ubyte")
if not os.path.exists(path):
    path += ".gz"
images = osq.read_idx(path)[:count]
np.save(out, (images.astype(np.float32) / 255.0)[:, None, :, :])
PY
echo "CPU: $(lscpu | grep 'Model name' | sed 's/Model name: *//'), 1 thread; ONNX Runtime $(node -p "require('onnxruntime-node-latest/package.json').version")"
printf '%-18s %8s %10s %10s %8s %12s %12s | %-26s %-26s\n' model batch "sq ms" "ORT ms" "ORT/sq" "ORT-style ms" "ORT-style/sq" \
  "ours: agree, max|diff|" "ORT-style: agree, max|diff|"
IFS=, read -ra LIST <<<"$MODELS"
for entry in "${LIST[@]}"; do
  if [[ $entry == *.onnx ]]; then fp32=$(realpath "$entry") m=$(basename "$entry" .onnx)
  else fp32=$ROOT/tests/fixtures/models/$entry.onnx m=$entry; fi
  ours=$WORK/$m.dynamic.onnx
  peer=$WORK/$m.ort_dynamic.onnx
  "$BUILD/slimquant" quantize "$fp32" --mode dynamic -o "$ours" >/dev/null
  $PY "$ROOT/bench/ort_style_quantize.py" --mode dynamic "$fp32" "$peer" >/dev/null
  "$BUILD/slimquant" run "$fp32" --input input="$WORK/images.npy" --output-dir "$WORK/$m.fp32" >/dev/null
  "$BUILD/slimquant" run "$ours" --input input="$WORK/images.npy" --output-dir "$WORK/$m.ours" >/dev/null
  node "$ROOT/bench/check_deploy.js" --ort-worker onnxruntime-node-latest "$peer" "$WORK/images.npy" "$WORK/$m.peer" >/dev/null
  quality=$($PY - "$WORK/$m" <<'PY'
import sys, numpy as np
base = sys.argv[1]
ref = np.load(base + ".fp32/logits.npy")
def q(path):
    y = np.load(path)
    return f"{int((y.argmax(1) == ref.argmax(1)).sum())}/{len(ref)}, {np.abs(y - ref).max():.4f}"
print(f"{q(base + '.ours/logits.npy'):<26} {q(base + '.peer/default/logits.npy'):<26}")
PY
)
  for batch in 1 32; do
    # CPU-time medians (wall time on a shared machine includes preemption): slimquant_latency
    # (bench/latency.cpp) and compare_runtimes.js's ORT worker measure both.
    # The best of ROUNDS interleaved rounds (a busy machine slows some rounds of either runtime).
    sq=1e9 ort=1e9 style=1e9
    ort_ms() {
      node "$ROOT/bench/compare_runtimes.js" --ort-worker "$1" ${batch}x1x28x28 "$RUNS" onnxruntime-node-latest |
        tail -1 | $PY -c 'import json,sys; print(json.load(sys.stdin)["cpu_median_ms"])'
    }
    for ((r = 0; r < ROUNDS; r++)); do
      s1=$("$BUILD/slimquant_latency" "$ours" ${batch}x1x28x28 "$RUNS" | tail -1 |
        $PY -c 'import json,sys; print(json.load(sys.stdin)["cpu_median_ms"])')
      o1=$(ort_ms "$ours") p1=$(ort_ms "$peer")
      sq=$($PY -c "print(min($sq, $s1))") ort=$($PY -c "print(min($ort, $o1))") style=$($PY -c "print(min($style, $p1))")
    done
    printf '%-18s %8s %10.3f %10.3f %8.2f %12.3f %12.2f | %s\n' "$m" "$batch" "$sq" "$ort" "$($PY -c "print($ort / $sq)")" \
      "$style" "$($PY -c "print($style / $sq)")" "$([ "$batch" = 1 ] && echo "$quality" || echo)"
  done
done
