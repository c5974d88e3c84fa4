#!/usr/bin/env node
// Where the time goes, per node, in ONNX Runtime (bench/node_times.py's ORT side): one thread,
// graph optimizations all, `warmup` untimed runs, then `runs` runs under ORT's profiler; prints one
// JSON line {"nodes": [{"name", "op", "ms"}], "runs", "ort_version"} with each node's mean kernel
// time per run (ORT's fused nodes keep the name of the node they grew from, plus a suffix).
//
//   node bench/node_times.js MODEL RUNS NAME=FILE.npy [...] [--warmup N]
const fs = require('fs');
const os = require('os');
const path = require('path');
const ort = require('onnxruntime-node-latest');
const { readNpy } = require('./model_forms_ort');

async function main() {
  const args = process.argv.slice(2);
  const warmupIndex = args.indexOf('--warmup');
  const warmup = warmupIndex >= 0 ? parseInt(args.splice(warmupIndex, 2)[1], 10) : 3;
  const [model, runsText, ...inputSpecs] = args;
  const runs = parseInt(runsText, 10);
  const feeds = {};
  for (const spec of inputSpecs) {
    const eq = spec.indexOf('=');
    const a = readNpy(spec.slice(eq + 1));
    feeds[spec.slice(0, eq)] = new ort.Tensor(a.type, a.data, a.shape);
  }
  const options = { intraOpNumThreads: 1, interOpNumThreads: 1, executionMode: 'sequential', graphOptimizationLevel: 'all' };
  const plain = await ort.InferenceSession.create(model, options);
  for (let i = 0; i < warmup; i++) await plain.run(feeds);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'node_times_'));
  const session = await ort.InferenceSession.create(model, { ...options, enableProfiling: true,
    profileFilePrefix: path.join(dir, 'ort') });
  await session.run(feeds);  // the first run creates kernels: not counted
  const first = Date.now();
  for (let i = 0; i < runs; i++) await session.run(feeds);
  await session.endProfiling();
  const file = fs.readdirSync(dir).map((f) => path.join(dir, f))[0];
  const events = JSON.parse(fs.readFileSync(file));
  fs.rmSync(dir, { recursive: true });
  const byNode = new Map();
  let seen = 0;
  for (const e of events) {
    if (e.cat !== 'Node' || !e.name.endsWith('_kernel_time')) continue;
    const name = e.name.slice(0, -'_kernel_time'.length);
    const entry = byNode.get(name) || { name, op: e.args.op_name, us: [] };
    entry.us.push(e.dur);
    byNode.set(name, entry);
    seen++;
  }
  // Every run logs each node once: keep the last `runs` entries of each (the first run's are kernel creation).
  const nodes = [...byNode.values()].map((n) => ({ name: n.name, op: n.op,
    ms: n.us.slice(-runs).reduce((a, b) => a + b, 0) / Math.min(runs, n.us.length) / 1e3 }));
  console.log(JSON.stringify({ nodes, runs, events: seen, wall_ms: Date.now() - first,
    ort_version: require('onnxruntime-node-latest/package.json').version }));
}

main().catch((e) => {
  console.log(JSON.stringify({ error: String(e.message || e).split('\n')[0] }));
  process.exit(1);
});
