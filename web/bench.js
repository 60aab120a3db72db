// The bench page: the native `bench` suites' problems (from the library, so the shapes
// are the same) timed in the browser, one row per (problem, kernel), written as the native
// `bench --json` schema. `?suite=quick&kernels=fused,materialized&reps=3&run=1` starts a
// run at once (a kernel may name a tiling: `fused/shared`)
// and reports it (page.js), for web/headless.py.
import { fail, openContext, report } from './page.js';

const $ = (id) => document.getElementById(id);
const SCHEMA = 'wgpu-attention-bench/1';

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

// Times one problem: the first call (pipelines compile), one warm-up, then `reps`.
async function time(problem, reps) {
  const once = async () => {
    const t0 = performance.now();
    await problem.run();
    return performance.now() - t0;
  };
  const first = await once();
  await once();
  const samples = [];
  for (let i = 0; i < reps; i++) samples.push(await once());
  return { first, samples };
}

function row(cells, cls) {
  const tr = $('rows').insertRow();
  for (const c of cells) tr.insertCell().textContent = c;
  if (cls) tr.className = cls;
}

async function run(ctx, adapter, suite, kernels, reps) {
  const rows = [];
  const cases = JSON.parse(ctx.benchCases(suite));
  const total = cases.length * kernels.length;
  const started = performance.now();
  for (const c of cases) {
    const [b, hq, hkv, lq, lk, d, dv] = c.shape;
    const mask = c.causal ? 'causal-top-left' : 'none';
    const label = `${c.shape.join(',')} ${mask} ${c.dtype}`;
    for (const kernel of kernels) {
      // `fused/shared` forces a tiling, as WGPU_ATTENTION_TILING does natively.
      const [family, tiling] = kernel.split('/');
      $('summary').textContent = `${rows.length + 1} of ${total}: ${label} ${kernel}`;
      const base = { batch: b, heads_q: hq, heads_kv: hkv, len_q: lq, len_k: lk, head_dim: d, head_dim_v: dv,
        mask, dtype: c.dtype, precision: 'highest', kernel };
      try {
        const problem = await ctx.benchProblem({ shape: c.shape, causal: c.causal, dtype: c.dtype, kernel: family, tiling });
        const [name, flops, bytes] = [problem.kernel(), problem.flops(), problem.bytes()];
        let timed;
        try {
          timed = await time(problem, reps);
        } finally {
          problem.free();
        }
        const { first, samples } = timed;
        const med = median(samples);
        const r = { ...base, kernel: name, flops, compulsory_bytes: bytes,
          status: 'measured', clock: 'wall-clock', reps, first_ms: first, median_ms: med,
          min_ms: Math.min(...samples), max_ms: Math.max(...samples),
          gflops: flops / med / 1e6, gbps: bytes / med / 1e6, tokens_per_second: b * lq / med * 1e3 };
        rows.push(r);
        row([label, r.kernel, first.toFixed(1), med.toFixed(2), r.min_ms.toFixed(2), r.gflops.toFixed(2),
          r.gbps.toFixed(2)]);
      } catch (e) {
        const reason = String(e.message ?? e);
        rows.push({ ...base, status: 'skipped', reason });
        row([label, kernel, reason], 'error');
      }
    }
  }
  const seconds = (performance.now() - started) / 1000;
  $('summary').textContent = `${rows.length} rows in ${seconds.toFixed(1)} s`;
  return {
    schema: SCHEMA,
    tool_version: 'web',
    unix_time: Math.floor(Date.now() / 1000),
    suite,
    reps,
    flops: '2*B*Hq*Lq*Lk*(D+Dv), i.e. 4*B*Hq*Lq*Lk*D when Dv = D; halved for causal',
    compulsory_bytes: "Q, K, V read once and O written once, at the row's dtype",
    runs: [{
      adapter: { name: adapter.name, backend: `${adapter.backend} (${navigator.userAgent})`,
        device_type: adapter.device_type, driver: adapter.driver, driver_info: adapter.driver_info },
      timing_clock: 'wall-clock',
      probe: {},
      rows,
    }],
  };
}

async function main() {
  const { ctx, adapter } = await openContext();
  const params = new URLSearchParams(location.search);
  for (const key of ['suite', 'kernels', 'reps']) {
    if (!params.has(key)) continue;
    // A list of kernels the menu lacks (e.g. fused/shared,fused/blocked) joins it.
    if (key === 'kernels' && ![...$(key).options].some((o) => o.value === params.get(key))) {
      $(key).add(new Option(params.get(key), params.get(key)));
    }
    $(key).value = params.get(key);
  }
  const start = async () => {
    $('start').disabled = true;
    $('rows').replaceChildren();
    const doc = await run(ctx, adapter, $('suite').value, $('kernels').value.split(','), Number($('reps').value));
    const link = $('download');
    link.href = URL.createObjectURL(new Blob([JSON.stringify(doc, null, 1)], { type: 'application/json' }));
    link.hidden = false;
    $('start').disabled = false;
    return doc;
  };
  $('form').addEventListener('submit', (e) => {
    e.preventDefault();
    start().catch(fail);
  });
  if (params.get('run') === '1') await report(await start());
}

main().catch(fail);
