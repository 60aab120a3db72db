//! The library's own guards under hostile input (issue 36), without a GPU: the CPU
//! reference validates what it is given, ALiBi slopes that would overflow are refused,
//! and heatmaps stay bounded whatever their labels and panel count.

use wgpu_attention::check::Rng;
use wgpu_attention::heatmap::{render_grid, render_panel, Labels, Panel, MAX_GRID_PANELS, MAX_LABEL_CHARS};
use wgpu_attention::{reference, AttentionOptions, AttentionShape, Error};

#[test]
fn the_reference_refuses_shapes_it_would_divide_by_or_index_past() {
    let mut rng = Rng::new(36);
    let data = rng.vec(64, -1.0, 1.0);
    // Zero key/value heads, and query heads that are no multiple of them.
    for shape in [
        AttentionShape::new(1, 1, 0, 1, 1, 4, 4),
        AttentionShape::new(1, 1, 2, 1, 1, 4, 4),
        AttentionShape::new(1, 1, 1, 1, 1, 0, 4),
    ] {
        let got = reference::attention(&data[..4], &data[..4], &data[..4], &shape, &AttentionOptions::default());
        assert!(
            matches!(got, Err(Error::Unsupported { .. } | Error::Shape { .. })),
            "{shape:?}: {got:?}"
        );
    }
    // Slices shorter (or longer) than the shape says.
    let shape = AttentionShape::new(1, 2, 1, 3, 4, 4, 4);
    let (q, kv) = (&data[..24], &data[..16]);
    assert!(reference::attention(q, kv, kv, &shape, &AttentionOptions::default()).is_ok());
    for (q, k, v, name) in [
        (&data[..23], kv, kv, "q"),
        (q, &data[..15], kv, "k"),
        (q, kv, &data[..17], "v"),
    ] {
        let err = reference::attention(q, k, v, &shape, &AttentionOptions::default()).expect_err(name);
        assert!(err.to_string().contains(&format!("length of {name}")), "{err}");
    }
}

#[test]
fn alibi_slopes_whose_bias_would_overflow_are_refused() {
    let shape = AttentionShape::new(1, 2, 2, 3, 5, 4, 4);
    let with = |slopes: Vec<f32>| AttentionOptions {
        alibi_slopes: Some(slopes),
        ..Default::default()
    };
    assert!(shape.check_options(&with(vec![0.5, -0.25])).is_ok());
    // 2e29 · (3 + 5) passes 1e30; 1e29 · 8 does not.
    assert!(shape.check_options(&with(vec![0.5, -1e29])).is_ok());
    let err = shape.check_options(&with(vec![0.5, -2e29])).expect_err("2e29");
    assert!(err.to_string().contains("entry 1"), "{err}");
    assert!(shape.check_options(&with(vec![-1e38, 0.5])).is_err());
    // The reference refuses them too, instead of returning NaN.
    let mut rng = Rng::new(1);
    let (q, kv) = (rng.vec(24, -1.0, 1.0), rng.vec(40, -1.0, 1.0));
    assert!(reference::attention(&q, &kv, &kv, &shape, &with(vec![-1e38, 0.5])).is_err());
}

#[test]
fn heatmaps_stay_bounded_whatever_the_labels_and_panel_count() {
    let mut rng = Rng::new(8);
    let weights = rng.vec(12, 0.0, 1.0);
    let long: Vec<String> = (0..4).map(|i| format!("{i}{}", "w".repeat(100_000))).collect();
    let labels = Labels {
        queries: Some(long[..3].to_vec()),
        keys: Some(long.clone()),
    };
    let panel = Panel {
        title: "t".repeat(100_000),
        weights: &weights,
        len_q: 3,
        len_k: 4,
    };
    let (canvas, _) = render_panel(&panel, &labels).expect("drawn");
    // Labels of MAX_LABEL_CHARS 6-pixel characters, a 480-pixel grid at most, margins.
    let bound = 2 * (MAX_LABEL_CHARS as u32 * 6 + 480) + 600;
    assert!(
        canvas.width < bound && canvas.height < bound,
        "{} x {}",
        canvas.width,
        canvas.height
    );
    let shortened = labels.shortened();
    let first = &shortened.queries.as_ref().expect("labels")[0];
    assert_eq!(first.chars().count(), MAX_LABEL_CHARS);
    assert!(first.starts_with("0www") && first.ends_with("..."), "{first}");

    let many: Vec<Panel> = (0..=MAX_GRID_PANELS)
        .map(|h| Panel {
            title: format!("head {h}"),
            weights: &weights,
            len_q: 3,
            len_k: 4,
        })
        .collect();
    let Err(err) = render_grid(&many, &labels) else {
        panic!("a grid of {} panels was drawn", many.len());
    };
    assert!(err.to_string().contains(&MAX_GRID_PANELS.to_string()), "{err}");
    let (grid, _) = render_grid(&many[..MAX_GRID_PANELS], &labels).expect("a full grid");
    assert!(u64::from(grid.width) * u64::from(grid.height) <= wgpu_attention::heatmap::MAX_CANVAS_PIXELS);
}

#[test]
fn backend_lists_and_key_split_counts_take_only_what_they_name() {
    // Issue 64 item 8: wgpu's parser skipped `bogus` in `vulkan,bogus`; the key-split
    // count took `+2` and ` 2 `.
    use wgpu_attention::wgpu::Backends;
    use wgpu_attention::AdapterSelector;
    assert_eq!(
        AdapterSelector::parse_backends("WGPU_BACKEND", "Vulkan,gl").expect("two backends"),
        Backends::VULKAN | Backends::GL
    );
    for bad in ["vulkan,bogus", "vulkan,", "", "vulkan;gl"] {
        let e = AdapterSelector::parse_backends("WGPU_BACKEND", bad)
            .expect_err(bad)
            .to_string();
        assert!(
            e.contains("WGPU_BACKEND") && e.contains("is not a backend"),
            "{bad:?}: {e}"
        );
    }
    assert_eq!(wgpu_attention::tune::parse_key_splits("x", "16").expect("16"), 16);
    for bad in ["+2", " 2 ", "2 ", "", "0", "17", "0x2", "２"] {
        let e = wgpu_attention::tune::parse_key_splits("WGPU_ATTENTION_KEY_SPLITS", bad).expect_err(bad);
        assert!(e.to_string().contains("WGPU_ATTENTION_KEY_SPLITS"), "{bad:?}: {e}");
    }
}
