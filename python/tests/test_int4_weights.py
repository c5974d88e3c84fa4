"""4-bit weight-only quantization from Python: PostTrainingQuantization(mode="weight-only",
weight_bits=4, block_size=..., weight_rounding="rtn" | "gptq") and quant_post_dynamic(weight_bits=4)."""
import onnx
import pytest

import slimquant
from conftest import MODELS


def _blocked_dequantize_nodes(path):
    model = onnx.load(path)
    nodes = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and
             any(a.name == "block_size" for a in n.attribute)]
    return model, nodes


def test_int4_blocks_from_python(tmp_path, fashion):
    vit = str(MODELS / "vit_small.onnx")
    path = slimquant.quant_post_dynamic(vit, str(tmp_path / "dyn.onnx"), weight_bits=4,
                                        quantizable_op_type=["MatMul", "Gemm"])
    model, blocked = _blocked_dequantize_nodes(path)
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [21]
    assert len(blocked) == 13 and all(a.i == 32 for n in blocked for a in n.attribute if a.name == "block_size")
    inits = {t.name: t for t in model.graph.initializer}
    assert all(inits[n.input[0]].data_type == 22 for n in blocked), "INT4 codes"

    images, _ = fashion
    loader = [images[i:i + 32] for i in range(0, 128, 32)]
    ptq = slimquant.PostTrainingQuantization(model_dir=vit, data_loader=loader, mode="weight-only", weight_bits=4,
                                             block_size=64, weight_rounding="gptq")
    ptq.quantize()
    out = ptq.save_quantized_model(str(tmp_path / "gptq.onnx"))
    model, blocked = _blocked_dequantize_nodes(out)
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["slimquant.weight_rounding"] == "gptq" and meta["slimquant.block_size"] == "64"
    x = images[:16]
    fp32 = list(slimquant.Session(vit).run(x).values())[0]
    w4 = list(slimquant.Session(out).run(x).values())[0]
    assert (fp32.argmax(axis=1) == w4.argmax(axis=1)).mean() >= 14 / 16

    with pytest.raises(ValueError, match="block_size"):
        slimquant.PostTrainingQuantization(model_dir=vit, mode="weight-only", weight_bits=4, block_size=48).quantize()
    with pytest.raises(ValueError, match="weight_rounding"):
        slimquant.PostTrainingQuantization(model_dir=vit, mode="weight-only", weight_bits=4, weight_rounding="awq")


def test_int4_int8_activations_from_python(tmp_path):
    vit = str(MODELS / "vit_small.onnx")
    ptq = slimquant.PostTrainingQuantization(model_dir=vit, mode="weight-only", weight_bits=4,
                                             int4_activations="int8")
    ptq.quantize()
    out = ptq.save_quantized_model(str(tmp_path / "i8.onnx"))
    meta = {p.key: p.value for p in onnx.load(out).metadata_props}
    assert meta["slimquant.int4_activations"] == "int8"
    with pytest.raises(ValueError, match="int4_activations"):
        slimquant.PostTrainingQuantization(model_dir=vit, mode="weight-only", weight_bits=4, int4_activations="fp16")
    with pytest.raises(ValueError, match="int4_activations"):
        slimquant.PostTrainingQuantization(model_dir=vit, mode="weight-only", int4_activations="int8").quantize()
