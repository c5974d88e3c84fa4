#!/usr/bin/env bash
# Builds slimquant with AddressSanitizer and UndefinedBehaviorSanitizer in ./build-asan and runs the
# test suite under them. Any sanitizer report, in a test or in a `slimquant` process a test starts,
# fails the run.
#
#   scripts/check-sanitizers.sh                  # the whole suite
#   scripts/check-sanitizers.sh -R 'Npy|Session' # arguments go to ctest: here only a subset
#
# Environment: SANITIZER_BUILD_DIR (default build-asan), JOBS (default: the number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir="${SANITIZER_BUILD_DIR:-build-asan}"
jobs="${JOBS:-$(nproc)}"

# -O1 -g instead of the project's -O3: an ASan build at -O3 takes about 40 s per file, and -O1 keeps
# stack traces exact. Debug keeps assert() live. No Python package: python3 cannot load an ASan-built
# module without LD_PRELOADing the ASan runtime, so its tests run in the normal build only. float-cast-overflow (a NaN or out-of-range float
# converted to an integer) is undefined behaviour but not part of GCC's -fsanitize=undefined.
sanitize_flags="-fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all"
sanitize_flags+=" -fno-omit-frame-pointer -O1 -g"

launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

# Reports go to files as well as failing the process: a test that runs the CLI and expects it to
# fail would otherwise take a sanitizer's exit status for the expected one. The build needs the
# options too: test discovery runs the sanitized test binary.
report_dir="$PWD/$build_dir/sanitizer-reports"
rm -rf "$report_dir"
mkdir -p "$report_dir"
export ASAN_OPTIONS="log_path=$report_dir/asan:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:halt_on_error=1"
export UBSAN_OPTIONS="log_path=$report_dir/ubsan:print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan-suppressions.txt:print_suppressions=0"

build_start=$SECONDS
cmake -S . -B "$build_dir" "${launcher[@]}" \
  -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG="$sanitize_flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DSLIMQUANT_BUILD_BENCH=OFF -DSLIMQUANT_WITH_PYTHON=OFF -DSLIMQUANT_WITH_MPI=OFF >/dev/null
cmake --build "$build_dir" -j"$jobs"
echo "sanitizer build: $((SECONDS - build_start)) s"

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
# Without MPI (configured above) and -LE mpi for a build folder configured with it: Open MPI's own
# allocations read as leaks to LeakSanitizer. The MPI scale-out test (label mpi) runs in the normal
# build (scripts/test.sh).
(cd "$build_dir" && ctest --output-on-failure -j"$jobs" -LE mpi "$@") 2>&1 | tee "$report_dir/../ctest.log" ||
  status=$?
echo "sanitizer test run: $((SECONDS - test_start)) s"
# GCC's UBSan prints to stderr despite log_path when linked with ASan: look for its reports too.
if grep -q "runtime error:" "$report_dir/../ctest.log"; then
  echo "UndefinedBehaviorSanitizer reports in $build_dir/ctest.log" >&2
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
