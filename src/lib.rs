//! # wgpu-attention
//!
//! Multi-head scaled dot-product attention, `softmax(Q Kᵀ · scale + mask) V`, as
//! hand-written WGSL compute kernels dispatched through wgpu: the same kernels run on
//! Vulkan, Metal, DX12 and GL adapters and on Mesa's software rasterisers.
//!
//! ```no_run
//! use wgpu_attention::{sdpa, AttentionOptions, CausalAlignment, Context, Layout, Tensor};
//! # fn main() -> Result<(), wgpu_attention::Error> {
//! let ctx = Context::new()?;
//! let (b, h, l, d) = (1, 2, 5, 8);
//! let data: Vec<f32> = (0..b * h * l * d).map(|i| (i as f32 * 0.37).sin()).collect();
//! let q = Tensor::from_f32(&ctx, [b, h, l, d], Layout::Bhsd, &data)?;
//! let k = Tensor::from_f32(&ctx, [b, h, l, d], Layout::Bhsd, &data)?;
//! let v = Tensor::from_f32(&ctx, [b, h, l, d], Layout::Bhsd, &data)?;
//! let options = AttentionOptions { causal: Some(CausalAlignment::TopLeft), ..Default::default() };
//! let out = sdpa(&ctx, &q, &k, &v, &options)?;
//! let values: Vec<f32> = out.out.to_f32_vec(&ctx)?; // [B, H, L, D], BHSD
//! # Ok(()) }
//! ```
//!
//! What is here:
//!
//! - [`sdpa`] (and [`encode_sdpa`], [`sdpa_paged`]): attention with every mask (causal
//!   both alignments, key lengths, bool and additive masks, sliding windows, ALiBi, soft
//!   capping), GQA/MQA, f32 and f16, BHSD and BSHD layouts, optional weights and
//!   log-sum-exp; options in [`AttentionOptions`].
//! - [`KvCache`] and [`PagedKvCache`]: keys and values kept on the device for generating
//!   tokens, read by split-K decode.
//! - [`MultiHeadAttention`]: PyTorch's `nn.MultiheadAttention` (with GQA and a post-norm),
//!   its weights from safetensors files ([`load_safetensors`]).
//! - [`sdpa_backward`] (and [`encode_sdpa_backward`]): the gradients dQ, dK, dV of every
//!   mask, FlashAttention-2's two passes; [`MultiHeadAttention::backward`] for the layer.
//! - [`merge_attentions`]: partial attentions over blocks of keys merged exactly by
//!   their log-sum-exp; [`sdpa_sharded`] runs the blocks on several contexts (devices).
//! - [`apply_rotary`] and [`Rotary`]: rotary position embeddings, also inside
//!   [`KvCache`] and [`MhaConfig`] (LLaMA-style layers).
//! - [`mod@tune`]: tuning tables, the tensor-core variant measured fastest per GPU.
//! - [`mod@reference`]: the CPU reference every GPU path is tested against, in f64.
//! - `heatmap` (feature `viz`): attention-weight heatmaps as PNG.
//!
//! Measured speed on GPUs and CPU adapters, with adapter, driver, date and command:
//! `docs/benchmarks.md`.
//!
//! Features: `cli` (default: the `wgpu-attention` command line's dependencies) and
//! `viz` (default through `cli`). With `default-features = false` the library compiles
//! for `wasm32-unknown-unknown` too.
//!
//! Every function that waits on the GPU has an async form, the one implementation
//! ([`Context::new_async`], [`Tensor::from_f32_async`], [`Tensor::from_f16_async`],
//! [`sdpa_async`], [`sdpa_read_async`], [`Tensor::to_f32_vec_async`],
//! [`MultiHeadAttention::forward_async`], [`crate::Gpu::finished_async`]); the blocking forms
//! run it with `pollster` and exist on native targets only (on the web only the async
//! forms wait).
//!
//! The semantics (masks, alignment, fully masked rows), the conventions that differ
//! from PyTorch, examples and the command line are in the repository's `README.md`
//! (also this crate's page on a registry) and its `docs/` (`design.md`, `kernels.md`,
//! `cli.md`, `benchmarks.md`), which `cargo package` ships. In a
//! debug build, set `[profile.dev.package.naga] opt-level = 3`: unoptimised, naga
//! compiles the kernels' WGSL about 10x slower.

#![warn(missing_docs)]

// The public surface is the root's re-exports below, plus the `mha`, `reference` and
// `heatmap` modules. The `doc(hidden)` modules are public only for this crate's own
// CLI, web module, tests and benches.
mod attention;
mod backward;
// Timing uses std::time::Instant and blocking waits: native targets only, for now.
#[cfg(not(target_arch = "wasm32"))]
#[doc(hidden)]
pub mod bench;
#[doc(hidden)]
pub mod bench_cases;
#[doc(hidden)]
pub mod check;
mod context;
mod error;
mod gpu;
#[cfg(feature = "viz")]
pub mod heatmap;
// What a GPU compiler makes of each kernel (`isa`): plain Vulkan and naga's SPIR-V
// writer, native only.
#[cfg(all(feature = "isa", not(target_arch = "wasm32")))]
#[doc(hidden)]
pub mod isa;
#[doc(hidden)]
pub mod kernels;
mod kv_cache;
pub mod merge;
pub mod mha;
mod options;
mod paged_kv;
mod problem;
mod quantized_kv;
pub mod reference;
#[cfg(feature = "json")]
pub mod report;
pub mod rotary;
#[doc(hidden)]
pub mod sentence_example;
#[cfg(not(target_arch = "wasm32"))]
mod sharded;
mod staging;
mod tensor;
mod wait;

#[cfg(not(target_arch = "wasm32"))]
pub use attention::sdpa_read;
pub use attention::{
    encode_sdpa, encode_sdpa_paged, resolve_kernel, sdpa, sdpa_async, sdpa_paged, sdpa_read_async, AttentionOutput,
    ResolvedKernel,
};
pub use backward::{
    backward_tiling, encode_sdpa_backward, sdpa_backward, sdpa_backward_async, BackwardTiling, Gradients,
};
/// The `rows` backward's kernels by head-dim class, for the tests that run a GPU's on
/// a CPU adapter.
#[doc(hidden)]
pub use backward::{rows_for, PassKernels, ROWS_128, ROWS_128_WG, ROWS_256, ROWS_256_WG, ROWS_32, ROWS_64, ROWS_64_WG};
#[cfg(not(target_arch = "wasm32"))]
pub use context::{enumerate_adapters, quiet_headless_vulkan};
pub use context::{enumerate_adapters_async, AdapterSelector, Capabilities, Context, CoopConfig, Gpu, Policy};
pub use context::{COOP_BACKWARD_VAR, COOP_GEMM_VAR, KEY_SPLITS_VAR, MAX_KEY_SPLITS, SUBGROUPS_VAR};
#[doc(hidden)]
pub use error::checked_product;
pub use error::{Error, Result};
#[doc(hidden)]
pub use gpu::MAX_INDEXED_BINDING;
pub use gpu::{RuntimeChecks, RUNTIME_CHECKS_VAR};
pub use kernels::tune;
pub use kv_cache::{KvCache, KvCacheConfig};
pub use merge::{encode_merge_attentions, merge_attentions, merge_attentions_async, Merged};
pub use mha::{
    load_safetensors, HeadWeights, Inputs, LoadedMha, MhaConfig, MhaOptions, MhaOutput, MhaWeights, MultiHeadAttention,
    PostNorm,
};
pub use options::{
    key_lengths_from_tokens, key_mask_from_tokens, AttentionOptions, CausalAlignment, FusedTiling, KernelChoice, Mask,
    MaskValues, Precision, Window,
};
pub use paged_kv::{PageTable, PagedKvCache, PagedKvConfig, SequenceId};
pub use problem::{AttentionShape, MAX_HEAD_DIM};
pub use quantized_kv::{
    encode_sdpa_quantized, reads_codes, sdpa_quantized, QuantizedKv, QuantizedKvCache, QuantizedRows,
};
pub use rotary::{apply_rotary, encode_apply_rotary, Rotary, RotaryStyle};
#[cfg(not(target_arch = "wasm32"))]
pub use sharded::{sdpa_sharded, KeyShard};
pub use tensor::{relayout, DType, Layout, Tensor};
// One Context serves many threads (docs/design.md): this stops compiling if it no
// longer can. Not on wasm32, where wgpu's WebGPU objects belong to the browser's one
// thread and are not Send.
#[cfg(not(target_arch = "wasm32"))]
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<Context>();
};

/// Re-exported so callers use the same wgpu major version as this crate.
pub use wgpu;

// The README's Rust snippets compile as doctests, so they cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeSnippets;
