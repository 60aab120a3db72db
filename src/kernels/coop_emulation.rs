//! Runs the cooperative-matrix kernels (`flash_coop.wgsl`, `matmul_coop.wgsl`) on
//! adapters without tensor cores, for CI: every coop type and operation in the kernel's
//! WGSL is rewritten into plain WGSL that does the same per subgroup, so lavapipe
//! checks the kernels' own indexing, staging, masking and softmax against the
//! reference. It says nothing about the tensor cores themselves (their tile layouts
//! and rounding), which only a GPU run checks; and it is slow.
//!
//! The emulation, for subgroups of `SG` lanes where `SG` divides 16 (lavapipe's 8):
//! every 16 x 16 tile, operand or accumulator, is spread over the lanes, lane `l`
//! holding elements `l, l + SG, ...` of the row-major tile (256 / SG of them); A and B
//! operands hold the f16 values, exactly, as f32. In a multiply-add each lane computes
//! its own accumulator elements: for the slot `t` of element (i, j), i is the same in
//! every lane and j = (SG·t mod 16) + l, so B's element (k, j) sits in the lane itself
//! and A's (i, k) in lane k mod SG at a slot every lane agrees on, fetched with one
//! subgroup shuffle. Loads and stores become functions generated per workgroup array
//! the kernel passes to them (`coopLoadT<coop_mat16x16<f16, A>>(&qs[i], LDQ)` →
//! `em_load_t_qs_ab(i, LDQ)`). Operands kept in registers (the attention kernel's Q
//! fragments) so cost 256 / SG floats per lane, as accumulators do.

use crate::error::{Error, Result};

/// The emulating WGSL for a coop kernel's full source, for subgroups of `sg` lanes.
pub fn rewrite(source: &str, sg: u32) -> Result<String> {
    if sg == 0 || 16 % sg != 0 {
        return Err(Error::invalid(
            "cooperative-matrix emulation",
            format!("subgroups of {sg} lanes do not divide a 16-wide tile row"),
        ));
    }
    // Comments name the coop functions too; WGSL has no strings, so `//` starts one.
    let source: String = source
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut body = String::new();
    let mut functions: Vec<String> = Vec::new();
    let mut rest = source.as_str();
    // Each coop call is rewritten as it is met; its helper is generated once.
    while let Some(at) = next_call(rest) {
        body.push_str(&rest[..at]);
        let (replacement, helper, used) = rewrite_call(&rest[at..])?;
        body.push_str(&replacement);
        if !functions.contains(&helper) && !helper.is_empty() {
            functions.push(helper);
        }
        rest = &rest[at + used..];
    }
    body.push_str(rest);
    let body = body
        .replace("enable wgpu_cooperative_matrix;\n", "")
        .replace("coop_mat16x16<f32, C>", "EmC")
        .replace("coop_mat16x16<f16, A>", "EmAb")
        .replace("coop_mat16x16<f16, B>", "EmAb");
    let body = add_lane_builtin(&body)?;
    let prelude = format!(
        "const EM_SG: u32 = {sg}u;\nconst EM_SLOTS: u32 = {slots}u;\n{COMMON}",
        slots = 256 / sg
    );
    // Directives stay first; the helpers go after the kernel's declarations.
    let split = body
        .lines()
        .take_while(|l| l.starts_with("enable ") || l.starts_with("alias "))
        .map(|l| l.len() + 1)
        .sum::<usize>();
    Ok(format!(
        "{}{prelude}{}\n{}",
        &body[..split],
        &body[split..],
        functions.join("\n")
    ))
}

const COMMON: &str = "
struct EmAb {
    e: array<f32, EM_SLOTS>,
}

struct EmC {
    e: array<f32, EM_SLOTS>,
}

var<private> em_lane: u32;

fn em_mma(a: EmAb, b: EmAb, c: EmC) -> EmC {
    var d = c;
    for (var t = 0u; t < EM_SLOTS; t++) {
        let i = (t * EM_SG) / 16u;
        let col0 = (t * EM_SG) % 16u;
        var acc = d.e[t];
        for (var kk = 0u; kk < 16u; kk++) {
            let ai = i * 16u + kk;
            let a_ik = subgroupShuffle(a.e[ai / EM_SG], ai % EM_SG);
            acc += a_ik * b.e[(kk * 16u + col0) / EM_SG];
        }
        d.e[t] = acc;
    }
    return d;
}
";

/// Offset of the next coop call in `s`.
fn next_call(s: &str) -> Option<usize> {
    ["coopLoad", "coopStore", "coopMultiplyAdd("]
        .iter()
        .filter_map(|name| s.find(name))
        .min()
}

/// The text of a call's parenthesised arguments starting at `open` (an index of `(`),
/// split at top-level commas, and the index just past the closing parenthesis.
fn arguments(s: &str, open: usize) -> Result<(Vec<String>, usize)> {
    let mut depth = 0;
    let mut args = Vec::new();
    let mut start = open + 1;
    for (i, ch) in s[open..].char_indices().map(|(i, ch)| (open + i, ch)) {
        match ch {
            '(' | '[' => depth += 1,
            ')' | ']' => {
                depth -= 1;
                if depth == 0 {
                    args.push(s[start..i].trim().to_string());
                    return Ok((args, i + 1));
                }
            }
            ',' if depth == 1 => {
                args.push(s[start..i].trim().to_string());
                start = i + 1;
            }
            _ => {}
        }
    }
    Err(Error::invalid("cooperative-matrix emulation", "unbalanced call"))
}

/// `&array[index]` → (array, index).
fn element_pointer(arg: &str) -> Result<(String, String)> {
    let inner = arg
        .strip_prefix('&')
        .and_then(|a| a.strip_suffix(']'))
        .and_then(|a| a.split_once('['))
        .ok_or_else(|| Error::invalid("cooperative-matrix emulation", format!("pointer '{arg}'")))?;
    Ok((inner.0.trim().to_string(), inner.1.trim().to_string()))
}

/// Rewrites the coop call at the start of `s`: (replacement, helper function, bytes used).
fn rewrite_call(s: &str) -> Result<(String, String, usize)> {
    if s.starts_with("coopMultiplyAdd(") {
        return Ok(("em_mma(".into(), String::new(), "coopMultiplyAdd(".len()));
    }
    let store = s.starts_with("coopStore");
    let name_end = s.find(['<', '(']).unwrap_or(s.len());
    let row_major = s[..name_end].ends_with('T');
    let (role, open) = if store {
        ("c", name_end)
    } else {
        let open = s.find('(').unwrap_or(s.len());
        let role = if s[..open].contains(", C>") { "c" } else { "ab" };
        (role, open)
    };
    let (args, used) = arguments(s, open)?;
    let order = if row_major { "t" } else { "n" };
    // Element (r, c) of the tile sits at `at + r * stride + c` (row-major) or
    // `at + c * stride + r`.
    let offset = if row_major {
        "at + r * stride + c"
    } else {
        "at + c * stride + r"
    };
    if store {
        let [value, pointer, stride] = <[String; 3]>::try_from(args)
            .map_err(|_| Error::invalid("cooperative-matrix emulation", "coopStore takes 3 arguments here"))?;
        let (array, index) = element_pointer(&pointer)?;
        let name = format!("em_store_{order}_{array}");
        let helper = format!(
            "fn {name}(m: EmC, at: u32, stride: u32) {{
    for (var t = 0u; t < EM_SLOTS; t++) {{
        let idx = em_lane + t * EM_SG;
        let r = idx / 16u;
        let c = idx % 16u;
        {array}[{offset}] = m.e[t];
    }}
}}
"
        );
        return Ok((format!("{name}({value}, {index}, {stride})"), helper, used));
    }
    let [pointer, stride] = <[String; 2]>::try_from(args)
        .map_err(|_| Error::invalid("cooperative-matrix emulation", "coopLoad takes 2 arguments here"))?;
    let (array, index) = element_pointer(&pointer)?;
    let name = format!("em_load_{order}_{array}_{role}");
    let helper = if role == "c" {
        format!(
            "fn {name}(at: u32, stride: u32) -> EmC {{
    var m: EmC;
    for (var t = 0u; t < EM_SLOTS; t++) {{
        let idx = em_lane + t * EM_SG;
        let r = idx / 16u;
        let c = idx % 16u;
        m.e[t] = f32({array}[{offset}]);
    }}
    return m;
}}
"
        )
    } else {
        format!(
            "fn {name}(at: u32, stride: u32) -> EmAb {{
    var m: EmAb;
    for (var t = 0u; t < EM_SLOTS; t++) {{
        let idx = em_lane + t * EM_SG;
        let r = idx / 16u;
        let c = idx % 16u;
        m.e[t] = f32(f16({array}[{offset}]));
    }}
    return m;
}}
"
        )
    };
    Ok((format!("{name}({index}, {stride})"), helper, used))
}

/// Gives the entry point the lane index (or uses its own `subgroup_invocation_id`
/// parameter, where it declares one) and stores it in `em_lane` first thing.
fn add_lane_builtin(body: &str) -> Result<String> {
    let marker = "@builtin(subgroup_id) sg: u32,";
    if !body.contains(marker) {
        return Err(Error::invalid(
            "cooperative-matrix emulation",
            "no subgroup_id parameter",
        ));
    }
    // Every entry point (a module may have several) sets the lane for its helpers.
    let mut out = String::new();
    let mut rest = body;
    while let Some(at) = rest.find(marker) {
        let open = rest[at..]
            .find(") {\n")
            .map(|i| at + i + 4)
            .ok_or_else(|| Error::invalid("cooperative-matrix emulation", "no entry-point body"))?;
        let lane_marker = "@builtin(subgroup_invocation_id)";
        if let Some(own) = rest[at..open].find(lane_marker).map(|i| at + i + lane_marker.len()) {
            let name = rest[own..]
                .split(':')
                .next()
                .map(str::trim)
                .filter(|name| !name.is_empty())
                .ok_or_else(|| Error::invalid("cooperative-matrix emulation", "unnamed lane parameter"))?;
            out.push_str(&format!("{}    em_lane = {name};\n", &rest[..open]));
        } else {
            out.push_str(&format!(
                "{}{marker}\n    @builtin(subgroup_invocation_id) em_lane_in: u32,{}    em_lane = em_lane_in;\n",
                &rest[..at],
                &rest[at + marker.len()..open],
            ));
        }
        rest = &rest[open..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_become_helpers_generated_once() {
        let source = "enable f16;\nenable wgpu_cooperative_matrix;\nalias elem = f32;\n\
            var<workgroup> qs: array<f16, 512>;\nvar<workgroup> ss: array<f32, 512>;\n\
            @compute @workgroup_size(32)\nfn main(\n    @builtin(subgroup_id) sg: u32,\n) {\n\
            let i = 0u;\n\
            var acc = coop_mat16x16<f32, C>();\n\
            let a = coopLoadT<coop_mat16x16<f16, A>>(&qs[i], 16u);\n\
            let b = coopLoad<coop_mat16x16<f16, B>>(&qs[i], 16u);\n\
            acc = coopMultiplyAdd(a, b, acc);\n\
            acc = coopMultiplyAdd(a, coopLoad<coop_mat16x16<f16, B>>(&qs[i], 16u), acc);\n\
            coopStoreT(acc, &ss[i], 16u);\n}\n";
        let out = rewrite(source, 8).expect("rewrites");
        assert!(!out.contains("coop"), "{out}");
        assert!(
            out.starts_with("enable f16;\nalias elem = f32;\nconst EM_SG: u32 = 8u;"),
            "{out}"
        );
        assert_eq!(out.matches("fn em_load_n_qs_ab").count(), 1, "{out}");
        assert!(out.contains("em_load_t_qs_ab(i, 16u)") && out.contains("em_store_t_ss(acc, i, 16u)"));
        assert!(out.contains("em_lane = em_lane_in;"));
        assert!(rewrite(source, 7).is_err());
        // An entry point with its own lane parameter keeps it as the only one.
        let own = source.replace(
            "@builtin(subgroup_id) sg: u32,\n",
            "@builtin(subgroup_id) sg: u32,\n    @builtin(subgroup_invocation_id) lane: u32,\n",
        );
        let out = rewrite(&own, 8).expect("rewrites");
        assert_eq!(out.matches("subgroup_invocation_id").count(), 1, "{out}");
        assert!(out.contains("em_lane = lane;"), "{out}");
    }
}
