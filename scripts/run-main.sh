#!/usr/bin/env bash
# Installs everything, builds, and runs the main job on the bundled default data: evaluate the
# bundled ResNet-style model on the Fashion-MNIST test set.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
build/slimquant info tests/fixtures/models/resnet_small.onnx
build/slimquant eval tests/fixtures/models/resnet_small.onnx --dataset fashion-mnist:test
