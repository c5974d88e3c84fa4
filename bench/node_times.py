#!/usr/bin/python3
"""Where the time goes, per node and per op type, in slimquant and in ONNX Runtime on the same file
(issue 31: show where a model's time goes before changing a kernel).

Ours: build/slimquant_latency under SLIMQUANT_PROFILE=1 (each node's mean and fastest kernel time
over the timed runs; QDQ files by integer execution). ORT: bench/node_times.js (its profiler, one
thread, graph optimizations all). Both on the same input, one after the other, one thread each.
Both runtimes fuse, and name fused nodes differently (slimquant keeps the layer's name; ORT names a
Conv + BatchNorm + Relu "<Relu output>_nchwc", x * Sigmoid(x) "<Mul>/QuickGeluFusion/"): nodes are
grouped by their anchor, the layer (Conv, Gemm, MatMul, pool, ...) they follow in the original graph
through elementwise ops, and each group's time is compared; the op-type totals show the rest.

  /usr/bin/python3 bench/node_times.py MODEL SHAPE [--ort-model FILE] [--runs 20] [--top 25] [--build DIR]

SHAPE like 1x3x224x224 (the first model input; one-input models). --ort-model times another file in
ORT (e.g. ORT's own INT8 of the model, bench/ort_style_quantize.py) against MODEL in slimquant.
"""
import argparse
import json
import os
import re
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ours(build, model, shape, runs):
    env = dict(os.environ, SLIMQUANT_PROFILE="1", OMP_NUM_THREADS="1")
    p = subprocess.run([os.path.join(build, "slimquant_latency"), model, "x".join(map(str, shape)), str(runs)],
                       capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"slimquant_latency: {p.stderr.strip()[-400:]}")
    nodes = []
    for line in p.stderr.splitlines():
        m = re.match(r"\s*([\d.]+) ms\s+([\d.]+) ms\s+[\d.]+%\s+(\S+) '(.*)'", line)
        if m:
            nodes.append({"mean": float(m.group(1)), "min": float(m.group(2)), "op": m.group(3), "name": m.group(4)})
    whole = json.loads(p.stdout.strip().splitlines()[-1])
    return nodes, whole


def ort(model, shape, runs, work):
    import onnx
    x = (((np.arange(int(np.prod(shape))) * 2654435761) % 1000) / 1000).reshape(shape).astype(np.float32)
    feed = os.path.join(work, "node_times_input.npy")
    np.save(feed, x)
    m = onnx.load(model, load_external_data=False)
    init = {t.name for t in m.graph.initializer}
    name = next(v.name for v in m.graph.input if v.name not in init)
    p = subprocess.run(["node", os.path.join(ROOT, "bench", "node_times.js"), model, str(runs), f"{name}={feed}"],
                       capture_output=True, text=True)
    out = json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {"error": p.stderr[-400:]}
    if "error" in out:
        sys.exit(f"ORT: {out['error']}")
    return out


ELEMENTWISE = {"Relu", "Clip", "BatchNormalization", "Add", "Sub", "Mul", "Div", "Sigmoid", "HardSigmoid",
               "HardSwish", "LeakyRelu", "Tanh", "QuantizeLinear", "DequantizeLinear", "Identity"}


class Anchors:
    """Maps a node (by its name, or a value it writes) to its anchor: the nearest non-elementwise node
    found walking back from it through the first non-constant input of elementwise nodes."""

    def __init__(self, model_path):
        import onnx
        g = onnx.load(model_path, load_external_data=False).graph
        self.constants = {t.name for t in g.initializer}
        self.by_name = {n.name: n for n in g.node if n.name}
        self.producer = {o: n for n in g.node for o in n.output}

    def of_node(self, node):
        seen = 0
        while node is not None and node.op_type in ELEMENTWISE and seen < 16:
            data = [i for i in node.input if i and i not in self.constants and i in self.producer]
            node = self.producer[data[0]] if data else None
            seen += 1
        return None if node is None else (node.name or node.output[0])

    def of(self, name):
        """name: a node name, or a value name (ORT's fused nodes are named after their last output)."""
        for candidate in (name, re.sub(r"/QuickGeluFusion/?$", "", name), re.sub(r"_nchwc$", "", name),
                          re.sub(r"_quant$", "", name)):
            if candidate in self.by_name:
                return self.of_node(self.by_name[candidate])
            if candidate in self.producer:
                return self.of_node(self.producer[candidate])
        return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("shape")
    parser.add_argument("--ort-model")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    args = parser.parse_args()
    shape = [int(s) for s in args.shape.split("x")]
    work = os.path.join("/tmp", f"node_times_{os.getpid()}")
    os.makedirs(work, exist_ok=True)
    our_nodes, whole = ours(os.path.abspath(args.build), args.model, shape, args.runs)
    theirs = ort(args.ort_model or args.model, shape, args.runs, work)

    print(f"slimquant: {whole['cpu_median_ms']:.3f} CPU ms per run (median of {args.runs}), kernels "
          f"{sum(n['mean'] for n in our_nodes):.3f} ms mean, {sum(n['min'] for n in our_nodes):.3f} ms sum of "
          f"per-node minima; ORT {theirs['ort_version']}: kernels {sum(n['ms'] for n in theirs['nodes']):.3f} ms "
          f"mean (under its profiler)\n")
    by_op = {}
    for n in our_nodes:
        by_op.setdefault(n["op"], [0.0, 0.0])[0] += n["mean"]
    for n in theirs["nodes"]:
        by_op.setdefault(n["op"], [0.0, 0.0])[1] += n["ms"]
    print("| op type | slimquant ms | ORT ms |\n|---|---|---|")
    for op, (a, b) in sorted(by_op.items(), key=lambda kv: -max(kv[1])):
        print(f"| {op} | {a:.3f} | {b:.3f} |")

    ours_anchors, ort_anchors = Anchors(args.model), Anchors(args.ort_model or args.model)
    groups = {}  # anchor -> [our mean, our min, our ops, ORT ms, ORT ops]
    for n in our_nodes:
        g = groups.setdefault(ours_anchors.of(n["name"]) or n["name"], [0.0, 0.0, set(), 0.0, set()])
        g[0] += n["mean"]
        g[1] += n["min"]
        g[2].add(n["op"])
    unmatched = 0.0
    for n in theirs["nodes"]:
        a = ort_anchors.of(n["name"])
        if a is None or a not in groups:
            unmatched += n["ms"]
            continue
        groups[a][3] += n["ms"]
        groups[a][4].add(n["op"])
    print(f"\nTop {args.top} layers by slimquant's mean time: each layer with the elementwise ops after it "
          f"(ORT's nodes matched to no layer: {unmatched:.3f} ms)\n")
    print("| layer | slimquant ops | mean ms | min ms | ORT ops | ORT ms | ORT / slimquant |\n|---|---|---|---|---|---|---|")
    for name, (mean, low, ops, ort_ms, ort_ops) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:args.top]:
        ratio = f"{ort_ms / mean:.2f}" if ort_ms and mean else "—"
        print(f"| {name} | {'+'.join(sorted(ops))} | {mean:.3f} | {low:.3f} | {'+'.join(sorted(ort_ops)) or '—'} | "
              f"{ort_ms:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
