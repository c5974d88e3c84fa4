#!/usr/bin/env bash
# Installs everything, builds, and runs the main job on the bundled default data: quantize the
# bundled ResNet-style model to INT8 (calibrating on Fashion-MNIST training images) and compare FP32
# and INT8 top-1 on the 10k test images.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
mkdir -p out
build/slimquant quantize tests/fixtures/models/resnet_small.onnx fashion-mnist:train \
  --eval-dataset fashion-mnist:test -o out/resnet_small.int8.onnx
ls -l tests/fixtures/models/resnet_small.onnx out/resnet_small.int8.onnx
