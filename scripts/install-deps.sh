#!/usr/bin/env bash
# Installs every dependency slimquant needs from Debian packages, plus onnxruntime-node (npm,
# --ignore-scripts) for the peer benchmarks. Idempotent; safe to rerun.
#   --fuzz: also clang and libFuzzer for scripts/fuzz.sh (the normal build and tests need neither).
#   --bench: also what only the benchmarks need: bench/ocr/render_ocr_sets.py's text rendering
#            (Chinese and Latin fonts, PIL) and PaddleOCR's cv2 resize (python3-opencv pulls every
#            OpenCV module, so it stays out of the default install) and python3-torchvision for
#            bench/export_torchvision.py (the corpus of bench/speed_corpus.py and bench/model_forms.py).
set -euo pipefail
cd "$(dirname "$0")/.."

DEBIAN_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libonnx-dev libprotobuf-dev protobuf-compiler
  libdnnl-dev ocl-icd-opencl-dev opencl-c-headers  # Debian's oneDNN cmake config requires OpenCL
  libyaml-cpp-dev libcli11-dev nlohmann-json3-dev
  libcairo2-dev poppler-utils
  libopencv-core-dev libopencv-imgproc-dev libopencv-imgcodecs-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libonnx-testdata dataset-fashion-mnist
  liblapack-dev  # GPTQ's Cholesky factorisations (OpenBLAS's LAPACK where libopenblas0-pthread is installed)
  python3-torch python3-onnx python3-numpy libopenblas0-pthread
  python3-dev pybind11-dev python3-pybind11 python3-pytest  # the Python package (python/) and its tests
  libopenmpi-dev openmpi-bin  # optional MPI scale-out (docs/scale-out.md); the build works without
)
# Node.js runs ONNX Runtime for peer comparisons; keep an existing install (e.g. nodesource).
command -v node >/dev/null 2>&1 || DEBIAN_PACKAGES+=(nodejs npm)
# The fuzz build: clang with its sanitizer and libFuzzer runtimes, and clang's OpenMP.
[ "${1:-}" = "--fuzz" ] && DEBIAN_PACKAGES+=(clang libfuzzer-14-dev libclang-rt-14-dev libomp-14-dev)
[ "${1:-}" = "--bench" ] && DEBIAN_PACKAGES+=(python3-pil python3-opencv python3-torchvision fonts-wqy-microhei fonts-wqy-zenhei fonts-dejavu-core)

missing=()
for p in "${DEBIAN_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# ONNX Runtime is only a peer for benchmarks and the QDQ interoperability tests: the pinned
# onnxruntime-node and the latest (alias onnxruntime-node-latest), both CPU-only, no install scripts.
if command -v npm >/dev/null 2>&1 && { [ ! -d bench/node_modules/onnxruntime-node ] || [ ! -d bench/node_modules/onnxruntime-node-latest ]; }; then
  (cd bench && npm install --ignore-scripts --no-audit --no-fund --loglevel=error) || \
    echo "warning: onnxruntime-node could not be installed; peer comparisons will be skipped" >&2
fi
