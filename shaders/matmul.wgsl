// Plain matrix multiply C = A · B (row-major f32, M x K times K x N), the roofline probe
// the benchmark measures attention against.
//
// Tiling: a workgroup of 8x8 invocations covers a 64x64 block of C; each invocation
// computes an 8x8 block in eight vec4 pairs of accumulators. Per step along K it loads
// 8 values of A's column and 8 of B's row and does 64 multiply-adds: no workgroup
// memory, no barriers, which is the shape that runs fast on CPU adapters.
// Requires N to be a multiple of 4; rows past M are clamped and not stored.

struct MatmulParams {
    m: u32,
    n: u32,
    k: u32,
    pad: u32,
}

@group(0) @binding(0) var<uniform> mp: MatmulParams;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c: array<vec4<f32>>;

fn store_row(row: u32, col4: u32, lo: vec4<f32>, hi: vec4<f32>) {
    let n4 = mp.n / 4u;
    if row < mp.m {
        c[row * n4 + col4] = lo;
        if col4 + 1u < n4 {
            c[row * n4 + col4 + 1u] = hi;
        }
    }
}

@compute @workgroup_size(8, 8, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let col4 = gid.x * 2u; // first of two vec4 column blocks of C
    let row0 = gid.y * 8u;
    let n4 = mp.n / 4u;
    if col4 >= n4 || row0 >= mp.m {
        return;
    }
    let col4b = min(col4 + 1u, n4 - 1u);
    var rows: array<u32, 8>;
    for (var r = 0u; r < 8u; r++) {
        rows[r] = min(row0 + r, mp.m - 1u) * mp.k;
    }
    var lo: array<vec4<f32>, 8>;
    var hi: array<vec4<f32>, 8>;
    for (var kk = 0u; kk < mp.k; kk++) {
        let b_lo = b[kk * n4 + col4];
        let b_hi = b[kk * n4 + col4b];
        for (var r = 0u; r < 8u; r++) {
            let av = a[rows[r] + kk];
            lo[r] += av * b_lo;
            hi[r] += av * b_hi;
        }
    }
    for (var r = 0u; r < 8u; r++) {
        store_row(row0 + r, col4, lo[r], hi[r]);
    }
}
