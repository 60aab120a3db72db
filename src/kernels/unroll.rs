//! A small WGSL generator that writes a kernel's register arrays either as arrays
//! indexed by loop counters ("arrayed") or as one named value per element, the loops
//! that index them unrolled ("named"), from one source.
//!
//! A driver that does not unroll a loop keeps an array it indexes in local memory, and
//! every access becomes a load or a store; named values leave it no choice
//! (`matmul_coop.wgsl` and `flash_micro.wgsl` are written so by hand). Which runs
//! faster is the GPU's to say, so the tensor-core attention kernel is built both ways
//! and `tune` times both (docs/design.md, "Tensor cores").
//!
//! Directives, each alone on a line (leading spaces allowed):
//! - `//@array NAME SIZE TYPE` (SIZE without spaces, e.g. `D16*BANDS`): declares `var NAME: array<TYPE, SIZE>;`, or named,
//!   `var NAME_0: TYPE;` .. `var NAME_{SIZE-1}: TYPE;`.
//! - `//@each VAR < BOUND` .. `//@end` (nestable), optionally `//@each VAR < BOUND while
//!   EXPR < LIMIT`: the lines between run for VAR = 0 .. BOUND - 1 while EXPR < LIMIT.
//!   Arrayed, a `for` loop (the guard a `break`); named, one `{ .. }` block per value,
//!   with VAR written as its value (`3u`). A loop of one trip, and an array of one, are
//!   written out in both forms.
//! - `//@unroll VAR < BOUND` .. `//@end` (same options as `//@each`): written out in both
//!   forms, one `{ .. }` block per value, the arrays inside keeping their form (a loop
//!   whose array indices must be constants even where the arrays are arrays, so that
//!   the driver can keep them in registers).
//! - `//@if EXPR` .. `//@end`, optionally with `//@else` between: the lines of the first
//!   part where EXPR is not 0, else those of the second, in both forms (a variant's
//!   design choice that changes declarations or types, which a WGSL `if` could not).
//! - `//@macro NAME` .. `//@endmacro` defines lines that `//@expand NAME` inserts;
//!   `//@macro NAME(a, b)` takes arguments, `//@expand NAME(qf, 0u)`, written in the
//!   body as `$a`, `$b` (an array's name too: `$a@{c}`). Each argument is one name
//!   or number.
//!
//! Any other line starting `//@` is an error, as is an `//@else` outside an `//@if`.
//!
//! In any line, `NAME@{EXPR}` (NAME declared by `//@array`) is element EXPR of the
//! array: `NAME[EXPR]`, or named, `NAME_k` with k the value of EXPR, a sum of products
//! of integers, the `//@each` variables around it and the constants the caller gives.
//! BOUND and LIMIT are integers or such constants.

use std::collections::HashMap;

/// Expands the directives of `source`, the arrays named or arrayed; `consts` gives the
/// values BOUND, LIMIT and EXPR may name (the generator's, e.g. `D16`). An error says
/// which line broke which rule.
pub fn expand(source: &str, named: bool, consts: &[(&str, u32)]) -> Result<String, String> {
    let lines = with_macros(source)?;
    // Each array's size and whether its elements are named values.
    let mut arrays: HashMap<String, (u32, bool)> = HashMap::new();
    let mut out = String::with_capacity(source.len() * 2);
    let mut env: Vec<(String, u32)> = consts.iter().map(|&(n, v)| (n.to_string(), v)).collect();
    let mut at = 0;
    emit(&lines, &mut at, named, &mut env, &mut arrays, &mut out, false)?;
    if at != lines.len() {
        return Err(format!("line {}: //@end without //@each or //@if", lines[at].0));
    }
    Ok(out)
}

/// A macro: its parameters and its lines.
type Macro = (Vec<String>, Vec<(usize, String)>);

/// The source's lines (numbered from 1) with macros defined and expanded.
fn with_macros(source: &str) -> Result<Vec<(usize, String)>, String> {
    let mut macros: HashMap<String, Macro> = HashMap::new();
    let mut out = Vec::new();
    let mut defining: Option<(String, Macro)> = None;
    for (i, line) in source.lines().enumerate() {
        let n = i + 1;
        let directive = line.trim_start();
        if let Some(head) = directive.strip_prefix("//@macro ") {
            if defining.is_some() {
                return Err(format!("line {n}: //@macro inside //@macro"));
            }
            let (name, params) = call(head).map_err(|e| format!("line {n}: {e}"))?;
            defining = Some((name, (params, Vec::new())));
        } else if directive.starts_with("//@endmacro") {
            let (name, body) = defining
                .take()
                .ok_or(format!("line {n}: //@endmacro without //@macro"))?;
            macros.insert(name, body);
        } else if let Some((_, (_, body))) = defining.as_mut() {
            if directive.starts_with("//@expand") {
                return Err(format!("line {n}: //@expand inside //@macro"));
            }
            body.push((n, line.to_string()));
        } else if let Some(head) = directive.strip_prefix("//@expand ") {
            let (name, args) = call(head).map_err(|e| format!("line {n}: {e}"))?;
            let (params, body) = macros
                .get(&name)
                .ok_or(format!("line {n}: //@expand of an undefined macro '{name}'"))?;
            if args.len() != params.len() {
                return Err(format!(
                    "line {n}: {name} takes {} arguments, given {}",
                    params.len(),
                    args.len()
                ));
            }
            for (m, line) in body {
                let line = with_arguments(line, params, &args).map_err(|e| format!("line {m}: {e}"))?;
                out.push((*m, line));
            }
        } else {
            out.push((n, line.to_string()));
        }
    }
    match defining {
        Some((name, _)) => Err(format!("//@macro {name} has no //@endmacro")),
        None => Ok(out),
    }
}

/// `NAME` or `NAME(a, b)`: the name and the arguments.
fn call(head: &str) -> Result<(String, Vec<String>), String> {
    let head = head.trim();
    let Some((name, rest)) = head.split_once('(') else {
        return Ok((head.to_string(), Vec::new()));
    };
    let inner = rest.strip_suffix(')').ok_or(format!("'{head}': expected NAME(a, b)"))?;
    // One token each (a name or a number): pasted as text, anything longer could bind
    // differently inside the body.
    let args: Vec<String> = if inner.trim().is_empty() {
        Vec::new()
    } else {
        inner.split(',').map(|a| a.trim().to_string()).collect()
    };
    if let Some(bad) = args
        .iter()
        .find(|a| a.is_empty() || !a.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.'))
    {
        return Err(format!("'{head}': macro argument '{bad}' is not one name or number"));
    }
    Ok((name.trim().to_string(), args))
}

/// A macro line with each `$param` replaced by its argument.
fn with_arguments(line: &str, params: &[String], args: &[String]) -> Result<String, String> {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let name_len = rest[at + 1..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len() - at - 1);
        let name = &rest[at + 1..at + 1 + name_len];
        let k = params
            .iter()
            .position(|p| p == name)
            .ok_or(format!("'${name}' is no parameter of the macro"))?;
        out.push_str(&args[k]);
        rest = &rest[at + 1 + name_len..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Emits lines from `*at` to the end (or, `in_each`, to the `//@end` that closes the
/// block, left at `*at`).
fn emit(
    lines: &[(usize, String)],
    at: &mut usize,
    named: bool,
    env: &mut Vec<(String, u32)>,
    arrays: &mut HashMap<String, (u32, bool)>,
    out: &mut String,
    in_each: bool,
) -> Result<(), String> {
    while *at < lines.len() {
        let (n, line) = &lines[*at];
        let directive = line.trim_start();
        let indent = &line[..line.len() - directive.len()];
        let exact = directive.trim_end();
        if exact == "//@end" || exact == "//@else" {
            if in_each {
                return Ok(());
            }
            return Err(format!("line {n}: {exact} without //@each or //@if"));
        }
        if directive.starts_with("//@")
            && !["//@if ", "//@each ", "//@unroll ", "//@array "]
                .iter()
                .any(|d| directive.starts_with(d))
        {
            return Err(format!("line {n}: '{exact}' is no directive"));
        }
        *at += 1;
        if let Some(expr) = directive.strip_prefix("//@if ") {
            let chosen = evaluate(expr.trim(), env).map_err(|e| format!("line {n}: {e}"))? != 0;
            let is = |at: usize, d: &str| lines.get(at).is_some_and(|(_, l)| l.trim() == d);
            // Both parts are read (for their errors and their end); one is kept, and the
            // arrays the other declares are forgotten. The part left out is read in the
            // arrayed form with its indices unchecked: it may be written for constants
            // other than these (elements past an array's end).
            let mut kept = String::new();
            let mut dropped = String::new();
            let before = arrays.clone();
            let loose = |arrays: &HashMap<String, (u32, bool)>| -> HashMap<String, (u32, bool)> {
                arrays
                    .iter()
                    .map(|(k, &(size, _))| (k.clone(), (size, false)))
                    .collect()
            };
            if chosen {
                emit(lines, at, named, env, arrays, &mut kept, true)?;
            } else {
                emit(lines, at, false, env, &mut loose(arrays), &mut dropped, true)?;
            }
            let after_first = std::mem::replace(arrays, before);
            if is(*at, "//@else") {
                *at += 1;
                if chosen {
                    emit(lines, at, false, env, &mut loose(arrays), &mut dropped, true)?;
                } else {
                    emit(lines, at, named, env, arrays, &mut kept, true)?;
                }
            }
            if chosen {
                *arrays = after_first;
            }
            if !is(*at, "//@end") {
                return Err(format!("line {n}: //@if without //@end"));
            }
            *at += 1;
            out.push_str(&kept);
            continue;
        }
        if let Some(rest) = directive.strip_prefix("//@array ") {
            let mut parts = rest.trim().splitn(3, ' ');
            let (Some(name), Some(size), Some(ty)) = (parts.next(), parts.next(), parts.next()) else {
                return Err(format!("line {n}: expected //@array NAME SIZE TYPE"));
            };
            if ty.starts_with(['*', '+']) {
                return Err(format!("line {n}: //@array SIZE must have no spaces"));
            }
            let value = evaluate(size, env).map_err(|e| format!("line {n}: {e}"))?;
            // An array of one is a named value in both forms: the arrayed form then keeps
            // what a kernel without the axis had (one value, no index).
            let as_names = named || value == 1;
            arrays.insert(name.to_string(), (value, as_names));
            if as_names {
                for k in 0..value {
                    out.push_str(&format!("{indent}var {name}_{k}: {ty};\n"));
                }
            } else {
                out.push_str(&format!("{indent}var {name}: array<{ty}, {size}>;\n"));
            }
        } else if let Some((rest, unroll)) = directive
            .strip_prefix("//@each ")
            .map(|r| (r, false))
            .or_else(|| directive.strip_prefix("//@unroll ").map(|r| (r, true)))
        {
            let each = Each::parse(rest).map_err(|e| format!("line {n}: {e}"))?;
            let body_start = *at;
            // A loop of one trip is written out in both forms, as arrays of one are named.
            let one_trip = each.guard.is_none() && evaluate(&each.bound, env).is_ok_and(|b| b == 1);
            if named || one_trip || unroll {
                let bound = evaluate(&each.bound, env).map_err(|e| format!("line {n}: {e}"))?;
                for value in 0..bound {
                    env.push((each.var.clone(), value));
                    let go_on = match &each.guard {
                        None => true,
                        Some((expr, limit)) => {
                            evaluate(expr, env).map_err(|e| format!("line {n}: {e}"))?
                                < evaluate(limit, env).map_err(|e| format!("line {n}: {e}"))?
                        }
                    };
                    if go_on {
                        out.push_str(&format!("{indent}{{\n"));
                        *at = body_start;
                        emit(lines, at, named, env, arrays, out, true)?;
                        out.push_str(&format!("{indent}}}\n"));
                    }
                    env.pop();
                    if !go_on {
                        break;
                    }
                }
                // The body once more, only to find its end when no copy was emitted: in
                // the arrayed form, its indices unchecked (a loop of no trips may name
                // elements past an array's end at the value 0).
                *at = body_start;
                let mut sink = String::new();
                let mut loose = arrays
                    .iter()
                    .map(|(k, &(size, _))| (k.clone(), (size, false)))
                    .collect();
                env.push((each.var.clone(), 0));
                emit(lines, at, false, env, &mut loose, &mut sink, true)?;
                env.pop();
            } else {
                let var = &each.var;
                // Written-out variables around it are values here too.
                out.push_str(&format!(
                    "{indent}for (var {var} = 0u; {var} < {}; {var}++) {{\n",
                    with_values(&each.bound, env)
                ));
                if let Some((expr, limit)) = &each.guard {
                    let (expr, limit) = (with_values(expr, env), with_values(limit, env));
                    out.push_str(&format!(
                        "{indent}    if !({expr} < {limit}) {{\n{indent}        break;\n{indent}    }}\n"
                    ));
                }
                // Arrayed, the variable is the loop's own.
                env.push((var.clone(), u32::MAX));
                emit(lines, at, named, env, arrays, out, true)?;
                env.pop();
                out.push_str(&format!("{indent}}}\n"));
            }
            match lines.get(*at) {
                Some((_, l)) if l.trim() == "//@end" => *at += 1,
                Some((m, _)) => return Err(format!("line {m}: //@else inside //@each without //@if")),
                None => return Err(format!("line {n}: //@each or //@unroll without //@end")),
            }
        } else {
            let line = substitute(line, env, arrays).map_err(|e| format!("line {n}: {e}"))?;
            out.push_str(&line);
            out.push('\n');
        }
    }
    if in_each {
        return Err("//@each without //@end".into());
    }
    Ok(())
}

struct Each {
    var: String,
    bound: String,
    guard: Option<(String, String)>,
}

impl Each {
    /// `VAR < BOUND [while EXPR < LIMIT]`.
    fn parse(rest: &str) -> Result<Self, String> {
        let (head, guard) = match rest.split_once(" while ") {
            Some((head, guard)) => {
                let (expr, limit) = guard
                    .split_once('<')
                    .ok_or("expected //@each VAR < BOUND while EXPR < LIMIT")?;
                (head, Some((expr.trim().to_string(), limit.trim().to_string())))
            }
            None => (rest, None),
        };
        let (var, bound) = head.split_once('<').ok_or("expected //@each VAR < BOUND")?;
        let var = var.trim();
        if var.is_empty() || !var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("'{var}' is not a variable name"));
        }
        Ok(Each {
            var: var.to_string(),
            bound: bound.trim().to_string(),
            guard,
        })
    }
}

/// One line with its array elements written out, and the enclosing written-out
/// `//@each` variables replaced by their values.
fn substitute(line: &str, env: &[(String, u32)], arrays: &HashMap<String, (u32, bool)>) -> Result<String, String> {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(open) = rest.find("@{") {
        let close = rest[open..].find('}').ok_or("'@{' without '}'")? + open;
        let before = &rest[..open];
        let name_start = before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        let name = &before[name_start..];
        let (size, as_names) = *arrays.get(name).ok_or(format!("'{name}@{{..}}' names no //@array"))?;
        let expr = &rest[open + 2..close];
        out.push_str(&with_values(&before[..name_start], env));
        if as_names {
            // An array of one has one element: its index needs no value (a `for` loop's
            // variable may stand in it, bounded by the loop's guard).
            let k = if size == 1 { 0 } else { evaluate(expr, env)? };
            if k >= size {
                return Err(format!("{name}@{{{expr}}} is element {k} of {size}"));
            }
            out.push_str(&format!("{name}_{k}"));
        } else {
            out.push_str(&format!("{name}[{}]", with_values(expr, env)));
        }
        rest = &rest[close + 1..];
    }
    out.push_str(&with_values(rest, env));
    Ok(out)
}

/// Every token that is an enclosing written-out `//@each` variable becomes its value
/// (`3u`); a `for` loop's own variable (bound to `u32::MAX`) stays a name. Comments are
/// left alone.
fn with_values(text: &str, env: &[(String, u32)]) -> String {
    let (code, comment) = match text.find("//") {
        Some(i) => text.split_at(i),
        None => (text, ""),
    };
    let mut out = String::with_capacity(text.len());
    let mut token = String::new();
    let flush = |token: &mut String, out: &mut String| {
        // Only loop variables (pushed after the constants) are replaced; the last
        // binding of a name wins.
        match env.iter().rev().find(|(n, _)| n == token.as_str()) {
            Some((_, v)) if *v != u32::MAX && !is_constant(env, token) => out.push_str(&format!("{v}u")),
            _ => out.push_str(token),
        }
        token.clear();
    };
    for c in code.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            token.push(c);
        } else {
            flush(&mut token, &mut out);
            out.push(c);
        }
    }
    flush(&mut token, &mut out);
    out.push_str(comment);
    out
}

/// Whether `name` is one of the caller's constants (upper case by convention: the
/// WGSL declares them too, so they stay names).
fn is_constant(env: &[(String, u32)], name: &str) -> bool {
    name.chars().next().is_some_and(|c| c.is_ascii_uppercase()) && env.iter().any(|(n, _)| n == name)
}

/// The value of a sum of products of integers (a `u` suffix allowed) and names bound
/// in `env`; no parentheses (which this reading would get wrong).
fn evaluate(expr: &str, env: &[(String, u32)]) -> Result<u32, String> {
    if expr.contains(['(', ')']) {
        return Err(format!("'{expr}': no parentheses in a generator expression"));
    }
    let mut sum = 0u32;
    for term in expr.split('+') {
        let mut product = 1u32;
        for factor in term.split('*') {
            let factor = factor.trim();
            let value = match factor.trim_end_matches('u').parse::<u32>() {
                Ok(v) if factor.chars().next().is_some_and(|c| c.is_ascii_digit()) => v,
                _ => match env.iter().rev().find(|(n, _)| n == factor) {
                    Some((_, v)) if *v != u32::MAX => *v,
                    _ => return Err(format!("cannot evaluate '{factor}' in '{expr}'")),
                },
            };
            product = product.checked_mul(value).ok_or("overflow")?;
        }
        sum = sum.checked_add(product).ok_or("overflow")?;
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::expand;

    const SOURCE: &str = "\
//@macro ADD
    //@each c < N
        let ib = c * 16u;
        acc@{c} = acc@{c} + x@{g * K + c}; // c stays in comments
    //@end
//@endmacro
//@array acc N f32
//@array x 6 f32
//@each g < 2 while g * K < 3
//@expand ADD
//@end
";

    #[test]
    fn named_and_arrayed_forms_of_one_source() {
        let consts = [("N", 2), ("K", 2)];
        let named = expand(SOURCE, true, &consts).expect("named");
        assert!(named.contains("var acc_0: f32;\nvar acc_1: f32;\n"), "{named}");
        assert!(named.contains("let ib = 1u * 16u;"), "{named}");
        assert!(named.contains("acc_1 = acc_1 + x_3; // c stays in comments"), "{named}");
        assert!(!named.contains("@{") && !named.contains("//@"), "{named}");
        // g = 0 and 1 both pass the guard (0 < 3, 2 < 3): 2 x 2 copies.
        assert_eq!(named.matches("acc_0 = acc_0").count(), 2, "{named}");
        let arrayed = expand(SOURCE, false, &consts).expect("arrayed");
        assert!(arrayed.contains("var acc: array<f32, N>;"), "{arrayed}");
        assert!(arrayed.contains("for (var g = 0u; g < 2; g++) {"), "{arrayed}");
        assert!(arrayed.contains("if !(g * K < 3) {"), "{arrayed}");
        assert!(arrayed.contains("acc[c] = acc[c] + x[g * K + c];"), "{arrayed}");
    }

    #[test]
    fn macro_arguments_name_arrays_and_values() {
        let source =
            "//@macro ADD(to, from, at)\n//@each c < N\n$to@{c} = $to@{c} + $from@{c} * $at;\n//@end\n//@endmacro\n\
            //@array a N f32\n//@array b N f32\n//@expand ADD(a, b, 2.0)\n//@expand ADD(b, a, x_at)\n";
        let named = expand(source, true, &[("N", 2)]).expect("named");
        assert!(
            named.contains("a_1 = a_1 + b_1 * 2.0;") && named.contains("b_0 = b_0 + a_0 * x_at;"),
            "{named}"
        );
        let arrayed = expand(source, false, &[("N", 2)]).expect("arrayed");
        assert!(arrayed.contains("a[c] = a[c] + b[c] * 2.0;"), "{arrayed}");
    }

    #[test]
    fn conditions_keep_one_part_in_both_forms() {
        let source =
            "//@array a N f32\n//@if D\na@{1} = 1.0;\n//@else\nstaged;\n//@end\n//@if D * 0\nnever;\n//@end\nafter;\n";
        for named in [false, true] {
            let on = expand(source, named, &[("N", 2), ("D", 1)]).expect("expands");
            assert!(on.contains(if named { "a_1 = 1.0;" } else { "a[1] = 1.0;" }), "{on}");
            assert!(
                !on.contains("staged") && !on.contains("never") && on.ends_with("after;\n"),
                "{on}"
            );
            let off = expand(source, named, &[("N", 2), ("D", 0)]).expect("expands");
            assert!(
                off.contains("staged;") && !off.contains("1.0") && off.ends_with("after;\n"),
                "{off}"
            );
        }
        // An array declared in the part left out is none in what follows.
        let dropped = "//@if 0\n//@array a 2 f32\n//@end\na@{0} = 1.0;\n";
        let e = expand(dropped, true, &[]).expect_err("a names no array");
        assert!(e.contains("names no //@array"), "{e}");
    }

    #[test]
    fn unroll_writes_its_loop_out_in_both_forms() {
        // Arrays keep their form; the indices are the written-out values either way.
        let source = "//@array o N f32\n//@unroll i < N * 2 + 1 while i < N\no@{i} = o@{i + 1};\n//@end\nafter;\n";
        let consts = [("N", 3)];
        let arrayed = expand(source, false, &consts).expect("arrayed");
        assert!(!arrayed.contains("for ("), "{arrayed}");
        assert!(
            arrayed.contains("o[0u] = o[0u + 1];") && arrayed.contains("o[2u] = o[2u + 1];"),
            "{arrayed}"
        );
        assert_eq!(arrayed.matches("{\n").count(), 3, "{arrayed}");
        let named = expand(source, true, &consts).expect_err("o_3 is past the array");
        assert!(named.contains("element 3 of 3"), "{named}");
        let named = expand(&source.replace("i + 1", "i"), true, &consts).expect("named");
        assert!(named.contains("o_2 = o_2;") && named.ends_with("after;\n"), "{named}");
        // A part an //@if leaves out may be written for other constants.
        let other = "//@array o N f32\n//@if 0\n//@unroll i < 4\no@{i} = 1.0;\n//@end\n//@end\nafter;\n";
        assert_eq!(
            expand(other, true, &consts).expect("named"),
            "var o_0: f32;\nvar o_1: f32;\nvar o_2: f32;\nafter;\n"
        );
        let e = expand("//@unroll i < 2\nx;\n", false, &consts).expect_err("no end");
        assert!(e.contains("without //@end"), "{e}");
    }

    #[test]
    fn broken_directives_are_named_by_line() {
        let consts = [("N", 2)];
        for (source, says) in [
            ("//@each c < N\nx;\n", "without //@end"),
            ("x;\n//@end\n", "line 2"),
            (
                "//@array a N f32\n//@each c < 3\na@{c} = 1.0;\n//@end\n",
                "element 2 of 2",
            ),
            ("b@{0} = 1.0;\n", "names no //@array"),
            ("//@expand NOPE\n", "undefined macro"),
            ("//@each c < M\n//@end\n", "cannot evaluate 'M'"),
            ("//@array a N * 2 f32\n", "no spaces"),
            ("//@array a (N+1)*2 f32\n", "no parentheses"),
            ("//@macro M\n//@expand M\n//@endmacro\n", "inside //@macro"),
            ("//@if N\nx;\n", "without //@end"),
            (
                "//@macro M(a)\n$a;\n//@endmacro\n//@expand M(1, 2)\n",
                "takes 1 arguments, given 2",
            ),
            (
                "//@macro M(a)\n$b;\n//@endmacro\n//@expand M(1)\n",
                "'$b' is no parameter",
            ),
            ("//@each c < N\n//@else\n//@end\n", "//@else inside //@each"),
            ("x;\n//@else\n", "line 2"),
            (
                "//@macro M(a)\n$a;\n//@endmacro\n//@expand M(x + 1u)\n",
                "not one name or number",
            ),
            (
                "//@macro M(a)\n$a;\n//@endmacro\n//@expand M(x,)\n",
                "not one name or number",
            ),
            ("//@if N\n//@elseif 0\n//@end\n", "is no directive"),
        ] {
            let e = expand(source, true, &consts).expect_err(source);
            assert!(e.contains(says), "{source:?}: {e}");
        }
    }
}
