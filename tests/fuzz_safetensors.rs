//! The `.safetensors` loader on whole layers with many tensors (issue 36 §4), drawn
//! from a seed: PyTorch packed, PyTorch separate and Hugging Face naming, with or
//! without a prefix, biases, a LayerNorm, unrelated tensors (zero-sized ones too) and
//! `__metadata__`, every tensor in its own dtype (F32, F16, BF16, F64), the header
//! listing the tensors in one order and the data holding them in another. A file as
//! drawn must load, giving exactly the tensors written; then one defect is planted
//! (overlapping, aliased or gapped offsets, a name listed twice, dtype, shape or length
//! disagreeing with the offsets, a misshaped or unsupported tensor, a missing one,
//! truncated or trailing data, head counts that do not fit) and the loader must return
//! `Err` with a message that names the problem. No GPU needed.

use proptest::prelude::*;
use std::fmt::Write as _;
use wgpu_attention::check::Rng;
use wgpu_attention::mha::{load_safetensors, LoadedMha, WeightNaming};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Dt {
    F32,
    F16,
    BF16,
    F64,
}

impl Dt {
    const ALL: [Dt; 4] = [Dt::F32, Dt::F16, Dt::BF16, Dt::F64];

    fn name(self) -> &'static str {
        match self {
            Dt::F32 => "F32",
            Dt::F16 => "F16",
            Dt::BF16 => "BF16",
            Dt::F64 => "F64",
        }
    }

    fn size(self) -> usize {
        match self {
            Dt::F16 | Dt::BF16 => 2,
            Dt::F32 => 4,
            Dt::F64 => 8,
        }
    }

    /// An unsupported dtype of the same element size.
    fn unsupported_twin(self) -> &'static str {
        match self {
            Dt::F16 => "I16",
            Dt::BF16 => "U16",
            Dt::F32 => "I32",
            Dt::F64 => "I64",
        }
    }

    /// `x` as this dtype stores it, read back as f32.
    fn round(self, x: f32) -> f32 {
        match self {
            Dt::F32 | Dt::F64 => x,
            Dt::F16 => half::f16::from_f32(x).to_f32(),
            Dt::BF16 => half::bf16::from_f32(x).to_f32(),
        }
    }

    fn encode(self, x: f32, out: &mut Vec<u8>) {
        match self {
            Dt::F32 => out.extend_from_slice(&x.to_le_bytes()),
            Dt::F16 => out.extend_from_slice(&half::f16::from_f32(x).to_le_bytes()),
            Dt::BF16 => out.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes()),
            Dt::F64 => out.extend_from_slice(&f64::from(x).to_le_bytes()),
        }
    }
}

/// One tensor as drawn: its values as its dtype stores them.
#[derive(Clone, Debug)]
struct Drawn {
    name: String,
    dt: Dt,
    shape: Vec<usize>,
    values: Vec<f32>,
    /// Part of the layer (read by the loader), or an unrelated tensor.
    layer: bool,
}

/// One header entry as written: what the header says, right or wrong.
#[derive(Clone, Debug)]
struct Entry {
    name: String,
    dtype: String,
    shape: Vec<usize>,
    offsets: (usize, usize),
}

/// A drawn layer: its tensors, the loader's arguments and what it must give back.
#[derive(Clone, Debug)]
struct Layer {
    naming: WeightNaming,
    prefix: String,
    heads: usize,
    kv_heads_arg: Option<usize>,
    kv_heads: usize,
    embed: usize,
    kdim: usize,
    vdim: usize,
    tensors: Vec<Drawn>,
    metadata: bool,
}

impl Layer {
    fn get(&self, name: &str) -> Option<&Drawn> {
        self.tensors
            .iter()
            .find(|t| t.layer && t.name == format!("{}{name}", self.prefix))
    }
}

fn draw_layer(rng: &mut Rng) -> Layer {
    let naming = [
        WeightNaming::PyTorchPacked,
        WeightNaming::PyTorchSeparate,
        WeightNaming::HuggingFace,
    ][rng.below(3)];
    let prefix = ["", "encoder.layers.0.self_attn."][rng.below(2)].to_string();
    let heads = 1 + rng.below(4);
    let head_dim = 1 + rng.below(3);
    let e = heads * head_dim;
    let divisors: Vec<usize> = (1..=heads).filter(|&g| heads.is_multiple_of(g)).collect();
    let (kv_heads, kdim, vdim) = match naming {
        WeightNaming::PyTorchPacked => (heads, e, e),
        WeightNaming::PyTorchSeparate => (heads, 1 + rng.below(5), 1 + rng.below(5)),
        WeightNaming::HuggingFace => (divisors[rng.below(divisors.len())], 1 + rng.below(5), 1 + rng.below(5)),
    };
    let kv = kv_heads * head_dim;
    let kv_heads_arg = match naming {
        WeightNaming::HuggingFace | WeightNaming::PyTorchPacked if rng.below(2) == 0 => Some(kv_heads),
        _ => None,
    };
    let bias = rng.below(3) != 0;
    let mut specs: Vec<(&str, Vec<usize>)> = match naming {
        WeightNaming::PyTorchPacked => vec![("in_proj_weight", vec![3 * e, e]), ("out_proj.weight", vec![e, e])],
        WeightNaming::PyTorchSeparate => vec![
            ("q_proj_weight", vec![e, e]),
            ("k_proj_weight", vec![e, kdim]),
            ("v_proj_weight", vec![e, vdim]),
            ("out_proj.weight", vec![e, e]),
        ],
        WeightNaming::HuggingFace => vec![
            ("q_proj.weight", vec![e, e]),
            ("k_proj.weight", vec![kv, kdim]),
            ("v_proj.weight", vec![kv, vdim]),
            ("o_proj.weight", vec![e, e]),
        ],
    };
    if bias {
        match naming {
            WeightNaming::HuggingFace => {
                // Each bias on its own: some projections with one, some without.
                for (name, n) in [
                    ("q_proj.bias", e),
                    ("k_proj.bias", kv),
                    ("v_proj.bias", kv),
                    ("o_proj.bias", e),
                ] {
                    if rng.below(4) != 0 {
                        specs.push((name, vec![n]));
                    }
                }
            }
            _ => {
                specs.push(("in_proj_bias", vec![3 * e]));
                specs.push(("out_proj.bias", vec![e]));
            }
        }
    }
    if rng.below(3) == 0 {
        specs.push(("norm.weight", vec![e]));
        specs.push(("norm.bias", vec![e]));
    }
    let mut tensors: Vec<Drawn> = specs
        .into_iter()
        .map(|(name, shape)| {
            let dt = Dt::ALL[rng.below(4)];
            let n = shape.iter().product();
            Drawn {
                name: format!("{prefix}{name}"),
                dt,
                values: rng.vec(n, -2.0, 2.0).into_iter().map(|x| dt.round(x)).collect(),
                shape,
                layer: true,
            }
        })
        .collect();
    // Unrelated tensors the loader must ignore: another layer's, zero-sized ones, and
    // (under a prefix) a layer name without it.
    for i in 0..rng.below(4) {
        let dt = Dt::ALL[rng.below(4)];
        let shape = match rng.below(3) {
            0 => vec![0, 1 + rng.below(3)],
            1 => vec![1 + rng.below(5)],
            _ => vec![1 + rng.below(3), 1 + rng.below(3), 1 + rng.below(2)],
        };
        let name = if i == 0 && !prefix.is_empty() {
            "out_proj.weight".to_string()
        } else {
            format!("decoder.layers.{i}.fc.weight")
        };
        let n = shape.iter().product();
        tensors.push(Drawn {
            name,
            dt,
            values: rng.vec(n, -2.0, 2.0).into_iter().map(|x| dt.round(x)).collect(),
            shape,
            layer: false,
        });
    }
    Layer {
        naming,
        prefix,
        heads,
        kv_heads_arg,
        kv_heads,
        embed: e,
        kdim,
        vdim,
        tensors,
        metadata: rng.below(2) == 0,
    }
}

/// A random permutation of `0..n`.
fn shuffled(rng: &mut Rng, n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.below(i + 1));
    }
    order
}

/// The header entries and data of `tensors`, their data in `data_order`.
fn lay_out(tensors: &[Drawn], data_order: &[usize]) -> (Vec<Entry>, Vec<u8>) {
    let mut entries: Vec<Option<Entry>> = vec![None; tensors.len()];
    let mut data = Vec::new();
    for &i in data_order {
        let t = &tensors[i];
        let begin = data.len();
        for &x in &t.values {
            t.dt.encode(x, &mut data);
        }
        entries[i] = Some(Entry {
            name: t.name.clone(),
            dtype: t.dt.name().to_string(),
            shape: t.shape.clone(),
            offsets: (begin, data.len()),
        });
    }
    (
        entries.into_iter().map(|e| e.expect("every tensor laid out")).collect(),
        data,
    )
}

/// A `.safetensors` file with the header listing `entries` in `header_order`.
fn file(entries: &[Entry], header_order: &[usize], data: &[u8], metadata: bool) -> Vec<u8> {
    let mut header = String::from("{");
    if metadata {
        header.push_str("\"__metadata__\":{\"format\":\"pt\"},");
    }
    for (n, &i) in header_order.iter().enumerate() {
        let e = &entries[i];
        let shape: Vec<String> = e.shape.iter().map(usize::to_string).collect();
        write!(
            header,
            "{}\"{}\":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
            if n == 0 { "" } else { "," },
            e.name,
            e.dtype,
            shape.join(","),
            e.offsets.0,
            e.offsets.1
        )
        .expect("write to a String");
    }
    header.push('}');
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

/// Checks a loaded layer against the drawn one, tensor by tensor, bit for bit.
fn assert_layer(layer: &Layer, loaded: &LoadedMha, what: &str) {
    let e = layer.embed;
    let values = |name: &str| layer.get(name).map(|t| t.values.clone());
    let third = |v: &Option<Vec<f32>>, i: usize| v.as_ref().map(|v| v[i * e..(i + 1) * e].to_vec());
    assert_eq!(loaded.naming, layer.naming, "{what}");
    let c = &loaded.config;
    assert_eq!(
        (c.embed_dim, c.num_heads, c.num_kv_heads, c.kdim, c.vdim),
        (e, layer.heads, layer.kv_heads, layer.kdim, layer.vdim),
        "{what}: config {c:?}"
    );
    let w = &loaded.weights;
    let (q, k, v, o, biases) = match layer.naming {
        WeightNaming::PyTorchPacked => {
            let packed = values("in_proj_weight").expect("drawn");
            let in_bias = values("in_proj_bias");
            (
                (packed[..e * e].to_vec(), third(&in_bias, 0)),
                (packed[e * e..2 * e * e].to_vec(), third(&in_bias, 1)),
                (packed[2 * e * e..].to_vec(), third(&in_bias, 2)),
                (values("out_proj.weight").expect("drawn"), values("out_proj.bias")),
                in_bias.is_some() || values("out_proj.bias").is_some(),
            )
        }
        WeightNaming::PyTorchSeparate => {
            let in_bias = values("in_proj_bias");
            (
                (values("q_proj_weight").expect("drawn"), third(&in_bias, 0)),
                (values("k_proj_weight").expect("drawn"), third(&in_bias, 1)),
                (values("v_proj_weight").expect("drawn"), third(&in_bias, 2)),
                (values("out_proj.weight").expect("drawn"), values("out_proj.bias")),
                in_bias.is_some() || values("out_proj.bias").is_some(),
            )
        }
        WeightNaming::HuggingFace => {
            let pair = |p: &str| {
                (
                    values(&format!("{p}.weight")).expect("drawn"),
                    values(&format!("{p}.bias")),
                )
            };
            let (q, k, v, o) = (pair("q_proj"), pair("k_proj"), pair("v_proj"), pair("o_proj"));
            let any_bias = [&q, &k, &v, &o].iter().any(|p| p.1.is_some());
            (q, k, v, o, any_bias)
        }
    };
    assert_eq!(c.bias, biases, "{what}: config.bias");
    for (label, got, want) in [("q", &w.q, q), ("k", &w.k, k), ("v", &w.v, v), ("o", &w.o, o)] {
        assert!(got.weight == want.0, "{what}: {label} weight differs");
        assert!(got.bias == want.1, "{what}: {label} bias differs");
    }
    let norm = values("norm.weight").zip(values("norm.bias"));
    assert_eq!(
        w.norm.as_ref().map(|n| (n.weight.clone(), n.bias.clone())),
        norm,
        "{what}: norm"
    );
}

/// The defects planted in a drawn file, one at a time.
const DEFECTS: [&str; 15] = [
    "overlap",
    "alias",
    "gap",
    "duplicate-appended",
    "duplicate-same-range",
    "duplicate-identical",
    "dtype-length",
    "shape-length",
    "misshaped",
    "unsupported-dtype",
    "missing",
    "truncated",
    "trailing",
    "heads",
    "kv-heads",
];

/// The loader's arguments and a file, with one defect planted, and the phrases its
/// error must hold; `None` where the drawn layer offers no place for this defect.
struct Planted {
    bytes: Vec<u8>,
    heads: usize,
    kv_heads: Option<usize>,
    expect: Vec<String>,
}

fn plant(defect: &str, layer: &Layer, rng: &mut Rng) -> Option<Planted> {
    let n = layer.tensors.len();
    let data_order = shuffled(rng, n);
    let header_order = shuffled(rng, n);
    let (mut entries, mut data) = lay_out(&layer.tensors, &data_order);
    let mut header_order = header_order;
    let (mut heads, mut kv_heads) = (layer.heads, layer.kv_heads_arg);
    let nonempty: Vec<usize> = (0..n)
        .filter(|&i| entries[i].offsets.1 > entries[i].offsets.0)
        .collect();
    let read: Vec<usize> = (0..n).filter(|&i| layer.tensors[i].layer).collect();
    let pick = |rng: &mut Rng, from: &[usize]| from[rng.below(from.len())];
    let offsets = vec!["weights file".to_string(), "offset".to_string()];
    let named = |i: usize| format!("'{}'", layer.tensors[i].name);
    let expect: Vec<String> = match defect {
        "overlap" => {
            // A tensor after another moves back into it, keeping its length.
            let later: Vec<usize> = nonempty.iter().copied().filter(|&i| entries[i].offsets.0 > 0).collect();
            if later.is_empty() {
                return None;
            }
            let i = pick(rng, &later);
            let by = 1 + rng.below(entries[i].offsets.0);
            entries[i].offsets = (entries[i].offsets.0 - by, entries[i].offsets.1 - by);
            offsets
        }
        "alias" => {
            // A second name for the bytes of another tensor of the same byte length; its
            // own bytes are gone, so the data is exactly covered twice over one range.
            let pairs: Vec<(usize, usize)> = (0..n)
                .flat_map(|a| (0..n).map(move |b| (a, b)))
                .filter(|&(a, b)| {
                    a != b
                        && nonempty.contains(&a)
                        && entries[a].offsets.1 - entries[a].offsets.0 == entries[b].offsets.1 - entries[b].offsets.0
                })
                .collect();
            let (a, b) = pick_pair(rng, &pairs)?;
            let (begin, end) = entries[b].offsets;
            data.drain(begin..end);
            for e in entries.iter_mut() {
                if e.offsets.0 >= end {
                    e.offsets = (e.offsets.0 - (end - begin), e.offsets.1 - (end - begin));
                }
            }
            entries[b].offsets = entries[a].offsets;
            entries[b].dtype = entries[a].dtype.clone();
            entries[b].shape = entries[a].shape.clone();
            offsets
        }
        "gap" => {
            // Bytes no tensor claims, between two tensors (or after the last, where the
            // tensor picked is zero-sized at the data's end: then the file is "not fully
            // covered").
            let later: Vec<usize> = (0..n).filter(|&i| entries[i].offsets.0 > 0).collect();
            if later.is_empty() {
                return None;
            }
            let i = pick(rng, &later);
            let at = entries[i].offsets.0;
            let by = 1 + rng.below(8);
            data.splice(at..at, std::iter::repeat_n(0x41, by));
            for e in entries.iter_mut() {
                if e.offsets.0 >= at && e.offsets.1 > at {
                    e.offsets = (e.offsets.0 + by, e.offsets.1 + by);
                }
            }
            vec!["weights file".to_string(), "offset|not fully covered".to_string()]
        }
        "duplicate-appended" | "duplicate-same-range" | "duplicate-identical" => {
            let i = pick(rng, &read);
            let mut twin = entries[i].clone();
            match defect {
                "duplicate-appended" => {
                    // Another copy of the name with its own data at the end.
                    let t = &layer.tensors[i];
                    let begin = data.len();
                    for x in &t.values {
                        t.dt.encode(-x, &mut data);
                    }
                    twin.offsets = (begin, data.len());
                    // The first entry's range is then a gap to the crate; the error
                    // may say so instead, as long as it is an error.
                }
                "duplicate-same-range" => {
                    // The same bytes read as another dtype of another size: F32 [n] as
                    // F16 [2n], or the reverse where the count is even.
                    let t = &layer.tensors[i];
                    let count: usize = t.shape.iter().product();
                    let (dtype, shape) = match t.dt {
                        Dt::F32 => ("F16", vec![2 * count]),
                        Dt::F64 => ("F32", vec![2 * count]),
                        Dt::F16 | Dt::BF16 if count.is_multiple_of(2) => ("F32", vec![count / 2]),
                        Dt::F16 => ("BF16", vec![count]),
                        Dt::BF16 => ("F16", vec![count]),
                    };
                    twin.dtype = dtype.to_string();
                    twin.shape = shape;
                }
                _ => {}
            }
            entries.push(twin);
            header_order.insert(rng.below(header_order.len() + 1), n);
            if defect == "duplicate-appended" {
                // An error, whatever it names (the crate sees a gap where the first
                // entry's bytes were, or the twin).
                vec!["weights file".into()]
            } else {
                vec!["twice".into(), named(i)]
            }
        }
        "dtype-length" => {
            let i = pick(rng, &nonempty);
            let now = layer.tensors[i].dt;
            let others: Vec<Dt> = Dt::ALL.into_iter().filter(|d| d.size() != now.size()).collect();
            let other = others[rng.below(others.len())];
            entries[i].dtype = other.name().to_string();
            vec!["weights file".into(), "invalid shape, data type, or offset".into()]
        }
        "shape-length" => {
            let i = pick(rng, &nonempty);
            entries[i].shape[0] += 1 + rng.below(3);
            vec!["weights file".into(), "invalid shape, data type, or offset".into()]
        }
        "misshaped" => {
            // The same elements in another shape: a leading 1, or a matrix flattened.
            // Only tensors whose shape the embed dim fixes (k and v weights may
            // legitimately come in other widths).
            let fixed: Vec<usize> = read
                .iter()
                .copied()
                .filter(|&i| {
                    let name = &layer.tensors[i].name[layer.prefix.len()..];
                    !matches!(
                        name,
                        "k_proj.weight" | "v_proj.weight" | "k_proj_weight" | "v_proj_weight"
                    )
                })
                .collect();
            let i = pick(rng, &fixed);
            let shape = &mut entries[i].shape;
            *shape = if shape.len() == 2 && rng.below(2) == 0 {
                vec![shape[0] * shape[1]]
            } else {
                std::iter::once(1).chain(shape.iter().copied()).collect()
            };
            vec!["shape mismatch".into(), named(i)]
        }
        "unsupported-dtype" => {
            let i = pick(rng, &read);
            entries[i].dtype = layer.tensors[i].dt.unsupported_twin().to_string();
            vec!["unsupported dtype".into(), named(i)]
        }
        "missing" => {
            let required: Vec<usize> = read
                .iter()
                .copied()
                .filter(|&i| {
                    let name = &layer.tensors[i].name[layer.prefix.len()..];
                    matches!(
                        name,
                        "out_proj.weight"
                            | "k_proj_weight"
                            | "v_proj_weight"
                            | "k_proj.weight"
                            | "v_proj.weight"
                            | "o_proj.weight"
                            | "norm.bias"
                    )
                })
                .collect();
            let i = pick(rng, &required);
            let (begin, end) = entries[i].offsets;
            data.drain(begin..end);
            for e in entries.iter_mut() {
                if e.offsets.0 >= end {
                    e.offsets = (e.offsets.0 - (end - begin), e.offsets.1 - (end - begin));
                }
            }
            header_order.retain(|&j| j != i);
            vec!["missing from the file".into(), named(i)]
        }
        "truncated" => {
            if data.is_empty() {
                return None;
            }
            let by = 1 + rng.below(data.len());
            data.truncate(data.len() - by);
            vec!["weights file".into(), "incomplete metadata".into()]
        }
        "trailing" => {
            data.extend(std::iter::repeat_n(0x3c, 1 + rng.below(8)));
            vec!["weights file".into(), "incomplete metadata".into()]
        }
        "heads" => {
            // A head count that does not divide the embed dim.
            heads = layer.embed + 1 + rng.below(3);
            if kv_heads.is_some() {
                kv_heads = Some(heads);
            }
            vec!["multiple of".into()]
        }
        "kv-heads" => match layer.naming {
            WeightNaming::HuggingFace => {
                kv_heads = Some(layer.kv_heads + 1);
                vec!["k_proj.weight".into()]
            }
            _ => {
                kv_heads = Some(layer.heads + 1);
                vec!["num_kv_heads".into(), "as many key/value heads".into()]
            }
        },
        other => panic!("unknown defect {other}"),
    };
    Some(Planted {
        bytes: file(&entries, &header_order, &data, layer.metadata),
        heads,
        kv_heads,
        expect,
    })
}

fn pick_pair(rng: &mut Rng, pairs: &[(usize, usize)]) -> Option<(usize, usize)> {
    (!pairs.is_empty()).then(|| pairs[rng.below(pairs.len())])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Each drawn file loads to exactly what was written; with one defect planted it is
    /// an error that names the problem. `seed` reproduces the case
    /// (`check_one(seed, defect)`).
    #[test]
    fn layers_load_exactly_and_planted_defects_are_named(seed in any::<u64>(), defect in 0..DEFECTS.len()) {
        check_one(seed, DEFECTS[defect]);
    }
}

/// The property for one seed and defect.
fn check_one(seed: u64, defect: &str) {
    let mut rng = Rng::new(seed);
    let layer = draw_layer(&mut rng);
    let what = format!("seed {seed}, {:?} prefix {:?}", layer.naming, layer.prefix);
    // As drawn: the tensors in a random order in the header and another in the data.
    let n = layer.tensors.len();
    let (data_order, header_order) = (shuffled(&mut rng, n), shuffled(&mut rng, n));
    let (entries, data) = lay_out(&layer.tensors, &data_order);
    let bytes = file(&entries, &header_order, &data, layer.metadata);
    let loaded = load_safetensors(&bytes, layer.heads, layer.kv_heads_arg, &layer.prefix)
        .unwrap_or_else(|e| panic!("{what}: a consistent file was refused: {e}\n{layer:?}"));
    assert_layer(&layer, &loaded, &what);
    let Some(planted) = plant(defect, &layer, &mut rng) else {
        return;
    };
    match load_safetensors(&planted.bytes, planted.heads, planted.kv_heads, &layer.prefix) {
        Ok(loaded) => panic!(
            "{what}: defect {defect} was accepted as {:?}\nheader: {}",
            loaded.config,
            header_text(&planted.bytes)
        ),
        Err(e) => {
            let message = e.to_string();
            // A phrase may name alternatives, `a|b`: either says the reason.
            for phrase in &planted.expect {
                assert!(
                    phrase.split('|').any(|p| message.contains(p)),
                    "{what}: defect {defect}: the error does not say {phrase:?}: {message}\nheader: {}",
                    header_text(&planted.bytes)
                );
            }
        }
    }
}

fn header_text(bytes: &[u8]) -> String {
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    String::from_utf8_lossy(&bytes[8..(8 + n).min(bytes.len())]).into_owned()
}

#[test]
fn every_defect_is_planted_in_some_drawn_layer() {
    // The property above returns early where a layer offers no place for a defect;
    // each must still be tried: over these seeds every defect is planted at least 10 times.
    for defect in DEFECTS {
        let planted = (0..200u64)
            .filter(|&seed| {
                let mut rng = Rng::new(seed);
                let layer = draw_layer(&mut rng);
                let n = layer.tensors.len();
                let _ = (shuffled(&mut rng, n), shuffled(&mut rng, n));
                plant(defect, &layer, &mut rng).is_some()
            })
            .count();
        assert!(planted >= 10, "{defect} planted in only {planted} of 200 layers");
    }
    for seed in 0..40u64 {
        for defect in DEFECTS {
            check_one(seed, defect);
        }
    }
}

#[test]
fn a_name_listed_twice_is_refused_however_it_is_spelt() {
    // `"a"` and `"\u0061"` are one JSON name; the crate keeps one of the two entries.
    let header = r#"{"norm.weight":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"norm.\u0077eight":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&1.5f32.to_le_bytes());
    let e = load_safetensors(&bytes, 1, None, "").expect_err("a duplicate name");
    assert!(e.to_string().contains("'norm.weight' twice"), "{e}");
    // Names that only look alike are two names: the file is then refused for another
    // reason (no layer in it), not as a duplicate.
    let header = r#"{"a\\u0062":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"ab":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&1.5f32.to_le_bytes());
    let e = load_safetensors(&bytes, 1, None, "").expect_err("no layer");
    assert!(e.to_string().contains("found none of"), "{e}");
}
