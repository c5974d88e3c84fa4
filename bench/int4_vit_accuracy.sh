#!/usr/bin/env bash
# Fashion-MNIST test top-1 of the ViT fixture in FP32 and with 4-bit weight-only quantization
# (MatMul / Gemm weights INT4 in blocks of 32, 64, 128; RTN and GPTQ), evaluated by slimquant on the
# 10,000 test images. GPTQ calibrates on the first --calib training images.
#
#   bench/int4_vit_accuracy.sh [--calib 512] [--out DIR] [--build DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
calib=512 out=/tmp/int4_vit_accuracy build="$root/build"
while [ $# -gt 0 ]; do
  case "$1" in
    --calib) calib=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
model="$root/tests/fixtures/models/vit_small.onnx"
top1() { OMP_NUM_THREADS=1 "$build/slimquant" eval "$1" fashion-mnist:test --threads 1 --json | tail -1 |
  /usr/bin/python3 -c 'import json,sys; print("%.2f" % (100 * json.load(sys.stdin)["top1"]))'; }
fp32=$(top1 "$model")
echo "ViT fixture, Fashion-MNIST test top-1 (%): FP32 $fp32"
echo "block  rounding  top-1   loss vs FP32 (points)"
for block in 32 64 128; do
  for rounding in rtn gptq; do
    q="$out/vit_w4_b${block}_${rounding}.onnx"
    data=()
    [ "$rounding" = gptq ] && data=(fashion-mnist:train --limit "$calib" --batch-size 32)
    OMP_NUM_THREADS=1 "$build/slimquant" quantize "$model" "${data[@]}" --mode weight-only --weight-bits 4 \
      --block-size "$block" --weight-rounding "$rounding" --no-eval --threads 1 -o "$q" >/dev/null
    t=$(top1 "$q")
    echo "$block    $rounding     $t   $(/usr/bin/python3 -c "print('%.2f' % ($fp32 - $t))")"
  done
done
