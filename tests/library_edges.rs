//! The library's edges a hostile review found (issue 36 §3): a device shared by several
//! contexts and its loss, GPU errors that escape every error scope on one thread of
//! many, buffer sizes within 16 bytes of 2^64, `info`'s adapter filters, and the
//! wording of a full KV cache.

use crate::common;
use std::sync::mpsc;
use wgpu_attention::wgpu;
use wgpu_attention::{Context, DType, Error, KvCache, Layout, PagedKvCache, Tensor};
use wgpu_attention::{KvCacheConfig, PagedKvConfig};

fn upload(ctx: &Context) -> wgpu_attention::Result<Tensor> {
    Tensor::from_f32(ctx, [1, 1, 2, 4], Layout::Bhsd, &[0.5; 8])
}

/// Lets wgpu run the device-lost callback of a destroyed device.
fn poll(ctx: &Context) {
    let _ = ctx.device().poll(wgpu::PollType::Poll);
}

#[test]
fn every_context_on_a_device_sees_its_loss_and_the_callers_hooks_run() {
    let Some(first) = common::own_ctx() else { return };
    // A context of another wgpu instance on the same adapter: wgpu numbers its device
    // like `first`'s, yet it is another device, which must not be taken for lost.
    let Some(other) = common::own_ctx() else { return };
    let second = Context::from_wgpu(
        first.adapter_info().clone(),
        first.device().clone(),
        first.queue().clone(),
    );
    let (tx, hooked) = mpsc::channel();
    second.on_device_lost(move |reason, _| tx.send(reason).expect("the test waits"));
    assert!(!first.is_lost() && !second.is_lost());

    first.device().destroy();
    poll(&first);
    assert!(first.is_lost(), "the first context missed the loss");
    assert!(second.is_lost(), "the second context missed the loss");
    assert_eq!(hooked.try_recv(), Ok(wgpu::DeviceLostReason::Destroyed));
    assert!(hooked.try_recv().is_err(), "the hook ran twice");
    let err = upload(&second).expect_err("an upload to a lost device");
    assert!(err.to_string().contains("device was lost"), "{err}");

    // A hook registered after the loss runs at once.
    let (tx, late) = mpsc::channel();
    first.on_device_lost(move |reason, _| tx.send(reason).expect("the test waits"));
    assert_eq!(late.try_recv(), Ok(wgpu::DeviceLostReason::Destroyed));

    // A context made on the dead device is lost from the start.
    let third = Context::from_wgpu(
        first.adapter_info().clone(),
        first.device().clone(),
        first.queue().clone(),
    );
    assert!(third.is_lost(), "a context on a dead device took it for alive");

    assert!(!other.is_lost(), "another device was taken for the lost one");
    upload(&other).expect("another device still works");
}

#[test]
fn a_callback_the_caller_sets_afterwards_can_chain_to_the_contexts() {
    let Some(ctx) = common::own_ctx() else { return };
    let ours = ctx.device_lost_callback();
    let (tx, called) = mpsc::channel();
    ctx.device().set_device_lost_callback(move |reason, message| {
        tx.send(()).expect("the test waits");
        ours(reason, message);
    });
    ctx.device().destroy();
    poll(&ctx);
    assert_eq!(called.try_recv(), Ok(()), "the caller's callback did not run");
    assert!(ctx.is_lost(), "the chained callback did not reach the context");
}

#[test]
fn an_escaped_error_goes_to_the_thread_that_raised_it() {
    let Some(ctx) = common::own_ctx() else { return };
    let (raised_tx, raised) = mpsc::channel();
    let (checked_tx, checked) = mpsc::channel();
    let ctx = &ctx;
    std::thread::scope(|s| {
        let submitter = s.spawn(move || {
            // Outside every error scope: a buffer without usages is invalid.
            drop(ctx.device().create_buffer(&wgpu::BufferDescriptor {
                label: Some("invalid on purpose"),
                size: 16,
                usage: wgpu::BufferUsages::empty(),
                mapped_at_creation: false,
            }));
            raised_tx.send(()).expect("the main thread waits");
            checked.recv().expect("the main thread answers");
            let err = upload(ctx).expect_err("this thread's escaped error");
            assert!(
                matches!(&err, Error::Gpu { during, .. }
                    if during.contains("on this thread") && during.contains("outside an error scope")),
                "{err}"
            );
            upload(ctx).expect("reported once");
        });
        raised.recv().expect("the submitter raised its error");
        let here = upload(ctx);
        // Answered before anything here may fail, so the submitter never waits forever.
        checked_tx.send(()).expect("the submitter waits");
        let submitter = submitter.join();
        here.expect("another thread's escaped error is not this call's");
        submitter.expect("the submitter's checks");
    });
}

#[test]
fn a_buffer_within_16_bytes_of_2_to_the_64_is_refused() {
    let Some(ctx) = common::ctx() else { return };
    let before = ctx.allocated_bytes();
    // 2^64 - 4 bytes: the element count fits, rounding up to 16 bytes would wrap to 0.
    for (shape, dtype) in [
        ([(1 << 62) - 1, 1, 1, 1], DType::F32),
        ([1, 1, 2, (1 << 62) - 1], DType::F16),
        ([1, 1, 1, usize::MAX / 4], DType::F32),
    ] {
        let result = Tensor::empty(ctx, shape, Layout::Bhsd, dtype);
        assert!(
            matches!(
                &result,
                Err(Error::LimitExceeded {
                    limit: "max_buffer_size",
                    ..
                })
            ),
            "{shape:?} {dtype:?}: {:?}",
            result.map(|t| t.buffer().size())
        );
    }
    assert_eq!(ctx.allocated_bytes(), before, "a refused buffer was counted");
}

#[test]
fn a_full_kv_cache_names_its_capacity_not_a_device_limit() {
    let Some(ctx) = common::ctx() else { return };
    let rows = |n: usize| upload_rows(ctx, n);
    let mut cache = KvCache::new(
        ctx,
        KvCacheConfig {
            batch: 1,
            heads_kv: 1,
            capacity: 24,
            head_dim: 4,
            head_dim_v: 4,
            layout: Layout::Bhsd,
            dtype: DType::F32,
        },
    )
    .expect("cache");
    cache.append(ctx, &rows(24), &rows(24)).expect("fits");
    let err = cache.append(ctx, &rows(1), &rows(1)).expect_err("full");
    let message = err.to_string();
    assert!(
        matches!(
            err,
            Error::CapacityExceeded {
                requested: 25,
                max: 24,
                ..
            }
        ),
        "{message}"
    );
    assert!(
        message.contains("needs 25 rows but the cache's capacity is 24 rows"),
        "{message}"
    );
    assert!(!message.contains("device"), "{message}");

    let mut pool = PagedKvCache::new(
        ctx,
        PagedKvConfig {
            pages: 2,
            page_size: 4,
            heads_kv: 1,
            head_dim: 4,
            head_dim_v: 4,
            layout: Layout::Bhsd,
            dtype: DType::F32,
        },
    )
    .expect("pool");
    let id = pool.add_sequence();
    let err = pool.append(ctx, &[id], &rows(9), &rows(9)).expect_err("3 pages of 2");
    let message = err.to_string();
    assert!(
        matches!(
            err,
            Error::CapacityExceeded {
                requested: 3,
                max: 2,
                ..
            }
        ),
        "{message}"
    );
    assert!(
        message.contains("needs 3 pages but the pool's free space is 2 pages"),
        "{message}"
    );
    assert!(!message.contains("device"), "{message}");
}

/// `n` rows `[1, 1, n, 4]` for a cache of one sequence and one head.
fn upload_rows(ctx: &Context, n: usize) -> Tensor {
    Tensor::from_f32(ctx, [1, 1, n, 4], Layout::Bhsd, &vec![0.25; n * 4]).expect("upload")
}

/// `info` with `args` and this environment (`WGPU_BACKEND`, `WGPU_ADAPTER_NAME`; `None`
/// removes the variable): exit code, stdout, stderr.
fn info(args: &[&str], backend: Option<&str>, name: Option<&str>) -> (Option<i32>, String, String) {
    let mut cmd = common::cli::bin();
    cmd.arg("info").args(args);
    for (var, value) in [("WGPU_BACKEND", backend), ("WGPU_ADAPTER_NAME", name)] {
        match value {
            Some(v) => cmd.env(var, v),
            None => cmd.env_remove(var),
        };
    }
    let out = cmd.output().expect("run wgpu-attention info");
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    (out.status.code(), text(out.stdout), text(out.stderr))
}

/// The (name, backend) of each adapter `info --json` lists.
fn listed(stdout: &str) -> Vec<(String, String)> {
    let adapters: serde_json::Value = serde_json::from_str(stdout).expect("info --json prints JSON");
    let field = |a: &serde_json::Value, key: &str| a[key].as_str().expect("a string").to_string();
    adapters
        .as_array()
        .expect("a list")
        .iter()
        .map(|a| (field(a, "name"), field(a, "backend")))
        .collect()
}

#[test]
fn info_lists_only_the_backend_and_name_asked_for() {
    let (code, stdout, stderr) = info(&["--json"], None, None);
    assert_eq!(code, Some(0), "{stderr}");
    let every = listed(&stdout);
    let vulkan = |list: &[(String, String)]| list.iter().filter(|(_, b)| b == "Vulkan").count();
    if vulkan(&every) == 0 || vulkan(&every) == every.len() {
        common::skip_or_fail(&format!(
            "needs a Vulkan adapter and one on another backend (lavapipe and llvmpipe GL); found {every:?}"
        ));
        return;
    }
    // WGPU_BACKEND, --backend, and --backend over WGPU_BACKEND.
    for (env, flag) in [
        (Some("vulkan"), None),
        (None, Some("vulkan")),
        (Some("gl"), Some("vulkan")),
    ] {
        let mut args = vec!["--json"];
        args.extend(flag.iter().flat_map(|&f| ["--backend", f]));
        let (code, stdout, stderr) = info(&args, env, None);
        assert_eq!(code, Some(0), "WGPU_BACKEND={env:?} --backend {flag:?}: {stderr}");
        let got = listed(&stdout);
        assert!(
            got.len() == vulkan(&every) && vulkan(&got) == got.len(),
            "WGPU_BACKEND={env:?} --backend {flag:?} listed {got:?}"
        );
    }
    // WGPU_ADAPTER_NAME and --adapter filter by name (case-insensitive substring).
    let name = every[0].0.to_uppercase();
    for (args, env) in [
        (&["--json", "--adapter", &name][..], None),
        (&["--json"][..], Some(name.as_str())),
    ] {
        let (code, stdout, stderr) = info(args, None, env);
        assert_eq!(code, Some(0), "{stderr}");
        let got = listed(&stdout);
        assert!(
            !got.is_empty() && got.iter().all(|(n, _)| n.to_uppercase().contains(&name)),
            "{args:?} WGPU_ADAPTER_NAME={env:?} listed {got:?}"
        );
    }
    // A filter that matches nothing is bad input: one line that names it, exit 2.
    for (args, env) in [(&["--adapter", "nosuch"][..], None), (&["--json"][..], Some("nosuch"))] {
        let (code, stdout, stderr) = info(args, None, env);
        assert_eq!(code, Some(2), "{args:?} WGPU_ADAPTER_NAME={env:?}: {stdout}{stderr}");
        assert!(stdout.is_empty(), "{stdout}");
        // Drivers may print lines of their own (lavapipe's conformance warning).
        let ours: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("error: ") && !l.contains("XDG_RUNTIME_DIR"))
            .collect();
        assert_eq!(ours.len(), 1, "{stderr}");
        assert!(
            ours[0].starts_with("error: no GPU adapter matches name containing 'nosuch'; adapters found: "),
            "{stderr}"
        );
        assert!(ours[0].contains(&every[0].0), "the adapters there are: {stderr}");
    }
}

#[test]
fn info_numbers_adapters_keeps_to_120_columns_and_the_backend_prefix_picks() {
    // Issue 56: lines of 407 characters; two adapters of one name that --adapter could
    // not tell apart.
    let (code, stdout, stderr) = info(&[], None, None);
    assert_eq!(code, Some(0), "{stderr}");
    for line in stdout.lines() {
        assert!(line.chars().count() <= 120, "{} chars: {line}", line.chars().count());
    }
    let (_, json, _) = info(&["--json"], None, None);
    let every = listed(&json);
    for (i, (name, _)) in every.iter().enumerate() {
        assert!(stdout.contains(&format!("#{i} {name} [")), "#{i} {name}: {stdout}");
    }
    // `BACKEND:NAME` picks on that backend only; `#N` the Nth listed. (A bare `N` is a
    // name where one holds it: "0" is in "LLVM 15.0.6", as "4090" is in an RTX 4090.)
    for (i, (name, backend)) in every.iter().enumerate() {
        let prefixed = format!("{}:{}", backend.to_lowercase(), name);
        let index = format!("#{i}");
        for args in [
            vec!["--json", "--adapter", prefixed.as_str()],
            vec!["--json", "--adapter", index.as_str()],
        ] {
            let (code, out, err) = info(&args, None, None);
            assert_eq!(code, Some(0), "{args:?}: {err}");
            let got = listed(&out);
            assert!(got.iter().all(|(_, b)| b == backend), "{args:?}: {got:?}");
            assert!(got.iter().any(|(n, _)| n == name), "{args:?}: {got:?}");
        }
    }
    let (code, _, err) = info(&["--adapter", "#99"], None, None);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("adapter #99"), "{err}");
}
