"""Quantization-aware training from Python (seed 003's QAT with PaddleSlim's quanters): the quanters'
arguments reach the library's quanters, a Python loop of train_step lowers the loss, the converted
INT8 model agrees with the simulation, the export is `slimquant qat`'s, and wrong arguments name
themselves."""
import tempfile
import types
import warnings

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import slimquant
from conftest import FASHION_MNIST, batches, read_idx, run_cli

TRAIN_SAMPLES = 256
ONE_THREAD = dict(num_threads=1)  # training's many small parallel regions crawl on a busy 2-core machine


@pytest.fixture(scope="module")
def fashion_train():
    """The first Fashion-MNIST training images (the conftest's preprocessing): what QAT trains on."""
    images = read_idx(FASHION_MNIST / "train-images-idx3-ubyte.gz", TRAIN_SAMPLES).astype(np.float32) / 255.0
    labels = read_idx(FASHION_MNIST / "train-labels-idx1-ubyte.gz", TRAIN_SAMPLES).astype(np.int64)
    return images.reshape(-1, 1, 28, 28), labels


def saved_graph(model):
    with tempfile.TemporaryDirectory() as d:
        model.save(f"{d}/m.onnx")
        return onnx.load(f"{d}/m.onnx").graph


def initializers(graph):
    return {t.name: numpy_helper.to_array(t) for t in graph.initializer}


def weight_codes(graph):
    """The int8 weight initializers feeding DequantizeLinear, by name."""
    inits = initializers(graph)
    return {n.input[0]: inits[n.input[0]] for n in graph.node
            if n.op_type == "DequantizeLinear" and n.input[0] in inits and inits[n.input[0]].dtype == np.int8}


def activation_scales(graph):
    """Scale and zero point of every activation QuantizeLinear, by the tensor it quantizes."""
    inits = initializers(graph)
    return {n.input[0]: (float(inits[n.input[1]]), int(inits[n.input[2]]), inits[n.input[2]].dtype)
            for n in graph.node if n.op_type == "QuantizeLinear"}


def cross_entropy(logits, labels):
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-log_probs[np.arange(len(labels)), labels].mean())


@pytest.fixture(scope="module")
def trained(model_path, fashion_train):
    """QAT with the library's default quanters, calibrated, then a Python loop of train_step."""
    images, labels = fashion_train
    qat = slimquant.QAT(slimquant.QuantConfig())
    model = qat.quantize(model_path, calibration_data=(images, labels), batch_size=32, batch_nums=4, **ONE_THREAD)
    before = cross_entropy(model(images), labels)
    losses = []
    for epoch in range(3):
        for x, y in batches(images, labels):
            losses.append(model.train_step(x, y, lr=0.005))
    after = cross_entropy(model(images), labels)
    return types.SimpleNamespace(qat=qat, model=model, before=before, after=after, losses=losses)


def test_quanter_arguments_reach_the_library(model_path, fashion_train):
    images, _ = fashion_train
    config = slimquant.QuantConfig(activation=slimquant.PACTQuanter(init_value=3.0),
                                   weight=slimquant.WeightLSQplusQuanter(quant_bits=4, per_channel=True))
    # Centred pixels: the stem's input has negative values (signed grid), the ReLU outputs none.
    model = slimquant.QAT(config).quantize(model_path, calibration_data=images[:64] - 0.5, batch_nums=2, **ONE_THREAD)
    quanters = model.quanters
    acts = {t: q for t, q in quanters.items() if not q["is_weight"]}
    weights = {t: q for t, q in quanters.items() if q["is_weight"]}
    assert acts and weights and len(acts) + len(weights) == len(quanters)
    for q in acts.values():
        assert q["type"] == "pact"
        (alpha,) = q["parameters"].values()
        assert float(alpha) == 3.0  # init_value, not the calibrated range
        assert q["scale"] == [pytest.approx(3.0 / (127 if q["dtype"] == "int8" else 255))]
    assert {q["dtype"] for q in acts.values()} == {"int8", "uint8"}  # the stem input is signed, ReLU outputs not

    graph = saved_graph(slimquant.QAT(config).convert(model))  # before training: the initial values
    for tensor, (scale, zero_point, dtype) in activation_scales(graph).items():
        if tensor in acts:
            assert zero_point == 0 and scale == pytest.approx(3.0 / (127 if dtype == np.int8 else 255), rel=1e-6)
    codes = weight_codes(graph)
    assert len(codes) == len(weights)
    for name, w in codes.items():
        assert np.abs(w).max() <= 7, name  # the 4-bit grid
    assert max(int(np.abs(w).max()) for w in codes.values()) == 7
    assert graph_metadata(model, config)["slimquant.weight_bits"] == "4"
    per_channel = [q for q in weights.values() if len(q["scale"]) > 1]
    assert len(per_channel) == len(weights)

    # per_channel=False (PaddleSlim's default): one step per weight.
    model = slimquant.QAT(slimquant.QuantConfig(weight=slimquant.WeightLSQplusQuanter())).quantize(model_path,
                                                                                                 **ONE_THREAD)
    steps = [q["parameters"] for q in model.quanters.values() if q["is_weight"]]
    assert steps and all(next(iter(p.values())).size == 1 for p in steps)


def graph_metadata(model, config):
    with tempfile.TemporaryDirectory() as d:
        slimquant.QAT(config).convert(model).save(f"{d}/m.onnx")
        return {p.key: p.value for p in onnx.load(f"{d}/m.onnx").metadata_props}


def test_pact_learning_rate_scales_alpha_steps(model_path, fashion_train):
    images, labels = fashion_train
    moved = []
    for factor in (None, 50.0):
        config = slimquant.QuantConfig(activation=slimquant.PACTQuanter(learning_rate=factor))
        model = slimquant.QAT(config).quantize(model_path, calibration_data=images[:64], batch_nums=2, **ONE_THREAD)
        before = {t: float(next(iter(q["parameters"].values()))) for t, q in model.quanters.items() if not q["is_weight"]}
        model.train_step(images[:32], labels[:32], lr=1e-3)
        after = {t: float(next(iter(q["parameters"].values()))) for t, q in model.quanters.items() if not q["is_weight"]}
        moved.append({t: after[t] - before[t] for t in before})
    plain, fast = moved
    changed = [t for t in plain if abs(plain[t]) > 1e-7]
    assert changed, "no PACT clip moved in one step"
    for t in changed:  # the first SGD step is lr * factor * gradient, the gradient the same (float32 alpha)
        assert fast[t] / plain[t] == pytest.approx(50.0, rel=1e-2), t


def test_act_lsq_plus_symmetric_and_asymmetric(model_path, fashion_train):
    images, _ = fashion_train
    for quanter, dtypes, params in ((slimquant.ActLSQplusQuanter(), {"int8"}, 1),
                                    (slimquant.ActLSQplusQuanter(sign=False), {"uint8"}, 1),
                                    (slimquant.ActLSQplusQuanter(symmetric=False), {"uint8"}, 2)):
        model = slimquant.QAT(slimquant.QuantConfig(activation=quanter)).quantize(
            model_path, calibration_data=images[:64] - 0.5, batch_nums=2, **ONE_THREAD)  # the stem input is signed
        acts = [q for q in model.quanters.values() if not q["is_weight"]]
        assert {q["type"] for q in acts} == {"lsq_plus"}
        assert {q["dtype"] for q in acts} == dtypes, quanter
        assert {len(q["parameters"]) for q in acts} == {params}, quanter  # scale, or scale and beta
        if quanter.symmetric:
            assert {q["zero_point"][0] for q in acts} == {0}
        else:
            assert any(q["zero_point"][0] != 0 for q in acts)  # the offset of the stem input


def test_python_training_loop_lowers_the_loss(trained):
    assert len(trained.losses) == 24
    assert trained.model.steps == 24
    assert trained.after < trained.before - 0.01, (trained.before, trained.after)
    assert np.mean(trained.losses[-8:]) < np.mean(trained.losses[:8])


def test_int8_session_agrees_with_the_simulation(trained, fashion):
    images, labels = fashion
    int8_model = trained.qat.convert(trained.model)
    session = slimquant.Session(int8_model)
    assert session.is_int8
    real = session.run(images)["logits"]
    simulated = trained.model(images)
    agreement = (real.argmax(1) == simulated.argmax(1)).mean()
    assert agreement >= 0.99, agreement
    assert (real.argmax(1) == labels).mean() > 0.8


def test_fixed_batch_model_trains_in_parts(tmp_path, model_path, fashion_train, capfd):
    """A model whose input declares batch 1 takes a step on 8 samples in parts, with the gradients
    accumulated: the same step as the dynamic model's, and one line saying so."""
    fixed = onnx.load(model_path)
    fixed.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    onnx.save(fixed, str(tmp_path / "fixed.onnx"))
    images, labels = fashion_train[0][:8], fashion_train[1][:8]
    after = {}
    for name, path in (("dynamic", model_path), ("fixed", str(tmp_path / "fixed.onnx"))):
        model = slimquant.QAT(slimquant.QuantConfig()).quantize(
            path, calibration_data=images, batch_size=8, batch_nums=1, **ONE_THREAD)
        capfd.readouterr()
        loss = model.train_step(images, labels, lr=0.005)
        said = capfd.readouterr().err
        after[name] = (loss, model(images))
        assert ("each training step accumulating the gradients of its parts" in said) == (name == "fixed"), said
    assert after["fixed"][0] == pytest.approx(after["dynamic"][0], rel=1e-6)
    np.testing.assert_allclose(after["fixed"][1], after["dynamic"][1], rtol=1e-4, atol=1e-4)


def test_train_matches_the_cli_export(tmp_path, model_path, fashion_train):
    images, labels = fashion_train
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "images.npy", images)
    np.save(data / "labels.npy", labels)
    cli_out = tmp_path / "cli.onnx"
    run_cli("qat", model_path, f"npy:{data}", "-o", cli_out, "--epochs", 1, "--batch-size", 32, "--steps-per-epoch", 6,
            "--calib-batches", 4, "--seed", 3, "--threads", 1, "--no-eval")

    qat = slimquant.QAT(slimquant.QuantConfig())
    model = qat.quantize(model_path, calibration_data=(images, labels), batch_size=32, batch_nums=4, **ONE_THREAD)
    reports = model.train((images, labels), epochs=1, batch_size=32, steps_per_epoch=6, seed=3)
    assert [r["steps"] for r in reports] == [6]
    py = saved_graph(qat.convert(model))
    cli = onnx.load(str(cli_out)).graph
    assert [n.op_type for n in py.node] == [n.op_type for n in cli.node]
    assert sum(n.op_type == "QuantizeLinear" for n in py.node) > 5
    py_codes, cli_codes = weight_codes(py), weight_codes(cli)
    assert sorted(py_codes) == sorted(cli_codes)
    for name in py_codes:
        np.testing.assert_array_equal(py_codes[name], cli_codes[name], err_msg=name)
    py_acts, cli_acts = activation_scales(py), activation_scales(cli)
    assert sorted(py_acts) == sorted(cli_acts)
    for name, (scale, zero_point, dtype) in py_acts.items():
        assert (zero_point, dtype) == cli_acts[name][1:], name
        assert scale == pytest.approx(cli_acts[name][0], rel=1e-6), name
    # The same engine on the same data in the same order: the very same file.
    with tempfile.TemporaryDirectory() as d:
        qat.convert(model).save(f"{d}/py.onnx")
        assert open(f"{d}/py.onnx", "rb").read() == cli_out.read_bytes()


def test_wrong_arguments_name_the_parameter(model_path, fashion_train):
    images, labels = fashion_train
    cases = [
        (lambda: slimquant.PACTQuanter(init_value=-1.0), ValueError, "init_value"),
        (lambda: slimquant.PACTQuanter(init_value="1"), TypeError, "init_value"),
        (lambda: slimquant.PACTQuanter(learning_rate=0), ValueError, "learning_rate"),
        (lambda: slimquant.PACTQuanter(dtype="float16"), ValueError, "dtype"),
        (lambda: slimquant.WeightLSQplusQuanter(quant_bits=9), ValueError, "quant_bits"),
        (lambda: slimquant.WeightLSQplusQuanter(quant_bits=4.0), TypeError, "quant_bits"),
        (lambda: slimquant.WeightLSQplusQuanter(per_channel="yes"), TypeError, "per_channel"),
        (lambda: slimquant.WeightLSQplusQuanter(sign=False), ValueError, "sign"),
        (lambda: slimquant.WeightLSQplusQuanter(symmetric=False), ValueError, "symmetric"),
        (lambda: slimquant.ActLSQplusQuanter(quant_bits=4), ValueError, "quant_bits"),
        (lambda: slimquant.ActLSQplusQuanter(batch_init=0), ValueError, "batch_init"),
        (lambda: slimquant.QuantConfig(activation=slimquant.WeightLSQplusQuanter()), ValueError,
         "WeightLSQplusQuanter is not a activation quanter"),
        (lambda: slimquant.QuantConfig(weight=slimquant.ActLSQplusQuanter()), ValueError, "not a weight quanter"),
        (lambda: slimquant.QuantConfig(activation=slimquant.PACTQuanter(quant_bits=4)), ValueError, "quant_bits=4"),
        (lambda: slimquant.QuantConfig(weight=slimquant.WeightLSQplusQuanter(quant_bits=4)).add_type_config(
            "Gemm", weight=slimquant.PACTQuanter(quant_bits=6)), ValueError, "quant_bits=6"),
        (lambda: slimquant.QAT("config"), TypeError, "config"),
        (lambda: slimquant.QAT().convert(model_path), TypeError, "model"),
        (lambda: slimquant.QAT().quantize(model_path, batch_nums=0), ValueError, "batch_nums"),
    ]
    for make, error, match in cases:
        with pytest.raises(error, match=match):
            make()
    model = slimquant.QAT().quantize(model_path, **ONE_THREAD)
    for kwargs, error, match in [(dict(lr=-1.0), ValueError, "lr"), (dict(optimizer="lion"), ValueError, "optimizer"),
                                 (dict(epochs=1.5), TypeError, "epochs"),
                                 (dict(lr_schedule="linear"), ValueError, "lr_schedule")]:
        with pytest.raises(error, match=match):
            model.train((images, labels), **kwargs)
    with pytest.raises(ValueError, match="labels"):
        model.train(images)  # no labels and no distill
    with pytest.raises(TypeError, match="data is required"):
        model.train()
    with pytest.raises(ValueError, match="3 labels for 32 samples"):
        model.train_step(images[:32], labels[:3])

    # Accepted without effect: a warning naming each, once, at the caller's line.
    with pytest.warns(UserWarning) as record:
        slimquant.WeightLSQplusQuanter(batch_init=20, reduce_type="max")
        slimquant.PACTQuanter(quanter=slimquant.FakeQuanterWithAbsMaxObserver)
        slimquant.ActLSQplusQuanter(per_channel=True)
    messages = [str(w.message) for w in record]
    assert len(messages) == 4
    for name in ("batch_init=20", "reduce_type='max'", "quanter=FakeQuanterWithAbsMaxObserver", "per_channel=True"):
        assert sum(name in m and "accepted and not used" in m for m in messages) == 1, (name, messages)
    assert all(w.filename == __file__ for w in record)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        slimquant.WeightLSQplusQuanter(quant_bits=8, per_channel=True)  # honoured: no warning


def test_seed_003_example_as_quantization_aware_training(model_path, fashion_train):
    """Seed 003's example with the QAT class and quanters, as a PaddleSlim user writes it for QAT:
    only the imports (stand-ins for paddle's layer classes), the model path and the data changed."""
    from slimquant import QAT, QuantConfig, ActLSQplusQuanter, WeightLSQplusQuanter
    paddle = types.SimpleNamespace(nn=types.SimpleNamespace(Linear=type("Linear", (), {})))
    ColumnParallelLinear, RowParallelLinear = "ColumnParallelLinear", "RowParallelLinear"  # custom op types
    QuantizedColumnParallelLinear = QuantizedRowParallelLinear = "MatMul"  # quantized as MatMul is
    dataloader = batches(*fashion_train)

    # create the model
    model = model_path

    # define QuantConfig
    q_config = QuantConfig(activation=None, weight=None)

    # define act_quanter and weight_quanter
    act_quanter = ActLSQplusQuanter()
    weight_quanter = WeightLSQplusQuanter()

    # map ColumnParallelLinear to QuantizedColumnParallelLinear
    q_config.add_qat_layer_mapping(ColumnParallelLinear,
                                   QuantizedColumnParallelLinear)
    # map RowParallelLinear to QuantizedRowParallelLinear
    q_config.add_qat_layer_mapping(RowParallelLinear,
                                   QuantizedRowParallelLinear)
    # for each layer if type in [paddle.nn.Linear, ColumnParallelLinear, RowParallelLinear]
    # make them quantizable
    q_config.add_type_config(
        [paddle.nn.Linear, ColumnParallelLinear, RowParallelLinear],
        activation=act_quanter,
        weight=weight_quanter,
    )

    qat = QAT(q_config)
    with pytest.warns(UserWarning, match="inplace=True is accepted and not used"):
        model = qat.quantize(model, inplace=True)

    # qat training
    qat_step = 5
    for step, data in enumerate(dataloader):
        loss = model.train_step(*data)
        if step == qat_step:
            break

    # convert to quant model that can evaluate and export
    with pytest.warns(UserWarning, match="inplace=True is accepted and not used"):
        model = qat.convert(model, inplace=True)

    assert np.isfinite(loss)
    graph = saved_graph(model)
    codes = weight_codes(graph)
    assert len(codes) == 1  # only the Linear (Gemm) layer
    (weight_name,) = codes
    inits = initializers(graph)
    dq = next(n for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] == weight_name)
    assert len(set(np.atleast_1d(inits[dq.input[1]]).tolist())) == 1  # per_channel=False: one step
    ((scale, zero_point, dtype),) = activation_scales(graph).values()
    assert zero_point == 0 and dtype == np.int8  # symmetric=True, sign=True
    images = fashion_train[0][:64]
    fp32 = slimquant.Session(model_path).run(images)["logits"]
    assert (slimquant.Session(model).run(images)["logits"].argmax(1) == fp32.argmax(1)).mean() > 0.9


def test_configure_distillation_calibrate_and_the_gil(model_path, fashion_train):
    images, labels = fashion_train
    model = slimquant.QAT().quantize(model_path, **ONE_THREAD)
    with pytest.raises(ValueError, match="no labels"):
        model.train_step(images[:32])  # cross-entropy needs labels
    model.configure(optimizer="adam", distill=True, temperature=2.0)
    losses = [model.train_step(images[i:i + 32]) for i in range(0, 96, 32)]  # against the float model
    assert model.steps == 3 and all(np.isfinite(losses)) and min(losses) >= 0.0
    with pytest.raises(ValueError, match="calibrate before training"):
        model.calibrate(images)

    # The engine runs without the GIL: another Python thread keeps counting meanwhile at a good
    # part of the pace it counts while this thread sleeps (held, it would count only in the few
    # milliseconds of Python around the engine's calls).
    import threading
    import time
    model = slimquant.QAT().quantize(model_path, calibration_data=images, batch_nums=2, **ONE_THREAD)
    assert model.calibrated
    done = threading.Event()
    ticks = 0

    def count():
        nonlocal ticks
        while not done.is_set():
            ticks += 1

    counter = threading.Thread(target=count)
    counter.start()
    try:
        start, t0 = ticks, time.perf_counter()
        time.sleep(0.2)
        idle_rate = (ticks - start) / (time.perf_counter() - t0)
        start, t0 = ticks, time.perf_counter()
        model.train((images, labels), epochs=1, steps_per_epoch=4)
        training_rate = (ticks - start) / (time.perf_counter() - t0)
    finally:
        done.set()
        counter.join()
    assert training_rate > 0.25 * idle_rate, (training_rate, idle_rate)
