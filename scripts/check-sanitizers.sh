#!/usr/bin/env bash
# Runs the sanitized tests: the code that parses untrusted input and the kernels that compute their
# own indices, compiled again with AddressSanitizer and UndefinedBehaviorSanitizer and linked with
# the rest of the normal build's objects (cmake/slimquant_sanitized.cmake), under the core, data,
# ir and runtime tests, the CLI's bad-input tests (a sanitized `slimquant`) and the fuzz corpus.
# Any sanitizer report, in a test or in a `slimquant` process a test starts, fails the run.
#
#   scripts/check-sanitizers.sh                  # every sanitized test
#   scripts/check-sanitizers.sh -R 'Npy|Session' # arguments go to ctest: here only a subset
#
# Environment: BUILD_DIR (default build, the normal Release build: only the instrumented files
# are compiled again), JOBS (default: the number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir="${BUILD_DIR:-build}"
# GNU nproc honours OMP_NUM_THREADS (1 in scripts/test.sh): count the cores without it.
jobs="${JOBS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}"

# Reports go to files as well as failing the process: a test that runs the CLI and expects it to
# fail would otherwise take a sanitizer's exit status for the expected one. ctest lists the sanitized
# binaries' tests when it starts (by running them), under the same options.
report_dir="$PWD/$build_dir/sanitizer-reports"
rm -rf "$report_dir"
mkdir -p "$report_dir"
export ASAN_OPTIONS="log_path=$report_dir/asan:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:halt_on_error=1"
export UBSAN_OPTIONS="log_path=$report_dir/ubsan:print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan-suppressions.txt:print_suppressions=0"

build_start=$SECONDS
cmake -S . -B "$build_dir" -DSLIMQUANT_SANITIZED_TESTS=ON >/dev/null
cmake --build "$build_dir" -j"$jobs"
echo "sanitized build: $((SECONDS - build_start)) s"

# One OpenMP thread per test, as in scripts/test.sh: concurrent tests' spinning threads fight over
# the cores otherwise.
export OMP_NUM_THREADS=1
# oneDNN 2.6's AMX int8 kernels (Sapphire Rapids with amx_int8 exposed) read past an allocation
# while a primitive is created when the process runs under AddressSanitizer: a SEGV inside
# libdnnl's dnnl_primitive_create for one CLI quantize (AnalyzeCli.TargetSearch...), whose normal
# build passes on the same CPU. Their JIT code is not instrumented anyway, so the sanitized run
# caps oneDNN at AVX-512 VNNI; scripts/test.sh runs every test on the CPU's own ISA.
export DNNL_MAX_CPU_ISA="${DNNL_MAX_CPU_ISA:-AVX512_CORE_VNNI}"
test_start=$SECONDS
status=0
(cd "$build_dir" && ctest --output-on-failure -j"$jobs" -L sanitized "$@") 2>&1 | tee "$build_dir/sanitized-ctest.log" ||
  status=$?
echo "sanitizer test run: $((SECONDS - test_start)) s"
# GCC's UBSan prints to stderr despite log_path when linked with ASan: look for its reports too.
if grep -q "runtime error:" "$build_dir/sanitized-ctest.log"; then
  echo "UndefinedBehaviorSanitizer reports in $build_dir/sanitized-ctest.log" >&2
  status=1
fi

reports=("$report_dir"/*)
if [ -e "${reports[0]}" ]; then
  for f in "${reports[@]}"; do
    echo "=== $f"
    cat "$f"
  done
  echo "sanitizer reports: ${#reports[@]} (in $report_dir)" >&2
  status=1
fi
exit "$status"
