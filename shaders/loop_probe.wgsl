// Loop-cap probe (kernels::loop_probe): one invocation runs a loop of `io[0]` trips,
// a count it reads from memory so the compiler cannot fold it, and writes how many
// trips it made to `io[1]`. Mesa's llvmpipe up to 22.x ends an invocation's loops after
// 65535 iterations in total and carries on; the count shows where a driver stops.

@group(0) @binding(0) var<storage, read_write> io: array<u32, 2>;

@compute @workgroup_size(1)
fn main() {
    let n = io[0];
    var trips = 0u;
    for (var i = 0u; i < n; i++) {
        trips += 1u;
    }
    io[1] = trips;
}
