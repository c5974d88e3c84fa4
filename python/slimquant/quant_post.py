"""PaddleSlim's function entry point for post-training quantization (seed 004's quant_post, later
quant_post_static), over PostTrainingQuantization with PaddleSlim's parameter names, defaults and
meanings."""
from ._compat import check_bool, explicit_arguments_function, warn_unused
from .quantization import PostTrainingQuantization, _output_path

__all__ = ["quant_post_static", "quant_post"]


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
