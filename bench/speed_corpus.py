#!/usr/bin/python3
"""Speed over the model corpus (issue 31): our FP32 and INT8 against ONNX Runtime's FP32 and its best
INT8, at batch 1 and 32, one thread, every ratio measured in the same run.

Models and files are bench/model_forms.py's (same OUT_DIR, same cache): for each model its `base`
form (FP32), our default `quantize` of it (`base.int8.onnx`, made here when missing: 6 calibration
samples, --algo auto), and ORT's own INT8 of the same base file in both of its styles
(bench/ort_style_quantize.py: `ort_static`, the QDQ file quantize_static writes, and `ort_dynamic`,
DynamicQuantizeLinear + ConvInteger/MatMulInteger as quantize_dynamic writes it). "ORT best INT8"
is the faster of the two at that batch.

Each configuration is its own process (ours: build/slimquant_latency; ORT: bench/model_forms_ort.js
time, onnxruntime-node-latest or with --ort pinned the pinned 1.20.1, graph optimizations all), timing the median process-CPU ms of RUNS
runs after a warm-up; the five configurations of a model and batch run interleaved, --rounds times,
and each keeps the smallest of its round medians (a shared machine only ever slows a run down;
ORT's INT8 style that took over 3x its other one in the first round is timed once).
A model named NAME@RES is the torchvision architecture at RES x RES (e.g. rsu_unet@1024, lraspp@1024):
those run at batch 1 only.

  /usr/bin/python3 bench/speed_corpus.py OUT_DIR [--models a,b,...] [--batches 1,32] [--runs 20]
                                         [--rounds 3] [--budget-s 8] [--ort latest|pinned] [--build DIR]

--budget-s bounds one timed process: runs = min(--runs, budget / the batch's expected time), at
least 3. Set DNNL_MAX_CPU_ISA (e.g. AVX512_CORE_VNNI on an AMX machine) in the environment to time
oneDNN as on an older CPU; the header names the ISA oneDNN used. Writes OUT_DIR/speed_corpus.{md,json}.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_forms as mf  # noqa: E402

DEFAULT_MODELS = ["mobilenet_v3_small", "resnet18", "efficientnet_b0", "lraspp", "vit_b_16", "ppocr_cls",
                  "ppocr_rec", "ppocr_det", "rsu_unet@1024", "lraspp@1024"]
CONFIGS = ["ours_fp32", "ours_int8", "ort_fp32", "ort_static", "ort_dynamic"]


def time_config(config, files, shape, runs, warmup, work, dtype):
    if config.startswith("ours"):
        ok, so, se = mf.sh([os.path.join(ARGS.build, "slimquant_latency"), files[config], "x".join(map(str, shape)),
                            str(runs), str(warmup)])
        if not ok:
            raise RuntimeError("slimquant_latency: " + mf.first_error_line(se + so))
        return json.loads(so.strip().splitlines()[-1])["cpu_median_ms"]
    x = (((np.arange(int(np.prod(shape))) * 2654435761) % 1000) / 1000).reshape(shape).astype(dtype)
    feed = os.path.join(work, f"time_input_{shape[0]}.npy")
    if not os.path.exists(feed):
        np.save(feed, x)
    name = next(iter(mf.model_input_types(files[config])))
    ok, so, se = mf.sh(["node", mf.ORT_HELPER, "time", files[config], str(runs), f"{name}={feed}", "--warmup",
                        str(warmup), "--ort", ARGS.ort])
    if not ok:
        raise RuntimeError("ORT: " + mf.first_error_line(so + se))
    return json.loads(so.strip().splitlines()[-1])["cpu_median_ms"]


def model_files(model):
    files = {"ours_fp32": mf.ensure_form(model, "base", ARGS.build),
             "ort_fp32": mf.ensure_form(model, "base", ARGS.build),
             "ort_static": mf.ensure_form(model, "ort_static", ARGS.build),
             "ort_dynamic": mf.ensure_form(model, "ort_dynamic", ARGS.build)}
    int8 = os.path.join(model.dir, "base.int8.onnx")
    if not os.path.exists(int8):
        mf.log(f"  quantizing {model.name}")
        mf.quantize_ours(ARGS.build, model, files["ours_fp32"], int8, "base")
    files["ours_int8"] = int8
    return files


def measure(model, batch):
    files = model_files(model)
    shape = [batch] + model.shape1()[1:]
    work = os.path.join(model.dir, "run", "speed")
    os.makedirs(work, exist_ok=True)
    dtype = np.float32
    best, errors, skipped = {}, {}, set()
    expected_ms = None
    for r in range(ARGS.rounds):
        for config in CONFIGS:
            if config in errors or config in skipped:
                continue
            runs = ARGS.runs if expected_ms is None else max(3, min(ARGS.runs, int(ARGS.budget_s * 1e3 / expected_ms)))
            warmup = 5 if expected_ms is None or expected_ms < 200 else 2
            try:
                t = time_config(config, files, shape, runs, warmup, work, dtype)
            except RuntimeError as e:
                errors[config] = str(e)
                continue
            best[config] = min(t, best.get(config, float("inf")))
            if expected_ms is None:
                expected_ms = t
        # ORT's slower INT8 style cannot be its best: after the first round it is not timed again
        # when it took over 3x the other (its dynamic ConvInteger files at 1024x1024: seconds a run).
        if r == 0 and "ort_static" in best and "ort_dynamic" in best:
            slow, fast = sorted(("ort_static", "ort_dynamic"), key=lambda c: -best[c])
            if best[slow] > 3 * best[fast]:
                skipped.add(slow)
        mf.log(f"  {model.name} batch {batch} round {r + 1}: " +
               ", ".join(f"{c} {best[c]:.2f}" for c in CONFIGS if c in best))
    row = {"model": model.name, "batch": batch, **{f"{c}_ms": best.get(c) for c in CONFIGS}, "errors": errors}
    ort_int8 = [best[c] for c in ("ort_static", "ort_dynamic") if c in best]
    row["ort_best_int8_ms"] = min(ort_int8) if ort_int8 else None
    row["ort_best_int8_style"] = None if not ort_int8 else (
        "static" if best.get("ort_static", float("inf")) <= best.get("ort_dynamic", float("inf")) else "dynamic")
    ratio = lambda a, b: a / b if a and b else None  # noqa: E731
    row["fp32_ratio"] = ratio(best.get("ort_fp32"), best.get("ours_fp32"))
    row["int8_ratio"] = ratio(row["ort_best_int8_ms"], best.get("ours_int8"))
    row["int8_speedup"] = ratio(best.get("ours_fp32"), best.get("ours_int8"))
    return row


def markdown(rows):
    head = ["model", "batch", "our FP32 ms", "our INT8 ms", "ORT FP32 ms", "ORT static ms", "ORT dynamic ms",
            "FP32 ORT/ours", "INT8 ORT best/ours", "our INT8 / our FP32"]
    keys = ["ours_fp32_ms", "ours_int8_ms", "ort_fp32_ms", "ort_static_ms", "ort_dynamic_ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], str(r["batch"])] + [mf.fmt(r[k], 2) for k in keys]
        cells += [mf.fmt(r["fp32_ratio"], 2), mf.fmt(r["int8_ratio"], 2) +
                  (f" ({r['ort_best_int8_style']})" if r["ort_best_int8_style"] else ""), mf.fmt(r["int8_speedup"], 2)]
        lines.append("| " + " | ".join(cells) + " |")
        for config, why in r["errors"].items():
            lines.append(f"| {r['model']} | {r['batch']} | {config} failed: {why.replace('|', '/')[:200]} |")
    return "\n".join(lines)


def ort_package_line(choice):
    package = {"latest": "onnxruntime-node-latest", "pinned": "onnxruntime-node"}[choice]
    with open(os.path.join(mf.ROOT, "bench", "node_modules", package, "package.json")) as f:
        return f"{package} {json.load(f)['version']}"


def geomean(values):
    values = [v for v in values if v]
    return float(np.exp(np.mean(np.log(values)))) if values else None


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--build", default=os.path.join(mf.ROOT, "build"))
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=8.0)
    parser.add_argument("--ort", choices=["latest", "pinned"], default="latest",
                        help="onnxruntime-node-latest or the pinned onnxruntime-node (bench/package.json)")
    ARGS = parser.parse_args()
    ARGS.build = os.path.abspath(ARGS.build)
    t0 = time.time()
    cpu, isa = mf.machine_line(ARGS.build)
    rows = []
    for model in mf.make_models(ARGS.models.split(","), ARGS.out):
        batches = [1] if "@" in model.name else [int(b) for b in ARGS.batches.split(",")]
        for batch in batches:
            try:
                rows.append(measure(model, batch))
            except RuntimeError as e:
                rows.append({"model": model.name, "batch": batch, "errors": {"files": str(e)},
                             **{k: None for k in ["ours_fp32_ms", "ours_int8_ms", "ort_fp32_ms", "ort_static_ms",
                                                  "ort_dynamic_ms", "fp32_ratio", "int8_ratio", "int8_speedup",
                                                  "ort_best_int8_style"]}})
            mf.log(json.dumps(rows[-1]))
    cap = os.environ.get("DNNL_MAX_CPU_ISA")
    header = (f"CPU: {cpu}; oneDNN ISA: {isa}" + (f" (DNNL_MAX_CPU_ISA={cap})" if cap else "") +
              f"; one thread; median CPU ms of up to {ARGS.runs} runs, best of {ARGS.rounds} interleaved rounds; "
              f"ORT: {ort_package_line(ARGS.ort)}; {time.time() - t0:.0f} s in all")
    summary = []
    for batch in sorted({r["batch"] for r in rows}):
        at = [r for r in rows if r["batch"] == batch]
        fp32, int8 = [r["fp32_ratio"] for r in at], [r["int8_ratio"] for r in at]
        summary.append(f"batch {batch}: FP32 ORT/ours min {mf.fmt(min(filter(None, fp32), default=None))}, "
                       f"geomean {mf.fmt(geomean(fp32))}; INT8 ORT best/ours min "
                       f"{mf.fmt(min(filter(None, int8), default=None))}, geomean {mf.fmt(geomean(int8))}")
    text = header + "\n\n" + markdown(rows) + "\n\n" + "\n".join(summary) + "\n"
    with open(os.path.join(ARGS.out, "speed_corpus.md"), "w") as f:
        f.write(text)
    with open(os.path.join(ARGS.out, "speed_corpus.json"), "w") as f:
        json.dump({"cpu": cpu, "onednn_isa": isa, "isa_cap": cap, "rows": rows}, f, indent=1)
    print(text)


if __name__ == "__main__":
    ARGS = None
    main()
