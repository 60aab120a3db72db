#!/usr/bin/env bash
# Every measurement the GPU side of this project needs, in one pass, for a GPU that is
# lent for a short time: adapter info, the `check` grid, fused attention (f32, f16, f32
# on tensor cores), decode against a long cache, a sliding window, an MHA layer, and
# PyTorch's SDPA beside them where it is installed (docs/design.md, "Measuring on a GPU").
#
# Each step has its own time limit and its output in a file, so a failing or slow step
# costs only itself. Nothing here decides pass or fail: it gathers figures to report.
#
# Usage (from the project root): docs/gpu/measure.sh [BINARY] [OUT_DIR]
#   BINARY   the wgpu-attention binary (default: target/release/wgpu-attention)
#   OUT_DIR  where the step logs and JSON go (default: $OUT, else gpu-measure)
# Environment: STEP_SECONDS (default 240) bounds each step; STEPS (e.g. "info check")
# runs only the steps named (default: all; see the names below), so a pass can be split
# across calls of a tool that bounds each call; TORCH (default python3, with
# torch_sdpa.py next to BINARY) runs the yardstick; SMOKE=1 shrinks every shape so the
# whole pass runs on a CPU adapter in under a minute (to test this script).
set -u

bin=${1:-target/release/wgpu-attention}
out=${2:-${OUT:-gpu-measure}}
step_seconds=${STEP_SECONDS:-240}
mkdir -p "$out"

# The shapes the issues' targets name (B,Hq,Hkv,Lq,Lk,D), or small ones under SMOKE=1.
if [ "${SMOKE:-0}" = 1 ]; then
    attn=(1,2,2,64,64,32 1,4,2,64,64,32) decode=1,4,2,256,32 window=(1,1,1,256,256,32 32,0)
    mha=1,64,64,4 reps=2 probe=64
else
    attn=(4,16,16,4096,4096,128 4,32,8,4096,4096,128 1,8,8,2048,2048,64)
    decode=1,32,8,32768,128 window=(1,1,1,8192,8192,64 1024,0)
    mha=8,2048,1024,16 reps=10 probe=8192
fi
shape_args=()
for s in "${attn[@]}"; do shape_args+=(--shape "$s"); done

failed=0
# step NAME COMMAND...: runs COMMAND under the time limit, its output in OUT/NAME.log,
# unless STEPS leaves NAME out.
step() {
    local name=$1
    shift
    if [ -n "${STEPS:-}" ] && [[ " $STEPS " != *" $name "* ]]; then
        return
    fi
    echo "== $name: $*"
    local start=$SECONDS
    timeout "$step_seconds" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "   rc $rc after $((SECONDS - start)) s (log: $out/$name.log)"
    [ "$rc" = 0 ] || failed=$((failed + 1))
}

step info "$bin" info
step check "$bin" check --json "$out/check.json"
step fused "$bin" bench "${shape_args[@]}" --causal --dtype both --kernel fused \
    --reps "$reps" --probe "$probe" --json "$out/fused.json"
step fused-medium "$bin" bench "${shape_args[@]}" --causal --dtype f32 --kernel fused \
    --precision medium --reps "$reps" --probe "$probe" --json "$out/fused-medium.json"
step decode "$bin" bench --decode "$decode" --dtype both --reps "$reps" --json "$out/decode.json"
step window "$bin" bench --shape "${window[0]}" --causal --window "${window[1]}" \
    --kernel fused --dtype both --reps "$reps" --json "$out/window.json"
step mha "$bin" bench --mha "$mha" --dtype f16 --probe "$probe" --reps "$reps"

torch_script=$(dirname "$bin")/torch_sdpa.py
if [ -f "$torch_script" ] && ${TORCH:-python3} -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    step torch ${TORCH:-python3} "$torch_script" "${attn[@]}"
else
    step torch echo "skipped: no $torch_script, or no torch with CUDA"
fi

for f in "$out"/*.log; do
    [ -e "$f" ] || continue
    echo "---- $(basename "$f") (last lines)"
    tail -n 12 "$f"
done
echo "$failed step(s) failed"
[ "$failed" = 0 ]
