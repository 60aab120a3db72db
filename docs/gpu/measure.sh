#!/usr/bin/env bash
# Every measurement the GPU side of this project needs, in one pass, for a GPU that is
# lent for a short time: adapter info, the `check` grid, `tune` (every tensor-core
# variant checked and timed; the winners in OUT/tune.tsv, to check in as
# tune/winners.tsv), fused attention (f32, f16, f32 on tensor cores, causal, GQA) with
# the GEMM probe, decode against a long cache, a sliding window, an MHA layer, the
# backward pass (the rows and tensor-core tilings and PyTorch's backward beside it), and PyTorch's SDPA
# beside them where it is installed (docs/design.md, "Measuring on a GPU"). Every step writes JSON; with PREVIOUS set, the bench JSON is compared row by
# row with the same files of an earlier pass (`bench --compare`).
#
# Each step has its own time limit and its output in a file, so a failing or slow step
# costs only itself, and the whole pass stays under TOTAL_SECONDS. Nothing here decides
# pass or fail: it gathers figures to report.
#
# Usage (from the project root): docs/gpu/measure.sh [BINARY] [OUT_DIR]
#   BINARY   the wgpu-attention binary (default: target/release/wgpu-attention)
#   OUT_DIR  where the step logs and JSON go (default: $OUT, else gpu-measure)
# Environment: STEP_SECONDS (default 150) bounds each step (TUNE_SECONDS, default 360,
# the tensor-core tune) and TOTAL_SECONDS (default
# 570, under a 10-minute call) the pass; STEPS (e.g. "info check") runs only the steps
# named (default: all; see the names below), so a pass can be split across calls of a
# tool that bounds each call; PREVIOUS (an earlier OUT_DIR) adds the comparisons; TORCH
# (default python3) runs the yardsticks (torch_sdpa.py, torch_backward.py, beside this script); SMOKE=1
# shrinks every shape so the whole pass runs on a CPU adapter in about a minute (to
# test this script; tune then emulates the tensor cores); PLAN (above) names a call's
# share of the steps.
set -u

# PLAN splits a lent GPU's 15 minutes into calls: `decisive` (at most 5 minutes: the
# driver's register figures, then what decides the next step: fused f32 and f16 with
# wgpu's runtime checks and without, decode against the copy probe, PyTorch beside
# them) and `rest` (tune, the other forward steps, the backward). A STEPS list wins.
case "${PLAN:-}" in
    decisive)
        STEPS=${STEPS:-"info isa fused fused-unchecked decode torch"}
        TOTAL_SECONDS=${TOTAL_SECONDS:-290} STEP_SECONDS=${STEP_SECONDS:-75}
        ;;
    rest)
        STEPS=${STEPS:-"check tune tune-f32 splits fused-medium fused-micro fused-no-subgroups window mha mha-gemm-direct backward backward-rows backward-rows-no-subgroups backward-coop backward-coop-named tune-backward torch-backward"}
        ;;
    "") ;;
    *)
        echo "PLAN: '$PLAN' is not decisive or rest" >&2
        exit 2
        ;;
esac

bin=${1:-target/release/wgpu-attention}
out=${2:-${OUT:-gpu-measure}}
step_seconds=${STEP_SECONDS:-150}
tune_seconds=${TUNE_SECONDS:-360}
total_seconds=${TOTAL_SECONDS:-570}
mkdir -p "$out"

# The shapes the issues' targets name (B,Hq,Hkv,Lq,Lk,D), or small ones under SMOKE=1.
if [ "${SMOKE:-0}" = 1 ]; then
    attn=(1,2,2,64,64,32 1,4,2,64,64,32) decode=1,4,2,256,32 window=(1,1,1,256,256,32 32,0)
    # The splits step without tensor cores: a CPU adapter has none, and `tune` refuses
    # variants it cannot measure (the tune step emulates them).
    micro256=1,1,1,64,64,256 splits_shape=1,2,1,20,200,16 splits=(--tilings micro,shared)
    mha=1,64,64,4 reps=2 probe=64
    # Two tensor-core variants: each emulated one is a compile of tens of seconds on lavapipe.
    tune=(--shape 1,2,1,20,40,16 --emulate-coop --reps 1 --variants 64x16x16,64x32x32)
    tune_f32=(--shape 1,2,1,20,40,16 --reps 1)
    tune_backward=(--shape 1,2,1,20,40,16 --emulate-coop --reps 1 --dtype f16 --variants 32x32x32n)
    backward=(1,2,2,64,64,32)
    # No GPU driver with statistics here: RADV's null hardware, one kernel.
    isa=(--radv-null navi31 --kernel "fused/shared 64 f32")
else
    attn=(4,16,16,4096,4096,128 4,32,8,4096,4096,128 1,8,8,2048,2048,64)
    micro256=2,16,16,4096,4096,256 splits_shape=1,8,8,2048,2048,64
    splits=(--variants 64x64x32,64x64x32n,64x64x32r32,64x64x32d,64x64x32dn,64x64x32r32d
        --tilings coop,micro,shared)
    decode=1,32,8,32768,128 window=(1,1,1,8192,8192,64 1024,0)
    mha=8,2048,1024,16 reps=10 probe=8192
    # Every tensor-core form that keeps its registers (70 at D 64, 24 at D 128 on 48 KiB:
    # one or two bands, arrayed or named, staged or direct, less those RDNA3 spills:
    # docs/isa.md) against `shared` in f16 at D 64 and 128; the
    # f32 tilings (`micro` at each lane count, `shared`) apart: all of it in one step
    # would outlast a 10-minute call.
    tune=(--dtype f16 --reps 3 --shape 4,16,16,4096,4096,64 --shape 4,16,16,4096,4096,128 --tilings coop,shared)
    tune_f32=(--dtype f32 --reps 3 --shape 4,16,16,4096,4096,128 --shape 1,8,8,2048,2048,64
        --shape 2,16,16,4096,4096,256 --tilings micro,shared)
    backward=(1,8,8,2048,2048,64 4,16,16,4096,4096,128)
    tune_backward=(--dtype f16 --reps 3 --shape 4,16,16,4096,4096,128)
    # The GPU driver's own figures (NVIDIA: registers per thread) for every GPU kernel,
    # with wgpu's runtime checks and without (docs/isa.md).
    isa=(--checks checked,unchecked)
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
    local left=$((total_seconds - SECONDS)) limit=$step_seconds
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -le 0 ]; then
        echo "== $name: skipped, TOTAL_SECONDS ($total_seconds) spent"
        failed=$((failed + 1))
        return
    fi
    echo "== $name: $*"
    local start=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "   rc $rc after $((SECONDS - start)) s (log: $out/$name.log)"
    [ "$rc" = 0 ] || failed=$((failed + 1))
}

step info "$bin" info
step isa "$bin" isa "${isa[@]}" --json "$out/isa.json"
step check "$bin" check --json "$out/check.json"
# tune checks every tensor-core variant against the reference and times it; a table is
# written only if every row is right.
# tune's --deadline: 40 s before its step's limit (TUNE_SECONDS, or what TOTAL_SECONDS
# leaves), it starts no more candidates and writes its table and JSON.
tune_deadline() {
    local limit=$((total_seconds - SECONDS))
    [ "$tune_seconds" -lt "$limit" ] && limit=$tune_seconds
    local d=$((limit - 40))
    [ "$d" -lt 10 ] && d=10
    echo "$d"
}
step_seconds=$tune_seconds step tune "$bin" tune "${tune[@]}" --deadline "$(tune_deadline)" \
    --table "$out/tune.tsv" --json "$out/tune.json"
step tune-f32 "$bin" tune "${tune_f32[@]}" --json "$out/tune-f32.json"
# Key splits on the grid that leaves the GPU idle ((1,8,2048,64): 8 x 32 workgroups of
# 64 rows for 132 SMs), every tiling, side by side in one process (issue 52).
step splits "$bin" tune --shape "$splits_shape" --dtype both --reps 3 --key-splits 1,2,4 \
    "${splits[@]}" --json "$out/splits.json"
step fused "$bin" bench "${shape_args[@]}" --causal --dtype both --kernel fused \
    --reps "$reps" --probe "$probe" --json "$out/fused.json"
# The same without wgpu's loop counters and bounds checks (docs/isa.md, "The runtime
# checks"): compare with fused.json row by row.
step fused-unchecked env WGPU_ATTENTION_RUNTIME_CHECKS=unchecked "$bin" bench "${shape_args[@]}" --causal \
    --dtype both --kernel fused --reps "$reps" --probe "$probe" --json "$out/fused-unchecked.json"
step fused-medium "$bin" bench "${shape_args[@]}" --causal --dtype f32 --kernel fused \
    --precision medium --reps "$reps" --probe "$probe" --json "$out/fused-medium.json"
# Full f32 on the micro-tile tiling (issue 53), pinned, at the shapes above and D 256;
# tune's rows time it beside `shared` (the GPU's f32 pick) in one process.
step fused-micro env WGPU_ATTENTION_TILING=micro "$bin" bench "${shape_args[@]}" --shape "$micro256" \
    --causal --dtype f32 --kernel fused --reps "$reps" --probe "$probe" --json "$out/fused-micro.json"
# `shared` as a GPU without subgroups runs it (a browser without `subgroups`, GL): the
# device made without them, each row's lanes summed through workgroup memory
# (`shared 128 wg`, `256 wg`; docs/isa.md); compare its f32 rows with fused.json's.
step fused-no-subgroups env WGPU_ATTENTION_SUBGROUPS=off WGPU_ATTENTION_TILING=shared "$bin" bench \
    "${shape_args[@]}" --causal --dtype f32 --kernel fused --reps "$reps" --probe "$probe" \
    --json "$out/fused-no-subgroups.json"
# Decode in the adapter's design (lanes on GPUs), in the tiled one, fused, and from an
# int8 KV cache, side by side in one process against one copy probe (docs/design.md,
# "Decode", "int8 KV cache").
step decode "$bin" bench --decode "$decode" --dtype both --kernel decode+tiles --kv-dtype int8 \
    --reps "$reps" --json "$out/decode.json"
step window "$bin" bench --shape "${window[0]}" --causal --window "${window[1]}" \
    --kernel fused --dtype both --reps "$reps" --json "$out/window.json"
step mha "$bin" bench --mha "$mha" --dtype f16 --probe "$probe" --reps "$reps" --json "$out/mha.json"
# The same with the coop GEMM's direct design (fragments from X's and W's rows, nothing
# staged; issue 52's item 5): its probe row (`coop-direct`) and the layer beside `mha`'s.
step mha-gemm-direct env WGPU_ATTENTION_COOP_GEMM=direct "$bin" bench --mha "$mha" --dtype f16 \
    --probe "$probe" --reps "$reps" --json "$out/mha-gemm-direct.json"

torch_script=$(dirname "$0")/torch_sdpa.py
if ${TORCH:-python3} -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    step torch ${TORCH:-python3} "$torch_script" "${attn[@]}"
else
    step torch echo "skipped: no torch with CUDA"
fi

# The backward pass beside the forward (issue 39), last: the `blocked` tiling on GPUs,
# then the portable `rows` one (through the forward's registers tiling) for comparison,
# and PyTorch's backward (docs/gpu/torch_backward.py) where torch has CUDA.
backward_args=()
for s in "${backward[@]}"; do backward_args+=(--shape "$s"); done
step backward "$bin" bench "${backward_args[@]}" --causal --dtype both --kernel fused+backward \
    --reps 3 --probe "$probe" --json "$out/backward.json"
step backward-rows env WGPU_ATTENTION_TILING=registers "$bin" bench "${backward_args[@]}" --dtype both \
    --kernel backward --reps 3 --probe "$probe" --json "$out/backward-rows.json"
# The same without subgroups: the `rows` classes' `wg` forms (compare with
# backward-rows.json).
step backward-rows-no-subgroups env WGPU_ATTENTION_SUBGROUPS=off WGPU_ATTENTION_TILING=registers "$bin" \
    bench "${backward_args[@]}" --dtype both --kernel backward --reps 3 --probe "$probe" \
    --json "$out/backward-rows-no-subgroups.json"
# The tensor-core backward (`coop`), through the forward's coop tiling (the GPU default
# where tensor cores exist; pinned here so that the rows say if it is not taken): f16,
# and f32 at precision medium; its rows name the tiling each pass ran. Needs tensor
# cores (the smoke pass leaves it out: `bench` has no emulation).
step backward-coop env WGPU_ATTENTION_TILING=coop "$bin" bench \
    "${backward_args[@]}" --causal --dtype both --precision medium --kernel fused+backward \
    --reps 3 --probe "$probe" --json "$out/backward-coop.json"
# The same with the backward's fragments and gradient tiles as named values (issue 52's
# first axis, for the backward): f16 only, beside the arrayed rows above.
step backward-coop-named env WGPU_ATTENTION_TILING=coop WGPU_ATTENTION_COOP_BACKWARD=named "$bin" bench \
    "${backward_args[@]}" --causal --dtype f16 --kernel fused+backward \
    --reps 3 --probe "$probe" --json "$out/backward-coop-named.json"
# Every tensor-core backward variant, arrayed and named, checked and timed (issue 52).
step_seconds=$tune_seconds step tune-backward "$bin" tune --backward "${tune_backward[@]}" \
    --deadline "$(tune_deadline)" --json "$out/tune-backward.json"
torch_backward=$(dirname "$0")/torch_backward.py
if ${TORCH:-python3} -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    step torch-backward ${TORCH:-python3} "$torch_backward" "${backward[@]}"
else
    step torch-backward echo "skipped: no torch with CUDA"
fi

# Row-by-row speedups over an earlier pass, for every bench file both passes wrote.
if [ -n "${PREVIOUS:-}" ]; then
    for name in fused fused-medium fused-micro decode window backward backward-coop; do
        if [ -f "$PREVIOUS/$name.json" ] && [ -f "$out/$name.json" ]; then
            step "compare-$name" "$bin" bench --compare "$PREVIOUS/$name.json" "$out/$name.json"
        fi
    done
fi

for f in "$out"/*.log; do
    [ -e "$f" ] || continue
    echo "---- $(basename "$f") (last lines)"
    tail -n 12 "$f"
done
echo "$failed step(s) failed"
[ "$failed" = 0 ]
