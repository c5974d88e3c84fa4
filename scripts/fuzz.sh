#!/usr/bin/env bash
# Runs the libFuzzer targets of fuzz/ for a set time each:
#   scripts/fuzz.sh [seconds-per-target] [target...]     (default: 60 s, every target)
# Targets: onnx_loader npy yaml_config image_list. Needs clang and libFuzzer
# (scripts/install-deps.sh --fuzz). Builds them with ASan + UBSan in build-fuzz/, grows a working
# corpus in build-fuzz/corpus/<target>/ from the committed seeds (fuzz/corpus/<target>/) and the
# regression inputs, keeps fuzzing past crashes (fork mode), copies every crash, OOM, timeout and
# leak into fuzz/regressions/<target>/ (which the normal test suite replays: commit them with the
# fix), and prints executions, exec/s and crashes per target. Seeds: fuzz/make_seeds.py.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(onnx_loader npy yaml_config image_list)
build=${SLIMQUANT_FUZZ_BUILD:-build-fuzz}
jobs=${SLIMQUANT_FUZZ_BUILD_JOBS:-2}

command -v clang++ >/dev/null 2>&1 || { echo "fuzz.sh needs clang: run scripts/install-deps.sh --fuzz" >&2; exit 2; }
if [ ! -f "$build/CMakeCache.txt" ]; then
  launcher=()
  command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # -O1: the sanitizers' usual level; -O3 builds take minutes per file with instrumentation.
  cmake -S . -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DSLIMQUANT_FUZZ=ON -DSLIMQUANT_BUILD_TESTS=OFF \
        -DSLIMQUANT_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g" \
        "${launcher[@]}" >/dev/null
fi
cmake --build "$build" -j"$jobs" --target "${targets[@]/#/fuzz_}" >/dev/null

# Leaks in third-party one-time initialisation (OpenMP, oneDNN caches) are not findings;
# everything else ASan or UBSan reports is.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OMP_NUM_THREADS=1
# The targets write each input to a scratch folder (the code under test reads files): keep it in RAM.
[ -z "${TMPDIR:-}" ] && [ -w /dev/shm ] && export TMPDIR=/dev/shm

summary=()
for target in "${targets[@]}"; do
  corpus="$build/corpus/$target"
  artifacts="$build/artifacts/$target"
  log="$build/logs/$target-$(date -u +%Y%m%dT%H%M%S).log"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")" "fuzz/regressions/$target"
  seeds=("fuzz/corpus/$target")
  [ -n "$(ls -A "fuzz/regressions/$target")" ] && seeds+=("fuzz/regressions/$target")
  before=$(ls "$artifacts" | wc -l)
  echo "fuzzing $target for ${seconds}s (log: $log)" >&2
  # -fork=1 with -ignore_*: a crash is recorded and fuzzing goes on (the log says which input).
  # -rss_limit_mb: an input that makes the code allocate 2 GB is a finding (sizes must be checked
  # against the data before allocating). -timeout: 30 s for one input is a hang.
  "$build/fuzz/fuzz_$target" -fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1 \
      -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=30 -print_final_stats=1 \
      -artifact_prefix="$artifacts/" "$corpus" "${seeds[@]}" >"$log" 2>&1 || true
  # Fork mode's progress lines: "#EXECS: cov: .. ft: .. corp: .. exec/s N oom/timeout/crash: a/b/c time: Ts ..."
  last=$(grep -E '^#[0-9]+: cov:' "$log" | tail -n1 || true)
  execs=$(sed -nE 's/^#([0-9]+):.*/\1/p' <<<"$last")
  elapsed=$(sed -nE 's/.* time: ([0-9]+)s.*/\1/p' <<<"$last")
  rate=$(( ${execs:-0} / (${elapsed:-0} > 0 ? ${elapsed:-1} : 1) ))  # the average, not the last job's
  found=$(sed -nE 's/.*oom\/timeout\/crash: ([0-9]+\/[0-9]+\/[0-9]+).*/\1/p' <<<"$last")
  new=0
  for f in "$artifacts"/*; do
    [ -f "$f" ] || continue
    dest="fuzz/regressions/$target/$(basename "$f")"
    if [ ! -e "$dest" ] && [ ! -e "fuzz/pending/$target/$(basename "$f")" ]; then
      cp "$f" "$dest"
      new=$((new + 1))
    fi
  done
  line="$target: ${execs:-0} executions, ${rate:-0} exec/s, oom/timeout/crash ${found:-0/0/0}, $((($(ls "$artifacts" | wc -l)) - before)) new artifact(s), $new copied to fuzz/regressions/$target/"
  echo "$(date -u +%FT%TZ) ${seconds}s $line" >>"$build/fuzz-stats.log"
  summary+=("$line")
done
printf '%s\n' "${summary[@]}"
