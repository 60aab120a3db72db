#!/usr/bin/env python3
"""Opens a page of web/ in headless Chromium on its WebGPU adapter (SwiftShader on a
machine without a GPU), waits for the JSON the page reports to /report, judges it, and
can save a screenshot of the page once it has reported.

    web/headless.py check.html --report target/ci/check-web.json [--native DIR]
    web/headless.py demo.html --report demo.json --screenshot demo.png
    web/headless.py 'bench.html?suite=quick&run=1' --report bench.json

Needs web/pkg (web/build.sh), Debian's chromium and python3; nothing else. The
screenshot goes through Chrome's DevTools protocol on a pipe (--remote-debugging-pipe:
NUL-separated JSON on file descriptors 3 and 4), so no WebDriver or websocket client is
needed. Exits 1 when the page reports an error or a failed case, or reports nothing.
"""
import argparse
import base64
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# WebGPU on SwiftShader, as Debian's Chromium offers it headless; no background
# networking (CI machines may have none); /tmp rather than a small /dev/shm.
CHROMIUM_FLAGS = [
    "--headless=new", "--no-sandbox", "--enable-unsafe-webgpu", "--enable-features=Vulkan",
    "--use-vulkan=swiftshader", "--use-webgpu-adapter=swiftshader", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1700,1000", "--remote-debugging-pipe",
]


class DevTools:
    """Chrome's DevTools protocol over the pipe: send a command, wait for its answer."""

    def __init__(self, to_chrome, from_chrome):
        self.out = os.fdopen(to_chrome, "wb", buffering=0)
        self.answers = {}
        self.cond = threading.Condition()
        self.next_id = 0
        threading.Thread(target=self._read, args=(os.fdopen(from_chrome, "rb", buffering=0),), daemon=True).start()

    def _read(self, pipe):
        pending = b""
        while chunk := pipe.read(65536):
            pending += chunk
            *messages, pending = pending.split(b"\0")
            for m in messages:
                message = json.loads(m)
                if "id" in message:
                    with self.cond:
                        self.answers[message["id"]] = message
                        self.cond.notify_all()

    def call(self, method, params=None, session=None, timeout=60):
        self.next_id += 1
        command = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            command["sessionId"] = session
        self.out.write(json.dumps(command).encode() + b"\0")
        with self.cond:
            if not self.cond.wait_for(lambda: self.next_id in self.answers, timeout):
                raise RuntimeError(f"DevTools: no answer to {method} in {timeout} s")
            answer = self.answers.pop(self.next_id)
        if "error" in answer:
            raise RuntimeError(f"DevTools: {method}: {answer['error']}")
        return answer["result"]

    def screenshot(self, url_part, path):
        pages = [t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page" and url_part in t["url"]]
        if not pages:
            raise RuntimeError(f"DevTools: no page at {url_part}")
        session = self.call("Target.attachToTarget", {"targetId": pages[0]["targetId"], "flatten": True})["sessionId"]
        shot = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session)
        with open(path, "wb") as f:
            f.write(base64.b64decode(shot["data"]))


def free_port():
    """A loopback port nothing listens on now (two runs at once must not collide)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, seconds=10):
    deadline = time.time() + seconds
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"the server did not listen on port {port}")


def verdict(page, report, native):
    """Why the page's report is a failure, or None."""
    if "error" in report:
        return f"the page failed: {report['error']}"
    if page.startswith("check"):
        bad = [c for c in report["cases"] if c["status"] not in ("ok", "skipped")]
        skipped = [c for c in report["cases"] if c["status"] == "skipped"]
        for c in bad + skipped:
            print(f"  {c['variant']:<22} {c['case']}: {c['status']}: {c.get('detail', '')}")
        if bad or not report["passed"]:
            return f"{len(bad)} cases failed"
        if native and skipped:
            return f"{len(skipped)} cases skipped although native outputs were served"
    elif page.startswith("demo"):
        if not report["passed"]:
            return "the sentence example disagrees with the CPU reference"
    elif page.startswith("bench"):
        rows = report["runs"][0]["rows"]
        for r in rows:
            status = f"{r['median_ms']:.2f} ms" if r["status"] == "measured" else r["reason"]
            print(f"  {r['batch']},{r['heads_q']},{r['heads_kv']},{r['len_q']},{r['len_k']},{r['head_dim']} "
                  f"{r['mask']} {r['dtype']} {r['kernel']}: {status}")
        if not any(r["status"] == "measured" for r in rows):
            return "no row was measured"
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("page", help="the page and its query, e.g. check.html")
    parser.add_argument("--report", required=True, help="where the page's JSON report goes")
    parser.add_argument("--screenshot", help="save a PNG of the whole page once it has reported")
    parser.add_argument("--native", help="a directory of native outputs, served at /native/")
    parser.add_argument("--port", type=int, default=0, help="default: a free one")
    parser.add_argument("--timeout", type=int, default=int(os.environ.get("WEB_CHECK_TIMEOUT", "1200")))
    args = parser.parse_args()
    if args.port == 0:
        args.port = free_port()
    report = os.path.abspath(args.report)
    if os.path.exists(report):
        os.remove(report)
    chromium = shutil.which("chromium") or sys.exit("headless: Debian's chromium is not installed")
    profile = tempfile.mkdtemp()
    serve = [sys.executable, os.path.join(HERE, "serve.py"), "--port", str(args.port), "--report", report, "--quiet"]
    if args.native:
        serve += ["--native", args.native]
    server = subprocess.Popen(serve)
    browser = None
    try:
        wait_for_port(args.port)
        to_chrome_r, to_chrome_w = os.pipe()
        from_chrome_r, from_chrome_w = os.pipe()
        # Chromium's ends above 9, so that moving them to 3 and 4 cannot close one.
        for fd in (to_chrome_r, from_chrome_w):
            high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
            os.close(fd)
            if fd == to_chrome_r:
                to_chrome_r = high
            else:
                from_chrome_w = high
        # Chromium reads commands on fd 3 and writes answers on fd 4.
        script = f'exec "$0" "$@" 3<&{to_chrome_r} 4>&{from_chrome_w} {to_chrome_r}<&- {from_chrome_w}>&-'
        url = f"http://127.0.0.1:{args.port}/{args.page}"
        log = open(os.path.join(profile, "chromium.log"), "wb")
        browser = subprocess.Popen(["bash", "-c", script, chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", url],
                                   pass_fds=(to_chrome_r, from_chrome_w), stdout=log, stderr=log)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        devtools = DevTools(to_chrome_w, from_chrome_r)
        started = time.time()
        while not os.path.exists(report):
            if time.time() - started > args.timeout or browser.poll() is not None or server.poll() is not None:
                log.flush()
                with open(os.path.join(profile, "chromium.log"), errors="replace") as f:
                    said = [line for line in f if "dbus" not in line][-20:]
                sys.exit(f"headless: no report from {args.page} after {time.time() - started:.0f} s (limit "
                         f"{args.timeout} s; browser running: {browser.poll() is None}, server running: "
                         f"{server.poll() is None}); Chromium said:\n{''.join(said)}")
            time.sleep(0.5)
        if args.screenshot:
            devtools.screenshot(args.page.split("?")[0], args.screenshot)
            print(f"headless: screenshot of {args.page} in {args.screenshot}")
        with open(report) as f:
            result = json.load(f)
        adapter = result.get("adapter") or result.get("runs", [{}])[0].get("adapter", {})
        name = adapter.get("name") or f"an unnamed {adapter.get('device_type', '?')} adapter"
        print(f"headless: {args.page} on {name} reported in {time.time() - started:.1f} s")
        problem = verdict(args.page, result, args.native)
        if problem:
            sys.exit(f"headless: {args.page}: {problem}")
        if args.page.startswith("check"):
            print(f"headless: {result['passed']} passed, {result['failed']} failed, {result.get('skipped', 0)} skipped")
    finally:
        for p in (browser, server):
            if p and p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
