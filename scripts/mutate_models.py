#!/usr/bin/python3
"""Field-level mutation fuzzer for the model path: mutates the fixture models the way a careless
exporter or a hostile file would, runs `slimquant run` (and `info` with --commands info,run) on every
mutant under a time and memory limit, and keeps the mutants that end badly.

    /usr/bin/python3 scripts/mutate_models.py --seed 1 --count 2000 [--binary build/slimquant]

Mutations (1 to 3 per mutant): attribute values (0, negative, huge, NaN, inf, emptied or lengthened
lists, bogus strings), dims of graph inputs and initializers (0, negative, 2^32, 2^62) with the
data left as it was, initializer data truncated or extended, data types swapped, op types swapped
or unknown, domains unknown, opset versions (0, 99, ...), node inputs dropped, output names
duplicated, external data pointing elsewhere (../, absolute, /dev/zero).

A run is a finding when it dies by a signal, times out, or exits with a code outside the README's
(0, 2, 3, 4, 5, 6, 7) - 70 (internal error) on an invalid model included. Findings are written to
--save-dir (default fuzz/regressions/onnx_loader/, which the test suite replays through the
fuzz_onnx_loader target) as <model>-s<seed>-<index>.onnx, with a summary in --summary. Mutant
`index` of a given --seed is always the same model, so `--seed S --only INDEX` reproduces one.
"""
import argparse
import collections
import concurrent.futures
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, mapping

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCUMENTED_EXIT_CODES = {0, 2, 3, 4, 5, 6, 7}
HUGE_INTS = [0, -1, -2, 1, 2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, -2**63, 10**9]
ODD_FLOATS = [0.0, -1.0, float("nan"), float("inf"), float("-inf"), 1e38, -1e38, 1e-45]
ODD_DIMS = [0, -1, -5, 2**31, 2**32, 2**62, 2**63 - 1]
OP_TYPES = ["Conv", "Gather", "Reshape", "Transpose", "Slice", "Pad", "Softmax", "Concat", "ReduceSum",
            "MatMul", "Gemm", "Resize", "Expand", "Tile", "TopK", "Split", "Squeeze", "Unsqueeze", "Cast",
            "MaxPool", "AveragePool", "BatchNormalization", "LayerNormalization", "Einsum", "Where", "Div",
            "QuantizeLinear", "DequantizeLinear", "ConvTranspose", "CumSum", "NonZero", "ScatterND",
            "GatherND", "Range", "ConstantOfShape", "If", "Loop", "NoSuchOp"]
OPSETS = [0, 1, 6, 7, 99, 2**31 - 1, -1]
DTYPES = [TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT8, TensorProto.UINT8, TensorProto.DOUBLE,
          TensorProto.BOOL, TensorProto.FLOAT16, TensorProto.STRING, TensorProto.INT32, 0, 999]
LOCATIONS = ["../outside.bin", "/etc/hostname", "/dev/zero", "missing.bin", "", "sub/../../x.bin"]


def mutate_attribute(model, rng):
    nodes = [n for n in model.graph.node if n.attribute]
    if not nodes:
        return None
    node = rng.choice(nodes)
    attr = rng.choice(node.attribute)
    if attr.type == onnx.AttributeProto.INT:
        attr.i = rng.choice(HUGE_INTS)
    elif attr.type == onnx.AttributeProto.FLOAT:
        attr.f = rng.choice(ODD_FLOATS)
    elif attr.type == onnx.AttributeProto.INTS:
        choice = rng.randrange(4)
        if choice == 0 or not attr.ints:
            del attr.ints[:]
            attr.ints.extend(rng.choice(HUGE_INTS) for _ in range(rng.randrange(1, 6)))
        elif choice == 1:
            attr.ints[rng.randrange(len(attr.ints))] = rng.choice(HUGE_INTS)
        elif choice == 2:
            del attr.ints[rng.randrange(len(attr.ints))]
        else:
            attr.ints.append(rng.choice(HUGE_INTS))
    elif attr.type == onnx.AttributeProto.FLOATS:
        if attr.floats:
            attr.floats[rng.randrange(len(attr.floats))] = rng.choice(ODD_FLOATS)
        else:
            attr.floats.append(rng.choice(ODD_FLOATS))
    elif attr.type == onnx.AttributeProto.STRING:
        attr.s = rng.choice([b"", b"bogus", b"\xff\xfe", b"NOTSET" * 100])
    elif attr.type == onnx.AttributeProto.TENSOR:
        mutate_tensor(attr.t, rng)
    else:
        attr.type = rng.choice([onnx.AttributeProto.INT, onnx.AttributeProto.FLOATS, onnx.AttributeProto.GRAPH])
    return f"attribute {node.op_type}.{attr.name}"


def mutate_tensor(t, rng):
    choice = rng.randrange(4)
    if choice == 0 and t.dims:
        t.dims[rng.randrange(len(t.dims))] = rng.choice(ODD_DIMS)
        return "dim"
    if choice == 1:
        t.dims.append(rng.choice([0, 2, 2**32, 2**62]))
        return "rank"
    if choice == 2 and t.raw_data:
        cut = rng.choice([0, 1, len(t.raw_data) // 2, len(t.raw_data) - 1])
        t.raw_data = t.raw_data[:cut] if rng.random() < 0.7 else t.raw_data + b"\x00" * rng.choice([1, 3, 4096])
        return "data size"
    t.data_type = rng.choice(DTYPES)
    return "data type"


def mutate_initializer(model, rng):
    if not model.graph.initializer:
        return None
    t = rng.choice(model.graph.initializer)
    return f"initializer {t.name}: {mutate_tensor(t, rng)}"


def mutate_input_dims(model, rng):
    inputs = [i for i in model.graph.input if i.type.tensor_type.HasField("shape")]
    if not inputs:
        return None
    value = rng.choice(inputs)
    dims = value.type.tensor_type.shape.dim
    if not dims or rng.random() < 0.2:
        dims.add().dim_value = rng.choice(ODD_DIMS[1:]) if rng.random() < 0.5 else 1
    else:
        dim = dims[rng.randrange(len(dims))]
        dim.dim_value = rng.choice(ODD_DIMS)
    if rng.random() < 0.2:
        value.type.tensor_type.elem_type = rng.choice(DTYPES)
    return f"input {value.name} dims"


def mutate_op_type(model, rng):
    node = rng.choice(model.graph.node)
    before = node.op_type
    if rng.random() < 0.15:
        node.domain = rng.choice(["com.unknown", "ai.onnx.ml", "com.microsoft"])
    else:
        node.op_type = rng.choice(OP_TYPES)
    return f"op {before} -> {node.domain + '::' if node.domain else ''}{node.op_type}"


def mutate_opset(model, rng):
    opset = model.opset_import[0] if model.opset_import else model.opset_import.add()
    opset.version = rng.choice(OPSETS)
    if rng.random() < 0.2:
        model.ir_version = rng.choice([0, 1, 3, 99, -1])
    return f"opset {opset.version}"


def mutate_outputs(model, rng):
    nodes = model.graph.node
    a, b = rng.choice(nodes), rng.choice(nodes)
    choice = rng.randrange(3)
    if choice == 0 and a.output and b.output:
        a.output[0] = b.output[0]  # two nodes write one tensor (or one node writes its own input)
        return "duplicate output"
    if choice == 1 and a.input:
        a.input[rng.randrange(len(a.input))] = rng.choice(["", "no_such_value"] + list(b.output))
        return "rewired input"
    if a.input:
        del a.input[rng.randrange(len(a.input))]
        return "dropped input"
    a.input.append(rng.choice(list(b.output) or ["x"]))
    return "extra input"


def mutate_external_data(model, rng):
    if not model.graph.initializer:
        return None
    t = rng.choice(model.graph.initializer)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    del t.external_data[:]
    for key, value in (("location", rng.choice(LOCATIONS)), ("offset", str(rng.choice([0, 0, 7, 2**40]))),
                       ("length", str(rng.choice([4, 64, 2**33])))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return f"external data {t.name} -> {t.external_data[0].value}"


MUTATORS = [(mutate_attribute, 5), (mutate_initializer, 4), (mutate_input_dims, 3), (mutate_op_type, 3),
            (mutate_opset, 1), (mutate_outputs, 2), (mutate_external_data, 1)]


def make_mutant(original, rng):
    model = onnx.ModelProto()
    model.CopyFrom(original)
    done = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        mutator = rng.choices([m for m, _ in MUTATORS], weights=[w for _, w in MUTATORS])[0]
        what = mutator(model, rng)
        if what:
            done.append(what)
    return model, done


def input_arrays(model):
    """Inputs of ones fitting the original model's declared inputs (symbolic dims as 1)."""
    initializers = {t.name for t in model.graph.initializer}
    arrays = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        shape = [d.dim_value if d.HasField("dim_value") else 1 for d in value.type.tensor_type.shape.dim]
        dtype = mapping.TENSOR_TYPE_TO_NP_TYPE[value.type.tensor_type.elem_type]
        arrays[value.name] = np.ones(shape, dtype)
    return arrays


def limit_resources(memory_mb):
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.setsid()  # so that a timeout kills the whole group
    return apply


def run_cli(args, timeout, memory_mb):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                            preexec_fn=limit_resources(memory_mb))
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "timeout", ""
    message = err.decode(errors="replace").strip().splitlines()
    return proc.returncode, message[-1][:300] if message else ""


def verdict(rc):
    if rc == "timeout":
        return "timeout"
    if rc < 0:
        return f"signal {signal.Signals(-rc).name}"
    if rc not in DOCUMENTED_EXIT_CODES:
        return f"exit code {rc}"
    return None


def check_mutant(index, args, originals, feeds, tmp):
    """Builds mutant `index` and runs the commands on it; returns (finding or None, exit codes)."""
    rng = random.Random(args.seed * 1_000_003 + index)
    name, original = rng.choice(originals)
    mutant, mutations = make_mutant(original, rng)
    work = os.path.join(tmp, str(index))
    os.makedirs(work)
    path = os.path.join(work, "mutant.onnx")
    with open(path, "wb") as f:
        f.write(mutant.SerializeToString())
    commands = {"info": [args.binary, "info", path],
                "run": [args.binary, "run", path, "--threads", "1", "--output-dir", os.path.join(work, "out")]
                + [a for feed in feeds[name] for a in ("--input", feed)]}
    codes = []
    finding = None
    for command in args.commands.split(","):
        rc, message = run_cli(commands[command], args.timeout, args.memory_mb)
        codes.append(f"{command} rc {rc}")
        bad = verdict(rc)
        if bad:
            saved = f"{name}-s{args.seed}-{index}.onnx"
            with open(os.path.join(args.save_dir, saved), "wb") as f:
                f.write(mutant.SerializeToString())
            finding = {"index": index, "model": name, "mutations": mutations, "command": command,
                       "verdict": bad, "message": message, "saved": saved}
            break  # one finding per mutant is enough to keep it
    shutil.rmtree(work, ignore_errors=True)
    return finding, codes


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--only", type=int, action="append", help="run only this mutant index (repeatable)")
    parser.add_argument("--binary", default=os.path.join(ROOT, "build", "slimquant"))
    parser.add_argument("--commands", default="run", help="comma-separated: info, run (run loads the model too)")
    parser.add_argument("--jobs", type=int, default=4, help="mutants checked at once")
    parser.add_argument("--models", nargs="*", default=[
        os.path.join(ROOT, "tests/fixtures/models", m + ".onnx") for m in ("resnet_small", "mobilenetv2_small", "vit_small")]
        + [os.path.join(ROOT, "fuzz/corpus/onnx_loader", m + ".onnx") for m in ("cnn", "attention", "shapes", "if", "qdq")])
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per command")
    parser.add_argument("--memory-mb", type=int, default=4096, help="address-space limit per command (ulimit -v)")
    parser.add_argument("--save-dir", default=os.path.join(ROOT, "fuzz/regressions/onnx_loader"))
    parser.add_argument("--summary", default=None, help="JSON summary file (default: <save-dir>/../mutate_models-s<seed>.json)")
    args = parser.parse_args()

    originals = [(os.path.splitext(os.path.basename(p))[0], onnx.load(p)) for p in args.models]
    indices = args.only or range(args.count)
    os.makedirs(args.save_dir, exist_ok=True)
    counts = collections.Counter()
    findings = []
    with tempfile.TemporaryDirectory(prefix="slimquant-mutants-") as tmp:
        feeds = {}
        for name, model in originals:
            feeds[name] = []
            for input_name, array in input_arrays(model).items():
                path = os.path.join(tmp, f"{name}.{len(feeds[name])}.npy")
                np.save(path, array)
                feeds[name].append(f"{input_name}={path}")
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            futures = [pool.submit(check_mutant, i, args, originals, feeds, tmp) for i in indices]
            for done, future in enumerate(futures, 1):
                finding, codes = future.result()
                counts.update(codes)
                if finding:
                    findings.append(finding)
                    print(f"[{finding['index']}] {finding['model']} {'; '.join(finding['mutations'])}: "
                          f"{finding['command']} -> {finding['verdict']} {finding['message']}", flush=True)
                if done % 100 == 0:
                    print(f"{done} mutants, {len(findings)} findings", file=sys.stderr, flush=True)

    summary = {"seed": args.seed, "count": len(indices), "exit_codes": dict(sorted(counts.items())),
               "findings": findings}
    summary_path = args.summary or os.path.join(os.path.dirname(os.path.normpath(args.save_dir)),
                                                f"mutate_models-s{args.seed}.json")
    if findings or args.summary:
        with open(summary_path, "w") as f:
            json.dump(summary, f, indent=1, default=str)
    print(json.dumps({"mutants": len(indices), "findings": len(findings), "exit_codes": summary["exit_codes"],
                      "by_verdict": collections.Counter(f["verdict"] for f in findings),
                      "summary": summary_path if findings or args.summary else None}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
