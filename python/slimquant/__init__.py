"""slimquant: ONNX -> INT8 post-training quantization, quantization-aware training, sensitivity analysis and an INT8 CPU runtime.

The names and parameters are the source documents' (PaddleSlim's), adapted to ONNX files; see
docs/python.md for a walkthrough and the table of PaddleSlim names.

    from slimquant import PostTrainingQuantization, quant_post_static, AnalysisQuant, Session
"""
from ._slimquant import (  # noqa: F401  (re-exported)
    Error,
    InvalidArgumentError,
    InvalidDataError,
    InvalidModelError,
    IoError,
    Model,
    Session,
    UnsupportedError,
    load_model,
    set_progress,
)
from ._types import ValueInfo  # noqa: F401
from .quantization import (  # noqa: F401
    AbsmaxObserver,
    AbsMaxChannelWiseWeightObserver,
    ActLSQplusQuanter,
    AVGObserver,
    EMDObserver,
    FakeQuanterWithAbsMaxObserver,
    HistObserver,
    KLObserver,
    MSEChannelWiseWeightObserver,
    MSEObserver,
    PACTQuanter,
    PostTrainingQuantization,
    PTQ,
    QAT,
    QATModel,
    QuantConfig,
    WeightLSQplusQuanter,
)
from .quant_post import quant_post, quant_post_dynamic, quant_post_static  # noqa: F401
from .analysis import AnalysisPTQ, AnalysisQAT, AnalysisQuant  # noqa: F401
from ._compat import Executor, Program  # noqa: F401  (what a Paddle-style eval_function receives)

__version__ = "0.1.0"
