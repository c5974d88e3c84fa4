#!/usr/bin/python3
"""Small end-to-end checks of model forms the GoogleTest suites do not cover (bench/model_forms.py
measures them on real networks; this keeps one fixture per form in the suite):

  * each fixture at the other opsets of 11, 13, 17 and 21 loads and runs equal to the fixture
    (mobilenetv2_small is exported at 11, resnet_small at 13, vit_small at 17; up to 17 by onnx's
    version converter, which cannot go down from 13 (no Identity adapter), 21 by
    bench/model_forms.py's upgrade_opset from 17, which moves Reduce axes to an input);
  * a fixture with its batch fixed at 1 quantizes (calibration feeds it one sample per run) and its
    INT8 model runs;
  * an If whose branch outputs are declared with an empty type (as Silero VAD's exports write them)
    loads and runs as a tensor of unknown type.

  /usr/bin/python3 tests/e2e/model_forms_test.py SLIMQUANT_CLI [WORK_DIR]

Prints one line per check and 'N passed, N failed'; exits 1 on any failure.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import version_converter

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "models")
sys.path.insert(0, os.path.join(ROOT, "bench"))
import model_forms  # noqa: E402  (upgrade_opset, set_batch: the corpus's own conversions)

# Outputs of one model at two opsets: the same kernels on the same weights, so only a changed
# graph rewrite (a different but equivalent op form) can move them, by float rounding at most.
SAME_OUTPUT_TOLERANCE = 1e-4


def run(cli, model, sample, out_dir):
    p = subprocess.run([cli, "run", model, "--input", f"input={sample}", "--output-dir", out_dir],
                       capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        raise AssertionError(f"slimquant run {os.path.basename(model)} exited {p.returncode}: {p.stderr.strip()[-300:]}")
    files = sorted(f for f in os.listdir(out_dir) if f.endswith(".npy"))
    return [np.load(os.path.join(out_dir, f)) for f in files]


def at_opset(model, opset):
    current = next(i.version for i in model.opset_import if i.domain in ("", "ai.onnx"))
    if opset <= 17:
        return version_converter.convert_version(model, opset)
    at17 = version_converter.convert_version(model, 17) if current != 17 else model
    return model_forms.upgrade_opset(at17, opset)


def check_opset(cli, work, name, opset):
    source = os.path.join(FIXTURES, f"{name}.onnx")
    sample = os.path.join(FIXTURES, f"{name}.input.npy")
    converted = os.path.join(work, f"{name}.opset{opset}.onnx")
    onnx.save(at_opset(onnx.load(source), opset), converted)
    expected = run(cli, source, sample, os.path.join(work, f"{name}.ref"))
    got = run(cli, converted, sample, os.path.join(work, f"{name}.opset{opset}"))
    assert len(got) == len(expected), f"{len(got)} outputs, expected {len(expected)}"
    for g, e in zip(got, expected):
        diff = float(np.max(np.abs(g - e)))
        assert diff <= SAME_OUTPUT_TOLERANCE, f"max |opset {opset} - fixture| = {diff}"


def check_fixed_batch_one_quantizes(cli, work):
    fixed = os.path.join(work, "resnet_small.batch1.onnx")
    onnx.save(model_forms.set_batch(onnx.load(os.path.join(FIXTURES, "resnet_small.onnx")), 1), fixed)
    assert onnx.load(fixed).graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1
    int8 = os.path.join(work, "resnet_small.batch1.int8.onnx")
    p = subprocess.run([cli, "quantize", fixed, "fashion-mnist:train", "-o", int8, "--batch-size", "4",
                        "--batch-nums", "2", "--algo", "emd", "--no-eval", "--progress", "none"],
                       capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, f"quantize exited {p.returncode}: {p.stderr.strip()[-300:]}"
    sample = os.path.join(work, "one_sample.npy")
    np.save(sample, np.load(os.path.join(FIXTURES, "resnet_small.input.npy"))[:1])
    out = run(cli, int8, sample, os.path.join(work, "batch1.int8"))
    assert out[0].shape[0] == 1 and np.all(np.isfinite(out[0]))


def check_if_with_untyped_branch_outputs(cli, work):
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    untyped = onnx.ValueInfoProto()
    untyped.name = "y"
    untyped.type.CopyFrom(onnx.TypeProto())  # present but empty
    def branch(name, op):
        out = onnx.ValueInfoProto()
        out.name = f"{name}_out"
        out.type.CopyFrom(onnx.TypeProto())
        return helper.make_graph([helper.make_node(op, ["x"], [f"{name}_out"])], name, [], [out])
    cond = helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0)
    positive = helper.make_node("Greater", ["m", "zero"], ["c"])
    branch_if = helper.make_node("If", ["c"], ["y"], then_branch=branch("then", "Relu"),
                                 else_branch=branch("else", "Neg"))
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    graph = helper.make_graph([cond, positive, branch_if], "untyped_if", [x], [untyped], [zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path = os.path.join(work, "untyped_if.onnx")
    onnx.save(model, path)
    sample = os.path.join(work, "untyped_if.x.npy")
    np.save(sample, np.array([-1.0, 2.0], dtype=np.float32))
    p = subprocess.run([cli, "run", path, "--input", f"x={sample}", "--output-dir", os.path.join(work, "untyped_if")],
                       capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, f"run exited {p.returncode}: {p.stderr.strip()[-300:]}"
    y = np.load(os.path.join(work, "untyped_if", "y.npy"))
    assert np.array_equal(y, np.array([0.0, 2.0], dtype=np.float32)), y


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    cli = os.path.abspath(sys.argv[1])
    work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="model_forms_test_")
    os.makedirs(work, exist_ok=True)
    other_opsets = {"mobilenetv2_small": (13, 17, 21), "resnet_small": (17, 21), "vit_small": (21,)}
    checks = [(f"{name} at opset {opset} runs as the fixture", lambda n=name, o=opset: check_opset(cli, work, n, o))
              for name, opsets in other_opsets.items() for opset in opsets]
    checks.append(("resnet_small with batch fixed at 1 quantizes and runs",
                   lambda: check_fixed_batch_one_quantizes(cli, work)))
    checks.append(("an If with untyped branch outputs loads and runs",
                   lambda: check_if_with_untyped_branch_outputs(cli, work)))
    failed = 0
    for label, check in checks:
        try:
            check()
            print(f"ok    {label}", flush=True)
        except Exception as e:  # every check reports, then the count decides the exit status
            failed += 1
            print(f"FAIL  {label}: {e}", flush=True)
    print(f"{len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
