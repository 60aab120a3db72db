#!/usr/bin/env bash
# Builds the ES module into web/pkg: the wasm32 library, then wasm-bindgen's JS glue.
# Needs the wasm32-unknown-unknown target and wasm-bindgen-cli of the version
# web/Cargo.toml pins (both installed here when missing).
set -euo pipefail
cd "$(dirname "$0")"
version=$(sed -n 's/^wasm-bindgen = "=\(.*\)"/\1/p' Cargo.toml)
rustup target add wasm32-unknown-unknown >/dev/null
if ! wasm-bindgen --version 2>/dev/null | grep -qx "wasm-bindgen $version"; then
  # Only the one binary, unoptimised: it installs in about half the time (80 s against
  # 175 on a 2-core machine, a fresh cargo home, most of a fresh CI's web step) and
  # writes the same files in about a second (docs/benchmarks.md, "Testing and CI").
  cargo install wasm-bindgen-cli --version "$version" --debug --bin wasm-bindgen
fi
# The workspace's `web` profile (opt-level "s"; the root Cargo.toml) and target/.
cargo build --profile web --target wasm32-unknown-unknown
wasm-bindgen --target web --out-dir pkg ../target/wasm32-unknown-unknown/web/wgpu_attention_web.wasm
echo "built web/pkg; serve with: python3 web/serve.py, then open http://127.0.0.1:8000/"
