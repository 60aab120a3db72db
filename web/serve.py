#!/usr/bin/env python3
"""Serves web/ on loopback only (WebGPU needs a secure context; 127.0.0.1 is one).

    python3 web/serve.py [--port 8000]
        then open http://127.0.0.1:8000/ (the demo, check and bench pages)

Besides web/ itself it serves the repository's test fixtures at /fixtures/ (the check
page runs the multi-head layer on PyTorch's), and with --native DIR a native build's
outputs at /native/ (the check page compares them with its own).

For the headless runs (web/headless.py): --report FILE writes the JSON a page POSTs to
/report, and --exit-after-report stops the server once it has.
"""
import argparse
import functools
import http.server
import os
import sys


class Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".wasm": "application/wasm",
        ".js": "text/javascript",
    }

    def translate_path(self, path):
        # The base class normalises the path and drops "..", so a mount cannot be left.
        for prefix, root in self.server.mounts:
            if path.startswith(prefix):
                inside = super().translate_path("/" + path[len(prefix):])
                return os.path.join(root, os.path.relpath(inside, self.directory))
        return super().translate_path(path)

    def do_POST(self):
        if self.path != "/report" or self.server.report is None:
            self.send_error(404)
            return
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        # Whole or not at all: the CI script reads the file once it exists.
        partial = self.server.report + ".partial"
        with open(partial, "wb") as f:
            f.write(body)
        os.replace(partial, self.server.report)
        self.send_response(204)
        self.end_headers()
        self.server.got_report = True

    def log_message(self, fmt, *args):
        if self.server.verbose:
            super().log_message(fmt, *args)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--report", help="write the check page's POSTed report here")
    parser.add_argument("--exit-after-report", action="store_true")
    parser.add_argument("--native", help="serve this directory at /native/")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    root = os.path.dirname(os.path.abspath(__file__))
    handler = functools.partial(Handler, directory=root)
    # One request at a time, so that got_report is set when handle_request returns.
    server = http.server.HTTPServer(("127.0.0.1", args.port), handler)
    server.report = args.report
    server.mounts = [("/fixtures/", os.path.join(os.path.dirname(root), "tests", "fixtures"))]
    if args.native:
        server.mounts.append(("/native/", os.path.abspath(args.native)))
    server.got_report = False
    server.verbose = not args.quiet
    print(f"serving {root} on http://127.0.0.1:{args.port}/", file=sys.stderr, flush=True)
    while not (args.exit_after_report and server.got_report):
        server.handle_request()


if __name__ == "__main__":
    main()
