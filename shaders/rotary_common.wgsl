// The rotation rule of rotary embeddings, shared by rotary.wgsl and kv_append.wgsl
// (docs/design.md, "Rotary embeddings"): element d < dim of a head row pairs with
//   NeoX (rotate_half): d ± dim/2, pair index d % (dim/2);
//   GPT-J (interleaved): d ^ 1, pair index d / 2;
// the first of a pair becomes x·cos − partner·sin, the second x·cos + partner·sin.

struct RotaryPair {
    pair: u32,
    partner: u32,
    first: bool,
}

fn rotary_pair(d: u32, dim: u32, interleaved: bool) -> RotaryPair {
    if interleaved {
        let first = d % 2u == 0u;
        return RotaryPair(d / 2u, select(d - 1u, d + 1u, first), first);
    }
    let half = dim / 2u;
    let first = d < half;
    return RotaryPair(d % half, select(d - half, d + half, first), first);
}

// The rotated value of an element with its partner's value and its pair's (cos, sin).
fn rotated(value: f32, partner: f32, cos_sin: vec2<f32>, first: bool) -> f32 {
    return select(value * cos_sin.x + partner * cos_sin.y, value * cos_sin.x - partner * cos_sin.y, first);
}
