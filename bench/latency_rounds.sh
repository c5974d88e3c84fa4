#!/bin/bash
# Interleaved latency rounds of prepared models (no quantization step), for A/B comparisons of two
# builds or two models on a shared, noisy machine: every round runs each configuration once
# (build/slimquant_latency, one thread, RUNS timed runs), configurations alternating, and the
# summary gives per configuration the median over rounds of the per-round CPU-time median, the
# best round median and the fastest single run.
#
#   bench/latency_rounds.sh SHAPE RUNS ROUNDS LABEL 'LATENCY_BINARY MODEL [VAR=VALUE...]' [LABEL '...']...
#
# e.g. bench/latency_rounds.sh 1x3x48x320 40 5 main '/work/main/build/slimquant_latency rec.int8.onnx' \
#        new 'build/slimquant_latency rec.int8.onnx SLIMQUANT_INT8_COMPUTE=int8'
set -euo pipefail
if [ $# -lt 5 ] || [ $(( ($# - 3) % 2 )) -ne 0 ]; then
  sed -n '2,10p' "$0" >&2
  exit 2
fi
shape=$1 runs=$2 rounds=$3
shift 3
labels=() configs=()
while [ $# -gt 0 ]; do labels+=("$1"); configs+=("$2"); shift 2; done
results=$(mktemp -d)
trap 'rm -r "$results"' EXIT
for _ in $(seq "$rounds"); do
  for i in "${!labels[@]}"; do
    read -r -a parts <<< "${configs[$i]}"
    env "${parts[@]:2}" "${parts[0]}" "${parts[1]}" "$shape" "$runs" | tail -1 >> "$results/$i"
  done
done
for i in "${!labels[@]}"; do
  /usr/bin/python3 - "$results/$i" "${labels[$i]}" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
medians = [r["cpu_median_ms"] for r in rows]
print(f"{sys.argv[2]:<32} CPU ms: median of round medians {statistics.median(medians):8.3f}  "
      f"best round median {min(medians):8.3f}  fastest run {min(r['cpu_min_ms'] for r in rows):8.3f}  ({len(rows)} rounds)")
PY
done
