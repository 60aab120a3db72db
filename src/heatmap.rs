//! Attention-weight heatmaps as PNG: one panel per (batch, head) with axis labels, a
//! colour scale and optional token labels, and a grid of all heads of a batch element.
//!
//! Drawing uses embedded-graphics (rectangles, built-in bitmap fonts, so no system fonts
//! are needed) on an RGB canvas, encoded with the png crate. Colours follow viridis from
//! weight 0 (dark purple) to the panel's maximum weight (yellow); a masked key gets
//! weight exactly 0 and so the colour of [`colour`]`(0.0)`.

use embedded_graphics::mono_font::ascii::FONT_6X10;
use embedded_graphics::mono_font::MonoTextStyle;
use embedded_graphics::pixelcolor::Rgb888;
use embedded_graphics::prelude::*;
use embedded_graphics::primitives::{PrimitiveStyle, Rectangle};
use embedded_graphics::text::{Alignment, Baseline, Text, TextStyleBuilder};

use crate::error::{Error, Result};

/// An RGB8 image being drawn.
pub struct Canvas {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Row-major RGB bytes.
    pub pixels: Vec<u8>,
}

/// The most pixels one image may have (8192 x 8192, 192 MiB of RGB): the layout is
/// bounded well below it (at most [`MAX_PANEL_CELLS`] cells a side, labels of at most
/// [`MAX_LABEL_CHARS`], grids of at most [`MAX_GRID_PANELS`]), so reaching it is a bug
/// reported as an error, never a wrapped size or a multi-GB allocation.
pub const MAX_CANVAS_PIXELS: u64 = 8192 * 8192;

impl Canvas {
    fn new(width: u32, height: u32) -> Result<Canvas> {
        let pixels = u64::from(width) * u64::from(height);
        if pixels > MAX_CANVAS_PIXELS {
            return Err(Error::invalid(
                "heatmap",
                format!("a {width} x {height} image is larger than {MAX_CANVAS_PIXELS} pixels"),
            ));
        }
        Ok(Canvas {
            width,
            height,
            pixels: vec![255; pixels as usize * 3],
        })
    }

    /// The colour at (x, y).
    pub fn pixel(&self, x: u32, y: u32) -> [u8; 3] {
        let i = (y as usize * self.width as usize + x as usize) * 3;
        [self.pixels[i], self.pixels[i + 1], self.pixels[i + 2]]
    }

    /// Encodes the canvas as PNG.
    pub fn to_png(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut encoder = png::Encoder::new(&mut out, self.width, self.height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let png_error = |e: png::EncodingError| Error::invalid("PNG encoding", e.to_string());
        let mut writer = encoder.write_header().map_err(png_error)?;
        writer.write_image_data(&self.pixels).map_err(png_error)?;
        writer.finish().map_err(png_error)?;
        Ok(out)
    }

    fn fill(&mut self, x: i32, y: i32, w: u32, h: u32, colour: [u8; 3]) {
        let style = PrimitiveStyle::with_fill(Rgb888::new(colour[0], colour[1], colour[2]));
        let _ = Rectangle::new(Point::new(x, y), Size::new(w, h))
            .into_styled(style)
            .draw(self);
    }

    fn text(&mut self, s: &str, x: i32, y: i32, alignment: Alignment) {
        let style = MonoTextStyle::new(&FONT_6X10, Rgb888::BLACK);
        let layout = TextStyleBuilder::new()
            .alignment(alignment)
            .baseline(Baseline::Top)
            .build();
        let _ = Text::with_text_style(s, Point::new(x, y), style, layout).draw(self);
    }
}

impl OriginDimensions for Canvas {
    fn size(&self) -> Size {
        Size::new(self.width, self.height)
    }
}

impl DrawTarget for Canvas {
    type Color = Rgb888;
    type Error = core::convert::Infallible;

    fn draw_iter<I: IntoIterator<Item = Pixel<Rgb888>>>(&mut self, pixels: I) -> core::result::Result<(), Self::Error> {
        for Pixel(p, c) in pixels {
            if p.x >= 0 && p.y >= 0 && (p.x as u32) < self.width && (p.y as u32) < self.height {
                let i = (p.y as usize * self.width as usize + p.x as usize) * 3;
                self.pixels[i..i + 3].copy_from_slice(&[c.r(), c.g(), c.b()]);
            }
        }
        Ok(())
    }
}

/// Viridis at nine evenly spaced points (from matplotlib's table).
const VIRIDIS: [[u8; 3]; 9] = [
    [68, 1, 84],
    [71, 44, 122],
    [59, 81, 139],
    [44, 113, 142],
    [33, 144, 141],
    [39, 173, 129],
    [92, 200, 99],
    [170, 220, 50],
    [253, 231, 37],
];

/// The colour of a weight scaled to [0, 1] (values outside are clamped; NaN is 0).
pub fn colour(t: f32) -> [u8; 3] {
    let t = if t.is_nan() { 0.0 } else { t.clamp(0.0, 1.0) };
    let x = t * (VIRIDIS.len() - 1) as f32;
    let i = (x.floor() as usize).min(VIRIDIS.len() - 2);
    let f = x - i as f32;
    let (a, b) = (VIRIDIS[i], VIRIDIS[i + 1]);
    std::array::from_fn(|c| (f32::from(a[c]) + f * (f32::from(b[c]) - f32::from(a[c]))).round() as u8)
}

/// One attention-weight matrix to draw.
pub struct Panel<'a> {
    /// Drawn above the panel; one longer than 80 characters is cut to 80, ending in `...`.
    pub title: String,
    /// `[len_q, len_k]`, row-major.
    pub weights: &'a [f32],
    /// Query positions: the panel's rows.
    pub len_q: usize,
    /// Key positions: the panel's columns.
    pub len_k: usize,
}

/// Labels and sizes shared by the panels of an image.
#[derive(Clone, Debug, Default)]
pub struct Labels {
    /// One per query position (token labels), else positions are numbered.
    pub queries: Option<Vec<String>>,
    /// One per key position.
    pub keys: Option<Vec<String>>,
}

/// Longest label drawn, in characters: longer ones end in `...` (a token label
/// several thousand characters long would otherwise widen the image without bound).
pub const MAX_LABEL_CHARS: usize = 16;

/// Longest panel title drawn, in characters.
const MAX_TITLE_CHARS: usize = 80;

/// `s` cut to `max` characters, its end replaced by `...` when cut.
fn shortened(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let kept: String = s.chars().take(max.saturating_sub(3)).collect();
        format!("{kept}...")
    }
}

impl Labels {
    /// The labels as drawn: each at most [`MAX_LABEL_CHARS`] characters.
    pub fn shortened(&self) -> Labels {
        let cut = |l: &Option<Vec<String>>| {
            l.as_ref()
                .map(|l| l.iter().map(|s| shortened(s, MAX_LABEL_CHARS)).collect())
        };
        Labels {
            queries: cut(&self.queries),
            keys: cut(&self.keys),
        }
    }
}

/// Where things are in a rendered panel (for tests and for callers that annotate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PanelGeometry {
    /// Top-left corner of cell (0, 0).
    pub origin: (u32, u32),
    /// Side of one cell in pixels.
    pub cell: u32,
    /// Query rows and key columns per drawn cell: (1, 1) unless the matrix was larger
    /// than the panel and max-pooled to fit (see [`MAX_PANEL_CELLS`]).
    pub pool: (usize, usize),
}

impl PanelGeometry {
    /// The pixel at the centre of the cell that shows (query i, key j).
    pub fn centre(&self, i: usize, j: usize) -> (u32, u32) {
        let (i, j) = (i / self.pool.0, j / self.pool.1);
        (
            self.origin.0 + j as u32 * self.cell + self.cell / 2,
            self.origin.1 + i as u32 * self.cell + self.cell / 2,
        )
    }
}

/// Most cells along one side of a single panel: a longer axis is max-pooled in blocks
/// of ⌈len / MAX_PANEL_CELLS⌉ positions (the title says so), so images stay small
/// however long the sequences, and a sharp peak stays visible.
pub const MAX_PANEL_CELLS: usize = 480;

/// Most panels in one grid image (an 8 x 8 grid).
pub const MAX_GRID_PANELS: usize = 64;

/// Most cells along one side of each panel of a grid of `cols` columns.
fn grid_panel_cells(cols: usize) -> usize {
    (960 / cols.max(1)).clamp(64, MAX_PANEL_CELLS)
}

/// A panel max-pooled to at most `max_cells` cells a side (finite weights only; a
/// block without any is 0), its title naming the pooling, and the labels that still
/// apply (token labels of a pooled axis are dropped; numbers are kept).
struct Pooled {
    title: String,
    weights: Vec<f32>,
    len_q: usize,
    len_k: usize,
    pool: (usize, usize),
    labels: Labels,
}

impl Pooled {
    fn of(p: &Panel, labels: &Labels, max_cells: usize) -> Pooled {
        let pool = (p.len_q.div_ceil(max_cells), p.len_k.div_ceil(max_cells));
        let (len_q, len_k) = (p.len_q.div_ceil(pool.0), p.len_k.div_ceil(pool.1));
        let weights = if pool == (1, 1) {
            p.weights.to_vec()
        } else {
            let mut out = vec![0.0f32; len_q * len_k];
            for (i, row) in p.weights.chunks_exact(p.len_k).enumerate() {
                let pooled = &mut out[(i / pool.0) * len_k..][..len_k];
                for (j, &w) in row.iter().enumerate() {
                    if w.is_finite() {
                        pooled[j / pool.1] = pooled[j / pool.1].max(w);
                    }
                }
            }
            out
        };
        let title = shortened(&p.title, MAX_TITLE_CHARS);
        let title = if pool == (1, 1) {
            title
        } else {
            format!("{title} (max of {}x{} blocks)", pool.0, pool.1)
        };
        Pooled {
            title,
            weights,
            len_q,
            len_k,
            pool,
            labels: Labels {
                queries: labels.queries.clone().filter(|_| pool.0 == 1),
                keys: labels.keys.clone().filter(|_| pool.1 == 1),
            },
        }
    }

    fn panel(&self) -> Panel<'_> {
        Panel {
            title: self.title.clone(),
            weights: &self.weights,
            len_q: self.len_q,
            len_k: self.len_k,
        }
    }
}

const CHAR_W: u32 = 6;
const CHAR_H: u32 = 10;
const PAD: u32 = 6;
const BAR_W: u32 = 14;

fn label_width(labels: &Option<Vec<String>>, count: usize) -> u32 {
    let widest = match labels {
        Some(l) => l.iter().map(|s| s.chars().count()).max().unwrap_or(1),
        None => (count.max(1) - 1).to_string().len(),
    };
    widest as u32 * CHAR_W
}

/// Pixels per cell: big enough to see, small enough to keep the image under ~600 px.
fn cell_size(len_q: usize, len_k: usize) -> u32 {
    (480 / len_q.max(len_k).max(1) as u32).clamp(1, 40)
}

/// Every `step`-th position gets a number so labels never overlap.
fn tick_step(cell: u32, label_px: u32) -> usize {
    (label_px.div_ceil(cell.max(1)) as usize).max(1)
}

fn max_weight(weights: &[f32]) -> f32 {
    let m = weights.iter().copied().filter(|w| w.is_finite()).fold(0.0f32, f32::max);
    if m > 0.0 {
        m
    } else {
        1.0
    }
}

fn check_panel(p: &Panel, labels: &Labels) -> Result<()> {
    if p.len_q == 0 || p.len_k == 0 || p.weights.len() != p.len_q * p.len_k {
        return Err(Error::invalid(
            "heatmap",
            format!("{} weights for a {} x {} panel", p.weights.len(), p.len_q, p.len_k),
        ));
    }
    for (name, l, n) in [("query", &labels.queries, p.len_q), ("key", &labels.keys, p.len_k)] {
        if let Some(l) = l {
            if l.len() != n {
                return Err(Error::invalid(
                    "heatmap",
                    format!("{} {name} labels for {n} positions", l.len()),
                ));
            }
        }
    }
    Ok(())
}

/// The size of a panel's drawing and where its cells start, relative to its own corner.
struct PanelLayout {
    width: u32,
    height: u32,
    geometry: PanelGeometry,
    key_label_rows: u32,
}

/// The layout of `p`, pooled by `pool` (numbered ticks show original positions).
fn panel_layout(p: &Panel, labels: &Labels, pool: (usize, usize)) -> PanelLayout {
    let cell = cell_size(p.len_q, p.len_k);
    let left = label_width(&labels.queries, p.len_q * pool.0) + PAD;
    let key_label_rows = match &labels.keys {
        Some(l) if cell >= CHAR_W => key_labels(l, cell).rows(),
        _ => 1,
    };
    let top = CHAR_H + PAD; // title
    let grid_w = cell * p.len_k as u32;
    let grid_h = cell * p.len_q as u32;
    let bottom = PAD + key_label_rows * CHAR_H + PAD + CHAR_H; // key labels + axis name

    // A level or staggered label centred under the last column may reach past the grid.
    let overhang = match &labels.keys {
        Some(l) if cell >= CHAR_W && !matches!(key_labels(l, cell), KeyLabels::Vertical(_)) => {
            let widest = l.iter().map(|s| s.chars().count()).max().unwrap_or(0) as u32 * CHAR_W;
            (widest / 2).saturating_sub(cell / 2)
        }
        _ => 0,
    };
    let width = (left + grid_w + overhang)
        .max(left + "key position".len() as u32 * CHAR_W)
        .max(p.title.chars().count() as u32 * CHAR_W);
    PanelLayout {
        width: width + PAD,
        height: top + grid_h + bottom,
        geometry: PanelGeometry {
            origin: (left, top),
            cell,
            pool: (1, 1),
        },
        key_label_rows,
    }
}

/// Draws `p` (already pooled by `pool`: tick numbers are the original positions).
fn draw_panel(
    canvas: &mut Canvas,
    corner: (u32, u32),
    p: &Panel,
    labels: &Labels,
    vmax: f32,
    pool: (usize, usize),
) -> PanelGeometry {
    let layout = panel_layout(p, labels, pool);
    let g = layout.geometry;
    let (x0, y0) = (corner.0 + g.origin.0, corner.1 + g.origin.1);
    canvas.text(&p.title, corner.0 as i32, corner.1 as i32, Alignment::Left);
    for i in 0..p.len_q {
        for j in 0..p.len_k {
            let w = p.weights[i * p.len_k + j];
            let (x, y) = (x0 + j as u32 * g.cell, y0 + i as u32 * g.cell);
            canvas.fill(x as i32, y as i32, g.cell, g.cell, colour(w / vmax));
        }
    }
    // Query labels to the left of their rows.
    let q_step = tick_step(g.cell, CHAR_H);
    for i in (0..p.len_q).step_by(q_step) {
        let text = labels
            .queries
            .as_ref()
            .map_or((i * pool.0).to_string(), |l| l[i].clone());
        let y = y0 + i as u32 * g.cell + g.cell / 2;
        canvas.text(
            &text,
            (x0 - PAD / 2) as i32,
            y.saturating_sub(CHAR_H / 2) as i32,
            Alignment::Right,
        );
    }
    // Token labels under their columns (see KeyLabels), else numbers every few columns.
    let below = y0 + p.len_q as u32 * g.cell + PAD / 2;
    match &labels.keys {
        Some(l) if g.cell >= CHAR_W => {
            let how = key_labels(l, g.cell);
            for (j, label) in l.iter().enumerate() {
                let x = (x0 + j as u32 * g.cell + g.cell / 2) as i32;
                match how {
                    KeyLabels::Level => canvas.text(label, x, below as i32, Alignment::Center),
                    KeyLabels::Staggered => {
                        let y = below + (j % 2) as u32 * CHAR_H;
                        canvas.text(label, x, y as i32, Alignment::Center);
                    }
                    KeyLabels::Vertical(_) => {
                        for (line, ch) in label.chars().enumerate() {
                            let y = below + line as u32 * CHAR_H;
                            canvas.text(&ch.to_string(), x, y as i32, Alignment::Center);
                        }
                    }
                }
            }
        }
        _ => {
            let widest = label_width(&None, p.len_k * pool.1) + CHAR_W;
            for j in (0..p.len_k).step_by(tick_step(g.cell, widest)) {
                let x = x0 + j as u32 * g.cell + g.cell / 2;
                canvas.text(&(j * pool.1).to_string(), x as i32, below as i32, Alignment::Center);
            }
        }
    }
    let axis_y = below + layout.key_label_rows * CHAR_H + PAD / 2;
    canvas.text("key position", x0 as i32, axis_y as i32, Alignment::Left);
    PanelGeometry {
        origin: (x0, y0),
        cell: g.cell,
        pool,
    }
}

/// How token labels sit under their columns: on one line where the widest fits its
/// column, on two alternating lines where it fits two, else down the column a
/// character per line (the only way long tokens in narrow columns stay readable).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyLabels {
    Level,
    Staggered,
    Vertical(u32),
}

impl KeyLabels {
    /// Text lines the labels take below the grid.
    fn rows(self) -> u32 {
        match self {
            KeyLabels::Level => 1,
            KeyLabels::Staggered => 2,
            KeyLabels::Vertical(n) => n,
        }
    }
}

fn key_labels(labels: &[String], cell: u32) -> KeyLabels {
    let widest = labels.iter().map(|s| s.chars().count()).max().unwrap_or(1).max(1) as u32;
    // A pixel of space between neighbouring labels.
    if widest * CHAR_W < cell {
        KeyLabels::Level
    } else if widest * CHAR_W < 2 * cell {
        KeyLabels::Staggered
    } else {
        KeyLabels::Vertical(widest)
    }
}

/// A vertical colour bar from 0 (bottom) to `vmax` (top), with both ends labelled.
fn draw_colour_bar(canvas: &mut Canvas, x: u32, y: u32, height: u32, vmax: f32) {
    for row in 0..height {
        let t = 1.0 - row as f32 / (height.max(2) - 1) as f32;
        canvas.fill(x as i32, (y + row) as i32, BAR_W, 1, colour(t));
    }
    let label_x = (x + BAR_W + 3) as i32;
    canvas.text(&format!("{vmax:.3}"), label_x, y as i32, Alignment::Left);
    canvas.text("0", label_x, (y + height - CHAR_H) as i32, Alignment::Left);
}

const BAR_SPACE: u32 = PAD + BAR_W + 3 + 5 * CHAR_W + PAD;

/// One panel with its colour bar (scaled to the panel's largest weight) and the query axis
/// name on top. Returns the image and where the cells are.
pub fn render_panel(panel: &Panel, labels: &Labels) -> Result<(Canvas, PanelGeometry)> {
    check_panel(panel, labels)?;
    let pooled = Pooled::of(panel, &labels.shortened(), MAX_PANEL_CELLS);
    let (panel, labels) = (&pooled.panel(), &pooled.labels);
    let layout = panel_layout(panel, labels, pooled.pool);
    let header = CHAR_H + PAD;
    let mut canvas = Canvas::new(layout.width + BAR_SPACE, header + layout.height)?;
    canvas.text("rows: query position", 0, 0, Alignment::Left);
    let vmax = max_weight(panel.weights);
    let geometry = draw_panel(&mut canvas, (0, header), panel, labels, vmax, pooled.pool);
    let grid_h = geometry.cell * panel.len_q as u32;
    draw_colour_bar(
        &mut canvas,
        layout.width,
        geometry.origin.1,
        grid_h.max(2 * CHAR_H),
        vmax,
    );
    Ok((canvas, geometry))
}

/// All panels (e.g. the heads of one batch element) in a grid of about square shape,
/// sharing one colour scale (the largest weight of any panel). Returns the image and each
/// panel's geometry.
pub fn render_grid(panels: &[Panel], labels: &Labels) -> Result<(Canvas, Vec<PanelGeometry>)> {
    let Some(first) = panels.first() else {
        return Err(Error::invalid("heatmap grid", "no panels"));
    };
    if panels.len() > MAX_GRID_PANELS {
        return Err(Error::unsupported(
            "panels in one heatmap grid",
            panels.len(),
            format!("at most {MAX_GRID_PANELS}"),
        ));
    }
    for p in panels {
        check_panel(p, labels)?;
        if (p.len_q, p.len_k) != (first.len_q, first.len_k) {
            return Err(Error::invalid("heatmap grid", "panels of different sizes"));
        }
    }
    let cols = (panels.len() as f64).sqrt().ceil() as u32;
    let rows = (panels.len() as u32).div_ceil(cols);
    let labels = labels.shortened();
    let pooled: Vec<Pooled> = panels
        .iter()
        .map(|p| Pooled::of(p, &labels, grid_panel_cells(cols as usize)))
        .collect();
    let views: Vec<Panel> = pooled.iter().map(Pooled::panel).collect();
    let (panels, first, labels) = (&views[..], &views[0], &pooled[0].labels);
    let layout = panel_layout(first, labels, pooled[0].pool);
    let header = CHAR_H + PAD;
    let (cell_w, cell_h) = (layout.width + PAD, layout.height + PAD);
    let mut canvas = Canvas::new(cols * cell_w + BAR_SPACE, header + rows * cell_h)?;
    canvas.text("rows: query position", 0, 0, Alignment::Left);
    let vmax = panels.iter().map(|p| max_weight(p.weights)).fold(0.0f32, f32::max);
    let geometries = panels
        .iter()
        .enumerate()
        .map(|(n, p)| {
            let (r, c) = (n as u32 / cols, n as u32 % cols);
            draw_panel(
                &mut canvas,
                (c * cell_w, header + r * cell_h),
                p,
                labels,
                vmax,
                pooled[n].pool,
            )
        })
        .collect();
    let bar_top = header + layout.geometry.origin.1;
    let bar_h = canvas.height.saturating_sub(bar_top + CHAR_H + PAD).max(2 * CHAR_H);
    draw_colour_bar(&mut canvas, cols * cell_w, bar_top, bar_h, vmax);
    Ok((canvas, geometries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_labels_lie_level_where_they_fit_their_column() {
        // The demo's sentences: five tokens, 40-pixel columns (issue 56: "tok5" was
        // drawn a letter per line).
        let words: Vec<String> = ["tok5", "tok2", "tok1", "<pad>", "<pad>"].map(String::from).to_vec();
        assert_eq!(key_labels(&words, cell_size(5, 5)), KeyLabels::Level);
        assert_eq!(key_labels(&words, 20), KeyLabels::Staggered);
        assert_eq!(key_labels(&words, 8), KeyLabels::Vertical(5));
        assert_eq!(KeyLabels::Vertical(5).rows(), 5);
    }
}
