//! wgpu-attention as an ES module (docs/design.md, "The web"): a context on the
//! browser's WebGPU adapter, attention on `Float32Array`s, and the `check` grid one
//! case at a time for the check page. Every call that waits returns a `Promise`; bad
//! input rejects it with the library's one-line error, and a Rust panic is logged to
//! the console before the module traps.

use std::rc::Rc;
use wasm_bindgen::prelude::*;
use wgpu_attention::check::{describe, run_case_async, standard_grid, variants, CheckCase, Variant, DEFAULT_SEED};
use wgpu_attention::{
    sdpa_async, AttentionOptions, AttentionShape, CausalAlignment, Context, KernelChoice, Layout, Tensor,
};

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
            .filter(|v| ctx.fused_config_for(v.tiling, v.dtype, v.precision).is_ok())
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

    /// `softmax(Q Kᵀ / sqrt(D) [+ causal]) V` on BHSD f32 data. `shape` is
    /// `[B, Hq, Hkv, Lq, Lk, D, Dv]`; `causal` is `"top-left"`, `"bottom-right"` or
    /// absent; `kernel` is `"auto"` (or absent), `"fused"`, `"materialized"` or
    /// `"decode"`. Resolves to the output, `[B, Hq, Lq, Dv]`.
    pub fn attention(
        &self,
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        shape: Vec<u32>,
        causal: Option<String>,
        kernel: Option<String>,
    ) -> js_sys::Promise {
        let ctx = self.ctx.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let out = attention(&ctx, &q, &k, &v, &shape, causal.as_deref(), kernel.as_deref())
                .await
                .map_err(js_error)?;
            Ok(js_sys::Float32Array::from(&out[..]).into())
        })
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
            let row = match run_case_async(&ctx, &case).await {
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

async fn attention(
    ctx: &Context,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: &[u32],
    causal: Option<&str>,
    kernel: Option<&str>,
) -> wgpu_attention::Result<Vec<f32>> {
    let invalid = |what: &str, why: &str| wgpu_attention::Error::Invalid {
        what: what.into(),
        reason: why.into(),
    };
    let &[b, hq, hkv, lq, lk, d, dv] = shape else {
        return Err(invalid("shape", "must be [B, Hq, Hkv, Lq, Lk, D, Dv]"));
    };
    let [b, hq, hkv, lq, lk, d, dv] = [b, hq, hkv, lq, lk, d, dv].map(|x| x as usize);
    let s = AttentionShape::new(b, hq, hkv, lq, lk, d, dv);
    let causal = match causal {
        None => None,
        Some("top-left") => Some(CausalAlignment::TopLeft),
        Some("bottom-right") => Some(CausalAlignment::BottomRight),
        Some(_) => return Err(invalid("causal", "must be \"top-left\", \"bottom-right\" or absent")),
    };
    let kernel = match kernel {
        None | Some("auto") => KernelChoice::Auto,
        Some("fused") => KernelChoice::Fused,
        Some("materialized") => KernelChoice::Materialized,
        Some("decode") => KernelChoice::Decode,
        Some(_) => return Err(invalid("kernel", "must be auto, fused, materialized or decode")),
    };
    let qt = Tensor::from_f32_async(ctx, [s.batch, s.heads_q, s.len_q, s.head_dim], Layout::Bhsd, q).await?;
    let kt = Tensor::from_f32_async(ctx, [s.batch, s.heads_kv, s.len_k, s.head_dim], Layout::Bhsd, k).await?;
    let vt = Tensor::from_f32_async(ctx, [s.batch, s.heads_kv, s.len_k, s.head_dim_v], Layout::Bhsd, v).await?;
    let options = AttentionOptions {
        causal,
        kernel,
        ..Default::default()
    };
    let out = sdpa_async(ctx, &qt, &kt, &vt, &options).await?;
    out.out.to_f32_vec_async(ctx).await
}
