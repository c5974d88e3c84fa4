#!/usr/bin/env node
// ONNX Runtime side of bench/model_forms.py: runs one model on .npy inputs and writes its outputs as
// .npy, or times it, one thread, graph optimizations all (what a user of ORT's defaults deploys).
//
//   node bench/model_forms_ort.js run MODEL OUT_DIR NAME=FILE.npy [...] [--ort latest|pinned]
//       writes OUT_DIR/<i>.npy for the i-th output and OUT_DIR/outputs.json {file: output name}
//   node bench/model_forms_ort.js time MODEL RUNS NAME=FILE.npy [...] [--ort latest|pinned] [--warmup N]
//       prints {"median_ms", "cpu_median_ms", "min_ms", "cpu_min_ms", "runs", "ort_version"} (bench/ort_timing.js)
//
// The last line printed is JSON; a failure prints {"error": "..."} and exits 1, so the caller can put
// ORT's own message into its table.
const fs = require('fs');
const path = require('path');
const { timeSession } = require('./ort_timing');

const NPY_DTYPES = {  // numpy descr -> [ORT type, typed array constructor]
  '<f4': ['float32', Float32Array], '<f2': ['float16', Uint16Array], '<f8': ['float64', Float64Array],
  '<i8': ['int64', BigInt64Array], '<i4': ['int32', Int32Array], '|u1': ['uint8', Uint8Array],
  '|i1': ['int8', Int8Array], '|b1': ['bool', Uint8Array],
};

function readNpy(file) {
  const buf = fs.readFileSync(file);
  if (buf.toString('latin1', 1, 6) !== 'NUMPY') throw new Error(`${file}: not a .npy file`);
  const major = buf[6];
  const headerLen = major === 1 ? buf.readUInt16LE(8) : buf.readUInt32LE(8);
  const start = (major === 1 ? 10 : 12) + headerLen;
  const header = buf.toString('latin1', major === 1 ? 10 : 12, start);
  const descr = /'descr':\s*'([^']+)'/.exec(header)[1];
  if (/'fortran_order':\s*True/.test(header)) throw new Error(`${file}: Fortran order is not read`);
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header)[1].split(',').map((s) => s.trim()).filter((s) => s)
    .map(Number);
  const entry = NPY_DTYPES[descr];
  if (!entry) throw new Error(`${file}: dtype ${descr} is not read`);
  const [type, Ctor] = entry;
  const bytes = buf.subarray(start);
  const copy = new Uint8Array(bytes.length);  // aligned copy for the typed array view
  copy.set(bytes);
  const data = new Ctor(copy.buffer, 0, bytes.length / Ctor.BYTES_PER_ELEMENT);
  return { type, data: type === 'bool' ? Uint8Array.from(data, (v) => v !== 0) : data, shape };
}

function writeNpy(file, tensor) {
  const descrOf = { float32: '<f4', float16: '<f2', float64: '<f8', int64: '<i8', int32: '<i4', uint8: '|u1',
    int8: '|i1', bool: '|b1' };
  const descr = descrOf[tensor.type];
  if (!descr) throw new Error(`output type ${tensor.type} is not written`);
  const shape = tensor.dims.length === 1 ? `(${tensor.dims[0]},)` : `(${tensor.dims.join(', ')})`;
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': ${shape}, }`;
  header += ' '.repeat((64 - ((10 + header.length + 1) % 64)) % 64) + '\n';
  const prefix = Buffer.alloc(10);
  prefix.write('\x93NUMPY', 0, 'latin1');
  prefix[6] = 1; prefix[7] = 0;
  prefix.writeUInt16LE(header.length, 8);
  const data = tensor.type === 'bool' ? Uint8Array.from(tensor.data, (v) => (v ? 1 : 0)) : tensor.data;
  fs.writeFileSync(file, Buffer.concat([prefix, Buffer.from(header, 'latin1'),
    Buffer.from(data.buffer, data.byteOffset, data.byteLength)]));
}

async function main() {
  const args = process.argv.slice(2);
  const ortIndex = args.indexOf('--ort');
  const ortChoice = ortIndex >= 0 ? args.splice(ortIndex, 2)[1] : 'latest';
  const warmupIndex = args.indexOf('--warmup');
  const warmup = warmupIndex >= 0 ? parseInt(args.splice(warmupIndex, 2)[1], 10) : 5;
  const ortPackage = { latest: 'onnxruntime-node-latest', pinned: 'onnxruntime-node' }[ortChoice];
  const ort = require(ortPackage);
  const version = require(`${ortPackage}/package.json`).version;
  const [command, model, third, ...inputSpecs] = args;
  const session = await ort.InferenceSession.create(model, {
    intraOpNumThreads: 1, interOpNumThreads: 1, executionMode: 'sequential', graphOptimizationLevel: 'all',
  });
  const feeds = {};
  for (const spec of inputSpecs) {
    const eq = spec.indexOf('=');
    const a = readNpy(spec.slice(eq + 1));
    feeds[spec.slice(0, eq)] = new ort.Tensor(a.type, a.data, a.shape);
  }
  if (command === 'run') {
    fs.mkdirSync(third, { recursive: true });
    const outputs = await session.run(feeds);
    const names = {};
    session.outputNames.forEach((name, i) => {
      writeNpy(path.join(third, `${i}.npy`), outputs[name]);
      names[`${i}.npy`] = name;
    });
    fs.writeFileSync(path.join(third, 'outputs.json'), JSON.stringify(names));
    console.log(JSON.stringify({ ort_version: version, outputs: session.outputNames }));
  } else if (command === 'time') {
    const runs = parseInt(third, 10);
    console.log(JSON.stringify({ ...(await timeSession(session, feeds, runs, warmup)), runs, ort_version: version }));
  } else {
    throw new Error(`unknown command '${command}' (run or time)`);
  }
}

if (require.main === module) {
  main().catch((e) => {
    console.log(JSON.stringify({ error: String(e.message || e).split('\n')[0] }));
    process.exit(1);
  });
}

module.exports = { readNpy, writeNpy };
