#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite: every test of the Release build,
# the kernel-dependent ones again with oneDNN limited to older CPUs' instruction sets, then the
# sanitized tests (scripts/check-sanitizers.sh: the parsers and hand-indexed kernels compiled again
# with ASan and UBSan, linked with this build's other objects). Prints the time of each stage.
#   ctest -L fast (in build/): the developer's inner loop; tests/CMakeLists.txt names the labels.
set -euo pipefail
cd "$(dirname "$0")/.."
stage_start=$SECONDS
# The cores, counted before OMP_NUM_THREADS is set below: GNU nproc honours OMP_NUM_THREADS, and
# `ctest -j"$(nproc)"` after the export ran every test one at a time (measured: 296 s instead of 155).
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
export JOBS="$jobs"
stage() { echo "== $1 ($((SECONDS - stage_start)) s since the start)"; }

stage "dependencies"
scripts/install-deps.sh
stage "Release build"
scripts/build.sh
cd build
# ctest runs tests in parallel, one per core: one OpenMP thread each, or spinning OpenMP threads
# of the concurrent tests fight over the cores (measured: 10x slower wall time).
export OMP_NUM_THREADS=1
stage "test suite"
ctest --output-on-failure -j"$jobs" --timeout 900 -LE sanitized

# The tests whose results depend on the kernels oneDNN picks for the CPU: run them as on a CPU
# without AVX-512 (AVX2: no VNNI, saturating int8 kernels) and on one with AVX-512 but no VNNI, so
# a suite written on one machine cannot pass only there. The command-line flows (CliQuantize) are not
# rerun: their kernels are the ones the suites above exercise, and they cost a third of a rerun.
ISA_DEPENDENT='^([A-Za-z]+/)?(ImplementationChoice|Int8Parity|Lowering|LoweringOnResnet|FusedKernel|Int8Compute|ActivationMatMul|SpelledActivationLowering|IntegerOps|Dnnl[A-Za-z]*|Session[A-Za-z]*|QuantizeLinear|DequantizeLinear|Gelu|FixtureModel|QuantizeReproducibility|DeployBackend|Int8Golden|ChannelWiseInputs|PaddlePatterns|ExecutionFusions|ChannelBlockedOps|ConvTransposeGemm|Dynamic|DynamicMatMulFusion|ConvBandsTest)\.'
# A cap at or above the CPU's own best instruction set would repeat the run above: skipped, saying so.
cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2 || true) "
has_flag() { [[ "$cpu_flags" == *" $1 "* ]]; }
for isa in AVX2 AVX512_CORE; do
  case $isa in
    AVX2) above=$({ has_flag avx512f || has_flag avx_vnni; } && echo yes || true) ;;         # AVX-512, or AVX2 with VNNI
    AVX512_CORE) above=$({ has_flag avx512_vnni || has_flag amx_tile; } && echo yes || true) ;;  # VNNI or AMX on AVX-512
  esac
  if [ -z "$above" ]; then
    stage "int8 and runtime tests with DNNL_MAX_CPU_ISA=$isa: skipped, this CPU has nothing above $isa"
    continue
  fi
  stage "int8 and runtime tests with DNNL_MAX_CPU_ISA=$isa"
  DNNL_MAX_CPU_ISA=$isa ctest --output-on-failure -j"$jobs" --timeout 900 -LE sanitized -R "$ISA_DEPENDENT"
done

stage "sanitized tests (ASan and UBSan)"
cd ..
scripts/check-sanitizers.sh
stage "done"
