"""The Python package against the command line: the same data and settings must give the same
quantized model, the same evaluation and the same layer ranking; eval_function exceptions must
reach the caller with the checkpoint kept; seed 002's example must run as written."""
import json
import pathlib
import re
import threading
import warnings

import numpy as np
import pytest

import slimquant
from conftest import BATCH_NUMS, BATCH_SIZE, MODELS, batches, run_cli, top1_eval


def sample_generator(images):
    """Seed 002's sample_generator: one sample per call, without the batch dimension."""
    def reader():
        for image in images:
            yield image
    return reader


def test_session_runs_the_fixture_as_pytorch_did(model_path):
    session = slimquant.Session(model_path)
    assert not session.is_int8
    assert session.input_names == ["input"] and session.output_names == ["logits"]
    (info,) = session.inputs
    assert info.dtype == "float32" and info.shape == ["batch", 1, 28, 28]
    images = np.load(MODELS / "resnet_small.input.npy")
    logits = session.run(images)["logits"]
    np.testing.assert_allclose(logits, np.load(MODELS / "resnet_small.logits.npy"), rtol=1e-4, atol=1e-4)
    # Outputs share the library's buffer and keep it alive without the session.
    del session
    np.testing.assert_allclose(logits, np.load(MODELS / "resnet_small.logits.npy"), rtol=1e-4, atol=1e-4)
    with pytest.raises(slimquant.InvalidArgumentError, match="dtype float64"):
        slimquant.Session(model_path).run(images.astype(np.float64))


def test_session_returns_a_sequence_output_as_a_list_of_arrays(tmp_path):
    """A scripted for loop (Loop + sequence ops) runs as PyTorch did; a sequence output is a list."""
    control_flow = MODELS / "control_flow"
    loop = slimquant.Session(str(control_flow / "loop_for_append.onnx"))
    y = loop.run(np.load(control_flow / "loop_for_append.input.npy"))["y"]
    np.testing.assert_allclose(y, np.load(control_flow / "loop_for_append.expected.npy"), rtol=1e-5, atol=1e-5)
    onnx = pytest.importorskip("onnx")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("SplitToSequence", ["x"], ["rows"])], "split",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 2])],
        [onnx.helper.make_tensor_sequence_value_info("rows", onnx.TensorProto.FLOAT, None)])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 16)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "split.onnx"))
    rows = slimquant.Session(str(tmp_path / "split.onnx")).run(np.arange(6, dtype=np.float32).reshape(3, 2))["rows"]
    assert isinstance(rows, list) and [r.tolist() for r in rows] == [[[0, 1]], [[2, 3]], [[4, 5]]]


def test_quantize_from_generator_matches_cli(tmp_path, model_path, fashion, npy_dir):
    images, labels = fashion
    ptq = slimquant.PostTrainingQuantization(
        executor=None, sample_generator=sample_generator(images), model_dir=model_path, batch_size=BATCH_SIZE,
        batch_nums=BATCH_NUMS, scope=None, algo="KL")
    ptq.quantize()
    py_model = ptq.save_quantized_model(tmp_path / "py.onnx")
    cli_model = tmp_path / "cli.onnx"
    run_cli("quantize", model_path, f"npy:{npy_dir}", "-o", cli_model, "--batch-size", BATCH_SIZE,
            "--batch-nums", BATCH_NUMS, "--algo", "KL", "--no-eval")
    assert ptq.report["batches"] == BATCH_NUMS and ptq.report["samples"] == BATCH_SIZE * BATCH_NUMS
    assert pathlib.Path(py_model).read_bytes() == cli_model.read_bytes()

    # Evaluated with the Python Session (integer execution of the QDQ model) = `slimquant eval`.
    session = slimquant.Session(py_model)
    assert session.is_int8
    py_top1 = top1_eval(images, labels)(session)
    cli = json.loads(run_cli("eval", cli_model, f"npy:{npy_dir}", "--json").strip().splitlines()[-1])
    assert py_top1 == cli["top1"]
    assert py_top1 > 0.8


def analysis_quant(model_path, fashion, save_dir, eval_function, **kwargs):
    images, labels = fashion
    return slimquant.AnalysisQuant(model_path, eval_function=eval_function, data_loader=batches(images, labels),
                                   save_dir=save_dir, ptq_config={"algo": "KL", "batch_nums": BATCH_NUMS}, **kwargs)


def ranking_lines(save_dir, layers):
    """analysis.txt's layer lines (name, op type, metric), whatever header the file has."""
    lines = (save_dir / "analysis.txt").read_text().splitlines()
    assert len(lines) >= layers
    return lines[-layers:]


def test_analysis_with_eval_function_matches_cli(tmp_path, model_path, fashion, cli_analysis):
    analyzer = analysis_quant(model_path, fashion, tmp_path, top1_eval(*fashion), num_histogram_plots=2)
    report = analyzer.metric_error_analyse()
    cli = json.loads((cli_analysis / "analysis.json").read_text())
    assert report["fp32_metric"] == cli["fp32_metric"] > 0.85
    assert [(l["name"], l["metric"]) for l in report["layers"]] == [(l["name"], l["metric"]) for l in cli["layers"]]
    assert ranking_lines(tmp_path, len(cli["layers"])) == ranking_lines(cli_analysis, len(cli["layers"]))
    assert len(report["layers"]) == cli["layers_total"] > 10
    for pdf in ("best_weight_hist_result.pdf", "worst_act_hist_result.pdf"):
        assert (tmp_path / pdf).read_bytes().startswith(b"%PDF")

    statistics = analyzer.statistical_analyse()  # on the calibration batches
    assert [l["layer"] for l in statistics["layers"]] == [l["name"] for l in analyzer.layers]
    assert (tmp_path / "statistics.csv").exists()


def test_skip_tensor_list_takes_the_layers_analysis_txt_ranks(tmp_path, model_path, fashion, cli_analysis):
    """Seed 000's workflow: the worst layers of analysis.txt passed to skip_tensor_list stay in
    float, exactly those, with no warning."""
    images, labels = fashion
    lines = [l for l in (cli_analysis / "analysis.txt").read_text().splitlines() if not l.startswith("#")]
    worst = [line.split("\t")[0] for line in lines[:3]]

    def quantize(**kwargs):
        ptq = slimquant.PostTrainingQuantization(
            executor=None, sample_generator=sample_generator(images), model_dir=model_path, batch_size=BATCH_SIZE,
            batch_nums=BATCH_NUMS, algo="KL", fallback_sqnr_db=0.0, **kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "matches nothing" would be a warning
            ptq.quantize()
        return [l["name"] for l in ptq.layers]

    every_layer = quantize()
    assert quantize(skip_tensor_list=worst) == [name for name in every_layer if name not in worst]
    assert len(every_layer) == len(lines) > 10


def test_eval_function_exception_stops_analysis_and_keeps_checkpoint(tmp_path, model_path, fashion, cli_analysis):
    evaluate = top1_eval(*fashion)
    calls = []

    class Interrupted(Exception):
        pass

    def failing(session):
        calls.append(1)
        if len(calls) == 6:  # FP32 and four layers finished
            raise Interrupted("stop here")
        return evaluate(session)

    analyzer = analysis_quant(model_path, fashion, tmp_path, failing, num_histogram_plots=0)
    with pytest.raises(Interrupted, match="stop here"):
        analyzer.metric_error_analyse()
    assert (tmp_path / "analysis_checkpoint.json").exists()
    assert not (tmp_path / "analysis.txt").exists()

    # The rerun evaluates only the layers the first run did not finish, and ranks as the CLI does.
    resumed = []

    def counting(session):
        resumed.append(1)
        return evaluate(session)

    report = analysis_quant(model_path, fashion, tmp_path, counting, num_histogram_plots=0).metric_error_analyse()
    assert len(resumed) == len(report["layers"]) - 4
    assert ranking_lines(tmp_path, len(report["layers"])) == ranking_lines(cli_analysis, len(report["layers"]))


def test_finished_save_dir_with_another_eval_function_is_refused(tmp_path, model_path, fashion):
    images, labels = fashion
    calls = []

    def counting(evaluate):
        def eval_function(session):
            calls.append(1)
            return evaluate(session)
        return eval_function

    first = analysis_quant(model_path, fashion, tmp_path, counting(top1_eval(images, labels)),
                           num_histogram_plots=0).metric_error_analyse()
    # The same evaluation again: one model is evaluated to check it, the outputs are rewritten.
    del calls[:]
    again = analysis_quant(model_path, fashion, tmp_path, counting(top1_eval(images, labels)),
                           num_histogram_plots=0).metric_error_analyse()
    assert len(calls) == 1
    assert again["layers"] == first["layers"]
    report = (tmp_path / "analysis.json").read_bytes()
    # Another evaluation (other data) does not get the old metrics back.
    other = analysis_quant(model_path, fashion, tmp_path, top1_eval(images[:100], labels[:100]),
                           num_histogram_plots=0)
    with pytest.raises(slimquant.InvalidArgumentError, match=re.escape(f"save_dir '{tmp_path}'") + ".*to start over"):
        other.metric_error_analyse()
    assert (tmp_path / "analysis.json").read_bytes() == report
    (tmp_path / "analysis_checkpoint.json").unlink()  # as the message says: starts over
    assert other.metric_error_analyse()["fp32_metric"] != first["fp32_metric"]


def test_second_analysis_in_the_same_process_while_a_forked_worker_lives(tmp_path, model_path, fashion):
    """A data loader's worker forked inside eval_function keeps a copy of the save_dir lock's
    descriptor; once the analysis has finished, the next one into that save_dir still runs."""
    import os
    evaluate = top1_eval(*fashion)
    read_end, write_end = os.pipe()
    workers = []

    def forking(session):
        if not workers:
            pid = os.fork()
            if pid == 0:  # the worker: waits until the test closes the pipe
                os.close(write_end)
                os.read(read_end, 1)
                os._exit(0)
            workers.append(pid)
        return evaluate(session)

    try:
        analysis_quant(model_path, fashion, tmp_path, forking, num_histogram_plots=0).metric_error_analyse()
        assert os.waitpid(workers[0], os.WNOHANG) == (0, 0)  # still alive
        report = analysis_quant(model_path, fashion, tmp_path, evaluate, num_histogram_plots=0).metric_error_analyse()
        assert len(report["layers"]) > 10
    finally:
        os.close(write_end)
        os.close(read_end)
        for pid in workers:
            os.waitpid(pid, 0)


def test_lent_session_cannot_outlive_eval_function(tmp_path, model_path, fashion):
    kept = []

    def keep(session):
        kept.append(session)
        return 1.0

    analyzer = analysis_quant(model_path, fashion, tmp_path, keep, num_histogram_plots=0, checkpoint_name="")
    analyzer.metric_error_analyse()
    with pytest.raises(slimquant.InvalidArgumentError, match="lent to one eval_function call"):
        kept[0].run(fashion[0][:1])


def test_gil_is_released_during_calibration(tmp_path, model_path, fashion):
    """A Python thread keeps running while C++ calibrates. The batches come from a list, whose
    iteration runs no Python code: without the GIL released around the C++ work, the other thread
    could not run at all until quantize() returned."""
    images, labels = fashion
    ticks, done = [], threading.Event()

    def ticker():
        while not done.is_set():
            ticks.append(1)
            done.wait(0.001)

    ptq = slimquant.PostTrainingQuantization(data_loader=batches(images, labels), model_dir=model_path, algo="mse")
    thread = threading.Thread(target=ticker)
    thread.start()
    try:
        started = len(ticks)
        ptq.quantize()
        during = len(ticks) - started
    finally:
        done.set()
        thread.join()
    assert during > 5


def test_seed_002_example_runs_with_executor_and_scope_none(tmp_path, model_path, fashion):
    # Seed 002's code with the model path and the data changed (exe = None: no Paddle executor).
    exe = None
    images, labels = fashion

    def val():  # reader.val(data_dir=...): a reader, each call a generator of samples
        def reader():
            for image, label in zip(images[:64], labels[:64]):
                yield image, int(label)
        return reader

    sample_generator = val()
    ptq = slimquant.PostTrainingQuantization(
        executor=exe,
        sample_generator=sample_generator,
        model_dir=model_path,
        model_filename=None,
        params_filename=None,
        batch_size=16,
        batch_nums=2,
        algo="KL",
        is_full_quantize="False" == "True")
    quantized_program = ptq.quantize()
    path = ptq.save_quantized_model(tmp_path / "mobilenetv1_int8_model")
    assert pathlib.Path(path) == tmp_path / "mobilenetv1_int8_model" / "model.onnx"
    assert quantized_program.num_nodes > 0 and slimquant.Session(path).is_int8


def test_quant_config_rules_and_ptq_flow(model_path, fashion):
    images, _ = fashion
    config = slimquant.QuantConfig(activation=slimquant.KLObserver(), weight=slimquant.AbsMaxChannelWiseWeightObserver())
    config.add_type_config("Gemm", activation=None, weight=None)  # the classifier head stays in float
    ptq = slimquant.PTQ(config)
    observed = ptq.quantize(model_path)
    for start in range(0, 128, BATCH_SIZE):
        observed({"input": images[start:start + BATCH_SIZE]})
    assert observed.samples_seen == 4
    types = {layer["op_type"] for layer in ptq.layers}
    assert types == {"Conv"}
    quantized = ptq.convert(observed)
    logits = slimquant.Session(quantized).run(images[:8])["logits"]
    fp32 = slimquant.Session(model_path).run(images[:8])["logits"]
    assert (logits.argmax(1) == fp32.argmax(1)).mean() >= 0.75


def test_analysis_qat_ranks_quantized_layers(tmp_path, model_path, fashion):
    images, labels = fashion
    ptq = slimquant.PostTrainingQuantization(sample_generator=sample_generator(images), model_dir=model_path,
                                             batch_size=BATCH_SIZE, batch_nums=2, algo="abs_max",
                                             fallback_sqnr_db=0)
    quant_path = ptq.save_quantized_model(tmp_path / "q.onnx") if ptq.quantize() else None
    analyzer = slimquant.AnalysisQAT(quant_model_dir=quant_path, float_model_dir=model_path,
                                     eval_function=top1_eval(images[:128], labels[:128]), save_dir=tmp_path / "qat")
    report = analyzer.metric_error_analyse()
    assert len(report["layers"]) == len(ptq.layers)
    assert (tmp_path / "qat" / "analysis.txt").exists()
