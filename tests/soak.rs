//! Long-running use (issue 13 §3): 10 000 attention calls of varying shapes, masks and
//! paths on one `Context` leave device memory and process memory flat after warm-up,
//! and a case repeated at the end gives the same bits as at the start.
//!
//! Device memory is the live bytes of wgpu's Vulkan/DX12 allocator
//! (`generate_allocator_report`; other backends report none and only RSS is bounded).
//! On a CPU adapter (lavapipe, llvmpipe) device memory is process memory too, so the
//! RSS bound covers it there.

mod common;
use common::paged::{PagedInputs, D};
use wgpu_attention::check::{alibi_slopes, random_bool_mask, Rng};
use wgpu_attention::{
    sdpa, sdpa_paged, AttentionOptions, CausalAlignment, Context, DType, KernelChoice, Layout, Tensor, Window,
};

const CALLS: usize = 10_000;
const WARM_UP: usize = 1_000;
/// Growth allowed after warm-up: allocator slack and the pipeline cache are built by
/// then, so anything per call that is never freed passes these within a few thousand
/// calls (the smallest call allocates ~1 KiB of buffers).
const DEVICE_SLACK: u64 = 1 << 20;
const RSS_SLACK: u64 = 32 << 20;

/// Resident set size in bytes (Linux; `None` elsewhere).
fn rss() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn device_bytes(ctx: &Context) -> Option<u64> {
    ctx.wait_idle().expect("device idle");
    ctx.device()
        .generate_allocator_report()
        .map(|r| r.total_allocated_bytes)
}

struct Case {
    q: Tensor,
    options: AttentionOptions,
}

#[test]
fn ten_thousand_calls_keep_memory_flat_and_results_stable() {
    let Some(ctx) = common::ctx() else { return };
    let mut rng = Rng::new(131);
    let dtype = if ctx.capabilities().f16 { DType::F16 } else { DType::F32 };
    // Shared keys: 3 sequences of 7 pages of 5 rows (Lk = 35), paged and gathered.
    let paged = PagedInputs::new(ctx, dtype, &mut rng, (3, 7, 24));
    let (batch, heads_q, lk) = (3, 4, 35);
    let mut q_of = |lq: usize| {
        let q = common::rounded(dtype, rng.vec(batch * heads_q * lq * D, -1.0, 1.0));
        Tensor::from_f32_as(ctx, [batch, heads_q, lq, D], Layout::Bhsd, dtype, &q).expect("upload")
    };
    let cases = [
        Case {
            q: q_of(9),
            options: AttentionOptions {
                causal: Some(CausalAlignment::BottomRight),
                ..Default::default()
            },
        },
        Case {
            q: q_of(4),
            options: AttentionOptions {
                kernel: KernelChoice::Materialized,
                key_lengths: Some(vec![35, 12, 1]),
                need_weights: true,
                ..Default::default()
            },
        },
        Case {
            q: q_of(1),
            options: AttentionOptions {
                kernel: KernelChoice::Decode,
                window: Some(Window {
                    left: Some(10),
                    right: Some(0),
                }),
                alibi_slopes: Some(alibi_slopes(heads_q)),
                ..Default::default()
            },
        },
        Case {
            q: q_of(6),
            options: AttentionOptions {
                mask: Some(random_bool_mask(&mut Rng::new(132), [batch, 1, 6, lk])),
                softcap: Some(4.0),
                need_lse: true,
                output_layout: Some(Layout::Bshd),
                ..Default::default()
            },
        },
    ];
    // Even calls go through the block table, odd ones over the gathered keys.
    let call = |n: usize| {
        let case = &cases[(n / 2) % cases.len()];
        let out = if n.is_multiple_of(2) {
            sdpa_paged(
                ctx,
                &case.q,
                &paged.k_pages,
                &paged.v_pages,
                &paged.table,
                &case.options,
            )
        } else {
            sdpa(ctx, &case.q, &paged.k, &paged.v, &case.options)
        };
        out.unwrap_or_else(|e| panic!("call {n}: {e}"))
    };
    let first = call(0).out.to_f32_vec(ctx).expect("read back");
    let mut baseline = None;
    for n in 1..CALLS {
        let out = call(n);
        // Reading back now and then keeps the queue from running far ahead.
        if n.is_multiple_of(64) {
            out.out.to_f32_vec(ctx).expect("read back");
        }
        drop(out);
        if n == WARM_UP {
            baseline = Some((device_bytes(ctx), rss()));
        }
    }
    let last = call(cases.len() * 2).out.to_f32_vec(ctx).expect("read back");
    assert!(
        first.iter().zip(&last).all(|(a, b)| a.to_bits() == b.to_bits()) && first.len() == last.len(),
        "the same call gave different bits after {CALLS} calls"
    );
    let (device_before, rss_before) = baseline.expect("warm-up done");
    let (device_after, rss_after) = (device_bytes(ctx), rss());
    eprintln!("device bytes {device_before:?} -> {device_after:?}; RSS {rss_before:?} -> {rss_after:?}");
    if let (Some(before), Some(after)) = (device_before, device_after) {
        assert!(
            after <= before + DEVICE_SLACK,
            "device memory grew from {before} to {after} bytes over {} calls",
            CALLS - WARM_UP
        );
    }
    if let (Some(before), Some(after)) = (rss_before, rss_after) {
        assert!(
            after <= before + RSS_SLACK,
            "RSS grew from {before} to {after} bytes over {} calls",
            CALLS - WARM_UP
        );
    }
}
