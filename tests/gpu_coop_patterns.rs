//! Each way the tensor-core kernels use cooperative matrices, alone, against the CPU:
//! named or arrayed accumulators, an array updated through a pointer, operand arrays,
//! column-major loads, reloading accumulators, operands from storage
//! (`coop_patterns.wgsl`). On a GPU with tensor cores this says which pattern a
//! driver gets wrong when a kernel fails; elsewhere it runs the same module through
//! the emulation (`kernels::coop_emulation`), which must agree with the GPU.

use crate::common;
use half::f16;
use wgpu_attention::check::Rng;
use wgpu_attention::kernels::coop_emulation;
use wgpu_attention::{Context, Layout, Tensor};

const M: usize = 16;
const K: usize = 64;
const N: usize = 64;

/// What an entry point leaves in `out`.
#[derive(Clone, Copy)]
enum Expect {
    /// This many times A·B.
    Product(f64),
    /// softmax(Q·Kᵀ / 8)·V for Q = A, K = B's rows 0-15, V = B's rows 16-31, with the
    /// probabilities rounded to f16 as the kernel stages them.
    Attention,
}

const PATTERNS: [(&str, Expect); 9] = [
    ("named", Expect::Product(1.0)),
    ("accumulator_array", Expect::Product(1.0)),
    ("accumulator_array_by_pointer", Expect::Product(1.0)),
    ("operand_array_and_column_major", Expect::Product(1.0)),
    ("accumulator_reload", Expect::Product(2.0)),
    ("from_storage", Expect::Product(1.0)),
    ("attention_one_band", Expect::Attention),
    ("arrays_across_a_runtime_loop", Expect::Product(4.0)),
    ("accumulators_at_runtime_indices", Expect::Product(1.0)),
];

/// softmax(Q·Kᵀ / 8)·V as [`Expect::Attention`] describes it, in f64.
fn one_band_attention(a: &[f32], b: &[f32]) -> Vec<f64> {
    let mut out = vec![0.0; M * N];
    for i in 0..M {
        let scores: Vec<f64> = (0..16)
            .map(|j| {
                (0..K)
                    .map(|d| f64::from(a[i * K + d]) * f64::from(b[j * N + d]))
                    .sum::<f64>()
                    / 8.0
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = scores
            .iter()
            .map(|s| f64::from(f16::from_f64(((s - max) as f32).exp().into()).to_f32()))
            .collect();
        let sum: f64 = p.iter().sum();
        for d in 0..N {
            out[i * N + d] = (0..16).map(|j| p[j] * f64::from(b[(16 + j) * N + d])).sum::<f64>() / sum;
        }
    }
    out
}

/// The context and the subgroup size the module runs with: real cooperative matrices
/// where the adapter has them, else emulated ones.
fn context() -> Option<(Context, u32)> {
    let ctx = common::own_ctx()?;
    if let Some(sg) = ctx.capabilities().coop_subgroup_size() {
        return Some((ctx, sg));
    }
    let ctx = common::emulating_ctx()?;
    let sg = ctx
        .capabilities()
        .coop_subgroup_size()
        .expect("emulation sets a subgroup size");
    Some((ctx, sg))
}

fn source(ctx: &Context, sg: u32) -> String {
    let text = include_str!("coop_patterns.wgsl");
    let (directives, body): (Vec<&str>, Vec<&str>) = text.lines().partition(|line| line.starts_with("enable "));
    let source = format!("{}\nconst SG: u32 = {sg}u;\n{}", directives.join("\n"), body.join("\n"));
    if ctx.capabilities().coop_emulated {
        coop_emulation::rewrite(&source, sg).expect("the emulation rewrites the patterns")
    } else {
        source
    }
}

#[test]
fn every_cooperative_matrix_pattern_the_kernels_use_agrees_with_the_cpu() {
    let Some((ctx, sg)) = context() else { return };
    let seed = 20261126;
    let mut rng = Rng::new(seed);
    // f16-exact inputs, so the products are exact and only f32 summation rounds.
    let mut draw = |n: usize| -> Vec<f32> { (0..n).map(|_| f16::from_f32(rng.uniform(-1.0, 1.0)).to_f32()).collect() };
    let a = draw(M * K);
    let b = draw(K * N);
    let product: Vec<f64> = (0..M * N)
        .map(|x| {
            (0..K)
                .map(|k| f64::from(a[(x / N) * K + k]) * f64::from(b[k * N + x % N]))
                .sum()
        })
        .collect();
    let attention = one_band_attention(&a, &b);
    let upload = |rows: usize, cols: usize, data: &[f32]| {
        Tensor::from_f32(&ctx, [1, 1, rows, cols], Layout::Bhsd, data).expect("upload")
    };
    let halves = |rows: usize, cols: usize, data: &[f32]| {
        let h: Vec<f16> = data.iter().map(|&x| f16::from_f32(x)).collect();
        Tensor::from_f16(&ctx, [1, 1, rows, cols], Layout::Bhsd, &h).expect("upload")
    };
    let (ta, tb, ta16, tb16) = (upload(M, K, &a), upload(K, N, &b), halves(M, K, &a), halves(K, N, &b));

    let module = ctx.device().create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("coop_patterns.wgsl"),
        source: wgpu::ShaderSource::Wgsl(source(&ctx, sg).into()),
    });
    let mut report = Vec::new();
    let mut wrong = Vec::new();
    for (entry, expect) in PATTERNS {
        let out = upload(M, N, &vec![f32::NAN; M * N]);
        let pipeline = ctx.device().create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(entry),
            layout: None,
            module: &module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        });
        let bindings: Vec<(u32, &Tensor)> = if entry == "from_storage" {
            vec![(2, &out), (3, &ta16), (4, &tb16)]
        } else {
            vec![(0, &ta), (1, &tb), (2, &out)]
        };
        let entries: Vec<wgpu::BindGroupEntry> = bindings
            .iter()
            .map(|&(binding, t)| wgpu::BindGroupEntry {
                binding,
                resource: t.buffer().as_entire_binding(),
            })
            .collect();
        let group = ctx.device().create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(entry),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let mut encoder = ctx.device().create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &group, &[]);
            pass.dispatch_workgroups(1, 1, 1);
        }
        ctx.queue().submit([encoder.finish()]);
        let got = out.to_f32_vec(&ctx).expect("readback");
        let expected: Vec<f64> = match expect {
            Expect::Product(times) => product.iter().map(|e| times * e).collect(),
            Expect::Attention => attention.clone(),
        };
        let err = got
            .iter()
            .zip(&expected)
            .map(|(&g, &e)| (f64::from(g) - e).abs())
            .fold(0.0, |m: f64, d| if d.is_nan() { f64::INFINITY } else { m.max(d) });
        // Exact products of values in [-1, 1], 64·t per sum for t times A·B, in f32: a
        // sum's rounding stays below t² · 64 · 2^-24 · 64 < t² · 1e-3; the attention's f32 exp may round a
        // probability to the neighbouring f16 (2^-11 of it, of an output below 1); a
        // wrong layout errs by O(1).
        let times = match expect {
            Expect::Product(t) => t,
            Expect::Attention => 1.0,
        };
        let ok = err <= 1e-3 * times * times;
        report.push(format!(
            "{entry:<32} max |err| {err:.2e} {}",
            if ok { "ok" } else { "WRONG" }
        ));
        if !ok {
            wrong.push(entry);
        }
    }
    eprintln!(
        "cooperative-matrix patterns on {} ({}, {sg} lanes):\n{}",
        ctx.adapter_info().name,
        if ctx.capabilities().coop_emulated {
            "emulated"
        } else {
            "tensor cores"
        },
        report.join("\n")
    );
    assert!(
        wrong.is_empty(),
        "seed {seed}: wrong results from {wrong:?}\n{}",
        report.join("\n")
    );
}
