#!/usr/bin/env bash
# Cost of `quantize` with precision recovery on a large network at high resolution (issue 30,
# item 5): calibration time, the whole job's time and peak memory, against one FP32 inference's
# peak memory. Recovery is forced (--fallback-sqnr 60) so that it always runs its full search.
#
#   bench/recovery_cost.sh [MODEL.onnx CALIB_NPY_DIR]
#
# Default: torchvision's DeepLabV3-MobileNetV3 (70 convolutions) at 1024x1024, exported by
# bench/export_torchvision.py into $WORK (needs python3-torchvision), calibrated on 6 images.
set -euo pipefail
cd "$(dirname "$0")/.."
SLIMQUANT=${SLIMQUANT:-build/slimquant}
WORK=${WORK:-/tmp/slimquant_recovery_cost}
SAMPLES=${SAMPLES:-6}
model=${1:-$WORK/deeplabv3_mbv3.onnx}
calib=${2:-$WORK/calib1024}
if [ ! -f "$model" ]; then
  /usr/bin/python3 bench/export_torchvision.py "$WORK" --resolution 1024 deeplabv3_mbv3
fi
peak_kib() { sed -n 's/.*Maximum resident set size (kbytes): //p' "$1"; }
echo "model: $model ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), ${OMP_NUM_THREADS:-all} threads)"

/usr/bin/python3 -c "import numpy as np, sys; np.save(sys.argv[2], np.load(sys.argv[1])[:1])" "$calib/x.npy" "$WORK/one.npy"
/usr/bin/time -v "$SLIMQUANT" --quiet run "$model" --input "input=$WORK/one.npy" --output-dir "$WORK/fp32_out" \
  >/dev/null 2>"$WORK/fp32.time"
start=$(date +%s.%N)
/usr/bin/time -v "$SLIMQUANT" --quiet quantize "$model" "npy:$calib" --limit "$SAMPLES" --batch-size 1 \
  --batch-nums "$SAMPLES" --fallback-sqnr 60 --no-eval --json -o "$WORK/int8.onnx" >"$WORK/quantize.log" 2>"$WORK/quantize.time"
end=$(date +%s.%N)
json=$(grep '^{' "$WORK/quantize.log" | tail -1)
field() { echo "$json" | /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
calib_s=$(field calib_seconds)
total_s=$(echo "$end - $start" | bc)
echo "calibration: ${calib_s} s on $SAMPLES samples; whole quantize: ${total_s} s ($(echo "scale=2; $total_s / $calib_s" | bc)x)"
echo "recovery: ranking by $(field fallback_ranking), $(field fallback_evaluations) evaluations of $(field fallback_samples) samples, $(field fallback_sqnr_db_per_tensor) -> $(field fallback_sqnr_db_after) dB, float layers: $(field fallback_float_layers)"
fp32_kib=$(peak_kib "$WORK/fp32.time"); q_kib=$(peak_kib "$WORK/quantize.time")
echo "peak memory: FP32 inference of one sample $((fp32_kib / 1024)) MiB, quantize $((q_kib / 1024)) MiB ($(echo "scale=2; $q_kib / $fp32_kib" | bc)x)"
