#!/usr/bin/python3
"""Dense prediction (issue 30, item 6): our default INT8 against ONNX Runtime's dynamic (and static)
INT8 of the same segmentation network, both against FP32.

Networks: torchvision's LR-ASPP MobileNetV3, DeepLabV3-MobileNetV3 and FCN-ResNet50 (random weights,
randomized BatchNorm statistics, as bench/model_forms.py exports them), at --resolution (256).
Calibration: 6 Fashion-MNIST training images (grey to RGB, scaled to the resolution, ImageNet
mean/std) for `slimquant quantize` (default settings, --algo auto, 2 more images held back for its
choice) and for the ORT-style static file (bench/ort_style_quantize.py, MinMax); the dynamic file
(quantize_dynamic's defaults) needs no data. Evaluation: --images Fashion-MNIST test images.

Per network and INT8 model, against FP32 (ONNX Runtime 1.30's output of the FP32 file):
  mask IoU   masks sigmoid(logit) > 0.5 (logit > 0) of every class channel; IoU per image over all
             channels and pixels; mean and minimum over the images
  argmax     share of pixels whose argmax class equals FP32's
  MAD        mean |INT8 logit - FP32 logit|
Our INT8 runs in slimquant (integer execution), the ORT files in ONNX Runtime 1.30.

  /usr/bin/python3 bench/dense_prediction.py OUT_DIR [--build DIR] [--models lraspp,deeplabv3_mbv3,fcn_resnet50]
                                             [--resolution 256] [--images 8]
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_forms as mf  # noqa: E402


def masks_iou(reference, test):
    """Per-image IoU of the logit > 0 masks over all channels and pixels ([N, C, H, W])."""
    ref, got = reference > 0, test > 0
    inter = np.logical_and(ref, got).reshape(len(ref), -1).sum(1)
    union = np.logical_or(ref, got).reshape(len(ref), -1).sum(1)
    return np.where(union > 0, inter / np.maximum(union, 1), 1.0)


def compare(reference, test):
    iou = masks_iou(reference, test)
    return {"iou_mean": float(iou.mean()), "iou_min": float(iou.min()),
            "argmax_agreement": float((reference.argmax(1) == test.argmax(1)).mean()),
            "mad": float(np.abs(reference - test).mean()), "sqnr_db": mf.sqnr_db([reference], [test])}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--build", default=os.path.join(mf.ROOT, "build"))
    parser.add_argument("--models", default="lraspp,deeplabv3_mbv3,fcn_resnet50")
    parser.add_argument("--resolution", type=int, default=256)
    parser.add_argument("--images", type=int, default=8)
    args = parser.parse_args()
    args.build = os.path.abspath(args.build)
    results = {}
    for name in args.models.split(","):
        model = mf.TorchvisionModel(name, args.out)
        if model.res != args.resolution:
            raise SystemExit(f"{name} exports at {model.res}; this script measures at that resolution only")
        base = mf.ensure_form(model, "base", args.build)
        work = os.path.join(model.dir, "dense")
        os.makedirs(work, exist_ok=True)
        x = mf.fashion_mnist_images("test", args.images, model.res)
        np.save(os.path.join(work, "x.npy"), x)
        feeds = [[f"input={os.path.join(work, 'x.npy')}"]]
        fp32 = mf.run_ort(base, feeds, work)[0]
        ours_path = os.path.join(model.dir, "base.int8.onnx")
        if not os.path.exists(ours_path):
            mf.quantize_ours(args.build, model, base, ours_path, "base")
        rows = {"slimquant default INT8": compare(fp32, mf.run_ours(args.build, ours_path, feeds, work)[0])}
        for form, label in (("ort_dynamic", "ORT dynamic INT8"), ("ort_static", "ORT static INT8 (MinMax)")):
            try:
                rows[label] = compare(fp32, mf.run_ort(mf.ensure_form(model, form, args.build), feeds, work)[0])
            except RuntimeError as e:
                rows[label] = {"error": str(e)}
        results[name] = rows
        print(name, json.dumps(rows), flush=True)
    lines = [f"Calibration: 6 Fashion-MNIST training images; evaluation: {args.images} test images at "
             f"{args.resolution}x{args.resolution}; masks: sigmoid(logit) > 0.5 per class channel", "",
             "| network | INT8 model | mask IoU mean | mask IoU min | argmax agreement | MAD | SQNR dB |",
             "|---|---|---|---|---|---|---|"]
    for name, rows in results.items():
        for label, r in rows.items():
            if "error" in r:
                lines.append(f"| {name} | {label} | ✗ {r['error'][:120]} | | | | |")
            else:
                lines.append(f"| {name} | {label} | {r['iou_mean']:.4f} | {r['iou_min']:.4f} | "
                             f"{r['argmax_agreement']:.4f} | {r['mad']:.4f} | {r['sqnr_db']:.1f} |")
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(args.out, "dense_prediction.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(args.out, "dense_prediction.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
