//! The integration tests as one binary (wgpu's own `tests/tests/wgpu-gpu/main.rs` is the
//! model): one link of wgpu instead of one per file, and one shared `Context`
//! (`common::ctx`), so a pipeline compiles once per run, not once per file. Each file
//! stays a module named after it (`cargo test --release --test it -- gpu_masks::`).
//!
//! Apart, as binaries of their own: `env_tiling` and `tune` (they set environment
//! variables every context reads) and `soak` (its memory bound needs a process of its
//! own).

#[path = "../common/mod.rs"]
mod common;

#[path = "../api_forgiving.rs"]
mod api_forgiving;
#[path = "../async_api.rs"]
mod async_api;
#[path = "../averaged_weights.rs"]
mod averaged_weights;
#[path = "../cli.rs"]
mod cli;
#[path = "../cli_backward.rs"]
mod cli_backward;
#[path = "../cli_bench_viz.rs"]
mod cli_bench_viz;
#[path = "../cli_hostile.rs"]
mod cli_hostile;
#[path = "../cli_mha.rs"]
mod cli_mha;
#[path = "../cli_quiet.rs"]
mod cli_quiet;
#[path = "../determinism.rs"]
mod determinism;
#[path = "../driver_loop_cap.rs"]
mod driver_loop_cap;
#[path = "../encode_errors.rs"]
mod encode_errors;
#[path = "../errors.rs"]
mod errors;
#[path = "../fuzz_inputs.rs"]
mod fuzz_inputs;
#[path = "../fuzz_safetensors.rs"]
mod fuzz_safetensors;
#[path = "../gpu_backward.rs"]
mod gpu_backward;
#[path = "../gpu_coop_emulated.rs"]
mod gpu_coop_emulated;
#[path = "../gpu_coop_patterns.rs"]
mod gpu_coop_patterns;
#[path = "../gpu_decode.rs"]
mod gpu_decode;
#[path = "../gpu_grid.rs"]
mod gpu_grid;
#[path = "../gpu_key_splits.rs"]
mod gpu_key_splits;
#[path = "../gpu_linear.rs"]
mod gpu_linear;
#[path = "../gpu_masks.rs"]
mod gpu_masks;
#[path = "../gpu_mha_backward.rs"]
mod gpu_mha_backward;
#[path = "../gpu_micro.rs"]
mod gpu_micro;
#[path = "../gpu_special.rs"]
mod gpu_special;
#[path = "../hostile_library.rs"]
mod hostile_library;
#[path = "../kv_cache.rs"]
mod kv_cache;
#[path = "../kv_int8.rs"]
mod kv_int8;
#[path = "../kv_texels.rs"]
mod kv_texels;
#[path = "../library_edges.rs"]
mod library_edges;
#[path = "../lowered_limits.rs"]
mod lowered_limits;
#[path = "../merge_attentions.rs"]
mod merge_attentions;
#[path = "../mha.rs"]
mod mha;
#[path = "../mha_torch.rs"]
mod mha_torch;
#[path = "../mha_weights.rs"]
mod mha_weights;
#[path = "../nonfinite_backward.rs"]
mod nonfinite_backward;
#[path = "../nonfinite_paths.rs"]
mod nonfinite_paths;
#[path = "../paged_kv.rs"]
mod paged_kv;
#[path = "../proptest_shapes.rs"]
mod proptest_shapes;
#[path = "../readback.rs"]
mod readback;
#[path = "../reference.rs"]
mod reference;
#[path = "../rotary.rs"]
mod rotary;
#[path = "../shader_validation.rs"]
mod shader_validation;
#[path = "../sharded.rs"]
mod sharded;
#[path = "../tensor_api.rs"]
mod tensor_api;
#[path = "../threads.rs"]
mod threads;
