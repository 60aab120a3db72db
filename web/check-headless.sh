#!/usr/bin/env bash
# Runs the check page (web/check.html) in headless Chromium on its WebGPU adapter
# (SwiftShader here) and fails unless every case passes. Needs web/pkg (web/build.sh)
# and Debian's chromium. Usage: web/check-headless.sh REPORT.json [PORT]
set -euo pipefail
report=$(realpath -m "$1")
port=${2:-8771}
timeout_s=${WEB_CHECK_TIMEOUT:-1200}
cd "$(dirname "$0")"
rm -f "$report"
profile=$(mktemp -d)
server=""
browser=""
finish() {
  kill $browser $server 2>/dev/null || true
  wait $browser $server 2>/dev/null || true
  rm -rf "$profile"
}
trap finish EXIT
python3 serve.py --port "$port" --report "$report" --exit-after-report --quiet &
server=$!
# WebGPU on SwiftShader, as Debian's Chromium offers it headless; no background
# networking (the machine has none to reach); /tmp rather than a small /dev/shm.
chromium --headless=new --no-sandbox --enable-unsafe-webgpu --enable-features=Vulkan \
  --use-vulkan=swiftshader --use-webgpu-adapter=swiftshader --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --disable-dev-shm-usage --user-data-dir="$profile" "http://127.0.0.1:$port/check.html" \
  >"$profile/chromium.log" 2>&1 &
browser=$!
waited=0
while [ ! -s "$report" ] && [ "$waited" -lt "$timeout_s" ]; do
  # The server exits once it has the report; the browser must stay up until then.
  kill -0 "$server" 2>/dev/null || break
  kill -0 "$browser" 2>/dev/null || { sleep 1; break; }
  sleep 2
  waited=$((waited + 2))
done
if [ ! -s "$report" ]; then
  echo "web check: no report from the page after ${waited} s (limit ${timeout_s} s; server running: $(kill -0 "$server" 2>/dev/null && echo yes || echo no), browser running: $(kill -0 "$browser" 2>/dev/null && echo yes || echo no)); Chromium said:" >&2
  grep -v dbus "$profile/chromium.log" | tail -20 >&2
  exit 1
fi
python3 - "$report" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
if "error" in r:
    sys.exit(f"web check: the page failed: {r['error']}")
a = r["adapter"]
print(f"web check on {a['name']} ({a['backend']}, {a['device_type']}): "
      f"{r['passed']} passed, {r['failed']} failed in {r['seconds']:.1f} s")
for c in r["cases"]:
    if c["status"] != "ok":
        print(f"  {c['variant']:<20} {c['case']}: {c['status']}: {c.get('detail', '')}")
sys.exit(1 if r["failed"] or not r["passed"] else 0)
PY
