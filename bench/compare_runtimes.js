#!/usr/bin/env node
// Latency table: slimquant vs ONNX Runtime (onnxruntime-node 1.20) on the fixture models, FP32 and
// INT8 (our exported QDQ model: slimquant runs it with integer kernels, ORT with its own QDQ
// fusion), batch 1 and 32, one thread, median of N runs each, plus peak memory (max RSS of the
// process that ran it) and model file sizes.
//
//   node bench/compare_runtimes.js [--runs 50] [--rounds 3] [--models resnet_small,...] [--int8-dir DIR]
//                                  [--weight-bits 8|7] (default: quantize's auto) [--batches 1,32]
//                                  [--calib DATA] [--calib-batch-size 32] [--calib-batches 10]
//
// --models takes fixture names or paths to any .onnx file with one float input whose first
// dimension is the batch (the other dimensions are read with `slimquant info --json`). Models that
// are not fixtures need --calib, a DATA spec for `slimquant quantize` (e.g. npy:DIR).
//
// Each cell is timed in its own process (slimquant: build/slimquant_latency, in-process timing of
// Session::run; ORT: a worker running session.run), so max RSS is per configuration. Wall-clock
// and CPU-time medians are both reported: on a busy shared machine the wall time includes
// preemption, the process CPU time per run does not. The machine is
// shared and noisy: every configuration is measured --rounds times, interleaving slimquant and
// ORT, and the smallest of the round medians is reported. INT8 models are made with
// `slimquant quantize` (10 calibration batches of 32 Fashion-MNIST training images) into --int8-dir.
const { execFileSync } = require('child_process');
const fs = require('fs');
const path = require('path');

const root = path.resolve(__dirname, '..');
const args = process.argv.slice(2);
const opt = (name, def) => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : def; };
const cli = path.join(root, 'build', 'slimquant');
const latencyBin = path.join(root, 'build', 'slimquant_latency');

function median(xs) { const s = [...xs].sort((a, b) => a - b); const m = s.length >> 1; return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; }

// Worker mode: time ONNX Runtime on one model and shape, print {median_ms, max_rss_kb}.
async function ortWorker(modelPath, shape, runs) {
  const ort = require('onnxruntime-node');
  const session = await ort.InferenceSession.create(modelPath, {
    intraOpNumThreads: 1, interOpNumThreads: 1, executionMode: 'sequential', graphOptimizationLevel: 'all',
  });
  const n = shape.reduce((a, b) => a * b, 1);
  const data = Float32Array.from({ length: n }, (_, i) => ((i * 2654435761) % 1000) / 1000);
  const feeds = { [session.inputNames[0]]: new ort.Tensor('float32', data, shape) };
  for (let i = 0; i < 5; i++) await session.run(feeds);
  const ms = [], cpu = [];
  for (let i = 0; i < runs; i++) {
    const c0 = process.cpuUsage();
    const t0 = process.hrtime.bigint();
    await session.run(feeds);
    ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
    const c = process.cpuUsage(c0);
    cpu.push((c.user + c.system) / 1e3);
  }
  console.log(JSON.stringify({ median_ms: median(ms), cpu_median_ms: median(cpu), max_rss_kb: process.resourceUsage().maxRSS }));
}

function ortLatency(modelPath, shape, runs) {
  const out = execFileSync(process.execPath, [__filename, '--ort-worker', modelPath, shape.join('x'), String(runs)],
    { encoding: 'utf8' });
  return JSON.parse(out.trim().split('\n').pop());
}

function slimquantLatency(modelPath, shape, runs) {
  // build/slimquant_latency (bench/latency.cpp): Session::run timed in-process, wall and CPU time;
  // GNU time writes its max RSS (KiB).
  const rssFile = path.join(require('os').tmpdir(), `sq_bench_rss_${process.pid}`);
  const out = execFileSync('/usr/bin/time', ['-f', '%M', '-o', rssFile, latencyBin, modelPath, shape.join('x'),
    String(runs)], { encoding: 'utf8' });
  const rss = parseInt(fs.readFileSync(rssFile, 'utf8').trim().split('\n').pop(), 10);
  fs.unlinkSync(rssFile);
  const r = JSON.parse(out.trim().split('\n').pop());
  return { median_ms: r.median_ms, cpu_median_ms: r.cpu_median_ms, max_rss_kb: rss };
}

// Quantized afresh every time (a fraction of a second): a model left from an older build or other
// settings would silently measure something else.
function makeInt8(name, fp32, int8Dir, weightBits, calib) {
  const file = path.join(int8Dir, name + '.int8.onnx');
  fs.mkdirSync(int8Dir, { recursive: true });
  const args = ['--quiet', 'quantize', fp32, calib, '--batch-size', opt('--calib-batch-size', '32'),
    '--batch-nums', opt('--calib-batches', '10'), '-o', file, '--no-eval'];
  if (weightBits) args.push('--weight-bits', weightBits);
  execFileSync(cli, args, { stdio: 'inherit' });
  return file;
}

// The model's one input without its batch dimension, e.g. [3, 224, 224].
function inputSampleShape(modelPath) {
  const info = JSON.parse(execFileSync(cli, ['info', modelPath, '--json'], { encoding: 'utf8' }).trim().split('\n').pop());
  const dims = info.inputs[0].shape.slice(1);
  if (info.inputs.length !== 1 || dims.some((d) => typeof d !== 'number'))
    throw new Error(`${modelPath}: needs exactly one input with fixed non-batch dimensions, has ${JSON.stringify(info.inputs)}`);
  return dims;
}

async function main() {
  const runs = parseInt(opt('--runs', '50'), 10);
  const rounds = parseInt(opt('--rounds', '3'), 10);
  const models = opt('--models', 'resnet_small,mobilenetv2_small,vit_small').split(',');
  const int8Dir = path.resolve(opt('--int8-dir', path.join(root, 'build', 'bench_int8')));
  const batches = opt('--batches', '1,32').split(',').map(Number);
  const cells = [];
  for (const spec of models) {
    const external = spec.endsWith('.onnx');
    const name = external ? path.basename(spec, '.onnx') : spec;
    const fp32 = external ? path.resolve(spec) : path.join(root, 'tests/fixtures/models', name + '.onnx');
    const calib = opt('--calib', external ? '' : 'fashion-mnist:train');
    if (!calib) throw new Error(`${spec}: models that are not fixtures need --calib DATA to be quantized`);
    const int8 = makeInt8(name, fp32, int8Dir, opt('--weight-bits', ''), calib);
    const sampleShape = inputSampleShape(fp32);
    for (const batch of batches)
      for (const [kind, file] of [['FP32', fp32], ['INT8', int8]])
        cells.push({ model: name, kind, batch, file, sampleShape, size: fs.statSync(file).size, sq: [], ort: [] });
  }
  for (let r = 0; r < rounds; r++)
    for (const c of cells) {
      const shape = [c.batch, ...c.sampleShape];
      c.sq.push(slimquantLatency(c.file, shape, runs));
      c.ort.push(ortLatency(c.file, shape, runs));
    }
  const best = (xs) => ({ ms: Math.min(...xs.map((x) => x.median_ms)), cpu: Math.min(...xs.map((x) => x.cpu_median_ms)),
    rss: Math.max(...xs.map((x) => x.max_rss_kb)) });
  const find = (m, k, b) => cells.find((c) => c.model === m && c.kind === k && c.batch === b);
  const rows = [];
  for (const name of [...new Set(cells.map((c) => c.model))])
    for (const batch of batches) {
      const f = find(name, 'FP32', batch), q = find(name, 'INT8', batch);
      const sf = best(f.sq), sq = best(q.sq), of = best(f.ort), oq = best(q.ort);
      rows.push({ model: name, batch, sq_fp32_ms: sf.ms, sq_int8_ms: sq.ms, ort_fp32_ms: of.ms, ort_int8_ms: oq.ms,
        sq_fp32_cpu: sf.cpu, sq_int8_cpu: sq.cpu, ort_fp32_cpu: of.cpu, ort_int8_cpu: oq.cpu,
        sq_fp32_rss_mb: sf.rss / 1024, sq_int8_rss_mb: sq.rss / 1024, ort_fp32_rss_mb: of.rss / 1024,
        ort_int8_rss_mb: oq.rss / 1024, fp32_bytes: f.size, int8_bytes: q.size });
    }
  const f3 = (x) => x.toFixed(3), f2 = (x) => x.toFixed(2);
  console.log('Wall-clock time per run (median, ms):');
  console.log('');
  console.log('| model | batch | slimquant FP32 ms | slimquant INT8 ms | ORT FP32 ms | ORT INT8 ms | ORT/sq FP32 | ORT/sq INT8 | sq INT8 speedup | ORT INT8 speedup |');
  console.log('|---|---|---|---|---|---|---|---|---|---|');
  for (const r of rows)
    console.log(`| ${r.model} | ${r.batch} | ${f3(r.sq_fp32_ms)} | ${f3(r.sq_int8_ms)} | ${f3(r.ort_fp32_ms)} | ${f3(r.ort_int8_ms)} | ` +
      `${f2(r.ort_fp32_ms / r.sq_fp32_ms)} | ${f2(r.ort_int8_ms / r.sq_int8_ms)} | ${f2(r.sq_fp32_ms / r.sq_int8_ms)} | ${f2(r.ort_fp32_ms / r.ort_int8_ms)} |`);
  console.log('');
  console.log('CPU time per run (median, ms; unaffected by preemption on a shared machine):');
  console.log('');
  console.log('| model | batch | slimquant FP32 | slimquant INT8 | ORT FP32 | ORT INT8 | ORT/sq FP32 | ORT/sq INT8 | sq INT8 speedup | ORT INT8 speedup |');
  console.log('|---|---|---|---|---|---|---|---|---|---|');
  for (const r of rows)
    console.log(`| ${r.model} | ${r.batch} | ${f3(r.sq_fp32_cpu)} | ${f3(r.sq_int8_cpu)} | ${f3(r.ort_fp32_cpu)} | ${f3(r.ort_int8_cpu)} | ` +
      `${f2(r.ort_fp32_cpu / r.sq_fp32_cpu)} | ${f2(r.ort_int8_cpu / r.sq_int8_cpu)} | ${f2(r.sq_fp32_cpu / r.sq_int8_cpu)} | ${f2(r.ort_fp32_cpu / r.ort_int8_cpu)} |`);
  console.log('');
  console.log('| model | batch | peak RSS MB: sq FP32 / sq INT8 / ORT FP32 / ORT INT8 | file KB: FP32 / INT8 (ratio) |');
  console.log('|---|---|---|---|');
  for (const r of rows)
    console.log(`| ${r.model} | ${r.batch} | ${r.sq_fp32_rss_mb.toFixed(1)} / ${r.sq_int8_rss_mb.toFixed(1)} / ${r.ort_fp32_rss_mb.toFixed(1)} / ` +
      `${r.ort_int8_rss_mb.toFixed(1)} | ${(r.fp32_bytes / 1024).toFixed(0)} / ${(r.int8_bytes / 1024).toFixed(0)} (${f2(r.int8_bytes / r.fp32_bytes)}) |`);
  console.log(`(best of ${rounds} rounds of median-of-${runs}, 1 thread, onnxruntime-node ` +
    `${require('onnxruntime-node/package.json').version}; ratios > 1: slimquant faster / INT8 faster than FP32)`);
  console.log(JSON.stringify(rows));
}

if (args[0] === '--ort-worker') {
  ortWorker(args[1], args[2].split('x').map(Number), parseInt(args[3], 10)).catch((e) => { console.error(e); process.exit(1); });
} else {
  main().catch((e) => { console.error(e); process.exit(1); });
}
