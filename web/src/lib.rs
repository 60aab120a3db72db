//! wgpu-attention as an ES module (docs/design.md, "The web"): a context on the
//! browser's WebGPU adapter; `attention` on typed arrays (f32, or f16 bit patterns where
//! the adapter has f16); `mha` with weights from a `.safetensors` buffer; the `check`
//! grid one case at a time for the check page; the bench suites' problems for the bench
//! page; and seed 003's sentence example for the demo page. Every call that waits
//! returns a `Promise`; bad input rejects it with the library's one-line error, and a
//! Rust panic is logged to the console before the module traps.

mod calls;
mod request;

use calls::Output;
use js_sys::{Float32Array, Object, Reflect, Uint16Array, Uint8ClampedArray};
use request::{Data, Request};
use std::rc::Rc;
use wasm_bindgen::prelude::*;
use wgpu_attention::bench_cases::{bench_data, Suite};
use wgpu_attention::check::{describe, standard_grid, variants, CheckCase, Variant, DEFAULT_SEED};
use wgpu_attention::heatmap::{render_grid, Labels, Panel};
use wgpu_attention::sentence_example::{PaddedSentences, OUT_BOUND, WEIGHTS_BOUND};
use wgpu_attention::{resolve_kernel, sdpa_async, AttentionOptions, AttentionShape, Context, DType, Layout, Tensor};

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn console_error(message: &str);
}

#[wasm_bindgen(start)]
fn start() {
    std::panic::set_hook(Box::new(|info| {
        console_error(&format!("wgpu-attention panicked: {info}"))
    }));
}

fn js_error(e: impl std::fmt::Display) -> JsValue {
    JsError::new(&e.to_string()).into()
}

/// A context on the browser's WebGPU adapter.
#[wasm_bindgen]
pub struct AttentionContext {
    ctx: Rc<Context>,
    grid: Rc<Vec<(Variant, CheckCase)>>,
}

#[wasm_bindgen]
impl AttentionContext {
    /// Requests the adapter and device; resolves to a context.
    pub async fn create() -> Result<AttentionContext, JsValue> {
        let ctx = Context::new_async().await.map_err(js_error)?;
        let grid = variants(ctx.capabilities().f16)
            .into_iter()
            .filter(|v| v.unmet(&ctx).is_none())
            .flat_map(|v| standard_grid(DEFAULT_SEED).into_iter().map(move |c| (v.clone(), c)))
            .collect();
        Ok(AttentionContext {
            ctx: Rc::new(ctx),
            grid: Rc::new(grid),
        })
    }

    /// The adapter, its enabled features and the limits the kernels use, as JSON.
    pub fn info(&self) -> String {
        let info = self.ctx.adapter_info();
        let caps = self.ctx.capabilities();
        serde_json::json!({
            "name": info.name,
            "backend": format!("{:?}", info.backend),
            "device_type": format!("{:?}", info.device_type),
            "driver": info.driver,
            "driver_info": info.driver_info,
            "f16": caps.f16,
            "subgroups": caps.subgroups,
            "timestamps": caps.timestamps,
            "max_workgroup_storage": caps.max_workgroup_storage,
            "max_storage_binding": caps.max_storage_binding,
            "max_invocations": caps.max_invocations,
        })
        .to_string()
    }

    /// `softmax(Q Kᵀ / sqrt(D) + masks) V` on BHSD data: `{q, k, v, shape: [B, Hq,
    /// Hkv, Lq, Lk, D, Dv], causal: "top-left" | "bottom-right", keyLengths, mask,
    /// maskShape, scale, kernel: "auto" | "fused" | "materialized" | "decode", tiling,
    /// returnWeights, averageWeights}`. `q`, `k`, `v` are `Float32Array`s, or `Uint16Array`s of f16 bit
    /// patterns (adapters with `shader-f16`). Resolves to `{output, shape, weights,
    /// weightsShape}`: the output `[B, Hq, Lq, Dv]` in the inputs' type, and f32
    /// weights `[B, Hq, Lq, Lk]` when `returnWeights` is true (`[B, 1, Lq, Lk]`, their
    /// mean over heads, with `averageWeights`).
    pub fn attention(&self, request: JsValue) -> js_sys::Promise {
        let ctx = self.ctx.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let output = calls::attention(&ctx, Request::new(request).map_err(js_error)?)
                .await
                .map_err(js_error)?;
            to_js(output)
        })
    }

    /// One multi-head attention layer with weights from a `.safetensors` file:
    /// `{safetensors, numHeads, numKvHeads, prefix, postNorm, normEps, query, key, value,
    /// shape: [B, Lq, Lk], causal, keyLengths, mask, maskShape, tokens, padId, dtype,
    /// returnWeights: "averaged" | "per-head"}` (names as PyTorch's
    /// `nn.MultiheadAttention` or Hugging Face's `q_proj`/.../`o_proj`; sequences
    /// batch-first `Float32Array`s). Resolves to `{output, shape, weights, weightsShape}`.
    pub fn mha(&self, request: JsValue) -> js_sys::Promise {
        let ctx = self.ctx.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let output = calls::mha(&ctx, Request::new(request).map_err(js_error)?)
                .await
                .map_err(js_error)?;
            to_js(output)
        })
    }

    /// The problems of a bench suite (`"quick"`, `"standard"`, `"long"`) this adapter
    /// can run, as JSON: `[{shape: [B, Hq, Hkv, Lq, Lk, D, Dv], causal, dtype}]`.
    #[wasm_bindgen(js_name = benchCases)]
    pub fn bench_cases(&self, suite: &str) -> Result<String, JsValue> {
        let suite = Suite::parse(suite).ok_or_else(|| js_error("suite must be quick, standard or long"))?;
        let cases: Vec<_> = suite
            .cases(self.ctx.capabilities().f16)
            .iter()
            .map(|c| {
                let s = c.shape;
                serde_json::json!({
                    "shape": [s.batch, s.heads_q, s.heads_kv, s.len_q, s.len_k, s.head_dim, s.head_dim_v],
                    "causal": c.causal,
                    "dtype": c.dtype.name(),
                })
            })
            .collect();
        Ok(serde_json::Value::from(cases).to_string())
    }

    /// Uploads a benchmark problem `{shape, causal, dtype, kernel, tiling}` (inputs as the
    /// native `bench` draws them; causal is top-left); resolves to a [`BenchProblem`]
    /// whose `run()` the page times.
    #[wasm_bindgen(js_name = benchProblem)]
    pub fn bench_problem(&self, request: JsValue) -> js_sys::Promise {
        let ctx = self.ctx.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let problem = BenchProblem::new(ctx, Request::new(request).map_err(js_error)?)
                .await
                .map_err(js_error)?;
            Ok(problem.into())
        })
    }

    /// Seed 003's padded sentences through a multi-head attention layer, on this
    /// adapter and the CPU reference (`wgpu_attention::sentence_example`). Resolves to
    /// `{sentences, heads, seq, dModel, outError, weightsError, bounds, padWeight,
    /// passed, images}`: each image `{width, height, rgba}` is one sentence's per-head
    /// weights drawn as the native `demo` draws them.
    #[wasm_bindgen(js_name = sentenceExample)]
    pub fn sentence_example(&self) -> js_sys::Promise {
        let ctx = self.ctx.clone();
        wasm_bindgen_futures::future_to_promise(async move { sentence_example(&ctx).await.map_err(js_error) })
    }

    /// How many cases the check page runs: each kernel variant this adapter supports
    /// over the `check` grid.
    #[wasm_bindgen(js_name = checkCount)]
    pub fn check_count(&self) -> usize {
        self.grid.len()
    }

    /// Runs check case `index` against the CPU reference; resolves to JSON with the
    /// variant, the case, the error and bound, and `status` (`ok`, `failed`, `error`).
    #[wasm_bindgen(js_name = runCheck)]
    pub fn run_check(&self, index: usize) -> js_sys::Promise {
        let (ctx, grid) = (self.ctx.clone(), self.grid.clone());
        wasm_bindgen_futures::future_to_promise(async move {
            let (variant, case) = grid
                .get(index)
                .ok_or_else(|| js_error(format!("no check case {index}")))?;
            let case = variant.apply(case);
            let row = match variant.run_async(&ctx, &case).await {
                Ok(o) => serde_json::json!({
                    "variant": variant.label, "case": describe(&case), "seed": case.seed,
                    "max_abs_error": o.out.max_abs, "bound": o.bound,
                    "status": if o.passed { "ok" } else { "failed" },
                    "detail": if o.passed { String::new() } else { o.summary() },
                }),
                Err(e) => serde_json::json!({
                    "variant": variant.label, "case": describe(&case), "seed": case.seed,
                    "status": "error", "detail": e.to_string(),
                }),
            };
            Ok(JsValue::from_str(&row.to_string()))
        })
    }
}

/// `{output, shape, weights, weightsShape}` for JavaScript.
fn to_js(output: Output) -> Result<JsValue, JsValue> {
    let object = Object::new();
    let out: JsValue = match output.out {
        Data::F32(v) => Float32Array::from(&v[..]).into(),
        Data::F16(v) => Uint16Array::from(&v[..]).into(),
    };
    set(&object, "output", &out)?;
    set(&object, "shape", &shape_js(&output.out_shape))?;
    if let Some((weights, shape)) = output.weights {
        set(&object, "weights", &Float32Array::from(&weights[..]).into())?;
        set(&object, "weightsShape", &shape_js(&shape))?;
    }
    Ok(object.into())
}

fn shape_js(shape: &[usize]) -> JsValue {
    shape
        .iter()
        .map(|&n| JsValue::from(n as f64))
        .collect::<js_sys::Array>()
        .into()
}

fn set(object: &Object, key: &str, value: &JsValue) -> Result<(), JsValue> {
    Reflect::set(object, &JsValue::from_str(key), value).map(|_| ())
}

/// A benchmark problem on the GPU: inputs uploaded once, `run()` timed by the page.
#[wasm_bindgen]
pub struct BenchProblem {
    ctx: Rc<Context>,
    inputs: Rc<[Tensor; 3]>,
    options: AttentionOptions,
    flops: f64,
    bytes: f64,
    kernel: String,
}

impl BenchProblem {
    async fn new(ctx: Rc<Context>, request: Request) -> wgpu_attention::Result<Self> {
        let dims = request.counts_exact("shape", f64::from(u32::MAX), "[B, Hq, Hkv, Lq, Lk, D, Dv]")?;
        let shape = bench_shape(dims, ctx.capabilities().max_buffer)?;
        let AttentionShape {
            batch: b,
            heads_q: hq,
            heads_kv: hkv,
            len_q: lq,
            len_k: lk,
            head_dim: d,
            head_dim_v: dv,
        } = shape;
        let dtype = match request.string("dtype")?.as_deref() {
            None | Some("f32") => DType::F32,
            Some("f16") => DType::F16,
            Some(other) => {
                return Err(wgpu_attention::Error::invalid(
                    "dtype",
                    format!("must be f32 or f16; got \"{other}\""),
                ))
            }
        };
        let case = wgpu_attention::bench_cases::BenchCase {
            shape,
            causal: request.flag("causal")?,
            window: None,
            dtype,
            precision: Default::default(),
        };
        let options = AttentionOptions {
            tiling: request.tiling()?,
            ..case.options(request.kernel()?)
        };
        let kernel = resolve_kernel(&ctx, dtype, &options, &shape)?.name();
        let [q, k, v] = bench_data(&shape);
        let upload = |h: usize, l: usize, d: usize, data: Vec<f32>| {
            let ctx = ctx.clone();
            async move { Tensor::from_f32_as_async(&ctx, [b, h, l, d], Layout::Bhsd, dtype, &data).await }
        };
        let inputs = [
            upload(hq, lq, d, q).await?,
            upload(hkv, lk, d, k).await?,
            upload(hkv, lk, dv, v).await?,
        ];
        Ok(BenchProblem {
            inputs: Rc::new(inputs),
            flops: case.flops(),
            bytes: compulsory_bytes(&shape, dtype),
            ctx,
            options,
            kernel,
        })
    }
}

/// A bench problem's shape `[B, Hq, Hkv, Lq, Lk, D, Dv]`, refused (before any input is
/// drawn or any size multiplied in `usize`, 32 bits here) unless the library's shape
/// checks pass (no zero sizes, whole GQA groups, head dims, element counts that fit)
/// and every tensor, the output included, fits the adapter's largest buffer (a shape
/// past it would exhaust the module's memory first).
fn bench_shape(dims: [usize; 7], max_buffer: u64) -> wgpu_attention::Result<AttentionShape> {
    let [b, hq, hkv, lq, lk, d, dv] = dims;
    let shape = AttentionShape::from_qkv([b, hq, lq, d], [b, hkv, lk, d], [b, hkv, lk, dv])?;
    let max_elements = max_buffer / 4;
    for (name, h, l, width) in [
        ("q", hq, lq, d),
        ("k", hkv, lk, d),
        ("v", hkv, lk, dv),
        ("the output", hq, lq, dv),
    ] {
        let elements = [b, h, l, width].iter().try_fold(1u64, |n, &x| n.checked_mul(x as u64));
        if elements.is_none_or(|n| n > max_elements) {
            return Err(wgpu_attention::Error::invalid(
                "shape",
                format!("{name} would exceed this adapter's largest buffer ({max_elements} f32 values)"),
            ));
        }
    }
    Ok(shape)
}

/// Bytes one call must move (Q, K, V read and O written once), as the native `bench`
/// counts them (`BenchCase::compulsory_bytes`), but in f64: its `usize` products can
/// wrap on wasm32.
fn compulsory_bytes(s: &AttentionShape, dtype: DType) -> f64 {
    let rows = s.batch as f64 * (s.heads_q as f64 * s.len_q as f64 + s.heads_kv as f64 * s.len_k as f64);
    rows * (s.head_dim + s.head_dim_v) as f64 * dtype.size() as f64
}

#[wasm_bindgen]
impl BenchProblem {
    /// FLOPs of one call (halved for causal, as the native `bench` counts them).
    pub fn flops(&self) -> f64 {
        self.flops
    }

    /// Bytes one call must move: Q, K, V read and O written once.
    pub fn bytes(&self) -> f64 {
        self.bytes
    }

    /// The kernel path and tiling the picker chose, as the native `bench` names it.
    pub fn kernel(&self) -> String {
        self.kernel.clone()
    }

    /// One call: records and submits the attention, resolves when the GPU has
    /// finished it.
    pub fn run(&self) -> js_sys::Promise {
        let (ctx, inputs, options) = (self.ctx.clone(), self.inputs.clone(), self.options.clone());
        wasm_bindgen_futures::future_to_promise(async move {
            let [q, k, v] = &*inputs;
            sdpa_async(&ctx, q, k, v, &options).await.map_err(js_error)?;
            ctx.finished_async().await.map_err(js_error)?;
            Ok(JsValue::UNDEFINED)
        })
    }
}

/// A JavaScript exception while building a result object (not expected: the objects
/// are fresh and plain).
fn js_failure(e: JsValue) -> wgpu_attention::Error {
    wgpu_attention::Error::invalid("building the result object", format!("{e:?}"))
}

async fn sentence_example(ctx: &Context) -> wgpu_attention::Result<JsValue> {
    let example = PaddedSentences::new()?;
    let result = example.run_async(ctx).await?;
    let (heads, seq) = (example.heads, example.seq);
    let images = js_sys::Array::new();
    for b in 0..example.batch {
        let panels: Vec<Panel> = (0..heads)
            .map(|h| Panel {
                title: format!("sentence {}, head {}", b + 1, h + 1),
                weights: &result.weights[(b * heads + h) * seq * seq..][..seq * seq],
                len_q: seq,
                len_k: seq,
            })
            .collect();
        let labels = Labels {
            queries: Some(example.words(b)),
            keys: Some(example.words(b)),
        };
        let (canvas, _) = render_grid(&panels, &labels)?;
        let rgba: Vec<u8> = canvas.pixels.chunks(3).flat_map(|p| [p[0], p[1], p[2], 255]).collect();
        let image = Object::new();
        set(&image, "width", &canvas.width.into()).map_err(js_failure)?;
        set(&image, "height", &canvas.height.into()).map_err(js_failure)?;
        set(&image, "rgba", &Uint8ClampedArray::from(&rgba[..]).into()).map_err(js_failure)?;
        images.push(&image);
    }
    let summary = serde_json::json!({
        "sentences": (0..example.batch).map(|b| example.words(b)).collect::<Vec<_>>(),
        "heads": heads,
        "seq": seq,
        "dModel": example.d_model,
        "outError": result.out_error,
        "weightsError": result.weights_error,
        "bounds": {"output": OUT_BOUND, "weights": WEIGHTS_BOUND},
        "padWeight": result.pad_weight,
        "passed": result.passed(),
    });
    let object: Object = js_sys::JSON::parse(&summary.to_string()).map_err(js_failure)?.into();
    set(&object, "images", &images.into()).map_err(js_failure)?;
    set(&object, "weights", &Float32Array::from(&result.weights[..]).into()).map_err(js_failure)?;
    Ok(object.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_shapes_are_checked_before_anything_uses_them() {
        let max_buffer = 1 << 28;
        // The shapes `bench --shape` was found dividing by zero with, and a group that
        // does not divide: each refused by the library's own checks.
        for dims in [
            [1, 1, 0, 1, 1, 4, 4],
            [1, 0, 1, 1, 1, 4, 4],
            [1, 3, 2, 4, 4, 8, 8],
            [1, 1, 1, 1, 1, 257, 8],
        ] {
            assert!(bench_shape(dims, max_buffer).is_err(), "{dims:?}");
        }
        // The output past the largest buffer while q, k and v fit.
        let err = bench_shape([1, 1, 1, 1 << 20, 1, 1, 256], max_buffer).expect_err("the output is 2^28 values");
        assert!(err.to_string().contains("the output"), "{err}");
        // Sizes whose product would wrap a 32-bit usize (and exceed any buffer).
        let big = (1 << 31) - 1;
        assert!(bench_shape([big, big, big, big, big, 256, 256], u64::MAX).is_err());
        let shape = bench_shape([2, 8, 2, 64, 96, 32, 16], max_buffer).expect("a valid shape");
        assert_eq!(shape, AttentionShape::new(2, 8, 2, 64, 96, 32, 16));
        assert_eq!(
            compulsory_bytes(&shape, DType::F32),
            (2 * 4 * (8 * 64 + 2 * 96) * 48) as f64
        );
    }
}
