"""The sensitivity analyses with the source documents' names: AnalysisQuant (seed 000; AnalysisPTQ is
PaddleSlim's later name for it) and AnalysisQAT (seed 001), ranking layers by the user's own
eval_function. The work (calibration, per-layer models, checkpoint and resume, report files,
histogram PDFs, target search, statistics) is the library's, as in `slimquant analyze`.
"""
import itertools
import os
import warnings

from . import _slimquant as _sq
from ._compat import check_data, refuse_paddle_model, session_eval_function, warn_unused
from .quantization import PostTrainingQuantization, _model


def _replayable(data, limit=None):
    """The data as something that can be iterated more than once (the histograms read the
    calibration data again): one-shot iterators and generators are read into a list (at most
    `limit` items, the batches calibration uses)."""
    if data is None:
        raise _sq.InvalidArgumentError("data_loader is required (the calibration data)")
    check_data(data, "data_loader")
    if callable(data) and not hasattr(data, "__iter__"):
        return data  # a reader: each call starts over
    if iter(data) is data:
        return list(itertools.islice(data, limit)) if limit else list(data)
    return data


def _iterate(data):
    return iter(data()) if callable(data) and not hasattr(data, "__iter__") else iter(data)


class AnalysisQuant:
    """PTQ sensitivity analysis (seed 000): calibrate once on data_loader, then quantize one layer
    at a time, evaluate each such model with eval_function(session) -> float (or PaddleSlim's
    eval_function(exe, program, feed_names, fetch_list), see slimquant.Executor) and rank the layers by
    the loss against FP32 (save_dir/analysis.txt, analysis.json). Finished layers are checkpointed
    (save_dir/checkpoint_name): a rerun with the same model, data and settings resumes; an
    exception raised by eval_function stops the analysis with the checkpoint kept and reaches the
    caller unchanged.

    data_loader yields calibration batches (as PostTrainingQuantization's data_loader); ptq_config
    holds PostTrainingQuantization's keyword arguments (algo, batch_nums, weight_quantize_type,
    quantizable_op_type, is_full_quantize, skip_tensor_list, ...). higher_is_better says which way
    the metric goes (False for losses and error rates).
    """

    def __init__(self, model_dir, model_filename=None, params_filename=None, eval_function=None,
                 data_loader=None, save_dir="analysis_results", checkpoint_name="analysis_checkpoint.json",
                 num_histogram_plots=10, ptq_config=None, *, higher_is_better=True, num_threads=0):
        self._evaluate = session_eval_function(eval_function, "AnalysisQuant")
        refuse_paddle_model(model_dir, model_filename, params_filename)
        if ptq_config is not None and not isinstance(ptq_config, dict):
            raise TypeError(f"ptq_config must be a dict of PostTrainingQuantization's parameters, got "
                            f"{type(ptq_config).__name__}")
        ptq_config = dict(ptq_config or {})
        for key in ("model_dir", "model_filename", "params_filename", "sample_generator", "data_loader",
                    "batch_generator"):
            if key in ptq_config:
                raise ValueError(f"ptq_config: '{key}' is AnalysisQuant's own parameter")
        self.eval_function = eval_function
        self.save_dir = os.fspath(save_dir)
        self.checkpoint_name = checkpoint_name or ""
        self.num_histogram_plots = int(num_histogram_plots)
        self.higher_is_better = bool(higher_is_better)
        self.num_threads = num_threads
        self.data_loader = _replayable(data_loader, ptq_config.get("batch_nums"))
        # Calibration: the library's PostTrainingQuantization without its precision fallback (the
        # analysis quantizes one layer at a time itself), as `slimquant analyze` calibrates.
        ptq_config.setdefault("fallback_sqnr_db", 0.0)
        self._calibration = PostTrainingQuantization(model_dir=model_dir, model_filename=model_filename,
                                                     params_filename=params_filename,
                                                     data_loader=self.data_loader, **ptq_config)
        self._calibration.quantize()
        self._batches = self._calibration.report["batches"]
        self._report = None

    @property
    def layers(self):
        """The quantizable layers (name, op_type, activations, weight), in model order."""
        return self._ptq.layers

    @property
    def _ptq(self):
        return self._calibration._impl.ptq

    def _calibration_batches(self):
        return itertools.islice(_iterate(self.data_loader), self._batches)

    def metric_error_analyse(self):
        """Ranks every quantizable layer; returns the report (also in save_dir/analysis.json) and
        writes the histogram PDFs (num_histogram_plots best and worst layers)."""
        fingerprint = {"calibration": "python data_loader", "calibration_batches": str(self._batches)}
        self._report = _sq.analyze_ptq(self._ptq, self._evaluate, self.higher_is_better, self.save_dir,
                                       self.checkpoint_name, fingerprint, self.num_threads)
        result = self._report.to_dict()
        if self.num_histogram_plots > 0:
            result["pdfs"] = _sq.write_analysis_histograms(self._ptq, self._report, self._calibration_batches,
                                                           self.num_histogram_plots, self.save_dir)
        return result

    def get_target_quant_model(self, target_metric, fallback_mode="float"):
        """The quantized model meeting target_metric with the fewest layers left in float (the
        search of `slimquant analyze --target-metric`, candidates evaluated with eval_function on
        slimquant's integer execution); the best model found is saved to
        save_dir/target_model.onnx even when the target cannot be met. fallback_mode "weight-only"
        first tries a damaging layer with only its weight quantized, "dynamic" with its input
        quantized per inference (`--fallback-mode`). Returns the search result."""
        if self._report is None:
            self.metric_error_analyse()
        timing = next(iter(self._calibration_batches()), None)
        return _sq.search_target(self._ptq, self._report, self._evaluate, self.higher_is_better,
                                 float(target_metric), self.save_dir, timing_feeds=timing,
                                 num_threads=self.num_threads, fallback_mode=fallback_mode)

    def statistical_analyse(self, batch_size=64):
        """Per layer FP32 vs quantized statistics of weights and input activations and the SQNR of
        its output (isolated and accumulated) on the calibration data: save_dir/statistics.csv and
        statistics.json; returns the JSON. Single-input models."""
        return _sq.layer_statistics(self._ptq, self._calibration_batches, self.save_dir, batch_size)


AnalysisPTQ = AnalysisQuant  # PaddleSlim's later name


class AnalysisQAT:
    """QAT sensitivity analysis (seed 001): for every quantized layer of a QDQ model, remove that
    layer's quantization (float weights restored from float_model_dir), evaluate with
    eval_function(session) -> float (or PaddleSlim's eval_function(exe, program, feed_names,
    fetch_list)) and rank the layers by the gain (save_dir/analysis.txt).
    qat_metric is the quantized model's metric (computed with eval_function when None). resume
    continues from the checkpoint of an interrupted run. data_loader is accepted for the documents'
    code (type-checked, with a warning that it is not used): the evaluation is eval_function's."""

    def __init__(self, quant_model_dir, float_model_dir, model_filename=None, params_filename=None,
                 quantizable_op_type=("conv2d", "depthwise_conv2d", "mul"), qat_metric=None, eval_function=None,
                 data_loader=None, save_dir="analysis_results", resume=False,
                 checkpoint_name="analysis_checkpoint.json", *, higher_is_better=True, num_threads=0):
        self._evaluate = session_eval_function(eval_function, "AnalysisQAT")
        if check_data(data_loader, "data_loader") is not None:
            warn_unused("AnalysisQAT data_loader", "the metrics come from eval_function, which reads its own data "
                        "(nothing is calibrated: the quantized model has its scales)")

        def load(path):
            refuse_paddle_model(path, model_filename, params_filename)
            is_dir = not isinstance(path, _sq.Model) and os.path.isdir(path)
            return _model(path, model_filename if is_dir else None, params_filename if is_dir else None)

        self.quant_model = load(quant_model_dir)
        self.float_model = load(float_model_dir)
        self.quantizable_op_type = list(quantizable_op_type)
        self.qat_metric = None if qat_metric is None else float(qat_metric)
        self.eval_function = eval_function
        self.data_loader = data_loader
        self.save_dir = os.fspath(save_dir)
        self.resume = bool(resume)
        self.checkpoint_name = checkpoint_name or ""
        self.higher_is_better = bool(higher_is_better)
        self.num_threads = num_threads

    def metric_error_analyse(self):
        """Ranks the quantized layers; returns the report (also in save_dir/analysis.json)."""
        checkpoint = os.path.join(self.save_dir, self.checkpoint_name) if self.checkpoint_name else None
        if not self.resume and checkpoint and os.path.exists(checkpoint):
            warnings.warn(f"starting over without resume=True: checkpoint '{checkpoint}' is replaced", stacklevel=2)
        report = _sq.analyze_qat(self.quant_model, self.float_model, self._evaluate, self.higher_is_better,
                                 self.save_dir, self.checkpoint_name, self.resume, self.qat_metric,
                                 self.quantizable_op_type, self.num_threads)
        return report.to_dict()
