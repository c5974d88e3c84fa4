#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite (unit, conformance, end-to-end), then
# the int8 and runtime tests again with oneDNN limited to older CPUs' instruction sets.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
cd build
# ctest runs tests in parallel, one per core: one OpenMP thread each, or spinning OpenMP threads
# of the concurrent tests fight over the cores (measured: 10x slower wall time).
export OMP_NUM_THREADS=1
ctest --output-on-failure -j"$(nproc)" --timeout 900

# The tests whose results depend on the kernels oneDNN picks for the CPU: run them as on a CPU
# without AVX-512 (AVX2: no VNNI, saturating int8 kernels) and on one with AVX-512 but no VNNI, so
# a suite written on one machine cannot pass only there.
ISA_DEPENDENT='^([A-Za-z]+/)?(ImplementationChoice|Int8Parity|Lowering|LoweringOnResnet|FusedKernel|Int8Compute|ActivationMatMul|SpelledActivationLowering|IntegerOps|Dnnl[A-Za-z]*|Session[A-Za-z]*|QuantizeLinear|DequantizeLinear|Gelu|FixtureModel|CliQuantize|QuantizeReproducibility|DeployBackend|Int8Golden|ChannelWiseInputs|PaddlePatterns|ExecutionFusions|ChannelBlockedOps|ConvTransposeGemm)\.'
for isa in AVX2 AVX512_CORE; do
  echo "== int8 and runtime tests with DNNL_MAX_CPU_ISA=$isa"
  DNNL_MAX_CPU_ISA=$isa ctest --output-on-failure -j"$(nproc)" --timeout 900 -R "$ISA_DEPENDENT"
done

# The whole suite again under AddressSanitizer and UndefinedBehaviorSanitizer (-O1 -g, in
# build-asan/; any report fails). Measured here: about 5 min of tests after a 25 min build.
echo "== test suite under ASan and UBSan"
cd ..
scripts/check-sanitizers.sh
