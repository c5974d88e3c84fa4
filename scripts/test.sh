#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite (unit, conformance, end-to-end).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
cd build
# ctest runs tests in parallel, one per core: one OpenMP thread each, or spinning OpenMP threads
# of the concurrent tests fight over the cores (measured: 10x slower wall time).
export OMP_NUM_THREADS=1
ctest --output-on-failure -j"$(nproc)" --timeout 900
