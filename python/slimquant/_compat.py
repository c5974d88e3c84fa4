"""What PaddleSlim users' code needs from us besides the class names: Paddle-style eval functions
(exe, program, feed_names, fetch_list) run against our Session, parameter checks that name the
parameter at fault, warnings for parameters accepted without effect, and a clear refusal of Paddle
model files (slimquant reads ONNX)."""
import functools
import inspect
import numbers
import os
import sys
import warnings

import numpy as np

from . import _slimquant as _sq

# ---- parameters


def explicit_arguments(func):
    """Decorator: records in self._explicit (methods) the names of the arguments the caller gave,
    so that a conflict (config= and algo=) is detected even when the value equals the default."""
    signature = inspect.signature(func)

    @functools.wraps(func)
    def wrapper(self, *args, **kwargs):
        self._explicit = set(signature.bind(self, *args, **kwargs).arguments) - {"self"}
        return func(self, *args, **kwargs)

    return wrapper


def explicit_arguments_function(impl):
    """Decorator for functions: impl(explicit, *args, **kwargs) is called with the set of argument
    names the caller gave; the public signature is impl's without `explicit`."""
    signature = inspect.signature(impl)
    public = signature.replace(parameters=list(signature.parameters.values())[1:])

    @functools.wraps(impl)
    def wrapper(*args, **kwargs):
        return impl(set(public.bind(*args, **kwargs).arguments), *args, **kwargs)

    wrapper.__signature__ = public
    return wrapper


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def user_stacklevel():
    """The warnings.warn stacklevel of the first caller outside this package (for the caller of
    this function's caller: the code that passed the parameter)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _PACKAGE_DIR:
        frame, level = frame.f_back, level + 1
    return level


def warn(message):
    warnings.warn(message, UserWarning, stacklevel=user_stacklevel())


def warn_unused(parameter, why):
    """A parameter accepted for the documents' code that changes nothing here: say so, naming it."""
    warnings.warn(f"{parameter} is accepted and not used: {why}", UserWarning, stacklevel=user_stacklevel())


def invalid(message):
    """A wrong value: slimquant.InvalidArgumentError, which is a ValueError."""
    return _sq.InvalidArgumentError(message)


def check_bool(value, name):
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    # A string here is the classic bug ("False" is true): refuse it rather than guess.
    raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def check_int(value, name, minimum=None, maximum=None, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        expected = "an int or None" if allow_none else "an int"
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum or maximum is not None and value > maximum:
        bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise invalid(f"{name} must be {bounds}" + (" or None" if allow_none else "") + f" (got {value})")
    return value


def check_float(value, name, low, high, low_open=False):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not (low < value if low_open else low <= value) or not value <= high or not np.isfinite(value):
        raise invalid(f"{name} must be in {'(' if low_open else '['}{low}, {high}] (got {value})")
    return value


def check_choice(value, name, choices):
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, one of {', '.join(choices)}; got {type(value).__name__} {value!r}")
    if value not in choices:
        raise invalid(f"{name} must be one of {', '.join(choices)} (got {value!r})")
    return value


def check_str_list(value, name, allow_none=True):
    """A list of names (a single str is refused: iterating it would give characters)."""
    if value is None and allow_none:
        return []
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, set, frozenset)):
        raise TypeError(f"{name} must be a list of str, got {type(value).__name__} {value!r}")
    for item in value:
        if not isinstance(item, str):
            raise TypeError(f"{name} must be a list of str; it holds {type(item).__name__} {item!r}")
    return list(value)


def check_path(value, name, allow_none=False):
    if value is None and allow_none:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or os.PathLike), got {type(value).__name__} {value!r}")
    return os.fspath(value)


def check_data(value, name):
    """Calibration or evaluation data: an iterable, or a callable returning an iterator (a reader)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, os.PathLike)) or not (callable(value) or hasattr(value, "__iter__")):
        raise TypeError(f"{name} must be an iterable of batches or a callable returning an iterator (a reader), "
                        f"got {type(value).__name__} {value!r}")
    return value


# ---- Paddle model files

_PADDLE_SUFFIXES = (".pdmodel", ".pdiparams", ".pdparams")


def _paddle_message(path):
    return (f"'{path}' is a PaddlePaddle model (.pdmodel/.pdiparams); slimquant reads ONNX models. Convert it "
            "first with paddle2onnx (pip install paddle2onnx): paddle2onnx --model_dir DIR --model_filename "
            "model.pdmodel --params_filename model.pdiparams --save_file model.onnx, then pass model.onnx as "
            "model_dir")


def refuse_paddle_model(model_dir, model_filename=None, params_filename=None):
    """slimquant.UnsupportedError (the CLI's exit 4) for a Paddle model, with the way to convert it."""
    if model_dir is None or not isinstance(model_dir, (str, os.PathLike)):
        return
    path = os.fspath(model_dir)
    named = [n for n in (model_filename, params_filename) if isinstance(n, str)]
    if path.endswith(_PADDLE_SUFFIXES) or os.path.basename(path) == "__model__":
        raise _sq.UnsupportedError(_paddle_message(path))
    for n in named:
        if n.endswith(_PADDLE_SUFFIXES) or n == "__model__":
            raise _sq.UnsupportedError(_paddle_message(os.path.join(path, n)))
    if os.path.isdir(path) and not model_filename:
        entries = os.listdir(path)
        if not any(e.endswith(".onnx") for e in entries):
            paddle = [e for e in entries if e.endswith(".pdmodel") or e == "__model__"]
            if paddle:
                raise _sq.UnsupportedError(_paddle_message(os.path.join(path, paddle[0])))


# ---- eval_function: slimquant's eval_function(session) or Paddle's (exe, program, feed_names, fetch_list)


class Program:
    """The candidate model handed to a Paddle-style eval_function as `program`: opaque, only for
    passing back to exe.run (as a paddle.static.Program is)."""

    def __init__(self, session):
        self._session = session

    @property
    def session(self):
        """The slimquant.Session running this model (valid during the eval_function call)."""
        return self._session

    def __repr__(self):
        return "<slimquant program: the model under evaluation>"


class FetchTarget(str):
    """An output name that also answers .name, as a Paddle fetch Variable does."""

    @property
    def name(self):
        return str(self)


class Executor:
    """What a Paddle-style eval_function receives as `exe`: run() mirrors paddle.static.Executor.run
    on the model under evaluation (slimquant's CPU runtime) and returns a list of numpy arrays in
    fetch_list order."""

    def __init__(self, program):
        self._program = program

    def run(self, program=None, feed=None, fetch_list=None, feed_var_name="feed", fetch_var_name="fetch",
            scope=None, return_numpy=True, use_program_cache=False, use_prune=False):
        # feed_var_name / fetch_var_name / scope / use_program_cache / use_prune steer Paddle's own
        # program execution; here the program is one ONNX model run on one runtime, so they change nothing.
        if program is not None and program is not self._program:
            raise invalid("Executor.run: program is not the model this executor evaluates; pass the `program` "
                          "argument the eval_function received")
        session = self._program.session
        if feed is None:
            feed = {}
        if not isinstance(feed, dict):
            raise TypeError(f"Executor.run: feed must be a dict of input name -> array, got {type(feed).__name__}")
        unknown = sorted(set(feed) - set(session.input_names))
        if unknown:
            raise invalid(f"Executor.run: feed names {unknown} are not inputs of the model (inputs: "
                          f"{session.input_names})")
        if fetch_list is None:
            return []  # as Paddle: nothing asked, nothing fetched
        if isinstance(fetch_list, (str, bytes)) or not isinstance(fetch_list, (list, tuple)):
            fetch_list = [fetch_list]
        names = [f if isinstance(f, str) else getattr(f, "name", None) for f in fetch_list]
        for f, n in zip(fetch_list, names):
            if not isinstance(n, str):
                raise TypeError(f"Executor.run: fetch_list items are output names or objects with .name, got {f!r}")
        outputs = session.run({k: np.asarray(v) for k, v in feed.items()}, output_names=names)
        # return_numpy=False gives Paddle tensors there; numpy arrays serve every use of those
        # (np.array(t), t.shape, indexing), so both return numpy.
        return [outputs[n] for n in names]


def _positional_arity(fn):
    """(required, total) positional parameters of a callable (total None with *args), or None when
    the signature cannot be read (builtins)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positional = [p for p in params if p.kind in kinds]
    required = sum(1 for p in positional if p.default is inspect.Parameter.empty)
    varargs = any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params)
    return required, None if varargs else len(positional)


def is_paddle_eval_function(fn):
    arity = _positional_arity(fn)
    return arity is not None and arity[0] == 4


def session_eval_function(eval_function, who):
    """The user's eval_function as the library calls it (one Session argument). A function with four
    required positional parameters is PaddleSlim's eval_function(exe, program, feed_names,
    fetch_list) and is called that way; anything else gets the Session."""
    if eval_function is None or not callable(eval_function):
        raise TypeError(f"{who}: eval_function is required: a callable eval_function(session) -> float, or "
                        "PaddleSlim's eval_function(exe, program, feed_names, fetch_list) -> float; got "
                        f"{type(eval_function).__name__}")
    arity = _positional_arity(eval_function)
    takes_session = arity is None or arity[0] <= 1 and (arity[1] is None or arity[1] >= 1)
    if not takes_session and arity[0] != 4:
        raise TypeError(f"{who}: eval_function takes {arity[0]} required positional arguments; it must take one "
                        "(a slimquant.Session) or four (exe, program, feed_names, fetch_list, as in PaddleSlim)")
    if arity is None or arity[0] != 4:
        return eval_function

    @functools.wraps(eval_function)
    def call_paddle_style(session):
        program = Program(session)
        fetch_list = [FetchTarget(n) for n in session.output_names]
        return eval_function(Executor(program), program, list(session.input_names), fetch_list)

    return call_paddle_style
