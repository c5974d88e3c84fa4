#!/usr/bin/env bash
# Accuracy and calibration cost of every activation observer (`algo`) on the fixture models.
#  - accuracy: calibrate with the CLI defaults (10 batches of 32 Fashion-MNIST training images),
#    evaluate INT8 (integer execution, `slimquant eval` of the QDQ model) on the 10k test images,
#    against the FP32 model on the same images;
#  - cost: calibration wall time over TIMING_BATCHES batches of 32 divided by plain FP32
#    inference (`slimquant eval`) over the same samples, measured back to back, each the fastest of
#    REPEATS runs (default 3).
# Used to choose the default algo (docs/quantization.md). Extra arguments go to `quantize`.
# TIMING_ONLY=1 skips the accuracy part (prints nan there).
set -euo pipefail
cd "$(dirname "$0")/.."
TIMING_BATCHES=${TIMING_BATCHES:-40}
REPEATS=${REPEATS:-3}
MODELS=${MODELS:-"resnet_small mobilenetv2_small vit_small"}
ALGOS=${ALGOS:-"abs_max min_max avg hist KL mse emd"}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
sq() { build/slimquant --quiet "$@" | tail -n 1; }
field() { /usr/bin/python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
echo "| model | algo | fp32 top1 | int8 top1 | drop (points) | calib time / fp32 inference |"
echo "|---|---|---|---|---|---|"
for model in $MODELS; do
  m=tests/fixtures/models/$model.onnx
  fp32=nan
  [ "${TIMING_ONLY:-0}" = 1 ] || fp32=$(field "$(sq eval $m fashion-mnist:test --json)" top1)
  for algo in $ALGOS; do
    int8=nan
    if [ "${TIMING_ONLY:-0}" != 1 ]; then
      sq quantize $m fashion-mnist:train --algo $algo -o "$out/q.onnx" --no-eval --json "$@" >/dev/null
      int8=$(field "$(sq eval "$out/q.onnx" fashion-mnist:test --json)" top1)
    fi
    calib=inf infer=inf
    for _ in $(seq "$REPEATS"); do  # fastest of REPEATS runs each: noise on a shared machine only adds
      c=$(field "$(sq quantize $m fashion-mnist:train --limit $((TIMING_BATCHES * 32)) --batch-nums $TIMING_BATCHES \
              --algo $algo -o "$out/t.onnx" --no-eval --json "$@")" calib_seconds)
      i=$(field "$(sq eval $m fashion-mnist:train --limit $((TIMING_BATCHES * 32)) --batch-size 32 --json)" seconds)
      calib=$(/usr/bin/python3 -c "print(min(float('$calib'), $c))")
      infer=$(/usr/bin/python3 -c "print(min(float('$infer'), $i))")
    done
    /usr/bin/python3 -c "
f,i,c,t=map(float,'$fp32 $int8 $calib $infer'.split())
print('| $model | $algo | %.4f | %.4f | %+.2f | %.2fx |' % (f, i, 100*(i-f), c/t))"
  done
done
