// The check page: runs the check grid case by case, then the JavaScript API's cases
// (api_cases.js), shows each row, and reports the whole run (page.js).
import { API_CASES, runApiCase, within } from './api_cases.js';
import { fail, openContext, report } from './page.js';

const $ = (id) => document.getElementById(id);

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
}

// One table row per case.
function show(c) {
  const row = $('rows').insertRow();
  cell(row, c.variant);
  cell(row, c.case);
  cell(row, c.max_abs_error === undefined ? '-' : c.max_abs_error.toExponential(2));
  cell(row, c.bound === undefined ? '-' : c.bound.toExponential(2));
  const text = c.status === 'ok' ? (c.detail ? `ok (${c.detail})` : 'ok') : `${c.status}: ${c.detail}`;
  cell(row, text, c.status);
}

async function main() {
  const { ctx, adapter } = await openContext();
  const n = ctx.checkCount() + API_CASES.length;
  const cases = [];
  const started = performance.now();
  const add = (c) => {
    cases.push(c);
    show(c);
    $('summary').textContent = `${cases.length} of ${n} cases run`;
  };
  for (let i = 0; i < ctx.checkCount(); i++) add(JSON.parse(await within(ctx.runCheck(i), `check case ${i}`)));
  for (const c of API_CASES) add(await runApiCase(ctx, adapter, c));
  const count = (status) => cases.filter((c) => c.status === status).length;
  const [passed, skipped] = [count('ok'), count('skipped')];
  const failed = n - passed - skipped;
  const seconds = (performance.now() - started) / 1000;
  $('summary').textContent = `${passed} passed, ${failed} failed, ${skipped} skipped (${seconds.toFixed(1)} s)`;
  $('summary').className = failed === 0 ? 'ok' : 'failed';
  await report({ adapter, passed, failed, skipped, seconds, cases });
}

main().catch(fail);
