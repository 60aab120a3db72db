// Sends a page's result to /report: web/serve.py --report writes it for the headless
// runs (web/headless.sh); served any other way, the POST fails quietly.
export async function report(body) {
  try {
    await fetch('/report', { method: 'POST', body: JSON.stringify(body) });
  } catch (_) {
    // No report endpoint: nothing to tell.
  }
}
