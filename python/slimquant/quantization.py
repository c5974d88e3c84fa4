"""Post-training quantization with the source documents' names: PostTrainingQuantization (seed 002),
QuantConfig with observers and quanters, and PTQ's quantize / sample / convert flow (seed 003).

Everything here only maps parameters onto the compiled library (slimquant._slimquant); the
calibration, observers and QDQ conversion are the same code the command line runs.
"""
import os
import warnings

from . import _slimquant as _sq

# ---- observers and quanters (seed 003): each names one of the library's algorithms.


class _Observer:
    """An activation or weight observer of QuantConfig; `algo` is the library's name for it."""

    algo = ""
    role = "activation"  # or "weight"

    def __init__(self, quant_bits=8):
        if self.role == "activation" and quant_bits != 8:
            raise ValueError(f"{type(self).__name__}: activations are quantized to 8 bits (quant_bits={quant_bits})")
        self.quant_bits = quant_bits

    def _apply(self, config):
        """Observer-wide options (histogram bins, percentile) go to the config's observer options."""

    def __repr__(self):
        return f"{type(self).__name__}()"


class AbsmaxObserver(_Observer):
    """Running max |x| (the documents' abs_max / direct); also a per-tensor weight observer."""

    algo = "abs_max"


class AVGObserver(_Observer):
    """Mean over batches of the per-sample max |x|."""

    algo = "avg"


class MSEObserver(_Observer):
    """Clipping threshold minimising the quantization MSE."""

    algo = "mse"


class EMDObserver(_Observer):
    """Clipping threshold minimising the difference of mean and std (slimquant's default)."""

    algo = "emd"


class HistObserver(_Observer):
    """Percentile of the |x| histogram: `percent` of the values lie below the threshold."""

    algo = "hist"

    def __init__(self, quant_bits=8, bins_count=2048, percent=0.99999):
        super().__init__(quant_bits)
        self.bins_count, self.percent = bins_count, percent

    def _apply(self, config):
        config.bins, config.hist_percent = self.bins_count, self.percent


class KLObserver(_Observer):
    """KL-divergence threshold on a histogram of |x| (the documents' KL)."""

    algo = "KL"

    def __init__(self, quant_bits=8, bins_count=2048):
        super().__init__(quant_bits)
        self.bins_count = bins_count

    def _apply(self, config):
        config.bins = self.bins_count


class AbsMaxChannelWiseWeightObserver(_Observer):
    """Per output channel max |w| (the default for weights)."""

    algo = "channel_wise_abs_max"
    role = "weight"


class MSEChannelWiseWeightObserver(_Observer):
    """Per output channel threshold minimising the weight MSE."""

    algo = "mse_channel_wise"
    role = "weight"


class _Quanter:
    """A QAT quanter of QuantConfig (used by `slimquant qat`; post-training flows only record it)."""

    name = ""
    roles = ("activation", "weight")

    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def __repr__(self):
        return f"{type(self).__name__}()"


class PACTQuanter(_Quanter):
    name = "pact"


class WeightLSQplusQuanter(_Quanter):
    name = "lsq_plus"
    roles = ("weight",)


class ActLSQplusQuanter(_Quanter):
    name = "lsq_plus"
    roles = ("activation",)


class FakeQuanterWithAbsMaxObserver(_Quanter):
    name = "moving_abs_max"
    roles = ("activation",)


def _names(value, what):
    """One name or a list of names -> a list of str (layers given as objects use their .name)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    out = []
    for item in items:
        if isinstance(item, str):
            out.append(item)
        elif hasattr(item, "name") and isinstance(item.name, str):
            out.append(item.name)
        else:
            raise TypeError(f"{what}: expected a name (str) or a list of names, got {type(item).__name__}")
    return out


class QuantConfig:
    """Which nodes are quantized and how (seed 003). Rules, highest priority first: per layer
    (add_layer_config: exact node names), per name (add_name_config: globs on node names such as
    "/layer1/*"), per op type (add_type_config: "Conv", "MatMul" or the documents' "conv2d", "mul"),
    then the global activation / weight given here. An observer class picks the algorithm, a quanter
    the QAT quanter; None keeps slimquant's default for that part (EMDObserver for activations,
    AbsMaxChannelWiseWeightObserver for weights). A rule whose activation and weight are both None
    leaves its nodes in float.
    """

    def __init__(self, activation=None, weight=None):
        self._config = _sq._QuantConfig(_sq.QuantRule())
        self._config.global_rule = self._rule(activation, weight, global_rule=True)

    def _rule(self, activation, weight, global_rule=False):
        """A QuantRule from observers / quanters / names; unset parts keep the global rule's."""
        if not global_rule and activation is None and weight is None:
            return _sq.QuantRule(quantize=False)
        base = self._config.global_rule
        rule = _sq.QuantRule(base.activation, base.weight, True, base.activation_quanter, base.weight_quanter)
        for part, value in (("activation", activation), ("weight", weight)):
            if value is None:
                continue
            if isinstance(value, type):
                value = value()  # a class given without calling it
            if isinstance(value, _Observer):
                if value.role == "weight" and part == "activation":
                    raise ValueError(f"{type(value).__name__} observes weights; it cannot be the activation observer")
                setattr(rule, part, value.algo)
                value._apply(self._config)
                if part == "weight" and value.quant_bits != 8:
                    self._config.weight_bits = value.quant_bits
            elif isinstance(value, _Quanter):
                if part not in value.roles:
                    raise ValueError(f"{type(value).__name__} is not a {part} quanter")
                setattr(rule, part + "_quanter", value.name)
            elif isinstance(value, str):
                setattr(rule, part, value)  # the library's own name ("KL", "mse_channel_wise", ...)
            else:
                raise TypeError(f"QuantConfig {part}: expected an observer, a quanter or a name, got {value!r}")
        return rule

    def add_layer_config(self, layer, activation=None, weight=None):
        """Rule for nodes named exactly `layer` (a name or a list of names)."""
        self._config.add_layer_config(_names(layer, "add_layer_config"), self._rule(activation, weight))
        return self

    def add_name_config(self, layer_name, activation=None, weight=None):
        """Rule for nodes whose name matches a glob in `layer_name`."""
        self._config.add_name_config(_names(layer_name, "add_name_config"), self._rule(activation, weight))
        return self

    def add_type_config(self, layer_type, activation=None, weight=None):
        """Rule for nodes of the op types in `layer_type` ("Conv", "conv2d", ...)."""
        self._config.add_type_config(_names(layer_type, "add_type_config"), self._rule(activation, weight))
        return self

    # The flow settings of seed 002 are part of the config too.
    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.__dict__["_config"], name)

    def set(self, **settings):
        """quantizable_op_type, is_full_quantize, skip_tensor_list, skip_quant, weight_bits,
        deploy_backend, hist_percent, asymmetric_activations."""
        for key, value in settings.items():
            if not hasattr(self._config, key):
                raise TypeError(f"QuantConfig.set: unknown setting '{key}'")
            setattr(self._config, key, value)
        return self

    @classmethod
    def from_yaml(cls, path):
        """The CLI's --config YAML (the documents' keys); returns (QuantConfig, other keys as dict)."""
        config, extra = _sq.load_quant_config_yaml(os.fspath(path))
        self = cls.__new__(cls)
        self._config = config
        return self, extra


def _model(model, model_filename=None, params_filename=None):
    """A path (file or folder) or a Model -> Model."""
    if isinstance(model, _sq.Model):
        return model
    return _sq.load_model(os.fspath(model), model_filename or "", params_filename or "")


class ObservedModel:
    """PTQ.quantize()'s result: calling it with a calibration batch (a dict of input name -> array,
    or an array) feeds the observers, as running PaddleSlim's observed model does."""

    def __init__(self, ptq):
        self._ptq = ptq

    def __call__(self, batch):
        self._ptq.sample(batch)

    @property
    def layers(self):
        return self._ptq.layers

    @property
    def samples_seen(self):
        return self._ptq.samples_seen


class PTQ:
    """Seed 003's flow: quantize (attach observers) -> call the observed model on calibration
    batches -> convert (freeze the scales into a QDQ model). convert() may be called again for any
    subset of layers (only_layers) without calibrating again."""

    def __init__(self, config=None):
        config = config if config is not None else QuantConfig()
        self._ptq = _sq._PTQ(config._config)

    def quantize(self, model, inplace=False, model_filename=None, params_filename=None):
        self._ptq.quantize(_model(model, model_filename, params_filename))
        return ObservedModel(self._ptq)

    def convert(self, model=None, inplace=False, only_layers=None):
        """The QDQ model (slimquant.Model: .save(path), or Session(model))."""
        return self._ptq.convert(only_layers)

    @property
    def layers(self):
        return self._ptq.layers


class PostTrainingQuantization:
    """Seed 002's post-training quantization over an ONNX model.

    Calibration data, exactly one of:
      sample_generator: yields one sample at a time (without batch dimension, or with 1), stacked
                        into batches of batch_size; batch_nums batches (all when None);
      data_loader / batch_generator: yields whole batches (batch_size does not apply; batch_nums
                        counts batches).
    Each item is a dict of input name -> array, an array (single-input models) or a tuple
    (array, label); the data is any iterable, or a callable returning an iterator (a reader).
    executor and scope are accepted for the documents' code and not used (slimquant runs on its own
    CPU runtime). algo defaults to slimquant's "emd" (as the CLI); the documents' "KL" and
    "direct"/"abs_max", "hist", "avg", "mse", "min_max" are all available.
    """

    def __init__(self, executor=None, sample_generator=None, model_dir=None, model_filename=None,
                 params_filename=None, batch_size=10, batch_nums=None, scope=None, algo="emd",
                 quantizable_op_type=None, is_full_quantize=False, is_use_cache_file=False,
                 cache_dir="./temp_post_training", *, data_loader=None, batch_generator=None,
                 weight_bits=8, activation_bits=8, weight_quantize_type="channel_wise_abs_max",
                 onnx_format=True, skip_tensor_list=None, skip_quant=None, hist_percent=0.99999,
                 deploy_backend="slimquant", activation_quantize_type=None, fallback_sqnr_db=20.0,
                 config=None):
        if executor is not None or scope is not None:
            warnings.warn("PostTrainingQuantization: executor and scope are not used (slimquant runs the ONNX "
                          "model on its own CPU runtime)", stacklevel=2)
        if model_dir is None:
            raise ValueError("PostTrainingQuantization needs model_dir (an .onnx file, or a folder with model_filename)")
        if activation_bits != 8:
            raise ValueError(f"activation_bits must be 8 (got {activation_bits})")
        if not onnx_format:
            raise ValueError("slimquant writes standard ONNX QDQ models only (onnx_format=True)")
        sources = [s for s in (sample_generator, data_loader, batch_generator) if s is not None]
        if len(sources) != 1:
            raise ValueError("give exactly one of sample_generator, data_loader, batch_generator")
        o = _sq._PostTrainingQuantizationOptions()
        o.model_dir = os.fspath(model_dir)
        o.model_filename = model_filename or ""
        o.params_filename = params_filename or ""
        o.batch_size = int(batch_size)
        o.batch_nums = None if batch_nums is None else int(batch_nums)
        o.algo = algo
        o.weight_quantize_type = weight_quantize_type
        o.weight_bits = int(weight_bits)
        o.deploy_backend = deploy_backend
        if quantizable_op_type is not None:
            o.quantizable_op_type = list(quantizable_op_type)
        o.is_full_quantize = bool(is_full_quantize)
        o.hist_percent = float(hist_percent)
        o.skip_tensor_list = list(skip_tensor_list or [])
        o.skip_quant = list(skip_quant or [])
        if activation_quantize_type is not None:
            if activation_quantize_type not in ("symmetric", "asymmetric"):
                raise ValueError("activation_quantize_type: 'symmetric' or 'asymmetric' "
                                 f"(got {activation_quantize_type!r})")
            o.asymmetric_activations = activation_quantize_type == "asymmetric"
        o.is_use_cache_file = bool(is_use_cache_file)
        o.cache_dir = os.fspath(cache_dir)
        o.fallback_sqnr_db = float(fallback_sqnr_db)
        if config is not None:
            o.config = config._config
        if sample_generator is not None:
            o.set_sample_generator(sample_generator)
        else:
            o.set_batch_generator(data_loader if data_loader is not None else batch_generator)
        self._impl = _sq._PostTrainingQuantization(o)
        self._quantized = None

    def quantize(self):
        """Calibrates and converts; returns the QDQ model (slimquant.Model)."""
        self._quantized = self._impl.quantize()
        for w in self._impl.warnings:
            warnings.warn(w, stacklevel=2)
        return self._quantized

    def save_quantized_model(self, save_model_path, model_filename=None, params_filename=None):
        """Writes the QDQ model: to save_model_path itself when it ends in .onnx, otherwise into that
        folder (created) as model_filename (default model.onnx). Returns the file's path."""
        path = os.fspath(save_model_path)
        if not path.endswith(".onnx"):
            os.makedirs(path, exist_ok=True)
            path = os.path.join(path, model_filename or "model.onnx")
        self._impl.save_quantized_model(path)
        return path

    @property
    def quantized_model(self):
        return self._impl.quantized_model

    @property
    def float_model(self):
        return self._impl.float_model

    @property
    def report(self):
        """Calibration figures: batches, samples, resumed_batches, seconds."""
        return self._impl.report

    @property
    def float_layers(self):
        """Layers the precision fallback left in float (fallback_sqnr_db)."""
        return self._impl.float_layers

    @property
    def layers(self):
        return self._impl.ptq.layers
