#!/usr/bin/env bash
# MPI scale-out end to end (docs/scale-out.md), registered by tests/CMakeLists.txt when slimquant is
# built with MPI. With 2 ranks on loopback:
#   1. analyze writes the same analysis.txt / analysis.json as 1 rank;
#   2. quantize (calibration sharded, observers merged) writes a byte-identical model for the
#      default observer and for avg, whose state depends on the batches, and the sharded
#      evaluation prints the same INT8 top-1;
#   3. killing one rank midway (injected after batch 12 of 32) stops the job; a rerun with 2 ranks, or with 1, resumes from the
#      checkpoint (every finished batch of every layer is kept) and writes the same ranking.
# Usage: mpi_scale_out.sh SLIMQUANT MPIEXEC SOURCE_DIR WORK_DIR
set -euo pipefail
slimquant=$1 mpiexec=$2 source_dir=$3 work=$4
model=$source_dir/tests/fixtures/models/resnet_small.onnx
rm -rf "$work" && mkdir -p "$work"
# CI runs as root; loopback TCP only (containers often have no other usable interface).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
# One OpenMP thread per process (as scripts/test.sh): ranks and concurrent tests share the cores,
# and spinning OpenMP threads on a busy machine are many times slower.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mpi() { local n=$1; shift; "$mpiexec" -np "$n" --oversubscribe "$@"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

# 32 evaluation batches of 4 (the kill below is injected at a batch, not raced against the clock).
analyze=(--quiet analyze "$model" fashion-mnist:test --limit 128 --batch-size 32 --batch-nums 4 --eval-batch-size 4
         --num-histogram-plots 0)
"$slimquant" "${analyze[@]}" --save-dir "$work/a1" > "$work/a1.log"
mpi 2 "$slimquant" "${analyze[@]}" --save-dir "$work/a2" > "$work/a2.log"
cmp "$work/a1/analysis.txt" "$work/a2/analysis.txt" || fail "analysis.txt differs between 1 and 2 ranks"
cmp "$work/a1/analysis.json" "$work/a2/analysis.json" || fail "analysis.json differs between 1 and 2 ranks"
echo "ok: analyze, 2 ranks = 1 rank"

for algo in emd avg; do
  # The sharded evaluation once (emd); avg calibrates only.
  quantize=(--quiet quantize "$model" fashion-mnist:train --limit 192 --batch-size 32 --batch-nums 6 --algo "$algo"
            --eval-dataset fashion-mnist:test)
  [ "$algo" = avg ] && quantize+=(--no-eval)
  "$slimquant" "${quantize[@]}" -o "$work/q1_$algo.onnx" > "$work/q1_$algo.log"
  mpi 2 "$slimquant" "${quantize[@]}" -o "$work/q2_$algo.onnx" > "$work/q2_$algo.log"
  cmp "$work/q1_$algo.onnx" "$work/q2_$algo.onnx" || fail "quantize --algo $algo: the model differs between 1 and 2 ranks"
  grep '^int8 top1' "$work/q1_$algo.log" > "$work/q1_$algo.top1" || true
  grep '^int8 top1' "$work/q2_$algo.log" > "$work/q2_$algo.top1" || true
  cmp "$work/q1_$algo.top1" "$work/q2_$algo.top1" || fail "quantize --algo $algo: sharded evaluation differs"
  echo "ok: quantize --algo $algo, 2 ranks = 1 rank ($(cat "$work/q2_$algo.top1"))"
done

# Rank 1 is killed (SIGKILL, by itself: SLIMQUANT_FAULT_KILL_RANK_AFTER_BATCH) once rank 0 has
# checkpointed 12 of the 32 batches; mpirun must stop the job.
checkpoint=$work/k/analysis_checkpoint.json
batches_done() { grep -o '"batches_done":[0-9]*' "$checkpoint" 2>/dev/null | cut -d: -f2 || true; }
if SLIMQUANT_FAULT_KILL_RANK_AFTER_BATCH=1:12 mpi 2 "$slimquant" "${analyze[@]}" --save-dir "$work/k" \
     > "$work/k_killed.log" 2>&1; then
  fail "the job went on after rank 1 was killed"
fi
done_at_kill=$(batches_done)
[ "$done_at_kill" = 12 ] || fail "checkpoint after the kill holds '$done_at_kill' batches, expected 12"
[ ! -e "$work/k/analysis.txt" ] || fail "the killed job wrote analysis.txt"
cp -r "$work/k" "$work/k1"
echo "ok: killed rank 1, the job stopped with $done_at_kill of 32 batches in the checkpoint"

# Rerun with 2 ranks and, from the same checkpoint, with 1 rank.
mpi 2 "$slimquant" "${analyze[@]}" --save-dir "$work/k" > "$work/k_rerun.log"
"$slimquant" "${analyze[@]}" --save-dir "$work/k1" > "$work/k1_rerun.log"
for dir in k k1; do
  grep -q "(resumed after $done_at_kill batches)" "$work/${dir}_rerun.log" ||
    fail "$dir: the rerun did not resume after $done_at_kill batches: $(head -1 "$work/${dir}_rerun.log")"
  cmp "$work/a1/analysis.txt" "$work/$dir/analysis.txt" || fail "$dir: resumed analysis.txt differs"
  # analysis.json records how many batches were resumed; everything else must be the same.
  sed '/"batches_resumed"/d' "$work/a1/analysis.json" > "$work/$dir.expected.json"
  sed '/"batches_resumed"/d' "$work/$dir/analysis.json" > "$work/$dir.actual.json"
  cmp "$work/$dir.expected.json" "$work/$dir.actual.json" || fail "$dir: resumed analysis.json differs"
  grep -q "\"batches_resumed\": $done_at_kill" "$work/$dir/analysis.json" || fail "$dir: batches_resumed not recorded"
done
echo "ok: resumed with 2 ranks and with 1 rank after $done_at_kill batches, same ranking as one uninterrupted rank"
