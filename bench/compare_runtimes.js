#!/usr/bin/env node
// Latency table: slimquant vs ONNX Runtime (onnxruntime-node) on the fixture models, FP32 (and
// INT8 models when given), batch 1 and 32, one thread, median of N runs each. slimquant is timed
// by its own `bench` command (in-process timing, same method as here); ONNX Runtime in this process.
//
//   node bench/compare_runtimes.js [--runs 50] [--models resnet_small,...] [--int8-dir DIR]
const { execFileSync } = require('child_process');
const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');

const root = path.resolve(__dirname, '..');
const args = process.argv.slice(2);
const opt = (name, def) => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : def; };
const runs = parseInt(opt('--runs', '50'), 10);
const models = opt('--models', 'resnet_small,mobilenetv2_small,vit_small').split(',');
const int8Dir = opt('--int8-dir', '');
const cli = path.join(root, 'build', 'slimquant');

function median(xs) { const s = [...xs].sort((a, b) => a - b); const m = s.length >> 1; return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; }

async function ortLatency(modelPath, shape) {
  const session = await ort.InferenceSession.create(modelPath, {
    intraOpNumThreads: 1, interOpNumThreads: 1, executionMode: 'sequential', graphOptimizationLevel: 'all',
  });
  const n = shape.reduce((a, b) => a * b, 1);
  const data = Float32Array.from({ length: n }, (_, i) => ((i * 2654435761) % 1000) / 1000);
  const feeds = { [session.inputNames[0]]: new ort.Tensor('float32', data, shape) };
  for (let i = 0; i < 5; i++) await session.run(feeds);
  const ms = [];
  for (let i = 0; i < runs; i++) {
    const t0 = process.hrtime.bigint();
    await session.run(feeds);
    ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  return median(ms);
}

function slimquantLatency(modelPath, shape) {
  const out = execFileSync(cli, ['--quiet', 'bench', modelPath, '--shape', shape.join('x'), '--runs', String(runs),
    '--threads', '1', '--json'], { encoding: 'utf8' });
  const last = out.trim().split('\n').pop();
  return JSON.parse(last).median_ms;
}

(async () => {
  const rows = [];
  for (const name of models) {
    const variants = [['FP32', path.join(root, 'tests/fixtures/models', name + '.onnx')]];
    if (int8Dir) variants.push(['INT8', path.join(int8Dir, name + '.int8.onnx')]);
    for (const [kind, file] of variants) {
      if (!fs.existsSync(file)) continue;
      for (const batch of [1, 32]) {
        const shape = [batch, 1, 28, 28];
        const sq = slimquantLatency(file, shape);
        const ortMs = await ortLatency(file, shape);
        rows.push({ model: name, kind, batch, slimquant_ms: sq, ort_ms: ortMs, ratio: ortMs / sq, size_bytes: fs.statSync(file).size });
      }
    }
  }
  console.log('| model | type | batch | slimquant ms | ONNX Runtime ms | ORT/slimquant |');
  console.log('|---|---|---|---|---|---|');
  for (const r of rows)
    console.log(`| ${r.model} | ${r.kind} | ${r.batch} | ${r.slimquant_ms.toFixed(3)} | ${r.ort_ms.toFixed(3)} | ${r.ratio.toFixed(2)}x |`);
  console.log(`(median of ${runs} runs, 1 thread, onnxruntime-node ${require('onnxruntime-node/package.json').version})`);
  console.log(JSON.stringify(rows));
})().catch((e) => { console.error(e); process.exit(1); });
