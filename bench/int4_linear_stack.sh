#!/usr/bin/env bash
# Batch-1 latency of a stack of 12 MatMul layers 4096 x 4096 (y = x W, 768 MiB of FP32 weights):
# slimquant FP32, slimquant 4-bit (weight-only, INT4 blocks of 32, the fused MatMulQb4w kernel), and
# ONNX Runtime 1.30 (onnxruntime-node-latest) on the same two files. One thread, median of the runs.
# ORT runs the 4-bit file twice: at its default (session.qdq_matmulnbits_accuracy_level 4: its fused
# MatMulNBits rounds the activations to int8 per block and multiplies in integers) and at level 0
# (float activations, the computation slimquant does: every weight exactly q * s). Ours runs a
# third file too, quantized with --int4-activations int8 (the computation of ORT's level 4).
#
#   bench/int4_linear_stack.sh [--runs 20] [--rounds 1] [--layers 12] [--dim 4096] [--block-size 32] [--out DIR]
#                              [--build DIR] [--compare-build DIR]
#
# --rounds R interleaves: each round times all of them (R processes each), so on a shared machine a
# slow spell falls on every row alike; a row's figure is the median of its rounds' medians (each
# round's figures are printed too). --compare-build adds the INT4 row of a second build (before and
# after a change, in the same rounds).
#
# The FP32 model is written by /usr/bin/python3 with onnx's helper (random N(0, 0.02) weights), the
# 4-bit one by `slimquant quantize --mode weight-only --weight-bits 4` (round to nearest: no data).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=20 rounds=1 layers=12 dim=4096 block=32 out=/tmp/int4_linear_stack build="$root/build" compare=""
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --compare-build) compare=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --dim) dim=$2; shift 2 ;;
    --block-size) block=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
fp32="$out/stack_${layers}x${dim}.onnx" int4="$out/stack_${layers}x${dim}.int4_b${block}.onnx"
int4_i8="$out/stack_${layers}x${dim}.int4_b${block}.i8act.onnx"
if [ ! -f "$fp32" ]; then
  /usr/bin/python3 - "$fp32" "$layers" "$dim" <<'EOF'
import sys
import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto
path, layers, dim = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
nodes, inits, x = [], [], "x"
for i in range(layers):
    w = (rng.standard_normal((dim, dim)) * 0.02).astype(np.float32)
    inits.append(numpy_helper.from_array(w, f"w{i}"))
    y = "y" if i == layers - 1 else f"h{i}"
    nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [y], name=f"linear{i}"))
    x = y
g = helper.make_graph(nodes, "linear_stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, dim])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, dim])], inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="int4_linear_stack")
m.ir_version = 8
onnx.save(m, path)
EOF
fi
[ -f "$int4" ] || "$build/slimquant" quantize "$fp32" --mode weight-only --weight-bits 4 --block-size "$block" \
  -o "$int4" >/dev/null
[ -f "$int4_i8" ] || "$build/slimquant" quantize "$fp32" --mode weight-only --weight-bits 4 --block-size "$block" \
  --int4-activations int8 -o "$int4_i8" >/dev/null
echo "CPU: $(lscpu | grep 'Model name' | sed 's/Model name:[ ]*//')"
echo "files: fp32 $(du -m "$fp32" | cut -f1) MiB, int4 $(du -m "$int4" | cut -f1) MiB"
ours() { OMP_NUM_THREADS=1 "${2:-$build}/slimquant" bench "$1" --shape "1x$dim" --runs "$runs" --warmup 3 --threads 1 --json |
  tail -1 | /usr/bin/python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["median_ms"])'; }
ort() {
  node -e '
const ort = require(process.argv[1]);
(async () => {
  const opts = { intraOpNumThreads: 1, interOpNumThreads: 1 };
  if (process.argv[5]) opts.extra = { session: { qdq_matmulnbits_accuracy_level: process.argv[5] } };
  const s = await ort.InferenceSession.create(process.argv[2], opts);
  const dim = Number(process.argv[3]), runs = Number(process.argv[4]);
  const x = new ort.Tensor("float32", Float32Array.from({ length: dim }, (_, i) => Math.sin(i)), [1, dim]);
  for (let i = 0; i < 3; ++i) await s.run({ x });
  const t = [];
  for (let i = 0; i < runs; ++i) { const t0 = process.hrtime.bigint(); await s.run({ x }); t.push(Number(process.hrtime.bigint() - t0) / 1e6); }
  t.sort((a, b) => a - b);
  console.log(t[Math.floor(t.length / 2)].toFixed(3));
})().catch((e) => { console.log("fails: " + e.message.split("\n")[0]); });
' "$root/bench/node_modules/$1" "$2" "$dim" "$runs" "${3:-}"
}
med() { /usr/bin/python3 -c 'import statistics,sys; print("%.3f" % statistics.median(float(v) for v in sys.argv[1:]))' "$@"; }
all_sq_fp32=() all_sq_int4=() all_cmp_int4=() all_ort_fp32=() all_ort_int4=() all_ort_exact=() all_sq_i8=()
for ((r = 1; r <= rounds; ++r)); do
  all_sq_fp32+=("$(ours "$fp32")")
  all_sq_int4+=("$(ours "$int4")")
  all_sq_i8+=("$(ours "$int4_i8")")
  [ -z "$compare" ] || all_cmp_int4+=("$(ours "$int4" "$compare")")
  all_ort_fp32+=("$(ort onnxruntime-node-latest "$fp32")")
  all_ort_int4+=("$(ort onnxruntime-node-latest "$int4")")
  all_ort_exact+=("$(ort onnxruntime-node-latest "$int4" 0)")
  [ "$rounds" -eq 1 ] || echo "  round $r: ours FP32 ${all_sq_fp32[-1]}, ours INT4 ${all_sq_int4[-1]}${compare:+, compare INT4 ${all_cmp_int4[-1]:-}}, ORT FP32 ${all_ort_fp32[-1]}, ORT INT4 ${all_ort_int4[-1]}, ORT INT4 level 0 ${all_ort_exact[-1]}, ours INT4 int8 act. ${all_sq_i8[-1]}"
done
sq_fp32=$(med "${all_sq_fp32[@]}") sq_int4=$(med "${all_sq_int4[@]}")
ort_fp32=$(med "${all_ort_fp32[@]}") ort_int4=$(med "${all_ort_int4[@]}") ort_exact=$(med "${all_ort_exact[@]}") sq_i8=$(med "${all_sq_i8[@]}")
echo "batch 1, one thread, block size $block, median of $runs runs (of $rounds rounds' medians) (ms):"
echo "  slimquant FP32  $sq_fp32"
echo "  slimquant INT4  $sq_int4  (FP32 / INT4 $(/usr/bin/python3 -c "print('%.2f' % ($sq_fp32 / $sq_int4))")x, ORT INT4 / ours $(/usr/bin/python3 -c "print('%.2f' % ($ort_int4 / $sq_int4))")x)"
echo "  slimquant INT4, --int4-activations int8  $sq_i8  (FP32 / INT4 $(/usr/bin/python3 -c "print('%.2f' % ($sq_fp32 / $sq_i8))")x, ORT INT4 (its default) / ours $(/usr/bin/python3 -c "print('%.2f' % ($ort_int4 / $sq_i8))")x)"
if [ -n "$compare" ]; then
  cmp_int4=$(med "${all_cmp_int4[@]}")
  echo "  slimquant INT4 ($compare)  $cmp_int4  ($(/usr/bin/python3 -c "print('%.2f' % ($sq_fp32 / $cmp_int4))")x FP32)"
fi
echo "  ORT 1.30 FP32   $ort_fp32"
echo "  ORT 1.30 INT4   $ort_int4  (its default: MatMulNBits at accuracy level 4, activations rounded to int8 per block)"
echo "  ORT 1.30 INT4   $ort_exact  (accuracy level 0: float activations, as ours; ORT / ours $(/usr/bin/python3 -c "print('%.2f' % ($ort_exact / $sq_int4))")x)"
if [ "$rounds" -gt 1 ]; then  # ratios within each round (the rows' medians above may come from different rounds)
  /usr/bin/python3 - "${all_sq_fp32[*]}" "${all_sq_int4[*]}" "${all_ort_int4[*]}" "${all_cmp_int4[*]:-}" \
    "${all_sq_i8[*]}" "${all_ort_exact[*]}" <<'EOF'
import statistics, sys
fp32, int4, ort = ([float(v) for v in a.split()] for a in sys.argv[1:4])
cmp_ = [float(v) for v in sys.argv[4].split()]
i8, ort_exact = ([float(v) for v in a.split()] for a in sys.argv[5:7])
def show(name, xs):
    print("  %s per round: median %.2fx (%.2f-%.2f)" % (name, statistics.median(xs), min(xs), max(xs)))
show("ORT INT4 / ours INT4", [o / i for o, i in zip(ort, int4)])
show("ours FP32 / ours INT4", [f / i for f, i in zip(fp32, int4)])
show("ORT INT4 level 0 / ours INT4", [o / i for o, i in zip(ort_exact, int4)])
show("ORT INT4 (default) / ours INT4 int8 act.", [o / i for o, i in zip(ort, i8)])
show("ours FP32 / ours INT4 int8 act.", [f / i for f, i in zip(fp32, i8)])
if cmp_: show("compare INT4 / ours INT4", [c / i for c, i in zip(cmp_, int4)])
EOF
fi
