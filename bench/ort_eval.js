#!/usr/bin/env node
// Top-1 of an ONNX model on the Fashion-MNIST test set under ONNX Runtime (onnxruntime-node).
// Reads Debian's dataset-fashion-mnist IDX files directly; inputs are pixels/255 (the fixtures'
// preprocessing). Last line: {"top1": ..., "samples": ..., "ort_version": ...}.
//   node bench/ort_eval.js MODEL [--limit N] [--dir /usr/share/datasets/fashion-mnist] [--ort pinned|latest]
// --ort: pinned (default) is require('onnxruntime-node') (1.20.1), latest is
// require('onnxruntime-node-latest') (1.30.0).
const fs = require('fs');
const path = require('path');
const zlib = require('zlib');

const args = process.argv.slice(2);
const opt = (name, def) => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : def; };
const ortChoice = opt('--ort', 'pinned');
if (!['pinned', 'latest'].includes(ortChoice)) {
  console.error(`error: --ort must be pinned or latest, got '${ortChoice}'`);
  process.exit(1);
}
const ortPackage = ortChoice === 'latest' ? 'onnxruntime-node-latest' : 'onnxruntime-node';
const ort = require(ortPackage);
const model = args[0];
const dir = opt('--dir', process.env.SLIMQUANT_FASHION_MNIST_DIR || '/usr/share/datasets/fashion-mnist');
const limit = parseInt(opt('--limit', '0'), 10);

function readIdx(file) {
  let buf = fs.readFileSync(file);
  if (file.endsWith('.gz')) buf = zlib.gunzipSync(buf);
  const ndim = buf[3];
  const dims = [];
  for (let i = 0; i < ndim; i++) dims.push(buf.readUInt32BE(4 + 4 * i));
  return { dims, data: buf.subarray(4 + 4 * ndim) };
}

(async () => {
  const images = readIdx(path.join(dir, 't10k-images-idx3-ubyte.gz'));
  const labels = readIdx(path.join(dir, 't10k-labels-idx1-ubyte.gz'));
  const n = limit > 0 ? Math.min(limit, images.dims[0]) : images.dims[0];
  const pixels = images.dims[1] * images.dims[2];
  const session = await ort.InferenceSession.create(model, { intraOpNumThreads: 1, interOpNumThreads: 1 });
  const batch = 100;
  let correct = 0;
  for (let start = 0; start < n; start += batch) {
    const m = Math.min(batch, n - start);
    const x = new Float32Array(m * pixels);
    for (let i = 0; i < m * pixels; i++) x[i] = images.data[start * pixels + i] / 255;
    const out = await session.run({ [session.inputNames[0]]: new ort.Tensor('float32', x, [m, 1, images.dims[1], images.dims[2]]) });
    const logits = out[session.outputNames[0]].data;
    const classes = logits.length / m;
    for (let i = 0; i < m; i++) {
      let best = 0;
      for (let c = 1; c < classes; c++) if (logits[i * classes + c] > logits[i * classes + best]) best = c;
      if (best === labels.data[start + i]) correct++;
    }
  }
  console.log(JSON.stringify({ top1: correct / n, samples: n, ort_version: require(`${ortPackage}/package.json`).version }));
})().catch((e) => { console.error('error:', e.message); process.exit(1); });
