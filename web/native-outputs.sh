#!/usr/bin/env bash
# Writes the native build's outputs that the check page compares with its own (its
# "this browser vs the native build" case): the gqa PyTorch fixture through `mha`, on
# the default adapter (lavapipe in CI). Serve the directory with
# `web/headless.py check.html --native DIR` (or `web/serve.py --native DIR`).
# Usage: web/native-outputs.sh path/to/wgpu-attention DIR
set -euo pipefail
bin=$(realpath "$(command -v "$1")")
out=$(realpath -m "$2")
fixtures=$(realpath "$(dirname "$0")/../tests/fixtures/torch_mha")
mkdir -p "$out"
"$bin" mha --weights "$fixtures/gqa.safetensors" --num-heads 4 --query "$fixtures/gqa_query.npy" \
  --key-lengths "$fixtures/gqa_key_lengths.npy" --out "$out/gqa_out.npy" \
  --weights-out "$out/gqa_weights.npy" --per-head
adapter=$("$bin" info --json | python3 -c 'import json, sys; a = json.load(sys.stdin)[0]; print(a["name"] + ", " + a["driver_info"])')
python3 -c 'import json, sys; json.dump({"adapter": sys.argv[1], "files": ["gqa_out.npy", "gqa_weights.npy"]}, open(sys.argv[2], "w"))' \
  "$adapter" "$out/manifest.json"
echo "native outputs on $adapter in $out"
