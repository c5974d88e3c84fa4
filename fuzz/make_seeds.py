#!/usr/bin/python3
"""Writes the committed seed corpus of the fuzz targets, fuzz/corpus/<target>/ (a few KB each).

Small hand-made inputs that reach deep: tiny models with the ops and attributes the fixtures use
(far smaller than the fixture files, so the fuzzer mutates structure, not weight bytes), .npy/.npz
of every dtype and header version, the YAML configs of the docs and tests, and image lists. Run
with /usr/bin/python3 (Debian's onnx and numpy); deterministic, so rerunning changes nothing.
"""
import io
import os
import struct
import sys
import zipfile
import zlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")
SEPARATOR = b"\n--SQFUZZ-PART--\n"  # fuzz_util.h kPartSeparator


def write(target, name, data):
    folder = os.path.join(CORPUS, target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def weights(shape, seed):
    return (np.random.default_rng(seed).standard_normal(shape) * 0.1).astype(np.float32)


def model_bytes(nodes, inputs, outputs, initializers, opset=13):
    graph = helper.make_graph(nodes, "seed", inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="slimquant-fuzz-seed")
    model.ir_version = 8
    onnx.checker.check_model(model) if all(o.type.tensor_type.HasField("shape") for o in outputs) else None
    return model.SerializeToString()


def f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def onnx_seeds():
    init = numpy_helper.from_array
    # Conv -> BatchNorm -> Relu -> MaxPool -> GlobalAveragePool -> Flatten -> Gemm
    cnn = model_bytes(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
         helper.make_node("BatchNormalization", ["c", "s", "o", "m", "v"], ["bn"], epsilon=1e-5),
         helper.make_node("Relu", ["bn"], ["r"]),
         helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
         helper.make_node("GlobalAveragePool", ["p"], ["g"]),
         helper.make_node("Flatten", ["g"], ["f"], axis=1),
         helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1)],
        [f32("x", ["N", 2, 8, 8])], [f32("y", ["N", 3])],
        [init(weights([4, 2, 3, 3], 1), "w"), init(weights([4], 2), "b"), init(np.ones(4, np.float32), "s"),
         init(np.zeros(4, np.float32), "o"), init(np.zeros(4, np.float32), "m"), init(np.ones(4, np.float32), "v"),
         init(weights([3, 4], 3), "fw"), init(weights([3], 4), "fb")])
    write("onnx_loader", "cnn.onnx", cnn)

    # Attention-like block: Shape/Gather/Concat/Reshape chains, MatMul, Softmax, Transpose, LayerNorm.
    attention = model_bytes(
        [helper.make_node("Shape", ["x"], ["sh"]),
         helper.make_node("Gather", ["sh", "zero"], ["n"], axis=0),
         helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
         helper.make_node("Concat", ["n1", "tail"], ["newshape"], axis=0),
         helper.make_node("MatMul", ["x", "wq"], ["q"]),
         helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1]),
         helper.make_node("MatMul", ["q", "qt"], ["scores"]),
         helper.make_node("Softmax", ["scores"], ["attn"], axis=-1),
         helper.make_node("MatMul", ["attn", "q"], ["ctx"]),
         helper.make_node("Add", ["ctx", "x"], ["res"]),
         helper.make_node("LayerNormalization", ["res", "ln_s", "ln_b"], ["ln"], axis=-1, epsilon=1e-5),
         helper.make_node("ReduceMean", ["ln"], ["pooled"], axes=[1], keepdims=0),
         helper.make_node("Reshape", ["ln", "newshape"], ["y"])],
        [f32("x", ["N", 4, 6])], [f32("y", None), f32("pooled", None)],
        [init(weights([6, 6], 5), "wq"), init(np.array([0], np.int64), "zero"),
         init(np.array([0], np.int64), "axes0"), init(np.array([24], np.int64), "tail"),
         init(np.ones(6, np.float32), "ln_s"), init(np.zeros(6, np.float32), "ln_b")], opset=17)
    write("onnx_loader", "attention.onnx", attention)

    # Shape-manipulating ops with constant inputs: Slice, Pad, Expand, Tile, Where, Cast, Resize.
    shapes = model_bytes(
        [helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["sl"]),
         helper.make_node("Pad", ["sl", "pads"], ["pd"], mode="constant"),
         helper.make_node("Expand", ["one", "eshape"], ["ex"]),
         helper.make_node("Mul", ["pd", "ex"], ["m"]),
         helper.make_node("Tile", ["m", "reps"], ["t"]),
         helper.make_node("Greater", ["t", "zerof"], ["gt"]),
         helper.make_node("Where", ["gt", "t", "zerof"], ["wh"]),
         helper.make_node("Cast", ["wh"], ["ci"], to=TensorProto.INT32),
         helper.make_node("Cast", ["ci"], ["cf"], to=TensorProto.FLOAT),
         helper.make_node("Resize", ["cf", "", "scales"], ["y"], mode="nearest"),
         helper.make_node("ReduceSum", ["y", "raxes"], ["s"], keepdims=1)],
        [f32("x", [1, 2, 6, 6])], [f32("y", None), f32("s", None)],
        [init(np.array([1, 1], np.int64), "starts"), init(np.array([5, 5], np.int64), "ends"),
         init(np.array([2, 3], np.int64), "axes"), init(np.array([1, 2], np.int64), "steps"),
         init(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"), init(np.ones(1, np.float32), "one"),
         init(np.array([1, 2, 1, 1], np.int64), "eshape"), init(np.array([1, 1, 2, 1], np.int64), "reps"),
         init(np.zeros(1, np.float32), "zerof"), init(np.array([1, 1, 2, 2], np.float32), "scales"),
         init(np.array([1], np.int64), "raxes")])
    write("onnx_loader", "shapes.onnx", shapes)

    # If with two branches reading an outer value; Constant nodes.
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["tr"])], "then", [], [f32("tr", None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["er"])], "else", [], [f32("er", None)])
    branches = model_bytes(
        [helper.make_node("Constant", [], ["cond"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True])),
         helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)],
        [f32("x", [2, 3])], [f32("y", None)], [])
    write("onnx_loader", "if.onnx", branches)

    # Loop with a carried value, a sequence built in the body and a scan output, reading an outer
    # value; ConcatFromSequence after it.
    i64, b = TensorProto.INT64, TensorProto.BOOL
    seq_f32 = helper.make_tensor_sequence_value_info
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "x"], ["acc_out"]),
         helper.make_node("SequenceInsert", ["seq_in", "acc_out"], ["seq_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Relu", ["acc_out"], ["scan_out"])],
        "body", [helper.make_tensor_value_info("i", i64, []), helper.make_tensor_value_info("cond_in", b, []),
                 f32("acc_in", None), seq_f32("seq_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", b, []), f32("acc_out", None),
         seq_f32("seq_out", TensorProto.FLOAT, None), f32("scan_out", None)])
    loop = model_bytes(
        [helper.make_node("SequenceEmpty", [], ["seq0"]),
         helper.make_node("Loop", ["trips", "cond", "x", "seq0"], ["acc", "seq", "scans"], body=body),
         helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0)],
        [f32("x", [2, 3])], [f32("y", None), f32("scans", None)],
        [init(np.array(3, np.int64), "trips"), init(np.array(True), "cond")], opset=16)
    write("onnx_loader", "loop.onnx", loop)

    # QDQ: quantized activations and per-channel int8 weights into a Conv.
    qdq = model_bytes(
        [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
         helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
         helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
         helper.make_node("Conv", ["xd", "wd"], ["y"], kernel_shape=[1, 1], group=1)],
        [f32("x", [1, 2, 4, 4])], [f32("y", None)],
        [init(np.array(0.02, np.float32), "xs"), init(np.array(0, np.uint8), "xz"),
         init(np.array([[[[3]], [[-5]]], [[[127]], [[-127]]]], np.int8), "wq"),
         init(np.array([0.01, 0.02], np.float32), "ws"), init(np.zeros(2, np.int8), "wz")])
    write("onnx_loader", "qdq.onnx", qdq)

    # External data: the weight lives in weights.bin next to the model (second part of the input).
    w = weights([4, 6], 7)
    tensor = numpy_helper.from_array(w, "w")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "weights.bin"), ("offset", "0"), ("length", str(w.nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "seed", [f32("x", [1, 4])],
                              [f32("y", [1, 6])], initializer=[tensor])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    write("onnx_loader", "external.onnx", model.SerializeToString() + SEPARATOR + w.tobytes())


def npy_bytes(array, version=None):
    buf = io.BytesIO()
    if version is None:
        np.save(buf, array, allow_pickle=False)
    else:
        np.lib.format.write_array(buf, array, version=version, allow_pickle=False)
    return buf.getvalue()


def npz_bytes(arrays, compressed):
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    return buf.getvalue()


def npy_seeds():
    rng = np.random.default_rng(0)
    write("npy", "f32.npy", npy_bytes(rng.standard_normal((2, 3)).astype(np.float32)))
    write("npy", "f64_v2.npy", npy_bytes(rng.standard_normal(4), version=(2, 0)))
    write("npy", "i8_v3.npy", npy_bytes(np.arange(-3, 3, dtype=np.int8), version=(3, 0)))
    write("npy", "u16_scalar.npy", npy_bytes(np.array(7, np.uint16)))
    write("npy", "i64_empty.npy", npy_bytes(np.zeros((0, 5), np.int64)))
    write("npy", "bool.npy", npy_bytes(np.array([[True, False]])))
    write("npy", "u4_3d.npy", npy_bytes(np.arange(8, dtype=np.uint32).reshape(2, 2, 2)))
    pair = {"images": rng.standard_normal((2, 2)).astype(np.float32), "labels": np.array([1, 0], np.int64)}
    write("npy", "stored.npz", npz_bytes(pair, compressed=False))
    write("npy", "deflated.npz", npz_bytes(pair, compressed=True))
    # zip64: numpy writes zip64 only for huge members; force it with zipfile.
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        with z.open("x.npy", "w", force_zip64=True) as f:
            f.write(npy_bytes(np.arange(6, dtype=np.int16)))
    write("npy", "zip64.npz", buf.getvalue())


def yaml_seeds():
    seeds = {
        "ptq.yaml": "algo: hist\nhist_percent: 0.999\nweight_quantize_type: abs_max\n"
                    "quantizable_op_type: [conv2d, mul]\nis_full_quantize: true\n"
                    "skip_tensor_list: [a, b]\nbatch_size: 16\ntype_config:\n  Gemm: {algo: mse}\n",
        "qat.yaml": "algo: abs_max\nepochs: 2\nweight_quanter: pact\n"
                    "type_config:\n  Gemm: {act_quanter: lsq_plus, weight_quanter: abs_max}\n",
        "analysis.yaml": "model_dir: ./model\nsave_dir: out\nnum_histogram_plots: 10\n"
                         "ptq_config:\n  algo: KL\n  weight_quantize_type: channel_wise_abs_max\n"
                         "  quantizable_op_type: [Conv, MatMul]\n  batch_size: 8\n  batch_nums: 4\n",
        "rules.yaml": "weight_bits: 4\nactivation_quantize_type: asymmetric\nbins: 2048\n"
                      "skip_quant: 'conv1,/fc'\nname_config:\n  /layer1/conv: {quantize: false}\n"
                      "layer_config:\n  conv*: {weight: abs_max, activation: avg}\n",
        "flow.yaml": "data: images:list.txt\nmean: [0.485, 0.456, 0.406]\nstd: [0.229, 0.224, 0.225]\n"
                     "resize: 224x224\nlimit: 100\nlr_schedule: {type: cosine, warmup: 1}\nseed: None\n",
        "anchors.yaml": "base: &b {algo: mse}\ntype_config:\n  Conv: *b\n  MatMul: *b\n",
    }
    for name, text in seeds.items():
        write("yaml_config", name, text.encode())


def png_bytes(width, height, channels):
    color_type = {1: 0, 3: 2}[channels]
    rows = b"".join(b"\x00" + bytes((x * 31 + y * 7) % 256 for x in range(width * channels)) for y in range(height))
    chunk = lambda kind, data: (struct.pack(">I", len(data)) + kind + data +
                                struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    header = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) +
            chunk(b"IEND", b""))


def image_list_seeds():
    write("image_list", "labelled.txt", b"gray.pgm 0\ngray.pgm 1\n")
    write("image_list", "unlabelled.txt", b"# calibration images\ncolor.ppm\n\n  color.ppm\t\r\n")
    write("image_list", "png.txt", b"fuzz.img 3\ngray.pgm 4\n" + SEPARATOR + png_bytes(6, 4, 1))
    write("image_list", "png_rgb.txt", b"fuzz.img\n" + SEPARATOR + png_bytes(5, 3, 3))
    write("image_list", "ppm.txt", b"fuzz.img 1\ncolor.ppm 2\n" + SEPARATOR + b"P6\n6 4\n255\n" + bytes(range(72)))


def main():
    onnx_seeds()
    npy_seeds()
    yaml_seeds()
    image_list_seeds()
    return 0


if __name__ == "__main__":
    sys.exit(main())
