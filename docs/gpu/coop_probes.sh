#!/usr/bin/env bash
# Asks the questions the tensor-core attention kernel's wrong results on an NVIDIA H200
# left open (docs/design.md, "Tensor cores"), in one pass of a few seconds on a GPU:
# `tune` checks every variant of the kernel against the CPU reference, once as it is
# and once per diagnostic probe (src/kernels/flash/coop_probes.rs says what each edits),
# and this prints a few variants' rows per probe: 64x16x16 and 64x16x64 (one band) and
# 64x64x64.
#
# Reading the rows (as of the H200 run: every variant wrong, output error about 1 and
# lse error about 0.36, as if scores and outputs were all zero):
#   - a probe whose rows say `ok` names the fault (zero-init: the kernel reads memory
#     it did not write; const-overrides, tid-from-lanes, always-rescale: the driver
#     mishandles that construct);
#   - store-marker: errors near 64 (output) and 7 (lse) mean the kernel runs to its end
#     and stores (1000 more where what it computed was +inf); errors unchanged mean it
#     never gets there (or never runs);
#   - scores-marker: an lse error that changes means the scores' coopStoreT into
#     workgroup memory never lands (the softmax then reads the marker, 3.0); unchanged
#     means the stores land and the products themselves are zero.
#
# Usage (from the project root): docs/gpu/coop_probes.sh [BINARY] [TUNE ARGS...]
#   BINARY     the wgpu-attention binary (default: target/release/wgpu-attention)
#   TUNE ARGS  passed to every `tune` (default: --shape 1,1,1,1,1,64 --dtype f16 --reps 1;
#              measure.sh's SMOKE pass adds --emulate-coop and a D 16 shape).
# Environment: PROBES, the probe sets to run, space-separated (`none` for the kernel as
# it is; default: none, each probe alone, then the four that keep the arithmetic together).
set -u
bin=${1:-target/release/wgpu-attention}
shift $(($# > 0 ? 1 : 0))
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--shape 1,1,1,1,1,64 --dtype f16 --reps 1)
all="none zero-init const-overrides tid-from-lanes always-rescale scores-marker store-marker
    zero-init,const-overrides,tid-from-lanes,always-rescale"
read -r -a probes <<<"$(echo ${PROBES:-$all})"
failed=0
for p in "${probes[@]}"; do
    echo "== probes: $p"
    [ "$p" = none ] && p=
    log=$(WGPU_ATTENTION_UNVERIFIED_COOP=1 WGPU_ATTENTION_COOP_PROBES=$p "$bin" tune "${args[@]}" 2>&1)
    rc=$?
    rows=$(echo "$log" | grep -E 'coop +[0-9]+x(16x64|64x64|16x16) |^error|panicked')
    echo "$rows" | cut -c1-220
    # Wrong rows are what this gathers (tune then exits 1, saying FAILED: wrong
    # results); anything else (a probe that no longer applies, no adapter, a panic, a
    # lost device) is this script's failure.
    if [ -z "$rows" ] || echo "$rows" | grep -qE '^error|panicked' ||
        { [ "$rc" != 0 ] && ! echo "$log" | grep -q '^FAILED: wrong results'; }; then
        echo "   (tune exited $rc)"
        failed=1
    fi
done
exit $failed
