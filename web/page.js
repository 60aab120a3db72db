// What every page does: open a context on the browser's adapter (showing it in
// #adapter), report its result to /report (web/serve.py --report writes it for
// web/headless.py; served any other way, the POST fails quietly), and show a failure
// in #summary.
import init, { AttentionContext } from './pkg/wgpu_attention_web.js';

export async function openContext() {
  if (!navigator.gpu) throw new Error('this browser has no WebGPU (navigator.gpu is missing)');
  await init();
  const ctx = await AttentionContext.create();
  const adapter = JSON.parse(ctx.info());
  const shown = document.getElementById('adapter');
  if (shown) shown.textContent = JSON.stringify(adapter, null, 1);
  return { ctx, adapter };
}

export async function report(body) {
  try {
    await fetch('/report', { method: 'POST', body: JSON.stringify(body) });
  } catch (_) {
    // No report endpoint: nothing to tell.
  }
}

export async function fail(e) {
  const summary = document.getElementById('summary');
  summary.textContent = `error: ${e.message ?? e}`;
  summary.className = 'error';
  await report({ error: String(e.message ?? e) });
}
