#!/bin/bash
# Per-sample latency against batch size, whole batches and the session's automatic parts
# (docs/performance.md, "Large batches in parts"): for tuning the part-size rule on another CPU.
# One thread; for each batch, `slimquant_latency` whole (SLIMQUANT_SAMPLES_PER_PART=0) and automatic,
# alternating, ROUNDS rounds; prints the best round's median CPU ms per sample.
#
#   bench/batch_scaling.sh MODEL SAMPLE_SHAPE [BATCHES] [ROUNDS]
#
# e.g. bench/batch_scaling.sh efficientnet_b0.int8.onnx 3x224x224 "1 2 4 8 16 32" 3
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,9p' "$0" >&2
  exit 2
fi
model=$1 shape=$2 batches=${3:-"1 2 4 8 16 32"} rounds=${4:-3}
bin=${SLIMQUANT_LATENCY:-$(dirname "$0")/../build/slimquant_latency}
per_sample() {  # BATCH PARTS: best round median / batch
  local best=""
  for _ in $(seq "$rounds"); do
    local ms
    ms=$(OMP_NUM_THREADS=1 SLIMQUANT_SAMPLES_PER_PART=$2 "$bin" "$model" "$1x$shape" $(( 64 / $1 > 3 ? 64 / $1 : 3 )) |
         tail -1 | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["cpu_median_ms"])')
    best=$(/usr/bin/python3 -c "print(min(x for x in [$ms, ${best:-$ms}]))")
  done
  /usr/bin/python3 -c "print(f'{$best / $1:.3f}')"
}
printf '%-6s %14s %14s\n' batch "whole ms/smp" "parts ms/smp"
for b in $batches; do
  printf '%-6s %14s %14s\n' "$b" "$(per_sample "$b" 0)" "$(per_sample "$b" -1)"
done
