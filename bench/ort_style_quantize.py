#!/usr/bin/python3
"""Builds the QDQ model ONNX Runtime's own quantizer would write, as the peer in bench/compare_runtimes.js.

The model an ORT user deploys is what `onnxruntime.quantization.quantize_static(..., quant_format=QDQ,
calibrate_method=MinMax, per_channel=True)` writes with its x86 defaults. That package is not
installable here (Debian's onnx + numpy only), so this script reproduces its output:

- pre-processing as ORT's quantizer pre-processing (its basic graph optimizations) does it: Constant
  nodes and Identity-of-initializer become initializers, BatchNormalization folds into the preceding
  Conv; models below opset 13 are converted to 13 first (ORT refuses per-channel QDQ below 13);
- calibration: min/max of every float input/output of the quantized ops over the calibration data,
  computed by running the FP32 model in ONNX Runtime (bench/ort_collect_ranges.js), then ORT's range
  adjustments (a Relu/Clip input with one consumer takes the Relu/Clip output's range; Softmax
  outputs are [0, 1]);
- activations uint8 asymmetric: rmin = min(min, 0), rmax = max(max, 0), scale = (rmax - rmin) / 255,
  zero point = round(-rmin / scale); float initializers read by quantized ops other than as weights
  (an Add's constant, say) are quantized the same way;
- weights int8 symmetric per channel (scale = max|w| / 127, range [-127, 127], int8 zero points,
  axis attribute: output channel of Conv, 1 for ConvTranspose and MatMul, per transB for Gemm);
  biases of Conv/ConvTranspose/Gemm int32 with scale = input scale * weight scale and zero point 0;
- ORT's placement (its QDQ quantizer registry, default op types): one Q->DQ pair per quantized
  tensor, read by all its consumers; Conv/ConvTranspose/Gemm/MatMul/Add/Mul/Concat/
  GlobalAveragePool/Sigmoid/LeakyRelu/Softmax/ArgMax/normalizations quantize their float inputs and
  outputs; Relu/Clip after a quantized tensor with a single consumer are removed, the producer writing
  straight into the Q that has the Relu/Clip output's range; Reshape/Transpose/Squeeze/Unsqueeze/
  Slice/MaxPool/AveragePool/Resize/Pad/TopK (and Split, Gather of a float initializer) quantize their
  output with their input's scale and zero point, and only when the input is quantized. Ops outside
  ORT's registry (Flatten, HardSigmoid, Div, Where, ...) stay float, as in ORT.

Names follow ORT's: `T_QuantizeLinear` -> `T_QuantizeLinear_Output` -> `T_DequantizeLinear` ->
`T_DequantizeLinear_Output`, initializers `T_scale`, `T_zero_point`, `W_quantized`.

  /usr/bin/python3 bench/ort_style_quantize.py FP32.onnx CALIB OUT.onnx [--batch-size 32] [--batches 10]
                                               [--ort latest|pinned]
  /usr/bin/python3 bench/ort_style_quantize.py --mode dynamic FP32.onnx OUT.onnx [--weight-type qint8|quint8]

`--mode dynamic` writes what `onnxruntime.quantization.quantize_dynamic(model, out)` writes with its
defaults (per_channel=False, reduce_range=False, weight_type QInt8, its IntegerOps registry), no data:
every MatMul and Conv reads DynamicQuantizeLinear codes (u8) of its float activation inputs and
per-tensor weights (QInt8: symmetric s8, scale = max|w| / 127; QUInt8: asymmetric u8), as
MatMulInteger / ConvInteger -> Cast -> Mul(x_scale * w_scale) [-> Add(bias) for Conv]; a MatMul of two
activations (attention) quantizes both dynamically. An LSTM with constant weights (layout 0) becomes
com.microsoft DynamicQuantizeLSTM: W and R quantized per direction, transposed to [dirs, in, 4*hidden].
Gemm stays float (not in the registry). ONNX
Runtime 1.20.1 has no ConvInteger for s8 weights: for convolutional models use --weight-type quint8,
as ORT's documentation advises.

CALIB: `fashion-mnist:train` (Debian's IDX files, pixels/255, [N,1,28,28]) or `npy:DIR` (DIR holds one
batched float array [N, ...], e.g. bench/export_torchvision.py's calibRES/x.npy). The first
batch-size * batches samples are used, as `slimquant quantize` does (defaults 10 batches of 32).
"""
import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
FASHION_MNIST_DIR = os.environ.get("SLIMQUANT_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")

# ORT's default op types: the keys of its QLinearOpsRegistry and QDQRegistry together.
OUTPUT_SHARES_INPUT = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice", "AveragePool", "TopK",
                       "MaxPool", "Resize", "Pad"}
REMOVABLE_ACTIVATIONS = {"Relu", "Clip"}
NORMALIZATIONS = {"BatchNormalization", "InstanceNormalization", "LayerNormalization"}
ALL_INPUTS_AND_OUTPUTS = {"Add", "Mul", "Concat", "GlobalAveragePool", "Sigmoid", "LeakyRelu", "Softmax",
                          "ArgMax", "CumSum"}
QUANTIZED_OP_TYPES = (OUTPUT_SHARES_INPUT | REMOVABLE_ACTIVATIONS | NORMALIZATIONS | ALL_INPUTS_AND_OUTPUTS |
                      {"Conv", "ConvTranspose", "Gemm", "MatMul", "Split", "Gather", "GatherElements"})
FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16)


def fail(message):
    print(f"ort_style_quantize: error: {message}", file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------------------------------------
# Calibration data


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_calibration(spec, count):
    """The first `count` samples of CALIB as float32 [N, ...]."""
    if spec in ("fashion-mnist", "fashion-mnist:train"):
        path = os.path.join(FASHION_MNIST_DIR, "train-images-idx3-ubyte")
        if not os.path.exists(path):
            path += ".gz"
        if not os.path.exists(path):
            fail(f"Fashion-MNIST training images not found in {FASHION_MNIST_DIR}")
        images = read_idx(path)[:count]
        return (images.astype(np.float32) / 255.0)[:, None, :, :]
    if spec.startswith("npy:"):
        directory = spec[4:]
        if not os.path.isdir(directory):
            fail(f"{spec}: {directory} is not a directory")
        files = sorted(f for f in os.listdir(directory) if f.endswith(".npy") and f != "labels.npy")
        if not files:
            fail(f"{spec}: no .npy file in {directory}")
        arrays = [np.load(os.path.join(directory, f)) for f in files]
        # One batched array, or one file per sample (the forms `slimquant quantize` reads).
        data = arrays[0] if len(arrays) == 1 else np.stack(arrays)
        if data.dtype == np.uint8:
            data = data.astype(np.float32) / 255.0
        return np.ascontiguousarray(data[:count], dtype=np.float32)
    fail(f"calibration data '{spec}': expected fashion-mnist:train or npy:DIR")


# ---------------------------------------------------------------------------------------------
# Pre-processing (what ORT's quantizer pre-processing gets from its basic graph optimizations)


def initializer_map(graph):
    return {t.name: t for t in graph.initializer}


def fold_constants_and_identities(graph):
    """Constant nodes and Identity nodes of an initializer become initializers."""
    inits = initializer_map(graph)
    kept = []
    renames = {}
    for node in graph.node:
        if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value":
            tensor = onnx.TensorProto()
            tensor.CopyFrom(node.attribute[0].t)
            tensor.name = node.output[0]
            graph.initializer.append(tensor)
            inits[tensor.name] = tensor
            continue
        if node.op_type == "Identity" and node.input[0] in inits:
            renames[node.output[0]] = node.input[0]
            continue
        kept.append(node)
    graph_outputs = {o.name for o in graph.output}
    for node in kept:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
    for out, src in renames.items():
        if out in graph_outputs:  # keep the graph output's name: materialize it as its own initializer
            tensor = onnx.TensorProto()
            tensor.CopyFrom(inits[src])
            tensor.name = out
            graph.initializer.append(tensor)
    del graph.node[:]
    graph.node.extend(kept)


def fold_batch_norms(graph):
    """Conv -> BatchNormalization (Conv output read only by the BN) becomes one Conv."""
    inits = initializer_map(graph)
    consumers = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    producer = {o: n for n in graph.node for o in n.output}
    graph_outputs = {o.name for o in graph.output}
    removed = set()
    for bn in graph.node:
        if bn.op_type != "BatchNormalization" or len(bn.output) != 1:
            continue
        conv = producer.get(bn.input[0])
        if conv is None or conv.op_type != "Conv" or len(consumers.get(conv.output[0], [])) != 1:
            continue
        if conv.output[0] in graph_outputs or conv.input[1] not in inits:
            continue
        if any(name not in inits for name in bn.input[1:5]):
            continue
        if len(conv.input) > 2 and conv.input[2] and conv.input[2] not in inits:
            continue
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        gamma, beta, mean, var = (numpy_helper.to_array(inits[n]).astype(np.float64) for n in bn.input[1:5])
        weight = numpy_helper.to_array(inits[conv.input[1]]).astype(np.float64)
        bias = (numpy_helper.to_array(inits[conv.input[2]]).astype(np.float64)
                if len(conv.input) > 2 and conv.input[2] else np.zeros(weight.shape[0]))
        factor = gamma / np.sqrt(var + eps)
        new_weight = (weight * factor.reshape(-1, *([1] * (weight.ndim - 1)))).astype(np.float32)
        new_bias = ((bias - mean) * factor + beta).astype(np.float32)
        # New initializer names: the originals may be shared with other nodes.
        weight_name, bias_name = conv.name + "_bn_folded_weight", conv.name + "_bn_folded_bias"
        if not conv.name:
            weight_name, bias_name = bn.output[0] + "_weight", bn.output[0] + "_bias"
        graph.initializer.extend([numpy_helper.from_array(new_weight, weight_name),
                                  numpy_helper.from_array(new_bias, bias_name)])
        while len(conv.input) < 3:
            conv.input.append("")
        conv.input[1], conv.input[2] = weight_name, bias_name
        conv.output[0] = bn.output[0]
        removed.add(id(bn))
    kept = [n for n in graph.node if id(n) not in removed]
    del graph.node[:]
    graph.node.extend(kept)


def remove_unused_initializers(graph):
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    graph_inputs = [i for i in graph.input if i.name in used or i.name not in initializer_map(graph)]
    del graph.input[:]
    graph.input.extend(graph_inputs)


def default_opset(model):
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            return opset.version
    fail("the model imports no ai.onnx opset")


def preprocess(model):
    if default_opset(model) < 13:
        from onnx import version_converter
        try:
            model = version_converter.convert_version(model, 13)
        except RuntimeError as e:
            # e.g. PP-OCRv4 rec (opset 9): Softmax 12->13 needs its input's rank, which shape
            # inference cannot reach through the exporter's Shape/Reshape chains.
            fail(f"ONNX's version converter cannot take this opset {default_opset(model)} model to opset 13 "
                 f"(per-channel QDQ needs it): {str(e).splitlines()[-1]}")
    fold_constants_and_identities(model.graph)
    fold_batch_norms(model.graph)
    remove_unused_initializers(model.graph)
    del model.graph.value_info[:]
    return onnx.shape_inference.infer_shapes(model)


# ---------------------------------------------------------------------------------------------
# Calibration


def tensor_types(model):
    types = {}
    for vi in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        if vi.type.HasField("tensor_type"):
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


def tensors_to_calibrate(model):
    """Float non-initializer inputs and outputs of the nodes ORT would quantize, in graph order."""
    types = tensor_types(model)
    inits = initializer_map(model.graph)
    names = []
    for node in model.graph.node:
        if node.op_type not in QUANTIZED_OP_TYPES:
            continue
        for name in list(node.input) + list(node.output):
            if name and name not in inits and types.get(name) in FLOAT_TYPES and name not in names:
                names.append(name)
    return names


def collect_ranges(model, names, data, batch_size, ort, workdir):
    """min/max of every tensor in `names` over `data`, from the FP32 model run in ONNX Runtime."""
    augmented = onnx.ModelProto()
    augmented.CopyFrom(model)
    existing = {o.name for o in augmented.graph.output}
    types = tensor_types(model)
    for name in names:
        if name not in existing:
            augmented.graph.output.append(helper.make_tensor_value_info(name, types[name], None))
    model_path = os.path.join(workdir, "augmented.onnx")
    onnx.save(augmented, model_path)
    data_path = os.path.join(workdir, "calibration.f32")
    data.astype("<f4").tofile(data_path)
    ranges_path = os.path.join(workdir, "ranges.json")
    script = os.path.join(HERE, "ort_collect_ranges.js")
    env = dict(os.environ)
    env["NODE_PATH"] = os.path.join(HERE, "node_modules") + (":" + env["NODE_PATH"] if env.get("NODE_PATH") else "")
    subprocess.run(["node", script, model_path, data_path, "x".join(map(str, data.shape)), str(batch_size),
                    ranges_path, "--ort", ort], check=True, env=env)
    with open(ranges_path) as f:
        ranges = json.load(f)
    missing = [n for n in names if n not in ranges["ranges"]]
    if missing:
        fail(f"ONNX Runtime returned no values for {missing[:5]}")
    return {n: (np.float32(r[0]), np.float32(r[1])) for n, r in ranges["ranges"].items()}, ranges["ort_version"]


def consumer_count(graph, name):
    return sum(1 for node in graph.node for i in node.input if i == name)


def adjust_ranges(graph, ranges):
    """ORT's adjustments before computing scales."""
    for node in graph.node:
        if node.op_type in REMOVABLE_ACTIVATIONS:
            if consumer_count(graph, node.input[0]) == 1 and node.input[0] in ranges and node.output[0] in ranges:
                ranges[node.input[0]] = ranges[node.output[0]]
        elif node.op_type == "Softmax":
            ranges[node.output[0]] = (np.float32(0.0), np.float32(1.0))


# ---------------------------------------------------------------------------------------------
# Quantization arithmetic (ORT's formulas)


def uint8_asymmetric_params(rmin, rmax):
    rmin = np.minimum(np.float32(rmin), np.float32(0))
    rmax = np.maximum(np.float32(rmax), np.float32(0))
    scale = np.float32(np.float64(rmax - rmin) / 255.0)
    if scale < np.finfo(np.float32).tiny:
        return np.float32(1.0), np.uint8(0)
    return scale, np.uint8(np.round(np.float32(0) - rmin / scale))


def int8_symmetric_scale(absmax):
    scale = np.float32(np.float64(np.float32(2) * np.float32(absmax)) / 254.0)
    return scale if scale >= np.finfo(np.float32).tiny else np.float32(1.0)


def quantize_array(values, scale, zero_point, qmin, qmax, dtype):
    q = np.round(values.astype(np.float32) / scale) + np.float32(zero_point)
    return np.clip(q, qmin, qmax).astype(dtype)


# ---------------------------------------------------------------------------------------------
# ORT's QDQ placement


class OrtStyleQuantizer:
    def __init__(self, model, ranges):
        self.model = model
        self.graph = model.graph
        self.ranges = ranges
        self.types = tensor_types(model)
        self.inits = initializer_map(self.graph)
        self.opset = default_opset(model)
        self.to_quantize = {}  # tensor -> {"kind": "activation"|"weight", "axis": int|None, "shared_with": str|None}
        self.biases = {}  # bias -> (input, weight, beta)
        self.removed = []
        self.quantized = {}  # tensor -> (scale name, zero point name) once its Q/DQ exists
        self.new_nodes = []

    # -- marking, as ORT's op quantizers do --
    def quantizable(self, name):
        if not name:
            return False
        if name in self.inits:
            return self.inits[name].data_type in FLOAT_TYPES
        return self.types.get(name) in FLOAT_TYPES

    def mark(self, name, kind="activation", axis=None, shared_with=None):
        if not self.quantizable(name):
            return
        if shared_with is not None or name not in self.to_quantize:
            self.to_quantize[name] = {"kind": kind, "axis": axis, "shared_with": shared_with}

    def mark_weight(self, name, axis):
        if name in self.inits:
            rank = len(self.inits[name].dims)
            per_channel = axis is not None and -rank <= axis < rank
            self.mark(name, "weight", (axis % rank) if per_channel else None)
        else:
            self.mark(name)

    def is_marked(self, name):
        return name in self.to_quantize or name in self.biases

    def consumers(self, name):
        return [n for n in self.graph.node if name in n.input]

    def try_replacing_upstream_output(self, upstream, output):
        graph_io = {i.name for i in self.graph.input} | {o.name for o in self.graph.output}
        if output in self.ranges and len(self.consumers(upstream)) == 1 and upstream not in graph_io:
            for node in self.graph.node:
                for i, name in enumerate(node.output):
                    if name == upstream:
                        node.output[i] = output
            self.to_quantize.pop(upstream, None)
            return True
        return False

    def quantize_node(self, node):
        op = node.op_type
        if op in ("Conv", "ConvTranspose"):
            self.mark(node.input[0])
            self.mark(node.output[0])
            self.mark_weight(node.input[1], 0 if op == "Conv" else 1)
            if len(node.input) > 2 and node.input[2]:
                self.mark_bias(node.input[2], node.input[0], node.input[1], 1.0)
        elif op == "Gemm":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            self.mark(node.input[0])
            self.mark(node.output[0])
            self.mark_weight(node.input[1], 0 if attrs.get("transB", 0) else 1)
            if len(node.input) > 2 and node.input[2] in self.inits:
                self.mark_bias(node.input[2], node.input[0], node.input[1], attrs.get("beta", 1.0))
                # ORT folds beta into the bias' scale and resets it.
                for a in node.attribute:
                    if a.name == "beta":
                        a.f = 1.0
        elif op == "MatMul":
            for name in list(node.input) + list(node.output):
                if name in self.inits:
                    self.mark_weight(name, 1)
                else:
                    self.mark(name)
        elif op in REMOVABLE_ACTIVATIONS:
            if not self.is_marked(node.input[0]):
                return
            if self.try_replacing_upstream_output(node.input[0], node.output[0]):
                self.removed.append(node)
            else:
                self.mark(node.input[0])
            self.mark(node.output[0])
        elif op in OUTPUT_SHARES_INPUT:
            if op == "MaxPool" and self.opset < 12 or op == "Resize" and self.opset < 11:
                return
            if op == "Pad" and not self.pad_value_is_zero(node):
                return
            if self.is_marked(node.input[0]):
                self.mark(node.output[0], shared_with=node.input[0])
        elif op == "Split":
            self.mark(node.input[0])
            for out in node.output:
                self.mark(out, shared_with=node.input[0])
        elif op in ("Gather", "GatherElements"):
            data = node.input[0]
            if data in self.inits and self.inits[data].data_type in FLOAT_TYPES:
                self.mark(data)
                self.mark(node.output[0], shared_with=data)
        elif op in NORMALIZATIONS:
            self.mark(node.input[0])
            self.mark_weight(node.input[1], None) if node.input[1] in self.inits else self.mark(node.input[1])
            if len(node.input) > 2 and node.input[2]:
                self.mark_bias(node.input[2], node.input[0], node.input[1], 1.0)
            self.mark(node.output[0])
        else:  # ALL_INPUTS_AND_OUTPUTS
            for name in list(node.input) + list(node.output):
                self.mark(name)

    def pad_value_is_zero(self, node):
        mode = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "mode"), b"constant")
        if mode != b"constant" or len(node.input) < 3 or not node.input[2]:
            return True
        value = node.input[2]
        return value in self.inits and not np.any(numpy_helper.to_array(self.inits[value]))

    def mark_bias(self, bias, input_name, weight, beta):
        if bias in self.inits and self.inits[bias].data_type in FLOAT_TYPES and bias not in self.biases:
            self.biases[bias] = (input_name, weight, beta)

    # -- materialization --
    def add_initializer(self, array, name):
        tensor = numpy_helper.from_array(array, name)
        self.graph.initializer.append(tensor)
        self.inits[name] = tensor
        return name

    def replace_input_everywhere(self, old, new, nodes=None):
        for node in (self.graph.node if nodes is None else nodes):
            for i, name in enumerate(node.input):
                if name == old:
                    node.input[i] = new

    def add_activation_qdq(self, name, scale_name, zp_name):
        graph_outputs = {o.name for o in self.graph.output}
        q_input, dq_output = name, name + "_DequantizeLinear_Output"
        if name in graph_outputs:
            q_input, dq_output = name + "_QuantizeLinear_Input", name
            for node in list(self.graph.node) + self.new_nodes:
                for i, out in enumerate(node.output):
                    if out == name:
                        node.output[i] = q_input
        else:
            self.replace_input_everywhere(name, dq_output, list(self.graph.node) + self.new_nodes)
        self.new_nodes.append(helper.make_node("QuantizeLinear", [q_input, scale_name, zp_name],
                                               [name + "_QuantizeLinear_Output"], name + "_QuantizeLinear"))
        self.new_nodes.append(helper.make_node("DequantizeLinear", [name + "_QuantizeLinear_Output", scale_name, zp_name],
                                               [dq_output], name + "_DequantizeLinear"))
        self.quantized[name] = (scale_name, zp_name)

    def add_initializer_dq(self, name, kind, axis):
        values = numpy_helper.to_array(self.inits[name]).astype(np.float32)
        if kind == "weight" and axis is not None:
            moved = np.moveaxis(values, axis, 0).reshape(values.shape[axis], -1)
            absmax = np.max(np.abs(moved), axis=1) if moved.shape[1] else np.zeros(moved.shape[0], np.float32)
            scale = np.array([int8_symmetric_scale(a) for a in absmax], dtype=np.float32)
            shape = [1] * values.ndim
            shape[axis] = -1
            q = quantize_array(values, scale.reshape(shape), 0, -127, 127, np.int8)
            zero_point = np.zeros(scale.shape, dtype=np.int8)
        elif kind == "weight":
            scale = np.array(int8_symmetric_scale(np.max(np.abs(values)) if values.size else 0), dtype=np.float32)
            q = quantize_array(values, scale, 0, -127, 127, np.int8)
            zero_point = np.array(0, dtype=np.int8)
        else:  # a float initializer read as an activation: uint8 asymmetric from its own min/max
            s, zp = uint8_asymmetric_params(values.min() if values.size else 0, values.max() if values.size else 0)
            scale, zero_point = np.array(s, dtype=np.float32), np.array(zp, dtype=np.uint8)
            q = quantize_array(values, scale, zero_point, 0, 255, np.uint8)
        q_name = self.add_initializer(q, name + "_quantized")
        scale_name = self.add_initializer(scale, name + "_scale")
        zp_name = self.add_initializer(zero_point, name + "_zero_point")
        dq_output = name + "_DequantizeLinear_Output"
        self.replace_input_everywhere(name, dq_output, list(self.graph.node) + self.new_nodes)
        attrs = {"axis": axis} if axis is not None else {}
        self.new_nodes.append(helper.make_node("DequantizeLinear", [q_name, scale_name, zp_name], [dq_output],
                                               name + "_DequantizeLinear", **attrs))
        self.quantized[name] = (scale_name, zp_name)

    def materialize(self):
        # Tensors with their own parameters first, then those sharing their input's, then biases.
        for name, info in list(self.to_quantize.items()):
            if info["shared_with"] is not None:
                continue
            if name in self.inits:
                self.add_initializer_dq(name, info["kind"], info["axis"])
            else:
                if name not in self.ranges:
                    fail(f"no calibration range for tensor '{name}'")
                scale, zp = uint8_asymmetric_params(*self.ranges[name])
                self.add_activation_qdq(name, self.add_initializer(np.array(scale, dtype=np.float32), name + "_scale"),
                                        self.add_initializer(np.array(zp, dtype=np.uint8), name + "_zero_point"))
        pending = {n: i["shared_with"] for n, i in self.to_quantize.items() if i["shared_with"] is not None}
        while pending:
            ready = [n for n, src in pending.items() if src in self.quantized]
            if not ready:
                fail(f"tensors {sorted(pending)[:5]} share parameters with tensors that are not quantized")
            for name in ready:
                self.add_activation_qdq(name, *self.quantized[pending.pop(name)])
        for bias, (input_name, weight, beta) in self.biases.items():
            if input_name not in self.quantized or weight not in self.quantized:
                continue  # ORT needs both scales; its quantizer stops here, we leave the bias float
            if bias + "_quantized" in self.inits:
                continue  # also read as a plain constant (vit_b_16's conv_proj.bias) and quantized as one already
            input_scale = numpy_helper.to_array(self.inits[self.quantized[input_name][0]]).astype(np.float32)
            weight_scale = numpy_helper.to_array(self.inits[self.quantized[weight][0]]).astype(np.float32)
            bias_scale = (input_scale * weight_scale * np.float32(beta)).astype(np.float32)
            values = numpy_helper.to_array(self.inits[bias])
            q = np.round(values.astype(np.float64) / bias_scale.astype(np.float64))
            info = np.iinfo(np.int32)
            q = np.clip(q, info.min, info.max).astype(np.int32).reshape(values.shape)
            per_channel = bias_scale.size > 1
            q_name = self.add_initializer(q, bias + "_quantized")
            scale_name = self.add_initializer(bias_scale.reshape(-1) if per_channel else bias_scale.reshape(()),
                                              bias + "_quantized_scale")
            zp_name = self.add_initializer(np.zeros(bias_scale.size, np.int32) if per_channel else np.array(0, np.int32),
                                           bias + "_quantized_zero_point")
            dq_output = bias + "_DequantizeLinear_Output"
            self.replace_input_everywhere(bias, dq_output, list(self.graph.node) + self.new_nodes)
            attrs = {"axis": 0} if per_channel else {}
            self.new_nodes.append(helper.make_node("DequantizeLinear", [q_name, scale_name, zp_name], [dq_output],
                                                   bias + "_DequantizeLinear", **attrs))

    def run(self):
        for node in list(self.graph.node):
            if node.op_type in QUANTIZED_OP_TYPES:
                self.quantize_node(node)
        self.materialize()
        removed = {id(n) for n in self.removed}
        nodes = [n for n in self.graph.node if id(n) not in removed] + self.new_nodes
        del self.graph.node[:]
        self.graph.node.extend(topological_order(nodes, self.graph))
        remove_unused_initializers(self.graph)
        del self.graph.value_info[:]
        return self.model


def topological_order(nodes, graph):
    available = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    ordered, pending = [], list(nodes)
    while pending:
        progress = []
        for node in pending:
            if all(name in available for name in node.input):
                ordered.append(node)
                available.update(node.output)
                progress.append(node)
        if not progress:
            fail(f"the quantized graph has a cycle or a dangling input near node '{pending[0].name}' "
                 f"({pending[0].op_type}, inputs {list(pending[0].input)})")
        ids = {id(n) for n in progress}
        pending = [n for n in pending if id(n) not in ids]
    return ordered


def name_unnamed_nodes(graph):
    """Every node named (ORT requires unique names for its own; onnx exporters leave some empty)."""
    used = {n.name for n in graph.node if n.name}
    for i, node in enumerate(graph.node):
        if not node.name:
            candidate = f"{node.op_type}_{i}"
            while candidate in used:
                candidate += "_"
            node.name = candidate
            used.add(candidate)


# ---------------------------------------------------------------------------------------------
# ORT's quantize_dynamic


def quantize_dynamic(model, weight_type):
    graph = model.graph
    inits = initializer_map(graph)
    new_nodes, new_inits = [], []
    dynamic = {}  # float tensor -> (codes, scale, zero point)

    def dynamic_input(name):
        if name not in dynamic:
            dynamic[name] = (name + "_quantized", name + "_scale", name + "_zero_point")
            new_nodes.append(helper.make_node("DynamicQuantizeLinear", [name], list(dynamic[name]),
                                              name=name + "_QuantizeLinear"))
        return dynamic[name]

    quantized_weights = {}  # an initializer two nodes share (an exporter's deduplication) is quantized once

    def weight(name):
        if name in quantized_weights:
            return quantized_weights[name]
        w = numpy_helper.to_array(inits[name]).astype(np.float32)
        if weight_type == "qint8":
            scale = int8_symmetric_scale(np.abs(w).max())
            zp = np.int8(0)
            q = quantize_array(w, scale, 0, -127, 127, np.int8)
        else:
            scale, zp = uint8_asymmetric_params(w.min(), w.max())
            q = quantize_array(w, scale, zp, 0, 255, np.uint8)
        new_inits.extend([numpy_helper.from_array(q, name + "_quantized"),
                          numpy_helper.from_array(np.array(scale, np.float32), name + "_scale"),
                          numpy_helper.from_array(np.array(zp, q.dtype), name + "_zero_point")])
        quantized_weights[name] = (name + "_quantized", name + "_scale", name + "_zero_point")
        return quantized_weights[name]

    def lstm_weight(name):
        """W [dirs, 4h, k] -> codes transposed to [dirs, k, 4h] and a scale / zero point per direction
        (quantize_dynamic's default per_channel=False quantizes per direction, axis 0)."""
        w = numpy_helper.to_array(inits[name]).astype(np.float32)
        codes, scales, zps = [], [], []
        for d in range(w.shape[0]):
            if weight_type == "qint8":
                scale, zp = int8_symmetric_scale(np.abs(w[d]).max()), np.int8(0)
                codes.append(quantize_array(w[d], scale, 0, -127, 127, np.int8))
            else:
                scale, zp = uint8_asymmetric_params(w[d].min(), w[d].max())
                codes.append(quantize_array(w[d], scale, zp, 0, 255, np.uint8))
            scales.append(scale)
            zps.append(zp)
        q = np.transpose(np.stack(codes), (0, 2, 1))
        names = (name + "_quantized", name + "_scale", name + "_zero_point")
        new_inits.extend([numpy_helper.from_array(np.ascontiguousarray(q), names[0]),
                          numpy_helper.from_array(np.array(scales, np.float32), names[1]),
                          numpy_helper.from_array(np.array(zps, q.dtype), names[2])])
        return names

    reshaped_biases = set()
    types = tensor_types(model)
    uses_ms_domain = False
    for node in graph.node:
        is_float = lambda n: n in inits or types.get(n) in FLOAT_TYPES
        # LSTM with constant W and R -> com.microsoft DynamicQuantizeLSTM (ORT's LSTMQuant); its
        # schema has no `layout`, so batch-first LSTMs stay float.
        layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
        if node.op_type == "LSTM" and len(node.input) > 2 and node.input[1] in inits and node.input[2] in inits \
                and len(inits[node.input[1]].dims) == 3 and len(inits[node.input[2]].dims) == 3 and layout == 0:
            w, r = lstm_weight(node.input[1]), lstm_weight(node.input[2])
            optional = [node.input[i] if len(node.input) > i else "" for i in range(3, 8)]
            lstm = helper.make_node("DynamicQuantizeLSTM", [node.input[0], w[0], r[0]] + optional + [w[1], w[2], r[1], r[2]],
                                    list(node.output), name=(node.name + "_quant") if node.name else "",
                                    domain="com.microsoft")
            lstm.attribute.extend(node.attribute)
            new_nodes.append(lstm)
            uses_ms_domain = True
            continue
        if node.op_type not in ("MatMul", "Conv") or not all(is_float(i) for i in node.input[:2]) or \
                node.input[0] in inits:
            new_nodes.append(node)
            continue
        a = dynamic_input(node.input[0])
        b = weight(node.input[1]) if node.input[1] in inits else dynamic_input(node.input[1])
        out = node.output[0]
        op = "MatMulInteger" if node.op_type == "MatMul" else "ConvInteger"
        q = helper.make_node(op, [a[0], b[0], a[2], b[2]], [out + "_output_quantized"], name=node.name + "_quant")
        if op == "ConvInteger":
            q.attribute.extend(node.attribute)
        new_nodes.append(q)
        new_nodes.append(helper.make_node("Cast", [out + "_output_quantized"], [out + "_output_quantized_cast_output"],
                                          to=TensorProto.FLOAT, name=out + "_output_quantized_cast"))
        new_nodes.append(helper.make_node("Mul", [a[1], b[1]], [out + "_scales_mul"], name=node.name + "_scales_mul"))
        bias = node.input[2] if op == "ConvInteger" and len(node.input) > 2 and node.input[2] else None
        scaled = out + "_output_scale_mul_output" if bias else out
        new_nodes.append(helper.make_node("Mul", [out + "_output_quantized_cast_output", out + "_scales_mul"], [scaled],
                                          name=node.name + "_output_scale_mul"))
        if bias:
            if bias + "_reshaped" not in reshaped_biases:
                reshaped_biases.add(bias + "_reshaped")
                b_values = numpy_helper.to_array(inits[bias]).astype(np.float32)
                new_inits.append(numpy_helper.from_array(b_values.reshape(1, -1, 1, 1), bias + "_reshaped"))
            new_nodes.append(helper.make_node("Add", [scaled, bias + "_reshaped"], [out], name=node.name + "_bias_add"))
    del graph.node[:]
    graph.node.extend(new_nodes)
    graph.initializer.extend(new_inits)
    remove_unused_initializers(graph)
    if uses_ms_domain and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="FP32 ONNX model")
    parser.add_argument("calib", help="fashion-mnist:train or npy:DIR (static mode; dynamic: the output)")
    parser.add_argument("output", nargs="?", help="QDQ model to write")
    parser.add_argument("--mode", choices=["static", "dynamic"], default="static",
                        help="static: quantize_static QDQ (default); dynamic: quantize_dynamic, no data")
    parser.add_argument("--weight-type", choices=["qint8", "quint8"], default="qint8",
                        help="dynamic mode's weight type (quantize_dynamic's weight_type, default QInt8)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--ort", choices=["latest", "pinned"], default="latest",
                        help="onnxruntime-node used to compute the FP32 activations (default latest)")
    args = parser.parse_args()
    if not os.path.isfile(args.model):
        fail(f"{args.model}: no such file")
    if args.mode == "dynamic":
        output = args.output or args.calib
        model = preprocess(onnx.load(args.model))
        name_unnamed_nodes(model.graph)
        quantized = quantize_dynamic(model, args.weight_type)
        del quantized.graph.value_info[:]
        quantized.producer_name = "slimquant bench/ort_style_quantize.py (ORT quantize_dynamic emulation)"
        onnx.checker.check_model(quantized)
        onnx.save(quantized, output)
        counts = {}
        for node in quantized.graph.node:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
        print(json.dumps({"output": output, "mode": "dynamic", "weight_type": args.weight_type, "nodes": counts}))
        return
    if args.output is None:
        fail("static mode needs CALIB and OUTPUT")

    model = preprocess(onnx.load(args.model))
    name_unnamed_nodes(model.graph)
    float_inputs = [i for i in model.graph.input if i.name not in initializer_map(model.graph)]
    if len(float_inputs) != 1:
        fail(f"{args.model}: needs exactly one graph input, has {[i.name for i in float_inputs]}")
    data = load_calibration(args.calib, args.batch_size * args.batches)
    names = tensors_to_calibrate(model)
    with tempfile.TemporaryDirectory(prefix="ort_style_quantize_") as workdir:
        ranges, ort_version = collect_ranges(model, names, data, args.batch_size, args.ort, workdir)
    adjust_ranges(model.graph, ranges)
    quantized = OrtStyleQuantizer(model, ranges).run()
    quantized.producer_name = "slimquant bench/ort_style_quantize.py (ORT quantize_static QDQ emulation)"
    onnx.checker.check_model(quantized)
    onnx.save(quantized, args.output)
    counts = {}
    for node in quantized.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    print(json.dumps({"output": args.output, "calibration_samples": int(data.shape[0]),
                      "calibrated_tensors": len(names), "ranges_from_onnxruntime": ort_version,
                      "nodes": counts}))


if __name__ == "__main__":
    main()
