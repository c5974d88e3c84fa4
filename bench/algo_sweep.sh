#!/usr/bin/env bash
# Accuracy of every activation observer (`algo`) on the fixture models: calibrate on 320
# Fashion-MNIST training images, evaluate FP32 and INT8 (simulated QDQ) on the 10k test images.
# Used to choose the default algo (docs/quantization.md).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
echo "| model | algo | fp32 top1 | int8 top1 | drop (points) | calib s |"
echo "|---|---|---|---|---|---|"
for model in resnet_small mobilenetv2_small vit_small; do
  for algo in abs_max min_max avg hist KL mse emd; do
    line=$(build/slimquant --quiet quantize tests/fixtures/models/$model.onnx fashion-mnist:train \
           --eval-dataset fashion-mnist:test --algo $algo -o "$out/$model.$algo.onnx" --json "$@" | tail -n 1)
    /usr/bin/python3 -c "
import json,sys; j=json.loads(sys.argv[1])
print('| $model | $algo | %.4f | %.4f | %+.2f | %.2f |' % (j['fp32_top1'], j['int8_top1'], 100*(j['int8_top1']-j['fp32_top1']), j['calib_seconds']))" "$line"
  done
done
rm -rf "$out"
