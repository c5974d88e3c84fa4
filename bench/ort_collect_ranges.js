#!/usr/bin/env node
// Calibration ranges for bench/ort_style_quantize.py: runs a model whose graph outputs include every
// tensor to calibrate (the script writes it) in ONNX Runtime on raw float32 calibration data, batch by
// batch, and writes {"ort_version", "ranges": {tensor: [min, max]}} (min/max over all batches, NaNs
// skipped), the MinMax calibration of ORT's quantizer.
//   node bench/ort_collect_ranges.js MODEL DATA.f32 NxCxHxW BATCH OUT.json [--ort latest|pinned]
const fs = require('fs');

const args = process.argv.slice(2);
const opt = (name, def) => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : def; };
const [modelPath, dataPath, shapeText, batchText, outPath] = args;
const which = opt('--ort', 'latest');
if (!['latest', 'pinned'].includes(which)) {
  console.error(`error: --ort must be latest or pinned, got '${which}'`);
  process.exit(1);
}
const pkg = which === 'latest' ? 'onnxruntime-node-latest' : 'onnxruntime-node';
const ort = require(pkg);

(async () => {
  if (!outPath) throw new Error('usage: ort_collect_ranges.js MODEL DATA.f32 NxCxHxW BATCH OUT.json [--ort latest|pinned]');
  const shape = shapeText.split('x').map(Number);
  const batch = parseInt(batchText, 10);
  const sampleSize = shape.slice(1).reduce((a, b) => a * b, 1);
  const buf = fs.readFileSync(dataPath);
  const data = new Float32Array(buf.buffer, buf.byteOffset, buf.byteLength / 4);
  if (data.length !== shape[0] * sampleSize)
    throw new Error(`${dataPath}: ${data.length} floats, expected ${shape.join('x')}`);
  const session = await ort.InferenceSession.create(modelPath, { intraOpNumThreads: 2, interOpNumThreads: 1 });
  const ranges = {};
  for (let start = 0; start < shape[0]; start += batch) {
    const n = Math.min(batch, shape[0] - start);
    const x = data.slice(start * sampleSize, (start + n) * sampleSize);
    const out = await session.run({ [session.inputNames[0]]: new ort.Tensor('float32', x, [n, ...shape.slice(1)]) });
    for (const [name, tensor] of Object.entries(out)) {
      if (tensor.type !== 'float32') continue;
      let lo = Infinity, hi = -Infinity;
      for (const v of tensor.data) { if (v < lo) lo = v; if (v > hi) hi = v; }
      if (lo > hi) continue;  // empty or all NaN
      const r = ranges[name];
      ranges[name] = r ? [Math.min(r[0], lo), Math.max(r[1], hi)] : [lo, hi];
    }
  }
  const version = require(`${pkg}/package.json`).version;
  fs.writeFileSync(outPath, JSON.stringify({ ort_version: version, ranges }));
})().catch((e) => { console.error('error:', e.message); process.exit(1); });
