// The bandwidth probe's copy (`bench`'s `%copy` ceiling, src/bench/probe.rs): src to
// dst in 16-byte words, as a kernel reads and writes memory at its best.
//
// Tiling: 256 invocations a workgroup, workgroups in a 2D grid (more than 65535 of them
// on a large copy). The grid's invocations walk the words in strides of the whole
// grid, so at every step consecutive invocations touch consecutive words (coalesced),
// and each invocation has several loads in flight across its steps.

// Words to copy (padded to 16 bytes, as every uniform block here).
struct CopyParams {
    words: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> cp: CopyParams;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<u32>>;

@compute @workgroup_size(256, 1, 1)
fn copy_words(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let invocations = groups.x * groups.y * 256u;
    let first = (wid.y * groups.x + wid.x) * 256u + lid;
    for (var w = first; w < cp.words; w += invocations) {
        dst[w] = src[w];
    }
}
