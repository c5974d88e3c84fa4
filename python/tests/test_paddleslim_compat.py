"""PaddleSlim users' code against the package (issue 32): Paddle-style eval functions, quant_post_static
with PaddleSlim's names and defaults, seed 003's QuantConfig semantics, and no parameter silently
ignored: wrong values name the parameter, conflicts name both, parameters without effect warn."""
import inspect
import json
import tempfile
import types
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import slimquant
from conftest import BATCH_NUMS, BATCH_SIZE, MODELS, batches, top1_eval


def paddle_eval_function(images, labels, batch_size=64):
    """An evaluation function as PaddleSlim users write them (PaddleSlim's auto-compression demos),
    unchanged: it only talks to exe, program, feed_names and fetch_list."""
    def val_loader():
        for start in range(0, len(images), batch_size):
            yield images[start:start + batch_size], labels[start:start + batch_size]

    def eval_function(exe, compiled_test_program, test_feed_names, test_fetch_list):
        results = []
        for batch_id, (image, label) in enumerate(val_loader()):
            pred = exe.run(compiled_test_program, feed={test_feed_names[0]: image}, fetch_list=test_fetch_list)
            pred = np.array(pred[0])
            results.append((pred.argmax(axis=1) == label).sum())
        return float(np.sum(results)) / len(images)

    return eval_function


def sample_reader(images, count=None):
    """Seed 004's sample_generator: a reader yielding one (image, label) sample at a time."""
    def reader():
        for image in images[:count]:
            yield image, 0
    return reader


def quantize_bytes(tmp_path, name, **kwargs):
    path = slimquant.quant_post_static(quantize_model_path=tmp_path / name, **kwargs)
    with open(path, "rb") as f:
        return f.read()


# ---- item 5: eval_function(exe, program, feed_names, fetch_list)


def test_executor_run_returns_numpy_in_fetch_list_order(model_path):
    session = slimquant.Session(model_path)
    program = slimquant.Program(session)
    exe = slimquant.Executor(program)
    images = np.load(MODELS / "resnet_small.input.npy")
    relu = "/stem/stem.2/Relu_output_0"
    out = exe.run(program, feed={"input": images}, fetch_list=[relu, "logits"])
    assert isinstance(out, list) and all(isinstance(o, np.ndarray) for o in out)
    np.testing.assert_allclose(out[1], np.load(MODELS / "resnet_small.logits.npy"), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(out[0], session.run(images, output_names=[relu])[relu])
    assert out[0].min() == 0.0 and out[0].shape[0] == len(images)
    # Fetch targets with .name (Paddle Variables) work as names do; return_numpy=False too.
    named = exe.run(program, feed={"input": images}, fetch_list=[types.SimpleNamespace(name="logits")],
                    return_numpy=False)
    np.testing.assert_array_equal(named[0], out[1])
    assert exe.run(program, feed={"input": images}) == []  # no fetch_list: nothing fetched, as in Paddle
    with pytest.raises(ValueError, match="program is not the model this executor evaluates"):
        exe.run(slimquant.Program(session), feed={"input": images}, fetch_list=["logits"])
    with pytest.raises(ValueError, match=r"feed names \['image'\]"):
        exe.run(program, feed={"image": images}, fetch_list=["logits"])


def test_paddle_style_eval_function_ranks_as_cli(tmp_path, model_path, fashion, cli_analysis):
    images, labels = fashion
    # Paddle's ptq_config values are accepted with their meaning: moving_average_abs_max names
    # Paddle's fake-quant op; the scales still come from algo, so the ranking is the CLI's.
    analyzer = slimquant.AnalysisQuant(
        model_dir=model_path, model_filename=None, params_filename=None,
        eval_function=paddle_eval_function(images, labels), data_loader=batches(images, labels),
        save_dir=tmp_path, num_histogram_plots=0,
        ptq_config={"algo": "KL", "batch_nums": BATCH_NUMS, "activation_quantize_type": "moving_average_abs_max",
                    "weight_quantize_type": "channel_wise_abs_max", "is_full_quantize": False})
    report = analyzer.metric_error_analyse()
    cli = json.loads((cli_analysis / "analysis.json").read_text())
    assert report["fp32_metric"] == cli["fp32_metric"] > 0.85
    assert [(l["name"], l["metric"]) for l in report["layers"]] == [(l["name"], l["metric"]) for l in cli["layers"]]


def test_target_search_takes_the_fallback_mode(tmp_path, model_path, fashion):
    images, labels = fashion
    analyzer = slimquant.AnalysisQuant(
        model_dir=model_path, model_filename=None, params_filename=None,
        eval_function=paddle_eval_function(images, labels), data_loader=batches(images, labels),
        save_dir=tmp_path, num_histogram_plots=0, ptq_config={"algo": "abs_max", "batch_nums": BATCH_NUMS})
    # A target the all-INT8 model meets: one evaluation, and the mode named in the result.
    result = analyzer.get_target_quant_model(0.0, fallback_mode="weight-only")
    assert result["fallback_mode"] == "weight-only" and result["met"]
    assert set(result["layer_modes"].values()) == {"static"}
    with pytest.raises(ValueError, match="fallback"):
        analyzer.get_target_quant_model(0.0, fallback_mode="int4")


def test_paddle_style_eval_function_in_analysis_qat(tmp_path, model_path, fashion):
    images, labels = fashion
    quant_path = slimquant.quant_post_static(None, model_path, tmp_path / "q", sample_generator=sample_reader(images),
                                             batch_size=BATCH_SIZE, batch_nums=2, algo="abs_max", fallback_sqnr_db=0)
    quantized_top1 = top1_eval(images, labels)(slimquant.Session(quant_path, int8=False))
    with pytest.warns(UserWarning, match="AnalysisQAT data_loader is accepted and not used"):
        analyzer = slimquant.AnalysisQAT(quant_model_dir=quant_path, float_model_dir=model_path,
                                         eval_function=paddle_eval_function(images, labels),
                                         data_loader=batches(images, labels), save_dir=tmp_path / "qat")
    report = analyzer.metric_error_analyse()
    # The QAT analysis evaluates the quantized model in float simulation, as the Session above.
    assert report["qat_metric"] == pytest.approx(quantized_top1)
    assert len(report["layers"]) == 17


def test_eval_function_of_another_shape_is_a_type_error(tmp_path, model_path, fashion):
    images, labels = fashion
    with pytest.raises(TypeError, match="eval_function takes 2 required positional arguments"):
        slimquant.AnalysisQAT(model_path, model_path, eval_function=lambda a, b: 0.0, save_dir=tmp_path)
    with pytest.raises(TypeError, match="eval_function is required"):
        slimquant.AnalysisQAT(model_path, model_path, eval_function=None, save_dir=tmp_path)


# ---- item 4: quant_post_static


def test_quant_post_static_has_paddleslims_signature():
    params = inspect.signature(slimquant.quant_post_static).parameters
    names = list(params)
    assert names[:3] == ["executor", "model_dir", "quantize_model_path"]
    defaults = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}
    assert defaults["algo"] == "KL" and defaults["batch_size"] == 10 and defaults["batch_nums"] is None
    assert defaults["hist_percent"] == 0.9999 and defaults["round_type"] == "round"
    assert defaults["bias_correction"] is False and defaults["onnx_format"] is True
    assert list(defaults["quantizable_op_type"]) == ["conv2d", "depthwise_conv2d", "mul"]
    assert defaults["weight_quantize_type"] == "channel_wise_abs_max"
    assert defaults["activation_quantize_type"] == "range_abs_max"
    ptq = inspect.signature(slimquant.PostTrainingQuantization).parameters
    assert ptq["algo"].default == "KL" and ptq["batch_size"].default == 10 and ptq["batch_nums"].default is None


def test_seed_004_example_runs_as_written(tmp_path, model_path, fashion):
    images, labels = fashion
    exe = None  # fluid.Executor(fluid.CPUPlace()): no Paddle here
    model_dir = model_path
    model_filename = None
    params_filename = None
    save_model_path = tmp_path / "mobilenet_v1_quant"
    sample_generator = sample_reader(images, 100)
    batch_size = 10
    batch_nums = 10
    algo = "KL"
    quantizable_op_type = ["conv2d", "depthwise_conv2d", "mul"]
    slimquant.quant_post(executor=exe,
                         model_dir=model_dir,
                         model_filename=model_filename,
                         params_filename=params_filename,
                         quantize_model_path=save_model_path,
                         sample_generator=sample_generator,
                         batch_size=batch_size,
                         batch_nums=batch_nums,
                         algo=algo,
                         quantizable_op_type=quantizable_op_type)
    session = slimquant.Session(save_model_path / "model.onnx")
    assert session.is_int8
    assert top1_eval(images, labels)(session) > 0.8


def test_sample_batch_generator_and_data_loader_mean_what_paddleslim_says(tmp_path, model_path, fashion):
    images = fashion[0][:64]
    consumed = []

    def counting_reader():
        for image in images:
            consumed.append(1)
            yield image

    common = dict(executor=None, model_dir=model_path, algo="abs_max", fallback_sqnr_db=0)
    # sample_generator: single samples stacked into batch_size batches; batch_nums batches of them.
    from_samples = quantize_bytes(tmp_path, "s", sample_generator=counting_reader, batch_size=16, batch_nums=2, **common)
    assert 32 <= len(consumed) <= 33  # at most one sample read ahead
    # batch_generator: a reader yielding the same batches; data_loader: an iterable of feed dicts
    # ([feed dict] as a paddle.io.DataLoader with return_list=False yields them).
    def batch_reader():
        for start in range(0, 64, 16):
            yield images[start:start + 16]

    loader = [[{"input": images[start:start + 16]}] for start in range(0, 64, 16)]
    assert quantize_bytes(tmp_path, "b", batch_generator=batch_reader, batch_nums=2, **common) == from_samples
    assert quantize_bytes(tmp_path, "d", data_loader=loader, batch_nums=2, **common) == from_samples
    # batch_nums=None: every sample (4 batches here), which changes the abs_max scales.
    consumed.clear()
    everything = quantize_bytes(tmp_path, "all", sample_generator=counting_reader, batch_size=16, **common)
    assert len(consumed) == 64 and everything != from_samples


def test_quant_post_static_values_and_types_name_the_parameter(tmp_path, model_path, fashion):
    reader = sample_reader(fashion[0], 20)
    base = dict(executor=None, model_dir=model_path, quantize_model_path=tmp_path / "out", sample_generator=reader)
    cases = [
        (dict(batch_nums=-1), ValueError, "batch_nums must be >= 1 or None"),
        (dict(batch_nums=2.5), TypeError, "batch_nums must be an int or None"),
        (dict(batch_size=0), ValueError, "batch_size must be >= 1"),
        (dict(batch_size="10"), TypeError, "batch_size must be an int"),
        (dict(algo="kld"), ValueError, "algo must be one of"),
        (dict(hist_percent=1.5), ValueError, "hist_percent must be in"),
        (dict(is_full_quantize="False"), TypeError, "is_full_quantize must be a bool"),
        (dict(quantizable_op_type="conv2d"), TypeError, "quantizable_op_type must be a list of str"),
        (dict(weight_bits=9), ValueError, r"weight_bits must be in \[2, 8\]"),
        (dict(activation_bits=16), ValueError, "activation_bits must be 8"),
        (dict(activation_quantize_type="moving_max"), ValueError, "activation_quantize_type must be one of"),
        (dict(weight_quantize_type="per_channel"), ValueError, "weight_quantize_type must be one of"),
        (dict(round_type="floor"), ValueError, "round_type must be one of"),
        (dict(data_loader=[fashion[0][:8]]), ValueError, "sample_generator and data_loader are both given"),
        (dict(sample_generator=None), ValueError, "needs calibration data"),
        (dict(sample_generator="images/"), TypeError, "sample_generator must be an iterable"),
        (dict(skip_tensor_list="x"), TypeError, "skip_tensor_list must be a list of str"),
    ]
    for change, error, message in cases:
        with pytest.raises(error, match=message):
            slimquant.quant_post_static(**{**base, **change})
    with pytest.raises(NotImplementedError, match="adaround"):
        slimquant.quant_post_static(**base, round_type="adaround")
    with pytest.raises(slimquant.UnsupportedError, match="ptf"):
        slimquant.quant_post_static(**base, algo="ptf")


def test_parameters_without_effect_warn_once_naming_themselves(tmp_path, model_path, fashion):
    reader = sample_reader(fashion[0], 20)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = slimquant.quant_post_static(object(), model_path, tmp_path / "out", sample_generator=reader,
                                           batch_size=10, scope=object(), save_model_filename="model.pdmodel",
                                           save_params_filename="model.pdiparams", onnx_format=False,
                                           optimize_model=False)
    messages = [str(w.message) for w in caught]
    for parameter in ("executor is accepted and not used", "scope is accepted and not used",
                      "save_params_filename is accepted and not used", "onnx_format=False is accepted and not used",
                      "optimize_model=False is accepted and not used", "save_model_filename='model.pdmodel'"):
        assert sum(parameter in m for m in messages) == 1, (parameter, messages)
    assert all(w.filename == __file__ for w in caught)  # attributed to the caller's line
    assert path == str(tmp_path / "out" / "model.onnx") and slimquant.Session(path).is_int8
    # batch_size does not apply to whole batches: said once, not per batch.
    with pytest.warns(UserWarning, match="batch_size is accepted and not used: data_loader yields whole batches"):
        slimquant.quant_post_static(None, model_path, tmp_path / "d", data_loader=batches(*fashion)[:2], batch_size=10)


def test_bias_correction_and_paddle_activation_types(tmp_path, model_path, fashion):
    images, labels = fashion
    common = dict(executor=None, model_dir=model_path, sample_generator=sample_reader(images, 64), batch_size=32)
    plain = quantize_bytes(tmp_path, "plain", **common)
    assert quantize_bytes(tmp_path, "moving", activation_quantize_type="moving_average_abs_max", **common) == plain
    # bias_correction reaches the library (its re-rounding changes no weight of this model, so only
    # the accuracy is checked); a non-bool is refused naming it.
    corrected = slimquant.quant_post_static(quantize_model_path=tmp_path / "bc", bias_correction=True, **common)
    assert top1_eval(images, labels)(slimquant.Session(corrected)) > 0.8
    with pytest.raises(TypeError, match="bias_correction must be a bool"):
        slimquant.quant_post_static(quantize_model_path=tmp_path / "bc", bias_correction="yes", **common)


def test_paddle_model_is_refused_with_the_way_to_convert_it(tmp_path, fashion):
    paddle_dir = tmp_path / "mobilenet_v1"
    paddle_dir.mkdir()
    (paddle_dir / "inference.pdmodel").write_bytes(b"\x0a\x00")
    (paddle_dir / "inference.pdiparams").write_bytes(b"\x00")
    reader = sample_reader(fashion[0], 10)
    attempts = [
        lambda: slimquant.quant_post_static(None, paddle_dir, tmp_path / "o", sample_generator=reader),
        lambda: slimquant.quant_post_static(None, paddle_dir, tmp_path / "o", sample_generator=reader,
                                            model_filename="inference.pdmodel", params_filename="inference.pdiparams"),
        lambda: slimquant.PostTrainingQuantization(sample_generator=reader, model_dir=paddle_dir / "inference.pdmodel"),
        lambda: slimquant.PTQ().quantize(paddle_dir / "inference.pdmodel"),
        lambda: slimquant.AnalysisQuant(paddle_dir, eval_function=lambda s: 1.0, data_loader=[fashion[0][:8]]),
    ]
    for attempt in attempts:
        with pytest.raises(slimquant.UnsupportedError, match="PaddlePaddle model.*paddle2onnx"):
            attempt()


# ---- items 7 and 2: conflicts, ignored keys, seed 003's semantics


def test_config_and_algo_conflict_names_both(model_path, fashion):
    config = slimquant.QuantConfig(activation=slimquant.HistObserver(), weight=None)
    data = batches(*fashion)
    with pytest.raises(ValueError, match="config and algo are both given"):
        slimquant.PostTrainingQuantization(model_dir=model_path, data_loader=data, config=config, algo="KL")
    with pytest.raises(ValueError, match="config and weight_quantize_type, is_full_quantize are both given"):
        slimquant.PostTrainingQuantization(model_dir=model_path, data_loader=data, config=config,
                                           weight_quantize_type="abs_max", is_full_quantize=True)


def test_yaml_output_keys_are_not_silently_ignored(tmp_path):
    path = tmp_path / "ptq.yaml"
    path.write_text("algo: KL\nonnx_format: false\noptimize_model: false\nsave_model_filename: quant.onnx\n")
    with pytest.warns(UserWarning) as caught:
        config, extra = slimquant.QuantConfig.from_yaml(path)
    messages = " | ".join(str(w.message) for w in caught)
    assert "onnx_format: false is accepted and not used" in messages
    assert "optimize_model: false is accepted and not used" in messages
    assert extra["save_model_filename"] == "quant.onnx" and config.global_rule.activation == "KL"


def test_analysis_qat_checks_data_loader_type(tmp_path, model_path):
    with pytest.raises(TypeError, match="data_loader must be an iterable"):
        slimquant.AnalysisQAT(model_path, model_path, eval_function=lambda s: 1.0, data_loader="val_list.txt",
                              save_dir=tmp_path)
    with pytest.raises(TypeError, match="data_loader must be an iterable"):
        slimquant.AnalysisQuant(model_path, eval_function=lambda s: 1.0, data_loader=42, save_dir=tmp_path)


def test_ptq_flow_inplace_only_layers_and_outputs(model_path, fashion):
    images, _ = fashion
    ptq = slimquant.PTQ(slimquant.QuantConfig(activation=slimquant.KLObserver(),
                                              weight=slimquant.AbsMaxChannelWiseWeightObserver()))
    with pytest.warns(UserWarning, match="inplace=True is accepted and not used"):
        model = ptq.quantize(model_path, inplace=True)
    fp32 = slimquant.Session(model_path)
    for start in range(0, 64, BATCH_SIZE):
        pred = model(images[start:start + BATCH_SIZE])  # returns the outputs, as a Paddle model does
        np.testing.assert_allclose(pred, fp32.run(images[start:start + BATCH_SIZE])["logits"], rtol=1e-4, atol=1e-4)
    assert model.samples_seen == 2
    with pytest.raises(ValueError, match=r"unknown layers \['/no/such'\]"):
        ptq.convert(model, only_layers=["/no/such", ptq.layers[0]["name"]])
    with pytest.warns(UserWarning, match="inplace=True is accepted and not used"):
        one = ptq.convert(model, inplace=True, only_layers=[ptq.layers[0]["name"]])
    assert sum(n.op_type == "DequantizeLinear" for n in onnx_nodes(one)) == 2  # input and weight of one Conv


def onnx_nodes(model, tmp=None):
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        model.save(f"{d}/m.onnx")
        return list(onnx.load(f"{d}/m.onnx").graph.node)


def test_observers_for_weights_are_checked_at_config_time():
    config = slimquant.QuantConfig(activation=None, weight=None)
    with pytest.raises(ValueError, match="KLObserver observes activations only.*AbsMaxChannelWiseWeightObserver"):
        config.add_type_config("Conv", activation=slimquant.KLObserver(), weight=slimquant.KLObserver())
    with pytest.raises(ValueError, match="unknown weight observer 'KL'"):
        config.add_type_config("Conv", weight="KL")
    # AbsmaxObserver and MSEObserver are also per-tensor weight observers.
    config.add_type_config("Conv", activation=slimquant.AbsmaxObserver(), weight=slimquant.AbsmaxObserver())
    config.add_type_config("Gemm", activation=slimquant.MSEObserver(), weight=slimquant.MSEObserver())
    config.add_type_config("MatMul", weight="mse")


def test_quant_config_none_none_quantizes_only_configured_layers(model_path, fashion):
    images, _ = fashion
    config = slimquant.QuantConfig(activation=None, weight=None)
    config.add_layer_config("/stem/stem.0/Conv", activation=slimquant.MSEObserver(),
                            weight=slimquant.MSEChannelWiseWeightObserver())
    ptq = slimquant.PTQ(config)
    model = ptq.quantize(model_path)
    model(images[:BATCH_SIZE])
    assert [(l["name"], l["weight_observer"]) for l in ptq.layers] == [("/stem/stem.0/Conv", "mse_channel_wise")]
    nodes = onnx_nodes(ptq.convert(model))
    assert sum(n.op_type == "QuantizeLinear" for n in nodes) == 1  # the one activation
    assert sum(n.op_type == "DequantizeLinear" for n in nodes) == 2


def test_seed_003_example_with_its_names(model_path, fashion):
    """Seed 003's example with the model, the data and the custom parallel layers changed
    (no ColumnParallelLinear in an ONNX model: a custom op type is mapped instead, below)."""
    images, _ = fashion
    paddle = types.SimpleNamespace(nn=types.SimpleNamespace(Linear=type("Linear", (), {})))
    model = model_path
    q_config = slimquant.QuantConfig(activation=None, weight=None)
    act_quanter = slimquant.MSEObserver()
    weight_quanter = slimquant.MSEObserver()  # per tensor for weights
    q_config.add_type_config([paddle.nn.Linear], activation=act_quanter, weight=weight_quanter)
    ptq = slimquant.PTQ(q_config)
    model = ptq.quantize(model, inplace=False)
    ptq_step = 3
    dataloader = batches(*fashion)
    for step, data in enumerate(dataloader):
        pred = model(data)
        if step == ptq_step:
            break
    model = ptq.convert(model, inplace=False)
    assert pred.shape == (BATCH_SIZE, 10)
    assert [(l["op_type"], l["weight_observer"]) for l in ptq.layers] == [("Gemm", "mse")]  # paddle.nn.Linear
    with tempfile.TemporaryDirectory() as d:
        model.save(f"{d}/m.onnx")
        graph = onnx.load(f"{d}/m.onnx").graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    weight_dq = [n for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits
                 and inits[n.input[0]].dtype == np.int8]
    assert len(weight_dq) == 1 and inits[weight_dq[0].input[1]].size == 1  # one scale for the whole weight
    logits = slimquant.Session(model).run(images[:64])["logits"]
    fp32 = slimquant.Session(model_path).run(images[:64])["logits"]
    assert (logits.argmax(1) == fp32.argmax(1)).mean() > 0.95


def abs_gemm_model(path):
    """x [N, 8] -> Abs -> Gemm(W [8, 4]): Abs has no quantization spec of its own."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 4], rng.standard_normal((8, 4)).astype(np.float32).ravel())
    graph = helper.make_graph(
        [helper.make_node("Abs", ["x"], ["a"], name="abs"), helper.make_node("Gemm", ["a", "w"], ["y"], name="fc")],
        "abs_gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return str(path)


def test_add_qat_layer_mapping_makes_an_op_type_quantizable(tmp_path):
    path = abs_gemm_model(tmp_path / "abs.onnx")
    data = np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32)
    with pytest.raises(ValueError, match="unknown op type 'Abs'.*add_qat_layer_mapping"):
        slimquant.PTQ(slimquant.QuantConfig().set(quantizable_op_type=["Abs"])).quantize(path)

    for target in ("Relu", {"activation_inputs": [0]}):
        config = slimquant.QuantConfig(activation=slimquant.AbsmaxObserver(), weight=None)
        config.add_qat_layer_mapping("Abs", target)
        ptq = slimquant.PTQ(config)
        model = ptq.quantize(path)
        model(data)
        assert [l["op_type"] for l in ptq.layers] == ["Abs", "Gemm"]
        nodes = onnx_nodes(ptq.convert(model))
        abs_input = next(n for n in nodes if n.op_type == "Abs").input[0]
        assert any(n.op_type == "DequantizeLinear" and n.output[0] == abs_input for n in nodes)
    with pytest.raises(ValueError, match="target 'Where' is not an op type slimquant quantizes"):
        slimquant.QuantConfig().add_qat_layer_mapping("Abs", "Where")


def test_quanters_in_a_post_training_config_warn_naming_them(model_path, fashion):
    config = slimquant.QuantConfig(activation=slimquant.PACTQuanter(init_value=20.0),
                                   weight=slimquant.AbsMaxChannelWiseWeightObserver())
    with pytest.warns(UserWarning, match=r"PTQ: QuantConfig activation is PACTQuanter \{'init_value': 20.0\}"):
        slimquant.PTQ(config)
    with pytest.warns(UserWarning, match="PostTrainingQuantization: QuantConfig activation is PACTQuanter"):
        slimquant.PostTrainingQuantization(model_dir=model_path, data_loader=batches(*fashion)[:1], config=config)


# ---- item 4: quant_post_dynamic (weight-only, no data)


def test_quant_post_dynamic_quantizes_weights_only_without_data(tmp_path, model_path, fashion):
    params = inspect.signature(slimquant.quant_post_dynamic).parameters
    assert list(params)[:2] == ["model_dir", "save_model_dir"]
    assert params["weight_bits"].default == 8
    assert list(params["quantizable_op_type"].default) == ["conv2d", "mul"]
    path = slimquant.quant_post_dynamic(model_dir=model_path, save_model_dir=str(tmp_path / "dyn"),
                                        save_model_filename="w.onnx")
    assert path == str(tmp_path / "dyn" / "w.onnx")
    graph = onnx.load(path).graph
    ops = [n.op_type for n in graph.node]
    assert "QuantizeLinear" not in ops, "activations stay float"
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    codes = [inits[n.input[0]] for n in graph.node if n.op_type == "DequantizeLinear"]
    assert codes and all(c.dtype == np.int8 for c in codes)
    conv_count = ops.count("Conv")
    assert len(codes) >= conv_count, "every convolution's weight is int8"
    import os
    assert os.path.getsize(path) < 0.35 * os.path.getsize(model_path)
    # The model computes what the float one does, within the weights' rounding.
    images, labels = fashion
    x = images[:64]
    fp32 = slimquant.Session(model_path).run(x)
    weights = slimquant.Session(path).run(x)
    fp32, weights = (list(r.values())[0] if isinstance(r, dict) else r[0] for r in (fp32, weights))
    assert (fp32.argmax(axis=1) == weights.argmax(axis=1)).mean() >= 62 / 64
    # The same through PostTrainingQuantization(mode="weight-only"), which takes no data.
    ptq = slimquant.PostTrainingQuantization(model_dir=model_path, mode="weight-only")
    ptq.quantize()
    same = ptq.save_quantized_model(str(tmp_path / "same.onnx"))
    with open(same, "rb") as a, open(path, "rb") as b:
        assert a.read() == b.read()


def test_dynamic_mode_quantizes_activations_per_inference_without_data(tmp_path, model_path, fashion):
    ptq = slimquant.PostTrainingQuantization(model_dir=model_path, mode="dynamic")
    ptq.quantize()
    path = ptq.save_quantized_model(str(tmp_path / "dyn.onnx"))
    model = onnx.load(path)
    assert {p.key: p.value for p in model.metadata_props}["slimquant.mode"] == "dynamic"
    ops = [n.op_type for n in model.graph.node]
    assert "QuantizeLinear" not in ops and "DequantizeLinear" not in ops
    assert ops.count("DynamicQuantizeLinear") >= 1
    assert "Conv" not in ops and "Gemm" not in ops, "every Conv and the Gemm read integers"
    assert ops.count("ConvInteger") == 16 and ops.count("MatMulInteger") == 1
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "ConvInteger":  # u8 codes = s8 + 128, one zero point 128
            assert inits[n.input[1]].dtype == np.uint8 and int(inits[n.input[3]]) == 128
        if n.op_type == "MatMulInteger":
            assert inits[n.input[1]].dtype == np.int8 and not inits[n.input[3]].any()
    images, _ = fashion
    x = images[:64]
    fp32 = slimquant.Session(model_path).run(x)
    dyn = slimquant.Session(path).run(x)
    fp32, dyn = (list(r.values())[0] if isinstance(r, dict) else r[0] for r in (fp32, dyn))
    assert (fp32.argmax(axis=1) == dyn.argmax(axis=1)).sum() >= 62


def test_quant_post_dynamic_refuses_what_it_cannot_do(tmp_path, model_path, fashion):
    with pytest.raises(ValueError, match="weight_bits=16"):
        slimquant.quant_post_dynamic(model_path, str(tmp_path / "a"), weight_bits=16)
    with pytest.raises(ValueError, match="weight_bits"):
        slimquant.quant_post_dynamic(model_path, str(tmp_path / "a"), weight_bits=9)
    with pytest.raises(TypeError, match="quantizable_op_type"):
        slimquant.quant_post_dynamic(model_path, str(tmp_path / "a"), quantizable_op_type="conv2d")
    with pytest.warns(UserWarning, match="generate_test_model"):
        slimquant.quant_post_dynamic(model_path, str(tmp_path / "b"), generate_test_model=True)
    images, _ = fashion
    with pytest.raises(ValueError, match="weight-only"):
        slimquant.PostTrainingQuantization(model_dir=model_path, mode="weight-only",
                                           sample_generator=sample_reader(images, 8))
    with pytest.raises(ValueError, match="mode"):
        slimquant.PostTrainingQuantization(model_dir=model_path, mode="dynamic",
                                           sample_generator=sample_reader(images, 8))


def test_algo_auto_chooses_a_candidate_and_says_which(tmp_path, model_path, fashion):
    images, _ = fashion
    data = [images[i:i + 16] for i in range(0, 64, 16)]
    ptq = slimquant.PostTrainingQuantization(model_dir=model_path, data_loader=data, batch_nums=3, algo="auto",
                                             fallback_sqnr_db=0)
    ptq.quantize()
    choice = ptq.algo_choice
    assert choice["chosen"] in ("emd", "KL", "mse", "hist", "avg")
    assert choice["held_back"], "the fourth batch was not calibrated"
    assert [s["algo"] for s in choice["scores"]] == ["emd", "KL", "mse", "hist", "avg"]
    assert all(s["sqnr_db"] > 15 for s in choice["scores"])
    assert choice["chosen"] in choice["description"]
    path = ptq.save_quantized_model(str(tmp_path / "auto.onnx"))
    meta = {p.key: p.value for p in onnx.load(path).metadata_props}
    assert meta["slimquant.activation_algo"] == choice["chosen"]
    explicit = slimquant.PostTrainingQuantization(model_dir=model_path, data_loader=data, batch_nums=3, algo="KL",
                                                  fallback_sqnr_db=0)
    explicit.quantize()
    assert explicit.algo_choice["chosen"] == ""
