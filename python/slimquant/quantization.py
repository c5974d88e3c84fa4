"""Post-training quantization with the source documents' names: PostTrainingQuantization (seed 002),
QuantConfig with observers and quanters, and PTQ's quantize / sample / convert flow (seed 003).

Everything here only maps parameters onto the compiled library (slimquant._slimquant); the
calibration, observers and QDQ conversion are the same code the command line runs.
"""
import os

import numpy as np

from . import _slimquant as _sq
from ._compat import (check_bool, check_choice, check_data, check_float, check_int, check_path, check_str_list,
                      explicit_arguments, invalid, refuse_paddle_model, warn, warn_unused)

# ---- observers and quanters (seed 003): each names one of the library's algorithms.


class _Observer:
    """An activation or weight observer of QuantConfig; `algo` is the library's name for it."""

    algo = ""
    role = "activation"  # or "weight"
    weight_algo = None  # the library's weight observer when it also observes weights

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
    weight_algo = "abs_max"


class AVGObserver(_Observer):
    """Mean over batches of the per-sample max |x|."""

    algo = "avg"


class MSEObserver(_Observer):
    """Clipping threshold minimising the quantization MSE; as a weight observer, one threshold for
    the whole weight (per tensor), searched on its values."""

    algo = "mse"
    weight_algo = "mse"


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
    weight_algo = "channel_wise_abs_max"


class MSEChannelWiseWeightObserver(_Observer):
    """Per output channel threshold minimising the weight MSE."""

    algo = "mse_channel_wise"
    role = "weight"
    weight_algo = "mse_channel_wise"


class _Quanter:
    """A QAT quanter of QuantConfig: QAT(config) trains with it; post-training flows record it and
    warn that they calibrate that part with its observer instead.

    Each subclass takes PaddleSlim's constructor arguments; those the library honours reach its
    quanter (through a named spec in the QAT options), the others warn when given, naming
    themselves. `kwargs` holds the arguments the caller gave."""

    name = ""  # the library's quanter type
    roles = ("activation", "weight")

    def _record(self, explicit, values):
        self.kwargs = {k: values[k] for k in values if k in explicit}

    def _spec(self, part):
        """Settings of the library's QuanterSpec for this quanter in `part` ("activation"/"weight")."""
        return {}

    def _check_role(self, part, where):
        if part not in self.roles:
            raise invalid(f"{where}: {type(self).__name__} is not a {part} quanter (it quantizes "
                          f"{' and '.join(self.roles)}s)")

    def _weight_bits(self):
        return None

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"{type(self).__name__}({args})"


def _check_dtype(dtype, who):
    # Training runs in float32; PaddleSlim's other trainable dtypes (float16) are not available.
    return check_choice(dtype, f"{who}: dtype", ("float32",))


def _check_bits(quant_bits, who, part_can_be_weight):
    bits = check_int(quant_bits, f"{who}: quant_bits", 2 if part_can_be_weight else 8, 8)
    return bits


def _warn_given(who, explicit, values, why):
    for parameter, reason in why.items():
        if parameter in explicit:
            warn_unused(f"{who}: {parameter}={values[parameter]!r}", reason)


class PACTQuanter(_Quanter):
    """PACT: a learnable clip alpha; the clipped tensor is quantized on the grid alpha / 127 (signed),
    alpha / 255 (never-negative activations) or alpha / (2^(bits-1) - 1) (weights).

    init_value: the initial alpha. None (slimquant's default) starts from the calibrated range
    (QAT.quantize(calibration_data=...)), the weights' max |w|, or the first batch's max |x|;
    PaddleSlim's default 100 is the clip in front of a separate quantizer, and a 100-wide 8-bit grid
    here would lose most activations. learning_rate: the factor on the optimizer's rate for alpha
    (PaddleSlim: 1000); None = 1, the optimizer's own rate. quanter: PaddleSlim's quantizer behind
    the clip; slimquant's PACT quantizes itself, so a quanter given warns. quant_bits: weights 2..8
    (the config's weight bits), activations 8."""

    name = "pact"

    @explicit_arguments  # a parameter without effect warns when given, even with its default value
    def __init__(self, quanter=None, init_value=None, learning_rate=None, dtype="float32", name=None, *,
                 quant_bits=8):
        who = "PACTQuanter"
        values = dict(quanter=quanter, init_value=init_value, learning_rate=learning_rate, dtype=dtype, name=name,
                      quant_bits=quant_bits)
        self.init_value = None if init_value is None else check_float(init_value, f"{who}: init_value", 0.0,
                                                                      float("inf"), low_open=True)
        self.learning_rate = 1.0 if learning_rate is None else check_float(
            learning_rate, f"{who}: learning_rate", 0.0, float("inf"), low_open=True)
        _check_dtype(dtype, who)
        self.quant_bits = _check_bits(quant_bits, who, True)
        if name is not None and not isinstance(name, str):
            raise TypeError(f"{who}: name must be a str or None, got {type(name).__name__} {name!r}")
        if quanter is not None:
            warn_unused(f"{who}: quanter={getattr(quanter, '__name__', type(quanter).__name__)}",
                        "slimquant's PACT quantizes the clipped tensor itself (scale alpha / 127, or / 255 for "
                        "never-negative activations)")
        if name is not None:
            warn_unused(f"{who}: name={name!r}", "quanter parameters are named after the tensor they quantize")
        self._record(self._explicit, values)

    def _spec(self, part):
        return {"init_value": self.init_value, "lr_scale": self.learning_rate}

    def _check_role(self, part, where):
        super()._check_role(part, where)
        if part == "activation" and self.quant_bits != 8:
            raise invalid(f"{where}: PACTQuanter quant_bits={self.quant_bits}: activations are quantized to 8 bits")

    def _weight_bits(self):
        return self.quant_bits


class WeightLSQplusQuanter(_Quanter):
    """LSQ+ for weights: a learnable step s (per output channel with per_channel=True, one per weight
    otherwise: PaddleSlim's default), initialised to max(|mu - 3 sigma|, |mu + 3 sigma|) / 2^(bits-1)
    of the weights; symmetric signed grid of quant_bits (2..8) bits."""

    name = "lsq_plus"
    roles = ("weight",)

    @explicit_arguments
    def __init__(self, quant_bits=8, sign=True, symmetric=True, per_channel=False, batch_init=20, quant_linear=False,
                 channel_num=None, reduce_type=None, dtype="float32", name=None, all_postive=False):
        who = "WeightLSQplusQuanter"
        values = dict(quant_bits=quant_bits, sign=sign, symmetric=symmetric, per_channel=per_channel,
                      batch_init=batch_init, quant_linear=quant_linear, channel_num=channel_num,
                      reduce_type=reduce_type, dtype=dtype, name=name, all_postive=all_postive)
        self.quant_bits = _check_bits(quant_bits, who, True)
        if not check_bool(sign, f"{who}: sign"):
            raise invalid(f"{who}: sign=False (unsigned weights) is not supported: weights are exported on a "
                          "signed symmetric grid")
        if not check_bool(symmetric, f"{who}: symmetric"):
            raise invalid(f"{who}: symmetric=False is not supported: weights are exported with zero point 0")
        if check_bool(all_postive, f"{who}: all_postive"):
            raise invalid(f"{who}: all_postive=True is not supported: weights are exported on a signed grid")
        self.per_channel = check_bool(per_channel, f"{who}: per_channel")
        check_int(batch_init, f"{who}: batch_init", 1)
        check_bool(quant_linear, f"{who}: quant_linear")
        check_int(channel_num, f"{who}: channel_num", 1, allow_none=True)
        if reduce_type is not None:
            check_choice(reduce_type, f"{who}: reduce_type", ("max",))
        _check_dtype(dtype, who)
        if name is not None and not isinstance(name, str):
            raise TypeError(f"{who}: name must be a str or None, got {type(name).__name__} {name!r}")
        _warn_given(who, self._explicit, values, {
            "batch_init": "the step is initialised once from the weights before training (they barely move "
                          "over the first batches)",
            "quant_linear": "the channel axis comes from the ONNX op (a Gemm/MatMul weight's output columns)",
            "channel_num": "the channel count comes from the weight's shape",
            "reduce_type": "training runs in one process; there is nothing to reduce across",
            "name": "quanter parameters are named after the tensor they quantize",
        })
        self._record(self._explicit, values)

    def _spec(self, part):
        return {"per_channel": self.per_channel}

    def _weight_bits(self):
        return self.quant_bits


class ActLSQplusQuanter(_Quanter):
    """LSQ+ for activations (one scale per tensor). symmetric=True (PaddleSlim's default): a
    learnable step s, y = s * clamp(round(x / s)) on s8 [-127, 127] (sign=True) or u8 [0, 255]
    with zero point 0 (sign=False). symmetric=False: LSQ+ with a learnable offset beta, asymmetric
    u8 (the zero point is round(-beta / s)), what `slimquant qat --act-quanter lsq_plus` uses.
    The step starts from the calibrated range, else the first batch."""

    name = "lsq_plus"
    roles = ("activation",)

    @explicit_arguments
    def __init__(self, quant_bits=8, sign=True, symmetric=True, per_channel=False, batch_init=20, quant_linear=False,
                 reduce_type=None, dtype="float32", name=None, all_postive=False):
        who = "ActLSQplusQuanter"
        values = dict(quant_bits=quant_bits, sign=sign, symmetric=symmetric, per_channel=per_channel,
                      batch_init=batch_init, quant_linear=quant_linear, reduce_type=reduce_type, dtype=dtype,
                      name=name, all_postive=all_postive)
        self.quant_bits = _check_bits(quant_bits, who, False)
        self.sign = check_bool(sign, f"{who}: sign")
        self.symmetric = check_bool(symmetric, f"{who}: symmetric")
        # all_postive: the activations are known to be >= 0, i.e. an unsigned grid.
        if check_bool(all_postive, f"{who}: all_postive"):
            self.sign = False
        check_bool(per_channel, f"{who}: per_channel")
        check_int(batch_init, f"{who}: batch_init", 1)
        check_bool(quant_linear, f"{who}: quant_linear")
        if reduce_type is not None:
            check_choice(reduce_type, f"{who}: reduce_type", ("max",))
        _check_dtype(dtype, who)
        if name is not None and not isinstance(name, str):
            raise TypeError(f"{who}: name must be a str or None, got {type(name).__name__} {name!r}")
        unused = {
            "per_channel": "activations have one scale per tensor (PaddleSlim's ActLSQplusQuanter too)",
            "batch_init": "the step starts from the calibration (or the first batch) before training",
            "quant_linear": "activations have no channel axis to choose",
            "reduce_type": "training runs in one process; there is nothing to reduce across",
            "name": "quanter parameters are named after the tensor they quantize",
        }
        if not self.symmetric:
            unused["sign"] = "the asymmetric grid's offset covers either sign"
        _warn_given(who, self._explicit, values, unused)
        self._record(self._explicit, values)

    def _spec(self, part):
        return {"symmetric": self.symmetric, "sign": self.sign if self.symmetric else None}


class FakeQuanterWithAbsMaxObserver(_Quanter):
    """Moving-average abs max of the activations (rate 0.9), no trainable parameters."""

    name = "moving_abs_max"
    roles = ("activation",)

    @explicit_arguments
    def __init__(self, moving_rate=0.9, bit_length=8, dtype="float32", name=None):
        who = "FakeQuanterWithAbsMaxObserver"
        values = dict(moving_rate=moving_rate, bit_length=bit_length, dtype=dtype, name=name)
        if check_float(moving_rate, f"{who}: moving_rate", 0.0, 1.0, low_open=True) != 0.9:
            warn_unused(f"{who}: moving_rate={moving_rate!r}", "the library's moving average uses rate 0.9")
        if check_int(bit_length, f"{who}: bit_length") != 8:
            raise invalid(f"{who}: bit_length must be 8 (got {bit_length}): activations are quantized to 8 bits")
        _check_dtype(dtype, who)
        if name is not None:
            warn_unused(f"{who}: name={name!r}", "quanters are named after the tensor they quantize")
        self._record(self._explicit, values)


# Paddle layer classes given to add_type_config, by class name -> the documents' op names.
_PADDLE_LAYER_TYPES = {"Linear": "mul", "Conv2D": "conv2d", "Conv2DTranspose": "conv2d_transpose"}

_WEIGHT_OBSERVERS = ("AbsMaxChannelWiseWeightObserver (the default), MSEChannelWiseWeightObserver, AbsmaxObserver or "
                     "MSEObserver (per tensor)")


def _names(value, what):
    """One name or a list of names -> a list of str (layers given as objects use their .name, layer
    classes their class name)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    out = []
    for item in items:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, type):
            out.append(_PADDLE_LAYER_TYPES.get(item.__name__, item.__name__))
        elif hasattr(item, "name") and isinstance(item.name, str):
            out.append(item.name)
        else:
            raise TypeError(f"{what}: expected a name (str) or a list of names, got {type(item).__name__}")
    return out


class _Unset:
    def __repr__(self):
        return "<slimquant default>"


_UNSET = _Unset()


class QuantConfig:
    """Which nodes are quantized and how (seed 003). Rules, highest priority first: per layer
    (add_layer_config: exact node names), per name (add_name_config: globs on node names such as
    "/layer1/*"), per op type (add_type_config: "Conv", "MatMul" or the documents' "conv2d", "mul"),
    then the global activation / weight given here. An observer class picks the algorithm, a quanter
    the QAT quanter.

    QuantConfig(activation=None, weight=None) quantizes nothing until a layer, name or type rule
    says so (PaddleSlim's meaning). QuantConfig() with no arguments quantizes every quantizable layer
    with slimquant's defaults (EMDObserver for activations, AbsMaxChannelWiseWeightObserver for
    weights); so does a part left unset or None while the other is given. A rule whose activation
    and weight are both None leaves its nodes in float.
    """

    def __init__(self, activation=_UNSET, weight=_UNSET):
        self._config = _sq._QuantConfig(_sq.QuantRule())
        self._quanters = []  # (where, quanter): post-training flows warn that they do not train
        self._quanter_specs = {}  # spec name (what the rules hold) -> (quanter, part)
        self._weight_bits_from = None  # the weight quanter whose quant_bits set the config's weight bits
        if activation is None and weight is None:
            self._config.global_rule = _sq.QuantRule(quantize=False)
        else:
            self._config.global_rule = self._rule(None if activation is _UNSET else activation,
                                                  None if weight is _UNSET else weight, global_rule=True,
                                                  where="QuantConfig")

    def _rule(self, activation, weight, global_rule=False, where="QuantConfig"):
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
                name = type(value).__name__
                if part == "activation" and value.role == "weight":
                    raise invalid(f"{where}: {name} observes weights; it cannot be the activation observer "
                                  "(activations: AbsmaxObserver, AVGObserver, MSEObserver, EMDObserver, "
                                  "HistObserver, KLObserver)")
                if part == "weight" and value.weight_algo is None:
                    raise invalid(f"{where}: {name} observes activations only, not weights; for weights use "
                                  f"{_WEIGHT_OBSERVERS}")
                setattr(rule, part, value.algo if part == "activation" else value.weight_algo)
                value._apply(self._config)
                if part == "weight" and value.quant_bits != 8:
                    self._config.weight_bits = value.quant_bits
            elif isinstance(value, _Quanter):
                value._check_role(part, where)
                setattr(rule, part + "_quanter", self._register_quanter(value, part, where))
                self._quanters.append((f"{where} {part}", value))
            elif isinstance(value, str):
                known = _sq.activation_algos() if part == "activation" else _sq.weight_algos()
                if value.lower() not in [k.lower() for k in known]:
                    raise invalid(f"{where}: unknown {part} observer '{value}' (known: {', '.join(known)})")
                setattr(rule, part, value)  # the library's own name ("KL", "mse_channel_wise", ...)
            else:
                raise TypeError(f"{where} {part}: expected an observer, a quanter or a name, got {value!r}")
        return rule

    def _register_quanter(self, quanter, part, where):
        """The name the rule holds for `quanter` in `part`: one per quanter object and role, so that
        QAT finds its settings (QATOptions.quanter_specs)."""
        for key, (known, known_part) in self._quanter_specs.items():
            if known is quanter and known_part == part:
                return key
        key = f"{quanter.name}#{len(self._quanter_specs) + 1}"
        self._quanter_specs[key] = (quanter, part)
        bits = quanter._weight_bits() if part == "weight" else None
        if bits is not None:
            previous = self._weight_bits_from
            if previous is not None and previous.quant_bits != bits:
                raise invalid(f"{where}: {type(quanter).__name__} quant_bits={bits} differs from {previous!r}: the "
                              "weights of one model are quantized to one bit width (QuantConfig weight_bits)")
            self._weight_bits_from = quanter
            self._config.weight_bits = bits
        return key

    def add_layer_config(self, layer, activation=None, weight=None):
        """Rule for nodes named exactly `layer` (a name or a list of names)."""
        self._config.add_layer_config(_names(layer, "add_layer_config"),
                                      self._rule(activation, weight, where="add_layer_config"))
        return self

    def add_name_config(self, layer_name, activation=None, weight=None):
        """Rule for nodes whose name matches a glob in `layer_name`."""
        self._config.add_name_config(_names(layer_name, "add_name_config"),
                                     self._rule(activation, weight, where="add_name_config"))
        return self

    def add_type_config(self, layer_type, activation=None, weight=None):
        """Rule for nodes of the op types in `layer_type` ("Conv", "conv2d", ...)."""
        self._config.add_type_config(_names(layer_type, "add_type_config"),
                                     self._rule(activation, weight, where="add_type_config"))
        return self

    def add_qat_layer_mapping(self, source, target):
        """Makes the op type `source` quantizable (PaddleSlim maps a layer class to its quantized
        class; an ONNX model has op types): `target` is an op type whose quantization it copies
        ("MatMul", "Conv", "Add", or the documents' "mul", ...), or a dict
        {"activation_inputs": [0], "weight_input": -1, "weight_axis": 0, "compute_op": False}
        (activation_inputs [-1] = every input; weight_input quantized per channel along weight_axis).
        The type is added to quantizable_op_type."""
        (op_type,) = _names(source, "add_qat_layer_mapping source")
        if isinstance(target, dict):
            unknown = set(target) - {"activation_inputs", "weight_input", "weight_axis", "compute_op"}
            if unknown:
                raise invalid(f"add_qat_layer_mapping: unknown spec keys {sorted(unknown)} (known: activation_inputs, "
                              "weight_input, weight_axis, compute_op)")
            inputs = target.get("activation_inputs", [0])
            if not isinstance(inputs, (list, tuple)) or not all(isinstance(i, int) for i in inputs):
                raise TypeError("add_qat_layer_mapping: activation_inputs must be a list of input indices")
            self._config.add_qat_layer_mapping_spec(
                op_type, list(inputs), check_int(target.get("weight_input", -1), "weight_input", -1),
                check_int(target.get("weight_axis", 0), "weight_axis", 0),
                check_bool(target.get("compute_op", False), "compute_op"))
        else:
            (like,) = _names(target, "add_qat_layer_mapping target")
            self._config.add_qat_layer_mapping_like(op_type, like)
        return self

    # The flow settings of seed 002 are part of the config too.
    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.__dict__["_config"], name)

    def set(self, **settings):
        """quantizable_op_type, is_full_quantize, skip_tensor_list, skip_quant, weight_bits,
        deploy_backend, hist_percent, asymmetric_activations, bias_correction."""
        for key, value in settings.items():
            if not hasattr(self._config, key) or key.startswith("add_") or key in ("validate", "fingerprint"):
                raise TypeError(f"QuantConfig.set: unknown setting '{key}'")
            setattr(self._config, key, value)
        return self

    @classmethod
    def from_yaml(cls, path):
        """The CLI's --config YAML (the documents' keys); returns (QuantConfig, other keys as dict).
        Keys about the written file that a QuantConfig cannot carry are checked here: onnx_format:
        false warns (the output is always ONNX QDQ); optimize_model is honoured (BatchNorm is always
        folded into the convolutions, what Paddle's optimize_model does) and warns when false;
        save_model_filename / save_params_filename are returned in the dict for the caller
        (quant_post_static uses them) and warn when nothing reads them."""
        config, extra = _sq.load_quant_config_yaml(os.fspath(path))
        self = cls.__new__(cls)
        self._config = config
        self._quanters = []
        self._quanter_specs = {}
        self._weight_bits_from = None
        _check_output_keys(extra, f"config file '{os.fspath(path)}'")
        return self, extra


_FALSE_TEXT = ("false", "False", "FALSE", "0", "no", "No", "off")


def _check_output_keys(extra, where):
    """Warn about the YAML keys that describe Paddle's output format and change nothing here."""
    if extra.get("onnx_format") in _FALSE_TEXT:
        warn_unused(f"{where}: onnx_format: false", "Paddle's fake-quantized program format is not available; "
                    "slimquant writes an ONNX QDQ model (what onnx_format: true writes)")
    if extra.get("optimize_model") in _FALSE_TEXT:
        warn_unused(f"{where}: optimize_model: false", "BatchNorm is always folded into the preceding "
                    "convolution before calibration (an exact rewrite; Paddle's optimize_model does the same)")


def _warn_quanters(config, who):
    for where, quanter in getattr(config, "_quanters", []):
        warn(f"{who}: {where} is {type(quanter).__name__}{' ' + str(quanter.kwargs) if quanter.kwargs else ''}: "
             "quanters train in quantization-aware training (slimquant.QAT, or slimquant qat); post-training "
             "quantization calibrates that part with its observer instead")


def _model(model, model_filename=None, params_filename=None):
    """A path (file or folder) or a Model -> Model."""
    if isinstance(model, _sq.Model):
        return model
    refuse_paddle_model(model, model_filename, params_filename)
    return _sq.load_model(check_path(model, "model"), model_filename or "", params_filename or "")


class ObservedModel:
    """PTQ.quantize()'s result: calling it with a calibration batch (a dict of input name -> array,
    or an array) feeds the observers and returns the model's outputs, as running PaddleSlim's
    observed model does: the output array for a single-output model, otherwise a list in the
    model's output order. (The outputs come from a second, plain FP32 run of the batch.)"""

    def __init__(self, ptq):
        self._ptq = ptq
        self._session = None

    def __call__(self, batch):
        self._ptq.sample(batch)
        if self._session is None:
            self._session = _sq.Session(self._ptq.float_model)
        outputs = list(self._session.run(batch).values())
        return outputs[0] if len(outputs) == 1 else outputs

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
        if config is not None and not isinstance(config, QuantConfig):
            raise TypeError(f"PTQ: config must be a QuantConfig, got {type(config).__name__}")
        config = config if config is not None else QuantConfig()
        _warn_quanters(config, "PTQ")
        self._ptq = _sq._PTQ(config._config)
        self._observed = None

    def quantize(self, model, inplace=False, model_filename=None, params_filename=None):
        """Attaches the observers to `model` (an .onnx path, a folder with model_filename, or a
        Model); returns the observed model to call on calibration batches."""
        if check_bool(inplace, "inplace"):
            warn_unused("PTQ.quantize: inplace=True", "an ONNX model is not changed in place; use the returned model")
        self._ptq.quantize(_model(model, model_filename, params_filename))
        self._observed = ObservedModel(self._ptq)
        return self._observed

    def convert(self, model=None, inplace=False, only_layers=None):
        """The QDQ model (slimquant.Model: .save(path), or Session(model)); only_layers: the names
        of the layers to quantize (from .layers), all when None."""
        if model is not None and model is not self._observed:
            raise invalid("PTQ.convert: model is not the model this PTQ's quantize() returned")
        if check_bool(inplace, "inplace"):
            warn_unused("PTQ.convert: inplace=True", "the QDQ model is a new model; use the returned model")
        if only_layers is not None:
            only_layers = check_str_list(only_layers, "only_layers", allow_none=False)
            known = {layer["name"] for layer in self._ptq.layers}
            unknown = [name for name in only_layers if name not in known]
            if unknown:
                raise invalid(f"PTQ.convert: only_layers names unknown layers {unknown} (the quantizable layers are "
                              f"PTQ.layers' names, e.g. {sorted(known)[:3]})")
        return self._ptq.convert(only_layers)

    @property
    def layers(self):
        return self._ptq.layers


# ---- quantization-aware training (seed 003's QAT): the library's train::QAT


def _as_array(value, what, dtype=None):
    try:
        array = np.asarray(value)
    except Exception as e:  # noqa: BLE001 (anything numpy cannot read is the caller's type error)
        raise TypeError(f"{what}: expected an array, got {type(value).__name__}") from e
    if array.dtype == object:
        raise TypeError(f"{what}: expected a numeric array, got {type(value).__name__}")
    return array if dtype is None else array.astype(dtype, copy=False)


def _sample_array(value, input_name, what):
    """One batch of model input: an array, a dict {input name: array}, or (array, label)."""
    if isinstance(value, dict):
        if len(value) != 1 or (input_name is not None and input_name not in value):
            raise invalid(f"{what}: a dict batch must hold exactly the model input '{input_name}' "
                          f"(got {sorted(value)})")
        value = next(iter(value.values()))
    elif isinstance(value, (tuple, list)) and len(value) >= 1 and not np.isscalar(value[0]) and (
            isinstance(value[0], dict) or hasattr(value[0], "__array__") or hasattr(value[0], "shape")):
        return _sample_array(value[0], input_name, what)
    return np.ascontiguousarray(_as_array(value, what, np.float32))


def _labels_array(value, count, what):
    labels = _as_array(value, what).reshape(-1)
    if labels.dtype.kind not in "iu":
        raise TypeError(f"{what}: labels must be integers (class indices), got dtype {labels.dtype}")
    if labels.size != count:
        raise invalid(f"{what}: {labels.size} labels for {count} samples")
    return np.ascontiguousarray(labels.astype(np.int64))


def _is_array_like(value):
    return isinstance(value, np.ndarray) or hasattr(value, "__array__")


def _collect(data, what, input_name, labels_required):
    """Training or calibration data -> (samples [N, ...] float32, labels [N] int64 or None).
    Accepted: a tuple (samples, labels) of arrays; an array of samples (calibration); an iterable of
    batches (x, y), [x, y], {input: x} or x; or a callable returning such an iterator (a reader)."""
    if data is None:
        raise TypeError(f"{what} is required: (images, labels) arrays or an iterable of (x, y) batches")
    if isinstance(data, tuple) and len(data) == 2 and _is_array_like(data[0]) and _is_array_like(data[1]) and \
            np.ndim(data[1]) == 1 and len(data[1]) == len(data[0]) and np.ndim(data[0]) > 1:
        samples = _sample_array(data[0], input_name, what)
        return samples, _labels_array(data[1], len(samples), what)
    if _is_array_like(data) and not isinstance(data, (list, tuple)):
        if labels_required:
            raise invalid(f"{what}: samples without labels; give (images, labels) or (x, y) batches")
        return _sample_array(data, input_name, what), None
    check_data(data, what)
    iterable = data() if callable(data) and not hasattr(data, "__iter__") else data
    xs, ys = [], []
    for item in iterable:
        x = _sample_array(item, input_name, what)
        label = None
        if isinstance(item, (tuple, list)) and len(item) >= 2:
            label = item[1]
        if label is None and labels_required:
            raise invalid(f"{what}: batch {len(xs)} has no labels; give (x, y) batches")
        xs.append(x if x.ndim > 1 else x[None])
        if label is not None:
            ys.append(_labels_array(label, len(xs[-1]), what))
    if not xs:
        raise _sq.InvalidDataError(f"{what} is empty")
    samples = np.ascontiguousarray(np.concatenate(xs))
    labels = np.concatenate(ys) if ys and len(ys) == len(xs) else None
    return samples, labels


def _aligned(array):
    """The library reads C-contiguous arrays in place when 64-byte aligned; the data is copied into
    an aligned buffer once here instead of on every call."""
    if array.ctypes.data % 64 == 0:
        return array
    buffer = np.empty(array.nbytes + 64, dtype=np.uint8)
    offset = (-buffer.ctypes.data) % 64
    out = buffer[offset:offset + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


_OPTIMIZERS = ("sgd", "adam", "adamw")
_LR_SCHEDULES = ("cosine", "step", "constant")


class QATModel:
    """QAT.quantize()'s result: the model with a quanter on every tensor PTQ would quantize, trained
    by the library's engine (the code `slimquant qat` runs).

    model(x) / forward(x): the first output of the fake-quantized model (evaluation mode: what the
    converted INT8 model computes) for a batch x (array, {input: array} or (array, label)).
    train_step(x, y, lr=None): one optimizer step on a batch, returns the loss (cross-entropy with
    the labels y, or the distillation loss without them when configured with distill=True).
    train(data, epochs=1, ...): epochs over (images, labels) or (x, y) batches, shuffled per epoch.
    QAT.convert(model) gives the QDQ slimquant.Model."""

    def __init__(self, qat_config, options, model, calibration_data=None):
        self._config = qat_config
        self._options = options
        self._float_model = model
        self._input_name = model.inputs[0].name
        self._trained = False
        self._prepare(calibration_data)

    def _prepare(self, calibration_data):
        samples = None
        if calibration_data is not None:
            samples, _ = _collect(calibration_data, "calibration_data", self._input_name, labels_required=False)
            samples = _aligned(samples)
        impl = _sq._QAT(self._config, self._options)
        impl.prepare(self._float_model, samples)
        self._impl = impl

    # -- calibration

    def calibrate(self, data, batch_size=None, batch_nums=None):
        """Initialises the activation quanters from a PTQ calibration (the config's observers) on
        `data`: batch_nums batches of batch_size samples (defaults: those QAT.quantize was given),
        as `slimquant qat` does with --calib-batches. Only before training: it prepares the model
        again from the float weights."""
        if self._trained:
            raise invalid("calibrate: the model has been trained already; calibrate before training (or "
                          "QAT.quantize(..., calibration_data=...))")
        if batch_size is not None:
            self._options.batch_size = check_int(batch_size, "batch_size", 1)
        if batch_nums is not None:
            self._options.calib_batches = check_int(batch_nums, "batch_nums", 1)
        self._prepare(data)
        return self

    @property
    def calibrated(self):
        return self._impl.calibrated

    # -- evaluation

    def forward(self, x):
        return self._impl.simulate(_sample_array(x, self._input_name, "model input"))

    __call__ = forward

    # -- training

    def configure(self, optimizer=None, lr=None, momentum=None, nesterov=None, weight_decay=None, distill=None,
                  temperature=None):
        """Optimizer and loss for train_step (train() takes the same arguments): optimizer "sgd"
        (momentum 0.9, the default), "adam" or "adamw"; lr the default rate of train_step (None: 1e-3
        for sgd, 1e-4 for adam/adamw); distill=True learns from the float model's outputs (KL
        divergence at `temperature`), no labels needed. Starts a fresh optimizer state."""
        o = self._options
        if optimizer is not None:
            o.optimizer = check_choice(optimizer, "optimizer", _OPTIMIZERS)
            if lr is None:
                o.lr = 0.0  # the optimizer's default rate
        if lr is not None:
            o.lr = check_float(lr, "lr", 0.0, float("inf"), low_open=True)
        if momentum is not None:
            o.momentum = check_float(momentum, "momentum", 0.0, 1.0)
        if nesterov is not None:
            o.nesterov = check_bool(nesterov, "nesterov")
        if weight_decay is not None:
            o.weight_decay = check_float(weight_decay, "weight_decay", 0.0, float("inf"))
        if distill is not None:
            o.distill = check_bool(distill, "distill")
        if temperature is not None:
            o.temperature = check_float(temperature, "temperature", 0.0, float("inf"), low_open=True)
        self._impl.set_training_options(o)
        return self

    def train_step(self, x, y=None, lr=None):
        """One optimizer step of the library's engine on the batch x with labels y (the GIL is
        released meanwhile); returns the loss before the step. lr: this step's rate (default: the
        configured one)."""
        x = _sample_array(x, self._input_name, "train_step x")
        if y is not None:
            y = _labels_array(y, len(x), "train_step y")
        rate = self._impl.lr if lr is None else check_float(lr, "lr", 0.0, float("inf"), low_open=True)
        loss = self._impl.train_step(x, y, rate)
        self._trained = True
        return loss

    @explicit_arguments
    def train(self, data=None, epochs=1, lr=None, optimizer="sgd", batch_size=32, steps_per_epoch=None,
              momentum=0.9, nesterov=False, weight_decay=0.0, lr_schedule="cosine", warmup_fraction=0.05,
              distill=False, temperature=1.0, seed=0, verbose=False):
        """Trains `epochs` epochs over `data`: (images, labels) arrays, or an iterable of (x, y)
        batches (gathered, then shuffled and re-batched by batch_size every epoch, as `slimquant qat`
        does; without labels only with distill=True). lr is the peak rate of the schedule
        (cosine with warmup_fraction linear warmup, step, constant); None: 1e-3 for sgd, 1e-4 for
        adam. steps_per_epoch limits each epoch to that many batches of a fresh shuffle. Each call
        starts a fresh optimizer and schedule. Returns one dict per epoch (epoch, steps, mean_loss,
        seconds, samples); verbose=True prints them."""
        if data is None:
            raise TypeError("train(data, ...): data is required ((images, labels) arrays or (x, y) batches); "
                            "this model is always in evaluation mode outside train()/train_step()")
        o = self._options
        o.epochs = check_int(epochs, "epochs", 0)
        o.batch_size = check_int(batch_size, "batch_size", 1)
        o.steps_per_epoch = check_int(steps_per_epoch, "steps_per_epoch", 1, allow_none=True) or 0
        o.optimizer = check_choice(optimizer, "optimizer", _OPTIMIZERS)
        o.lr = 0.0 if lr is None else check_float(lr, "lr", 0.0, float("inf"), low_open=True)
        o.momentum = check_float(momentum, "momentum", 0.0, 1.0)
        o.nesterov = check_bool(nesterov, "nesterov")
        o.weight_decay = check_float(weight_decay, "weight_decay", 0.0, float("inf"))
        o.lr_schedule = check_choice(lr_schedule, "lr_schedule", _LR_SCHEDULES)
        o.warmup_fraction = check_float(warmup_fraction, "warmup_fraction", 0.0, 1.0)
        o.distill = check_bool(distill, "distill")
        o.temperature = check_float(temperature, "temperature", 0.0, float("inf"), low_open=True)
        o.seed = check_int(seed, "seed", 0)
        verbose = check_bool(verbose, "verbose")
        samples, labels = _collect(data, "data", self._input_name, labels_required=not o.distill)
        self._impl.set_training_options(o)
        reports = []

        def on_epoch(report):
            reports.append(report)
            if verbose:
                print(f"epoch {report['epoch']}/{o.epochs}: mean loss {report['mean_loss']:.4f}, "
                      f"{report['seconds']:.1f} s ({report['samples']} samples)")

        self._trained = True
        self._impl.fit(_aligned(samples), labels, on_epoch)
        return reports

    # -- inspection

    @property
    def layers(self):
        """The quantized layers (name, op_type, activations, weight), as PTQ.layers."""
        return self._impl.layers

    @property
    def quanters(self):
        """Per quantized tensor: type, is_weight, bits, parameters (name -> array: alpha, scale,
        beta) and the exported scale / zero_point / dtype (None before a lazily initialised quanter
        has seen data)."""
        return self._impl.quanters

    @property
    def steps(self):
        """Optimizer steps since the optimizer was (re)started."""
        return self._impl.optimizer_steps

    def ptq_model(self):
        """The PTQ model of the calibration (the baseline QAT improves on); needs calibration data."""
        return self._impl.ptq_model()


class QAT:
    """Seed 003's quantization-aware training: QAT(config).quantize(model) -> a trainable QATModel
    (train it: model.train(data) or model.train_step(x, y) in your own loop) -> QAT.convert(model)
    -> the QDQ slimquant.Model, the form `slimquant qat` writes.

    The config's quanters (PACTQuanter, WeightLSQplusQuanter, ActLSQplusQuanter,
    FakeQuanterWithAbsMaxObserver) choose the quanter per rule; parts given an observer (or left
    unset) get the library's defaults, `slimquant qat`'s: WeightLSQplusQuanter per channel for
    weights, PACT for activations. Observers choose the calibration that initialises them."""

    def __init__(self, config=None):
        if config is not None and not isinstance(config, QuantConfig):
            raise TypeError(f"QAT: config must be a QuantConfig, got {type(config).__name__}")
        self._config = config if config is not None else QuantConfig()

    def _options(self, batch_size, batch_nums, num_threads):
        o = _sq._QATOptions()
        o.batch_size = check_int(batch_size, "batch_size", 1)
        o.calib_batches = check_int(batch_nums, "batch_nums", 1)
        o.num_threads = check_int(num_threads, "num_threads", 0)
        for key, (quanter, part) in self._config._quanter_specs.items():
            o.add_quanter_spec(key, quanter.name, **quanter._spec(part))
        return o

    def quantize(self, model, inplace=False, *, calibration_data=None, batch_size=32, batch_nums=8, num_threads=0,
                 model_filename=None, params_filename=None):
        """Puts quanters on `model` (an .onnx path, a folder with model_filename, or a Model) and
        returns the trainable QATModel. calibration_data (optional, as model.calibrate): a PTQ
        calibration over batch_nums batches of batch_size samples initialises the activation
        quanters, as `slimquant qat` does; without it they start from the first batch they see.
        num_threads: threads of every engine call of the model (0: all cores; 1 is much faster on
        a machine busy with other work, as the CLI's --threads)."""
        if check_bool(inplace, "inplace"):
            warn_unused("QAT.quantize: inplace=True", "an ONNX model is not changed in place; use the returned model")
        graph = _model(model, model_filename, params_filename)
        if len(graph.inputs) != 1:
            raise _sq.UnsupportedError(f"QAT trains single-input models; this one has {len(graph.inputs)} inputs")
        return QATModel(self._config._config, self._options(batch_size, batch_nums, num_threads), graph,
                        calibration_data)

    def convert(self, model, inplace=False):
        """The QDQ slimquant.Model of the trained model (.save(path), Session(model)): the trained
        weights quantized by their quanters' scales, the activations' Q/DQ pairs from theirs."""
        if not isinstance(model, QATModel):
            raise TypeError(f"QAT.convert: model must be what QAT.quantize returned, got {type(model).__name__}")
        if check_bool(inplace, "inplace"):
            warn_unused("QAT.convert: inplace=True", "the QDQ model is a new model; use the returned model")
        return model._impl.convert()


# activation_quantize_type: Paddle's values name the fake-quant op of its training-format program;
# the scale itself comes from `algo` there as here, and a QDQ model's activation scales are fixed
# at inference (what all three mean once deployed). slimquant's own values choose the grid.
_PADDLE_ACTIVATION_QUANTIZE_TYPES = ("range_abs_max", "moving_average_abs_max", "abs_max")
_ACTIVATION_QUANTIZE_TYPES = _PADDLE_ACTIVATION_QUANTIZE_TYPES + ("symmetric", "asymmetric")
_WEIGHT_QUANTIZE_TYPES = ("channel_wise_abs_max", "abs_max", "mse_channel_wise", "mse")
# What a QuantConfig decides; given together with config= they would be dropped, so they conflict.
_CONFIG_DECIDES = ("algo", "weight_quantize_type", "weight_bits", "quantizable_op_type", "is_full_quantize",
                   "hist_percent", "skip_tensor_list", "skip_quant", "activation_quantize_type", "deploy_backend",
                   "bias_correction")


def _check_algo(algo):
    known = _sq.activation_algos()
    if not isinstance(algo, str):
        raise TypeError(f"algo must be a str, one of {', '.join(known)}; got {type(algo).__name__} {algo!r}")
    if algo.lower() == "ptf":
        raise _sq.UnsupportedError("algo='ptf' (power-of-two factors per channel) is not implemented; use 'KL', "
                                   "'hist', 'mse', 'emd', 'avg', 'abs_max' or 'min_max'")
    if algo.lower() not in [k.lower() for k in known]:
        raise invalid(f"algo must be one of {', '.join(known)} (got {algo!r})")
    return algo


def _check_round_type(round_type):
    check_choice(round_type, "round_type", ("round", "adaround"))
    if round_type == "adaround":
        raise _sq.UnsupportedError("round_type='adaround' is not implemented (weights are rounded to nearest, "
                                   "round_type='round'); bias_correction=True and the precision fallback "
                                   "(fallback_sqnr_db) are slimquant's remedies for a model that loses accuracy")


def _output_path(directory, file_name, params_name, directory_arg, file_arg, params_arg):
    """Where the QDQ model goes: `directory` itself when it ends in .onnx, else directory/file_name
    (default model.onnx; a Paddle program name gets the .onnx suffix instead, with a warning)."""
    path = check_path(directory, directory_arg)
    if params_name is not None:
        check_path(params_name, params_arg)
        warn_unused(params_arg, "the ONNX model file holds the quantized weights; no separate parameters file is written")
    if path.endswith(".onnx") and file_name is None:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        return path
    name = check_path(file_name, file_arg) if file_name is not None else "model.onnx"
    if os.path.basename(name) != name or not name:
        raise invalid(f"{file_arg} must be a file name without folders (got {name!r})")
    stem, suffix = os.path.splitext(name)
    if suffix != ".onnx":
        onnx_name = (stem if suffix in (".pdmodel", ".pdiparams") else name) + ".onnx"
        if name == "__model__":
            onnx_name = "model.onnx"
        warn(f"{file_arg}={name!r}: slimquant writes an ONNX model, saved as {onnx_name!r}")
        name = onnx_name
    os.makedirs(path, exist_ok=True)
    return os.path.join(path, name)


class PostTrainingQuantization:
    """Seed 002's post-training quantization over an ONNX model, with PaddleSlim's defaults
    (algo="KL", batch_size=10, batch_nums=None: every sample).

    Calibration data, exactly one of:
      sample_generator: yields one sample at a time (without batch dimension, or with 1), stacked
                        into batches of batch_size; batch_nums batches (all when None);
      data_loader / batch_generator: yields whole batches (batch_size does not apply; batch_nums
                        counts batches).
    Each item is a dict of input name -> array, an array (single-input models) or a tuple
    (array, label); the data is any iterable, or a callable returning an iterator (a reader).
    executor and scope are accepted for the documents' code and not used (slimquant runs on its own
    CPU runtime; a warning says so). algo: "KL", "hist", "abs_max" (= "direct"), "min_max", "avg",
    "mse", "emd", "auto" (the CLI's default: the candidate closest to FP32, docs/quantization.md). config
    (a QuantConfig) decides algo, weight_quantize_type,
    quantizable_op_type, ...: giving both is an error naming them. mode="weight-only" quantizes the
    weights only (per channel; activations stay float) and takes no calibration data (as
    quant_post_dynamic); mode="dynamic" quantizes the weights per channel and the MatMul / Gemm / Conv
    inputs per inference (ONNX Runtime's quantize_dynamic form), with no calibration data either.
    With mode="weight-only" and weight_bits=4, MatMul / Gemm weights are stored
    as INT4 with one scale per block_size (32, 64 or 128) input features (an opset-21 blocked
    DequantizeLinear); weight_rounding="gptq" rounds them by GPTQ from the calibration data given
    (rounding to nearest, "rtn", without data); int4_activations="int8" makes our runtime round each
    group of 32 activations to int8 before multiplying by them (ONNX Runtime's default for 4-bit
    MatMuls: faster at batch 1, at that rounding's cost; "float", the default, keeps them exact).
    """

    @explicit_arguments
    def __init__(self, executor=None, sample_generator=None, model_dir=None, model_filename=None,
                 params_filename=None, batch_size=10, batch_nums=None, scope=None, algo="KL",
                 quantizable_op_type=None, is_full_quantize=False, is_use_cache_file=False,
                 cache_dir="./temp_post_training", *, data_loader=None, batch_generator=None,
                 weight_bits=8, activation_bits=8, weight_quantize_type="channel_wise_abs_max",
                 onnx_format=True, skip_tensor_list=None, skip_quant=None, hist_percent=0.99999,
                 deploy_backend="slimquant", activation_quantize_type="range_abs_max", round_type="round",
                 bias_correction=False, fallback_sqnr_db=20.0, config=None, mode="static", block_size=None,
                 weight_rounding="rtn", int4_activations="float"):
        who = type(self).__name__
        mode = check_choice(mode, "mode", ("static", "weight-only", "weight_only", "dynamic"))
        if executor is not None:
            warn_unused("executor", "slimquant runs the ONNX model on its own CPU runtime")
        if scope is not None:
            warn_unused("scope", "the ONNX model holds its weights; there is no Paddle scope to read them from")
        if model_dir is None:
            raise invalid(f"{who} needs model_dir (an .onnx file, or a folder with model_filename)")
        model_dir = check_path(model_dir, "model_dir")
        refuse_paddle_model(model_dir, model_filename, params_filename)
        if check_int(activation_bits, "activation_bits") != 8:
            raise invalid(f"activation_bits must be 8 (got {activation_bits}): activations are quantized to int8")
        if not check_bool(onnx_format, "onnx_format"):
            warn_unused("onnx_format=False", "Paddle's fake-quantized program format is not available; slimquant "
                        "writes an ONNX QDQ model (what onnx_format=True writes)")
        _check_round_type(round_type)

        given = {name: data for name, data in (("sample_generator", sample_generator),
                                                ("batch_generator", batch_generator),
                                                ("data_loader", data_loader)) if data is not None}
        for name, data in given.items():
            check_data(data, name)
        if len(given) > 1:
            raise invalid(f"{' and '.join(given)} are both given: give exactly one source of calibration data")
        if not given and mode == "static":
            raise invalid(f"{who} needs calibration data: sample_generator, batch_generator or data_loader "
                          "(mode='weight-only' and mode='dynamic' need none)")
        weight_rounding = check_choice(weight_rounding, "weight_rounding", ("rtn", "gptq"))
        if given and mode != "static" and not (mode in ("weight-only", "weight_only") and weight_rounding == "gptq"):
            raise invalid(f"mode={mode!r} calibrates nothing: {next(iter(given))} would not be used")
        batch_size = check_int(batch_size, "batch_size", 1)
        if "batch_size" in self._explicit and given and "sample_generator" not in given:
            warn_unused("batch_size", f"{next(iter(given))} yields whole batches (batch_size applies to "
                        "sample_generator)")
        batch_nums = check_int(batch_nums, "batch_nums", 1, allow_none=True)

        if config is not None:
            if not isinstance(config, QuantConfig):
                raise TypeError(f"config must be a QuantConfig, got {type(config).__name__}")
            clash = [name for name in _CONFIG_DECIDES if name in self._explicit]
            if clash:
                raise invalid(f"config and {', '.join(clash)} are both given: the QuantConfig decides "
                              f"{', '.join(clash)}; set them on the QuantConfig (its observers, or "
                              "QuantConfig.set(...)) instead")
            _warn_quanters(config, who)

        o = _sq._PostTrainingQuantizationOptions()
        o.model_dir = model_dir
        o.model_filename = model_filename or ""
        o.params_filename = params_filename or ""
        o.batch_size = batch_size
        o.batch_nums = batch_nums
        o.algo = _check_algo(algo)
        o.weight_quantize_type = check_choice(weight_quantize_type, "weight_quantize_type", _WEIGHT_QUANTIZE_TYPES)
        o.weight_bits = check_int(weight_bits, "weight_bits", 2, 8)
        o.deploy_backend = check_choice(deploy_backend, "deploy_backend", ("slimquant", "onnxruntime", "tensorrt"))
        if quantizable_op_type is not None:
            o.quantizable_op_type = check_str_list(quantizable_op_type, "quantizable_op_type", allow_none=False)
        o.is_full_quantize = check_bool(is_full_quantize, "is_full_quantize")
        o.hist_percent = check_float(hist_percent, "hist_percent", 0.0, 1.0, low_open=True)
        o.skip_tensor_list = check_str_list(skip_tensor_list, "skip_tensor_list")
        o.skip_quant = check_str_list(skip_quant, "skip_quant")
        check_choice(activation_quantize_type, "activation_quantize_type", _ACTIVATION_QUANTIZE_TYPES)
        o.asymmetric_activations = activation_quantize_type == "asymmetric"
        o.bias_correction = check_bool(bias_correction, "bias_correction")
        o.is_use_cache_file = check_bool(is_use_cache_file, "is_use_cache_file")
        o.cache_dir = check_path(cache_dir if cache_dir is not None else "./temp_post_training", "cache_dir")
        o.fallback_sqnr_db = check_float(fallback_sqnr_db, "fallback_sqnr_db", 0.0, float("inf"))
        if config is not None:
            o.config = config._config
        o.mode = mode
        o.block_size = check_int(block_size, "block_size", 32, 128, allow_none=True) or 0
        o.weight_rounding = weight_rounding
        o.int4_activations = check_choice(int4_activations, "int4_activations", ("float", "int8"))
        if "sample_generator" in given:
            o.set_sample_generator(sample_generator)
        elif given:
            o.set_batch_generator(next(iter(given.values())))
        self._impl = _sq._PostTrainingQuantization(o)
        self._quantized = None

    def quantize(self):
        """Calibrates and converts; returns the QDQ model (slimquant.Model)."""
        self._quantized = self._impl.quantize()
        for w in self._impl.warnings:
            warn(w)
        return self._quantized

    def save_quantized_model(self, save_model_path, model_filename=None, params_filename=None):
        """Writes the QDQ model: to save_model_path itself when it ends in .onnx, otherwise into that
        folder (created) as model_filename (default model.onnx; a Paddle name such as model.pdmodel
        becomes model.onnx, with a warning). params_filename is not used: the ONNX file holds the
        weights. Returns the file's path."""
        if self._quantized is None:
            raise invalid("save_quantized_model: call quantize() first")
        path = _output_path(save_model_path, model_filename, params_filename, "save_model_path", "model_filename",
                            "params_filename")
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
    def algo_choice(self):
        """With algo="auto": the observer chosen and what each candidate measured against FP32 (dict:
        chosen, channel_wise_conv_inputs, samples, held_back, scores, description); chosen is ""
        for an explicit algo."""
        return self._impl.algo_choice

    @property
    def layers(self):
        return self._impl.ptq.layers
