"""PaddleSlim's function entry points for post-training quantization (seed 004's quant_post, later
quant_post_static; and quant_post_dynamic, weights only), over PostTrainingQuantization with
PaddleSlim's parameter names, defaults and meanings."""
from . import _slimquant as _sq
from ._compat import (check_bool, check_int, check_path, check_str_list, explicit_arguments_function, invalid, warn,
                      warn_unused, refuse_paddle_model)
from .quantization import PostTrainingQuantization, _output_path

__all__ = ["quant_post_static", "quant_post", "quant_post_dynamic"]


@explicit_arguments_function
def quant_post_static(explicit, executor, model_dir, quantize_model_path, sample_generator=None,
                      batch_generator=None, data_loader=None, model_filename=None, params_filename=None,
                      save_model_filename=None, save_params_filename=None, batch_size=10, batch_nums=None,
                      scope=None, algo="KL", round_type="round", hist_percent=0.9999, bias_correction=False,
                      quantizable_op_type=("conv2d", "depthwise_conv2d", "mul"), is_full_quantize=False,
                      weight_bits=8, activation_bits=8, activation_quantize_type="range_abs_max",
                      weight_quantize_type="channel_wise_abs_max", optimize_model=False, onnx_format=True,
                      skip_tensor_list=None, is_use_cache_file=False, cache_dir=None, *, skip_quant=None,
                      deploy_backend="slimquant", fallback_sqnr_db=20.0):
    """Quantizes the ONNX model `model_dir` (an .onnx file, or a folder with model_filename) on
    calibration data and writes the QDQ model into the folder quantize_model_path as
    save_model_filename (default model.onnx). Returns the written file's path (PaddleSlim returns
    None).

    Calibration data, exactly one of (as PaddleSlim defines them):
      sample_generator: a reader yielding one sample at a time, batched by batch_size;
      batch_generator:  a reader yielding whole batches;
      data_loader:      an iterable of batches (feed dicts, [feed dict], arrays or (array, label)).
    batch_nums batches are used (every one when None). Defaults are PaddleSlim's: algo="KL",
    batch_size=10, batch_nums=None, hist_percent=0.9999, quantizable_op_type conv2d,
    depthwise_conv2d, mul (= ONNX Conv, MatMul, Gemm).

    Accepted for PaddleSlim code and without effect here (a warning names each one given):
    executor, scope, save_params_filename (the ONNX file holds the weights), onnx_format=False (the
    output is always ONNX QDQ), optimize_model=False (BatchNorm is always folded, as
    optimize_model=True does). activation_quantize_type takes Paddle's range_abs_max,
    moving_average_abs_max and abs_max (all give fixed activation scales computed by algo) or
    slimquant's symmetric / asymmetric. round_type="adaround" and algo="ptf" are refused as not
    implemented. slimquant's own options: skip_quant (op types, node names or globs left in float),
    deploy_backend, fallback_sqnr_db (the precision fallback; 0 disables).
    """
    if "optimize_model" in explicit and not check_bool(optimize_model, "optimize_model"):
        warn_unused("optimize_model=False", "BatchNorm is always folded into the preceding convolution before "
                    "calibration (an exact rewrite, what optimize_model=True does)")
    else:
        check_bool(optimize_model, "optimize_model")
    forwarded = {name: value for name, value in locals().items()
                 if name in explicit and name not in ("explicit", "quantize_model_path", "save_model_filename",
                                                      "save_params_filename", "optimize_model")}
    # PaddleSlim's defaults where quant_post_static's differ from PostTrainingQuantization's.
    forwarded.setdefault("hist_percent", hist_percent)
    forwarded.setdefault("quantizable_op_type", list(quantizable_op_type))
    forwarded.setdefault("executor", executor)  # required positional here; may be given positionally
    forwarded.setdefault("model_dir", model_dir)
    # The output folder is checked before the calibration, which may take minutes.
    path = _output_path(quantize_model_path, save_model_filename, save_params_filename, "quantize_model_path",
                        "save_model_filename", "save_params_filename")
    ptq = PostTrainingQuantization(**forwarded)
    ptq.quantize()
    ptq.save_quantized_model(path)
    return path


# Seed 004's name (PaddleSlim 1.x); the same function.
quant_post = quant_post_static


@explicit_arguments_function
def quant_post_dynamic(explicit, model_dir, save_model_dir, model_filename=None, params_filename=None,
                       save_model_filename=None, save_params_filename=None, quantizable_op_type=("conv2d", "mul"),
                       weight_bits=8, generate_test_model=False, onnx_format=False, block_size=None):
    """PaddleSlim's weight-only quantization: the weights of the quantizable_op_type layers (default
    conv2d and mul = ONNX Conv, MatMul and Gemm) are stored as int8 codes with one scale per output
    channel behind a DequantizeLinear, activations stay float, and no data is needed (slimquant
    quantize --mode weight-only). Writes save_model_dir/save_model_filename (default model.onnx;
    save_model_dir itself when it ends in .onnx) and returns its path (PaddleSlim returns None).
    The file is about a quarter of the float one; slimquant's runtime and ONNX Runtime dequantize
    the weights once when they load it.

    weight_bits: 8 (PaddleSlim's default), or 2..7 for a narrower grid in the same int8 storage; 4
    stores MatMul / Gemm weights as INT4 in blocks of block_size (32, 64 or 128; default 32) input
    features, read by an opset-21 blocked DequantizeLinear (Conv weights stay 8-bit per channel);
    PaddleSlim's 16 is refused (int16 weights need ONNX opset 21's DequantizeLinear). Without effect
    here (a warning names each one given): save_params_filename (the ONNX file holds the weights),
    generate_test_model (the saved model runs as is), onnx_format (the output is always ONNX).
    """
    model_dir = check_path(model_dir, "model_dir")
    refuse_paddle_model(model_dir, model_filename, params_filename)
    if not isinstance(weight_bits, bool) and weight_bits == 16:
        raise invalid("weight_bits=16: 16-bit weights need ONNX opset 21's int16 DequantizeLinear, which slimquant "
                      "does not write; use weight_bits=8")
    weight_bits = check_int(weight_bits, "weight_bits", 2, 8)
    op_types = check_str_list(quantizable_op_type, "quantizable_op_type", allow_none=False)
    if check_bool(generate_test_model, "generate_test_model"):
        warn_unused("generate_test_model=True", "the saved model itself runs in slimquant and ONNX Runtime (its "
                    "weights are dequantized when it is loaded): there is no separate test model")
    if "onnx_format" in explicit:
        check_bool(onnx_format, "onnx_format")
        warn_unused(f"onnx_format={onnx_format!r}", "the output is always an ONNX model (weights through "
                    "DequantizeLinear)")
    path = _output_path(save_model_dir, save_model_filename, save_params_filename, "save_model_dir",
                        "save_model_filename", "save_params_filename")
    o = _sq._PostTrainingQuantizationOptions()
    o.model_dir = model_dir
    o.model_filename = model_filename or ""
    o.params_filename = params_filename or ""
    o.mode = "weight-only"
    o.weight_bits = weight_bits
    o.block_size = check_int(block_size, "block_size", 32, 128, allow_none=True) or 0
    o.quantizable_op_type = op_types
    ptq = _sq._PostTrainingQuantization(o)
    ptq.quantize()
    for w in ptq.warnings:
        warn(w)
    ptq.save_quantized_model(path)
    return path
