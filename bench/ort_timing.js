// Timing of an ONNX Runtime session, shared by bench/compare_runtimes.js and bench/model_forms_ort.js:
// `warmup` untimed runs (5 by default), then `runs` timed ones; wall and process CPU time per run (on a shared machine the
// CPU time leaves out preemption), medians and minima in ms.
function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

async function timeSession(session, feeds, runs, warmup = 5) {
  for (let i = 0; i < warmup; i++) await session.run(feeds);
  const ms = [], cpu = [];
  for (let i = 0; i < runs; i++) {
    const c0 = process.cpuUsage();
    const t0 = process.hrtime.bigint();
    await session.run(feeds);
    ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
    const c = process.cpuUsage(c0);
    cpu.push((c.user + c.system) / 1e3);
  }
  return { median_ms: median(ms), cpu_median_ms: median(cpu), min_ms: Math.min(...ms), cpu_min_ms: Math.min(...cpu) };
}

module.exports = { median, timeSession };
