// The check page: runs the check grid case by case, shows each row, and POSTs the
// whole report to /report (web/serve.py writes it for CI; elsewhere the POST is ignored).
import init, { AttentionContext } from './pkg/wgpu_attention_web.js';

const $ = (id) => document.getElementById(id);

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
}

// A promise that settles within `ms`: a Rust panic traps the module, and a call it
// interrupted never settles; the report must still come.
const CASE_MS = 120000;
function within(promise, what) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer in ${CASE_MS / 1000} s (a panic? see the console)`)), CASE_MS);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

// One table row per case.
function show(c) {
  const row = $('rows').insertRow();
  cell(row, c.variant);
  cell(row, c.case);
  cell(row, c.max_abs_error === undefined ? '-' : c.max_abs_error.toExponential(2));
  cell(row, c.bound === undefined ? '-' : c.bound.toExponential(2));
  cell(row, c.status === 'ok' ? 'ok' : `${c.status}: ${c.detail}`, c.status);
}

async function report(body) {
  try {
    await fetch('/report', { method: 'POST', body: JSON.stringify(body) });
  } catch (_) {
    // Served without a report endpoint: nothing to tell.
  }
}

async function main() {
  if (!navigator.gpu) throw new Error('this browser has no WebGPU (navigator.gpu is missing)');
  await init();
  const ctx = await AttentionContext.create();
  const adapter = JSON.parse(ctx.info());
  $('adapter').textContent = JSON.stringify(adapter, null, 1);
  const n = ctx.checkCount() + API_CASES;
  const cases = [];
  const started = performance.now();
  for (let i = 0; i < ctx.checkCount(); i++) {
    const c = JSON.parse(await within(ctx.runCheck(i), `check case ${i}`));
    cases.push(c);
    show(c);
    $('summary').textContent = `${i + 1} of ${n} cases run`;
  }
  for (const c of await apiCases(ctx)) {
    cases.push(c);
    show(c);
  }
  const passed = cases.filter((c) => c.status === 'ok').length;
  const seconds = (performance.now() - started) / 1000;
  $('summary').textContent = `${passed} passed, ${n - passed} failed (${seconds.toFixed(1)} s)`;
  $('summary').className = passed === n ? 'ok' : 'failed';
  await report({ adapter, passed, failed: n - passed, seconds, cases });
}

// The JavaScript API itself: attention() against a reference computed here in f64
// (Float64 arithmetic), two calls in flight at once, and a bad shape rejecting the
// promise with the library's error.
const API_CASES = 3;

function seeded(seed) {
  let x = seed >>> 0;
  return () => {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    return x / 2 ** 32 * 2 - 1;
  };
}

// softmax(Q K^T / sqrt(D) + bottom-right causal) V for B = 1, BHSD, GQA by h / (Hq / Hkv).
function reference(q, k, v, [hq, hkv, lq, lk, d, dv]) {
  const out = new Float64Array(hq * lq * dv);
  for (let h = 0; h < hq; h++) {
    const hk = Math.floor(h / (hq / hkv));
    for (let i = 0; i < lq; i++) {
      const visible = i + lk - lq; // last key row i sees
      const s = [];
      for (let j = 0; j <= visible; j++) {
        let dot = 0;
        for (let c = 0; c < d; c++) dot += q[(h * lq + i) * d + c] * k[(hk * lk + j) * d + c];
        s.push(dot / Math.sqrt(d));
      }
      const m = Math.max(...s);
      const e = s.map((x) => Math.exp(x - m));
      const sum = e.reduce((a, b) => a + b, 0);
      for (let c = 0; c < dv; c++) {
        let o = 0;
        for (let j = 0; j < e.length; j++) o += e[j] * v[(hk * lk + j) * dv + c];
        out[(h * lq + i) * dv + c] = o / sum;
      }
    }
  }
  return out;
}

async function apiCases(ctx) {
  const [hq, hkv, lq, lk, d, dv] = [4, 2, 5, 9, 16, 8];
  const rand = seeded(97);
  const fill = (n) => Float32Array.from({ length: n }, rand);
  const q = fill(hq * lq * d), k = fill(hkv * lk * d), v = fill(hkv * lk * dv);
  const label = `B1 Hq${hq} Hkv${hkv} Lq${lq} Lk${lk} D${d} Dv${dv} causal bottom-right, seed 97`;
  const cases = [];
  try {
    const got = await within(ctx.attention(q, k, v, new Uint32Array([1, hq, hkv, lq, lk, d, dv]), 'bottom-right'), 'attention()');
    const want = reference(q, k, v, [hq, hkv, lq, lk, d, dv]);
    let err = got.length === want.length ? 0 : Infinity;
    for (let i = 0; i < want.length; i++) err = Math.max(err, Math.abs(got[i] - want[i]));
    const bound = 1e-5; // f32 accumulation over 16-term dot products and 9 keys
    cases.push({ variant: 'js attention()', case: label, max_abs_error: err, bound,
      status: err <= bound ? 'ok' : 'failed', detail: err <= bound ? '' : `max abs error ${err}` });
  } catch (e) {
    cases.push({ variant: 'js attention()', case: label, status: 'error', detail: String(e.message ?? e) });
  }
  // Two calls in flight at once: each awaits its own error scopes while the other runs.
  const both = 'two calls at once, the same inputs';
  try {
    const shape = new Uint32Array([1, hq, hkv, lq, lk, d, dv]);
    const [a, b] = await within(Promise.all([
      ctx.attention(q, k, v, shape, 'bottom-right'),
      ctx.attention(q, k, v, shape, 'bottom-right'),
    ]), 'two attention() calls');
    const same = a.length === b.length && a.every((x, i) => Object.is(x, b[i]));
    cases.push({ variant: 'js attention()', case: both, status: same ? 'ok' : 'failed',
      detail: same ? '' : 'the two results differ' });
  } catch (e) {
    cases.push({ variant: 'js attention()', case: both, status: 'error', detail: String(e.message ?? e) });
  }
  try {
    await within(ctx.attention(q, k, v, new Uint32Array([1, hq, hkv, lq]), undefined), 'attention()');
    cases.push({ variant: 'js attention()', case: 'a 4-number shape', status: 'failed', detail: 'resolved' });
  } catch (e) {
    const message = String(e.message ?? e);
    const ok = message.includes('shape') && !message.includes('\n');
    cases.push({ variant: 'js attention()', case: 'a 4-number shape', status: ok ? 'ok' : 'failed',
      detail: ok ? '' : `rejected with: ${message}` });
  }
  return cases;
}

main().catch(async (e) => {
  $('summary').textContent = `error: ${e.message ?? e}`;
  $('summary').className = 'error';
  await report({ error: String(e.message ?? e) });
});
