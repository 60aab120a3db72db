// The JavaScript API's own cases on the check page: attention() against an f64
// reference computed here, f16 inputs, concurrent calls, refusals, mha() on PyTorch's
// fixtures (tests/fixtures/torch_mha, served at /fixtures/), and one result compared with
// the native build's output for the same fixture (served at /native/ when the native
// run wrote it: web/native-outputs.sh, served by web/headless.py --native). Each case
// resolves to a table row.
import { fetchNpy } from './npy.js';

// How long one call may take before the case reports it (a Rust panic traps the module,
// and a call it interrupted never settles).
export const CASE_MS = 120000;
export function within(promise, what) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer in ${CASE_MS / 1000} s (a panic? see the console)`)), CASE_MS);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

function seeded(seed) {
  let x = seed >>> 0;
  return () => {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    return x / 2 ** 32 * 2 - 1;
  };
}

// softmax(Q K^T / sqrt(D) + bottom-right causal) V for B = 1, BHSD, GQA by h / (Hq / Hkv);
// the output [Hq, Lq, Dv] and the weights [Hq, Lq, Lk], in f64.
function reference(q, k, v, [hq, hkv, lq, lk, d, dv]) {
  const out = new Float64Array(hq * lq * dv);
  const weights = new Float64Array(hq * lq * lk);
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
      e.forEach((x, j) => { weights[(h * lq + i) * lk + j] = x / sum; });
      for (let c = 0; c < dv; c++) {
        let o = 0;
        for (let j = 0; j < e.length; j++) o += e[j] * v[(hk * lk + j) * dv + c];
        out[(h * lq + i) * dv + c] = o / sum;
      }
    }
  }
  return { out, weights };
}

function maxAbsError(got, want) {
  if (got.length !== want.length) return Infinity;
  let err = 0;
  for (let i = 0; i < want.length; i++) {
    const e = Math.abs(got[i] - want[i]);
    err = Number.isNaN(e) ? Infinity : Math.max(err, e);
  }
  return err;
}

// IEEE half-precision bits of x (round to nearest even) and back.
const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);
function toHalf(x) {
  f32[0] = x;
  const bits = u32[0];
  const sign = (bits >>> 16) & 0x8000;
  const exp = ((bits >>> 23) & 0xff) - 127 + 15;
  let mant = bits & 0x7fffff;
  if (exp >= 31) return sign | 0x7c00;
  if (exp <= 0) {
    if (exp < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - exp;
    const half = mant >>> shift;
    const rest = mant & ((1 << shift) - 1);
    const mid = 1 << (shift - 1);
    return sign | (half + (rest > mid || (rest === mid && (half & 1)) ? 1 : 0));
  }
  const half = (exp << 10) | (mant >>> 13);
  const rest = mant & 0x1fff;
  return sign | (half + (rest > 0x1000 || (rest === 0x1000 && (half & 1)) ? 1 : 0));
}
function fromHalf(h) {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 31) return mant ? NaN : sign * Infinity;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

// A row from a case that measures an error against a bound.
function measured(variant, label, err, bound) {
  return { variant, case: label, max_abs_error: err, bound, status: err <= bound ? 'ok' : 'failed',
    detail: err <= bound ? '' : `max abs error ${err}` };
}

// A row from a case that must reject with a one-line message naming `word`.
async function rejects(variant, label, promise, word) {
  try {
    await within(promise, label);
    return { variant, case: label, status: 'failed', detail: 'resolved' };
  } catch (e) {
    const message = String(e.message ?? e);
    const ok = message.includes(word) && !message.includes('\n');
    return { variant, case: label, status: ok ? 'ok' : 'failed', detail: ok ? '' : `rejected with: ${message}` };
  }
}

const SMALL = [4, 2, 5, 9, 16, 8]; // Hq, Hkv, Lq, Lk, D, Dv
function smallInputs(seed) {
  const [hq, hkv, lq, lk, d, dv] = SMALL;
  const rand = seeded(seed);
  const fill = (n) => Float32Array.from({ length: n }, rand);
  return { q: fill(hq * lq * d), k: fill(hkv * lk * d), v: fill(hkv * lk * dv), shape: [1, ...SMALL] };
}
const smallLabel = (seed) => `B1 Hq4 Hkv2 Lq5 Lk9 D16 Dv8 causal bottom-right, seed ${seed}`;

async function attentionMatchesReference(ctx) {
  const x = smallInputs(97);
  const got = await within(ctx.attention({ ...x, causal: 'bottom-right', returnWeights: true }), 'attention()');
  const want = reference(x.q, x.k, x.v, SMALL);
  // f32 accumulation over 16-term dot products and 9 keys
  const err = Math.max(maxAbsError(got.output, want.out), maxAbsError(got.weights, want.weights));
  return measured('js attention()', `${smallLabel(97)}, output and weights`, err, 1e-5);
}

async function twoCallsAtOnce(ctx) {
  const x = smallInputs(97);
  const request = { ...x, causal: 'bottom-right' };
  const [a, b] = await within(Promise.all([ctx.attention(request), ctx.attention(request)]), 'two attention() calls');
  const same = a.output.length === b.output.length && a.output.every((y, i) => Object.is(y, b.output[i]));
  return { variant: 'js attention()', case: 'two calls at once, the same inputs', status: same ? 'ok' : 'failed',
    detail: same ? '' : 'the two results differ' };
}

// f16 bit patterns in, f16 bit patterns out where the adapter has shader-f16; elsewhere a
// clear refusal.
async function halfInputs(ctx, adapter) {
  const x = smallInputs(98);
  const halves = (a) => Uint16Array.from(a, toHalf);
  const request = { q: halves(x.q), k: halves(x.k), v: halves(x.v), shape: x.shape, causal: 'bottom-right' };
  const label = `${smallLabel(98)}, f16 (Uint16Array)`;
  if (!adapter.f16) return rejects('js attention() f16', `${label}: refused without shader-f16`, ctx.attention(request), 'f16');
  const got = await within(ctx.attention(request), 'attention() f16');
  if (!(got.output instanceof Uint16Array)) {
    return { variant: 'js attention() f16', case: label, status: 'failed', detail: 'the output is not a Uint16Array' };
  }
  const back = (a) => Float64Array.from(a, fromHalf);
  const want = reference(back(request.q), back(request.k), back(request.v), SMALL);
  // f16 products and storage: the output's own rounding (2^-11 of |o| < 1) and f16 P
  return measured('js attention() f16', label, maxAbsError(Float64Array.from(got.output, fromHalf), want.out), 2e-3);
}

// PyTorch's fixtures (tests/fixtures/torch_mha/README.md): weights from .safetensors,
// the layer's output and weights within 2e-5 of PyTorch's, as tests/mha_torch.rs holds
// the native build.
const TORCH = '/fixtures/torch_mha/';
const TORCH_TOLERANCE = 2e-5;
const fixture = async (name) => (await fetchNpy(TORCH + name));
const weightsFile = async (name) => {
  const response = await fetch(TORCH + name);
  if (!response.ok) throw new Error(`${TORCH + name}: HTTP ${response.status}`);
  return response.arrayBuffer();
};

const torchCases = {
  async self() {
    const query = await fixture('self_query.npy');
    const tokens = await fixture('self_tokens.npy');
    const [b, l] = query.shape;
    return { request: { safetensors: await weightsFile('self.safetensors'), numHeads: 4, query: query.data,
      shape: [b, l, l], tokens: tokens.data, padId: 0, returnWeights: 'averaged' },
    out: 'self_out.npy', weights: 'self_weights.npy', label: 'self-attention, pad mask from tokens, PyTorch names' };
  },
  async cross() {
    const [query, key, value, mask] = await Promise.all(
      ['cross_query.npy', 'cross_key.npy', 'cross_value.npy', 'cross_mask.npy'].map(fixture));
    return { request: { safetensors: await weightsFile('cross.safetensors'), numHeads: 2, query: query.data,
      key: key.data, value: value.data, shape: [query.shape[0], query.shape[1], key.shape[1]],
      mask: mask.data, maskShape: [1, 1, ...mask.shape], returnWeights: 'averaged' },
    out: 'cross_out.npy', weights: 'cross_weights.npy', label: 'cross-attention, kdim 12, vdim 8, bool mask' };
  },
  async gqa() {
    const query = await fixture('gqa_query.npy');
    const lengths = await fixture('gqa_key_lengths.npy');
    const [b, l] = query.shape;
    return { request: { safetensors: await weightsFile('gqa.safetensors'), numHeads: 4, query: query.data,
      shape: [b, l, l], keyLengths: lengths.data, returnWeights: 'per-head' },
    out: 'gqa_out.npy', weights: 'gqa_weights_per_head.npy', label: 'GQA 4/2 heads, key lengths, Hugging Face names' };
  },
  async postnorm() {
    const query = await fixture('postnorm_query.npy');
    const [b, l] = query.shape;
    return { request: { safetensors: await weightsFile('postnorm.safetensors'), numHeads: 3,
      prefix: 'encoder.layers.0.', postNorm: true, query: query.data, shape: [b, l, l], causal: 'top-left',
      returnWeights: 'per-head' },
    out: 'postnorm_out.npy', weights: 'postnorm_weights_per_head.npy', label: 'causal, post-norm, prefixed names' };
  },
};

async function torchCase(ctx, name) {
  const c = await torchCases[name]();
  const got = await within(ctx.mha(c.request), `mha() ${name}`);
  const [out, weights] = await Promise.all([fixture(c.out), fixture(c.weights)]);
  const err = Math.max(maxAbsError(got.output, out.data), maxAbsError(got.weights, weights.data));
  return measured('js mha() vs PyTorch', `${name}: ${c.label}`, err, TORCH_TOLERANCE);
}

// The native build (lavapipe in CI) and this browser on the same fixture: gqa through
// mha(). Each is within 2e-5 of PyTorch, so they must agree within twice that.
async function nativeComparison(ctx) {
  const label = 'gqa fixture: this browser vs the native build';
  const manifest = await fetch('/native/manifest.json');
  if (!manifest.ok) {
    return { variant: 'js mha() vs native', case: label, status: 'skipped',
      detail: 'no native outputs served (web/native-outputs.sh writes them; web/headless.py --native serves them)' };
  }
  const native = await manifest.json();
  const c = await torchCases.gqa();
  const got = await within(ctx.mha(c.request), 'mha() gqa');
  const [out, weights] = await Promise.all([fetchNpy('/native/gqa_out.npy'), fetchNpy('/native/gqa_weights.npy')]);
  const err = Math.max(maxAbsError(got.output, out.data), maxAbsError(got.weights, weights.data));
  const same = [[got.output, out.data], [got.weights, weights.data]]
    .reduce((n, [a, b]) => n + a.filter((x, i) => Object.is(x, b[i])).length, 0);
  const total = out.data.length + weights.data.length;
  const row = measured('js mha() vs native', `${label} (${native.adapter})`, err, 2 * TORCH_TOLERANCE);
  row.detail = `${same} of ${total} values bit for bit equal${row.detail ? '; ' + row.detail : ''}`;
  return row;
}

// Requests a user gets wrong, each of which must reject with one line naming the field.
async function badRequests(ctx) {
  const x = smallInputs(97);
  const cases = [
    ['q as a plain Array', ctx.attention({ ...x, q: Array.from(x.q) }), 'q'],
    ['a mask without maskShape', ctx.attention({ ...x, mask: new Float32Array(45) }), 'maskShape'],
    ['causal "sideways"', ctx.attention({ ...x, causal: 'sideways' }), 'causal'],
    ['kernel "fast"', ctx.attention({ ...x, kernel: 'fast' }), 'kernel'],
    ['a fractional shape', ctx.attention({ ...x, shape: [1, 4, 2, 5.5, 9, 16, 8] }), 'shape'],
    ['q one value short', ctx.attention({ ...x, q: x.q.subarray(1) }), 'q'],
    ['not an object', ctx.attention(42), 'request'],
    ['mha without numHeads', ctx.mha({ safetensors: new Uint8Array(8), query: new Float32Array(4), shape: [1, 1, 1] }),
      'numHeads'],
  ];
  const failures = [];
  for (const [label, promise, word] of cases) {
    const row = await rejects('js api', label, promise, word);
    if (row.status !== 'ok') failures.push(`${label}: ${row.detail}`);
  }
  return { variant: 'js api', case: `${cases.length} bad requests, each refused naming its field`,
    status: failures.length ? 'failed' : 'ok', detail: failures.join('; ') };
}

export const API_CASES = [
  ['attention() vs f64 reference', (ctx) => attentionMatchesReference(ctx)],
  ['two calls at once', (ctx) => twoCallsAtOnce(ctx)],
  ['f16 inputs', (ctx, adapter) => halfInputs(ctx, adapter)],
  ['a 4-number shape', (ctx) => {
    const x = smallInputs(97);
    return rejects('js attention()', 'a 4-number shape', ctx.attention({ ...x, shape: [1, 4, 2, 5] }), 'shape');
  }],
  ['mha() self', (ctx) => torchCase(ctx, 'self')],
  ['mha() cross', (ctx) => torchCase(ctx, 'cross')],
  ['mha() gqa', (ctx) => torchCase(ctx, 'gqa')],
  ['mha() postnorm', (ctx) => torchCase(ctx, 'postnorm')],
  ['mha() with bytes that are not safetensors', (ctx) => rejects('js mha()', 'bytes that are not safetensors',
    ctx.mha({ safetensors: new Uint8Array([1, 2, 3]), numHeads: 2, query: new Float32Array(4), shape: [1, 1, 1] }),
    'weights file')],
  ['bad requests', (ctx) => badRequests(ctx)],
  ['native comparison', (ctx) => nativeComparison(ctx)],
];

// Runs one API case; a throw becomes an error row.
export async function runApiCase(ctx, adapter, [name, run]) {
  try {
    return await run(ctx, adapter);
  } catch (e) {
    return { variant: 'js api', case: name, status: 'error', detail: String(e.message ?? e) };
  }
}
