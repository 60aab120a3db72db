enable f16;
enable wgpu_cooperative_matrix;

// Each way the tensor-core kernels use cooperative matrices, alone, so that a GPU run
// says which one a driver gets wrong (tests/gpu_coop_patterns.rs). One subgroup of SG
// lanes (a prelude line sets SG) computes C = A·B for A 16 x 64 and B 64 x 64 (f32 in
// storage, staged as f16 into rows padded like the kernels'), as four 16 x 16 output
// tiles over four 16-deep chunks; C goes through workgroup memory to `out`. Entry
// points differ only in the pattern named by their name.

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read> a16: array<f16>;
@group(0) @binding(4) var<storage, read> b16: array<f16>;

const M: u32 = 16u;
const K: u32 = 64u;
const N: u32 = 64u;
const LDA: u32 = K + 8u; // halves per staged row of A (and of Bᵀ)
const LDB: u32 = N + 8u; // halves per staged row of B
const LDC: u32 = N + 4u; // floats per row of C

var<workgroup> sa: array<f16, M * LDA>;
var<workgroup> sb: array<f16, K * LDB>;
var<workgroup> sbt: array<f16, N * LDA>; // Bᵀ: sbt[n * LDA + k] = B[k][n]
var<workgroup> sc: array<f32, M * LDC>;

fn stage(lane: u32) {
    for (var x = lane; x < M * K; x += SG) {
        sa[(x / K) * LDA + x % K] = f16(a[x]);
    }
    for (var x = lane; x < K * N; x += SG) {
        let r = x / N;
        let c = x % N;
        sb[r * LDB + c] = f16(b[x]);
        sbt[c * LDA + r] = f16(b[x]);
    }
    workgroupBarrier();
}

fn finish(lane: u32) {
    workgroupBarrier();
    for (var x = lane; x < M * N; x += SG) {
        out[x] = sc[(x / N) * LDC + x % N];
    }
}

fn load_a(kc: u32) -> coop_mat16x16<f16, A> {
    let ia = kc * 16u;
    return coopLoadT<coop_mat16x16<f16, A>>(&sa[ia], LDA);
}

fn load_b(kc: u32, c: u32) -> coop_mat16x16<f16, B> {
    let ib = kc * 16u * LDB + c * 16u;
    return coopLoadT<coop_mat16x16<f16, B>>(&sb[ib], LDB);
}

fn store_c(acc: coop_mat16x16<f32, C>, c: u32) {
    let ic = c * 16u;
    coopStoreT(acc, &sc[ic], LDC);
}

// Four named accumulators, operands row-major from workgroup memory (matmul_coop.wgsl).
@compute @workgroup_size(SG)
fn named(
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    stage(lane);
    var acc0 = coop_mat16x16<f32, C>();
    var acc1 = coop_mat16x16<f32, C>();
    var acc2 = coop_mat16x16<f32, C>();
    var acc3 = coop_mat16x16<f32, C>();
    for (var kc = 0u; kc < K / 16u; kc++) {
        let fa = load_a(kc);
        acc0 = coopMultiplyAdd(fa, load_b(kc, 0u), acc0);
        acc1 = coopMultiplyAdd(fa, load_b(kc, 1u), acc1);
        acc2 = coopMultiplyAdd(fa, load_b(kc, 2u), acc2);
        acc3 = coopMultiplyAdd(fa, load_b(kc, 3u), acc3);
    }
    store_c(acc0, 0u);
    store_c(acc1, 1u);
    store_c(acc2, 2u);
    store_c(acc3, 3u);
    finish(lane);
}

// The accumulators as a function-scope array, indexed in loops (flash_coop.wgsl's `o`).
@compute @workgroup_size(SG)
fn accumulator_array(
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    stage(lane);
    var acc: array<coop_mat16x16<f32, C>, 4>;
    for (var c = 0u; c < 4u; c++) {
        acc[c] = coop_mat16x16<f32, C>();
    }
    for (var kc = 0u; kc < K / 16u; kc++) {
        let fa = load_a(kc);
        for (var c = 0u; c < 4u; c++) {
            acc[c] = coopMultiplyAdd(fa, load_b(kc, c), acc[c]);
        }
    }
    for (var c = 0u; c < 4u; c++) {
        store_c(acc[c], c);
    }
    finish(lane);
}

fn accumulate(acc: ptr<function, array<coop_mat16x16<f32, C>, 4>>, kc: u32) {
    let fa = load_a(kc);
    for (var c = 0u; c < 4u; c++) {
        (*acc)[c] = coopMultiplyAdd(fa, load_b(kc, c), (*acc)[c]);
    }
}

// The array updated through a pointer parameter (flash_coop.wgsl's pv_step).
@compute @workgroup_size(SG)
fn accumulator_array_by_pointer(
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    stage(lane);
    var acc: array<coop_mat16x16<f32, C>, 4>;
    for (var c = 0u; c < 4u; c++) {
        acc[c] = coop_mat16x16<f32, C>();
    }
    for (var kc = 0u; kc < K / 16u; kc++) {
        accumulate(&acc, kc);
    }
    for (var c = 0u; c < 4u; c++) {
        store_c(acc[c], c);
    }
    finish(lane);
}

// A fragments loaded once into an array (flash_coop.wgsl's `qf`); B column-major from
// the staged Bᵀ rows (its scores' Kᵀ).
@compute @workgroup_size(SG)
fn operand_array_and_column_major(
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    stage(lane);
    var fa: array<coop_mat16x16<f16, A>, 4>;
    for (var kc = 0u; kc < K / 16u; kc++) {
        fa[kc] = load_a(kc);
    }
    for (var c = 0u; c < 4u; c++) {
        var acc = coop_mat16x16<f32, C>();
        for (var kc = 0u; kc < K / 16u; kc++) {
            let ib = c * 16u * LDA + kc * 16u;
            let fb = coopLoad<coop_mat16x16<f16, B>>(&sbt[ib], LDA);
            acc = coopMultiplyAdd(fa[kc], fb, acc);
        }
        store_c(acc, c);
    }
    finish(lane);
}

// Accumulators stored, reloaded from workgroup memory (f32, row-major), and added to
// once more: `out` is 2 A·B (flash_coop.wgsl's rescale and resume).
@compute @workgroup_size(SG)
fn accumulator_reload(
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    stage(lane);
    for (var c = 0u; c < 4u; c++) {
        var acc = coop_mat16x16<f32, C>();
        for (var kc = 0u; kc < K / 16u; kc++) {
            acc = coopMultiplyAdd(load_a(kc), load_b(kc, c), acc);
        }
        store_c(acc, c);
    }
    workgroupBarrier();
    for (var c = 0u; c < 4u; c++) {
        let ic = c * 16u;
        var acc = coopLoadT<coop_mat16x16<f32, C>>(&sc[ic], LDC);
        for (var kc = 0u; kc < K / 16u; kc++) {
            acc = coopMultiplyAdd(load_a(kc), load_b(kc, c), acc);
        }
        workgroupBarrier();
        store_c(acc, c);
    }
    finish(lane);
}

// Operands straight from f16 storage (../shared/gpu/reference's coop_gemm_storage).
@compute @workgroup_size(SG)
fn from_storage(
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    for (var c = 0u; c < 4u; c++) {
        var acc = coop_mat16x16<f32, C>();
        for (var kc = 0u; kc < K / 16u; kc++) {
            let ia = kc * 16u;
            let ib = kc * 16u * N + c * 16u;
            let fa = coopLoadT<coop_mat16x16<f16, A>>(&a16[ia], K);
            let fb = coopLoadT<coop_mat16x16<f16, B>>(&b16[ib], N);
            acc = coopMultiplyAdd(fa, fb, acc);
        }
        store_c(acc, c);
    }
    finish(lane);
}

// flash_coop.wgsl's core for one band and one tile of 16 keys, unpipelined: Q·Kᵀ with Q
// fragments in an array and Kᵀ column-major (K = B's rows 0-15), the scores through
// workgroup memory to a softmax split across LPR lanes per row (subgroup shuffles for
// maxima and sums), P as f16 through workgroup memory, P·V (V = B's rows 16-31) into an
// accumulator array, normalised by the lanes. `out` is softmax(Q·Kᵀ / 8)·V.
const LDP: u32 = 16u + 8u; // halves per row of P
var<workgroup> sp: array<f16, 16u * LDP>;
var<workgroup> row_sums: array<f32, 16>;

@compute @workgroup_size(SG)
fn attention_one_band(
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    stage(lane);
    var qf: array<coop_mat16x16<f16, A>, 4>;
    for (var dc = 0u; dc < 4u; dc++) {
        qf[dc] = load_a(dc);
    }
    var s = coop_mat16x16<f32, C>();
    for (var dc = 0u; dc < 4u; dc++) {
        let ib = dc * 16u;
        let kt = coopLoad<coop_mat16x16<f16, B>>(&sb[ib], LDB);
        s = coopMultiplyAdd(qf[dc], kt, s);
    }
    coopStoreT(s, &sc[0], LDC);
    workgroupBarrier();

    let lpr = max(SG / 16u, 1u); // lanes per row
    let rpl = 16u * lpr / SG; // rows per lane
    let quads = 4u / lpr; // column quads per lane and row
    for (var rr = 0u; rr < rpl; rr++) {
        let r = lane / lpr + rr * (SG / lpr);
        var m = -3.0e38;
        for (var u = 0u; u < quads; u++) {
            let j = r * LDC + 4u * (lane % lpr + lpr * u);
            m = max(m, max(max(sc[j], sc[j + 1u]), max(sc[j + 2u], sc[j + 3u])) * 0.125);
        }
        for (var x = 1u; x < lpr; x *= 2u) {
            m = max(m, subgroupShuffleXor(m, x));
        }
        var sum = 0.0;
        for (var u = 0u; u < quads; u++) {
            let c = 4u * (lane % lpr + lpr * u);
            let j = r * LDC + c;
            let p4 = exp(vec4<f32>(sc[j], sc[j + 1u], sc[j + 2u], sc[j + 3u]) * 0.125 - m);
            let e = vec4<f16>(p4);
            sp[r * LDP + c] = e.x;
            sp[r * LDP + c + 1u] = e.y;
            sp[r * LDP + c + 2u] = e.z;
            sp[r * LDP + c + 3u] = e.w;
            sum += dot(vec4<f32>(e), vec4<f32>(1.0));
        }
        for (var x = 1u; x < lpr; x *= 2u) {
            sum += subgroupShuffleXor(sum, x);
        }
        if lane % lpr == 0u {
            row_sums[r] = sum;
        }
    }
    workgroupBarrier();

    var o: array<coop_mat16x16<f32, C>, 4>;
    for (var c = 0u; c < 4u; c++) {
        o[c] = coop_mat16x16<f32, C>();
    }
    let fp = coopLoadT<coop_mat16x16<f16, A>>(&sp[0], LDP);
    for (var c = 0u; c < 4u; c++) {
        let ib = 16u * LDB + c * 16u;
        let fv = coopLoadT<coop_mat16x16<f16, B>>(&sb[ib], LDB);
        o[c] = coopMultiplyAdd(fp, fv, o[c]);
    }
    workgroupBarrier();
    for (var c = 0u; c < 4u; c++) {
        store_c(o[c], c);
    }
    workgroupBarrier();
    for (var x = lane; x < M * N; x += SG) {
        out[x] = sc[(x / N) * LDC + x % N] / row_sums[x / N];
    }
}

// Fragment and accumulator arrays carried across a loop whose trip count the compiler
// cannot know (4, from a buffer's length), with a barrier in it, as flash_coop.wgsl's
// key loop carries its Q fragments and output tiles: `out` is 4 A·B.
@compute @workgroup_size(SG)
fn arrays_across_a_runtime_loop(
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    stage(lane);
    let rounds = arrayLength(&b) * 4u / (K * N);
    var fa: array<coop_mat16x16<f16, A>, 4>;
    for (var kc = 0u; kc < 4u; kc++) {
        fa[kc] = load_a(kc);
    }
    var acc: array<coop_mat16x16<f32, C>, 4>;
    for (var c = 0u; c < 4u; c++) {
        acc[c] = coop_mat16x16<f32, C>();
    }
    for (var t = 0u; t < rounds; t++) {
        for (var kc = 0u; kc < 4u; kc++) {
            for (var c = 0u; c < 4u; c++) {
                acc[c] = coopMultiplyAdd(fa[kc], load_b(kc, c), acc[c]);
            }
        }
        workgroupBarrier();
    }
    for (var c = 0u; c < 4u; c++) {
        store_c(acc[c], c);
    }
    finish(lane);
}

// Accumulators read back with an index the compiler cannot resolve (the loop over
// them stops at a count known only at run time), as flash_coop.wgsl's final store
// reads `o[c0 + u]` in a loop that ends at the value head dim: `out` is A·B.
@compute @workgroup_size(SG)
fn accumulators_at_runtime_indices(
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    stage(lane);
    let tiles = arrayLength(&b) * 4u / (K * N); // 4, unknown to the compiler
    var acc: array<coop_mat16x16<f32, C>, 4>;
    for (var c = 0u; c < 4u; c++) {
        acc[c] = coop_mat16x16<f32, C>();
    }
    for (var kc = 0u; kc < K / 16u; kc++) {
        let fa = load_a(kc);
        for (var c = 0u; c < 4u; c++) {
            acc[c] = coopMultiplyAdd(fa, load_b(kc, c), acc[c]);
        }
    }
    for (var c0 = 0u; c0 < 4u; c0 += 2u) {
        if c0 >= tiles {
            break;
        }
        for (var u = 0u; u < 2u; u++) {
            let c = c0 + u;
            store_c(acc[c], c);
        }
    }
    finish(lane);
}
