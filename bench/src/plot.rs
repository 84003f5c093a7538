//! Line charts of benchmark results, drawn with `plotters` to SVG or PNG.
//!
//! Text is rendered with plotters' pure-Rust `ab_glyph` support, so nothing links
//! against fontconfig or freetype. A TrueType font is loaded at run time from
//! `$PLOT_FONT` or a few common system paths ([`FONT_PATHS`]). PNG output needs one;
//! SVG output uses one for text measurement when present and otherwise falls back
//! to writing the text without measuring it (the viewer renders SVG text itself).
//!
//! Log axes are drawn by plotting `log2(v)` / `log10(v)` on a linear axis with tick
//! marks at powers of the base, labelled with the untransformed values (`8`, `64`,
//! `1Ki`, `1Mi` on a log2 axis; `10`, `100`, `1k` on a log10 axis).

use std::fmt::Write as _;
use std::ops::Range;
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, bail};
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::element::{Drawable, PointCollection};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters_backend::{BackendCoord, DrawingErrorKind};

/// One named line of (x, y) points, drawn in the order given.
pub struct Series {
    /// Legend entry of the line.
    pub name: String,
    /// The (x, y) points; must be finite (and positive on a log axis).
    pub points: Vec<(f64, f64)>,
    /// A label drawn next to each point (a sweep's parameter value, e.g. `θ 0.99`), in
    /// the order of `points`; empty for none.
    pub labels: Vec<String>,
}

/// Axis scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Linear axis.
    Linear,
    /// Logarithmic axis with ticks at powers of two (binary prefixes: `1Ki`, `1Mi`).
    Log2,
    /// Logarithmic axis with ticks at powers of ten (SI suffixes: `10k`, `1M`).
    Log10,
}

/// A line chart: one line + point markers per series, legend, axis labels.
pub struct LineChart<'a> {
    /// Chart title, drawn above the plot.
    pub title: &'a str,
    /// Description of the x axis (e.g. "payload (bytes)").
    pub x_label: &'a str,
    /// Description of the y axis (e.g. "latency (ns)").
    pub y_label: &'a str,
    /// Scale of the x axis.
    pub x_scale: Scale,
    /// Scale of the y axis.
    pub y_scale: Scale,
    /// The lines; each needs at least one point.
    pub series: &'a [Series],
}

/// Image size in pixels (both backends).
const SIZE: (u32, u32) = (1024, 640);
/// Font family name the loaded font is registered under.
const FAMILY: &str = "sans-serif";
/// Font sizes in plotters units (plotters renders `size / 1.24` pixels per em).
const TITLE_PX: u32 = 30;
const LABEL_PX: u32 = 21;
const TICK_PX: u32 = 18;
const LEGEND_PX: u32 = 19;

/// Font files tried, in order, after `$PLOT_FONT` (Debian/Ubuntu paths first).
pub const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/liberation2/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
    "/usr/share/fonts/truetype/ubuntu/Ubuntu-R.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
];

/// Error text when PNG output is asked for and no font can be loaded.
const NO_FONT: &str =
    "PNG needs a TrueType font (apt install fonts-dejavu-core) or use an .svg path";

/// Series colours (Tableau 10); beyond ten series, plotters' `Palette99` continues.
const COLORS: [(u8, u8, u8); 10] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
];

fn color(i: usize) -> RGBColor {
    match COLORS.get(i) {
        Some(&(r, g, b)) => RGBColor(r, g, b),
        None => {
            let c = Palette99::pick(i).to_rgba();
            RGBColor(c.0, c.1, c.2)
        }
    }
}

/// Load and register a font once per process. `Ok(path)` of the font in use, or an
/// error listing what was tried.
fn load_font() -> Result<&'static str, &'static str> {
    static FONT: OnceLock<Result<String, String>> = OnceLock::new();
    let r = FONT.get_or_init(|| {
        let env = std::env::var("PLOT_FONT").ok();
        let mut tried = Vec::new();
        for path in env
            .iter()
            .map(String::as_str)
            .chain(FONT_PATHS.iter().copied())
        {
            let Ok(bytes) = std::fs::read(path) else {
                continue;
            };
            // plotters keeps `&'static` font data; this happens at most once per process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            match plotters::style::register_font(FAMILY, FontStyle::Normal, bytes) {
                Ok(()) => return Ok(path.to_string()),
                Err(_) => tried.push(format!("{path} (not a usable TrueType/OpenType font)")),
            }
        }
        let mut msg = format!(
            "{NO_FONT} (no font at $PLOT_FONT, {} or {} other common paths",
            FONT_PATHS[0],
            FONT_PATHS.len() - 1
        );
        for t in &tried {
            let _ = write!(msg, "; {t}");
        }
        Err(msg + ")")
    });
    r.as_deref().map_err(String::as_str)
}

/// One axis after validation: range and ticks in plotting (transformed) coordinates.
struct Axis {
    scale: Scale,
    lo: f64,
    hi: f64,
    /// Labelled ticks with grid lines.
    bold: Vec<f64>,
    /// Extra unlabelled grid lines.
    light: Vec<f64>,
    /// Spacing of linear ticks in data units (controls label decimals).
    step: f64,
}

impl Scale {
    fn forward(self, v: f64) -> f64 {
        match self {
            Scale::Linear => v,
            Scale::Log2 => v.log2(),
            Scale::Log10 => v.log10(),
        }
    }

    fn inverse(self, t: f64) -> f64 {
        match self {
            Scale::Linear => t,
            Scale::Log2 => t.exp2(),
            Scale::Log10 => 10f64.powf(t),
        }
    }

    fn is_log(self) -> bool {
        self != Scale::Linear
    }
}

/// "Nice" tick spacing (1, 2, 2.5 or 5 times a power of ten) for about `n` ticks.
fn nice_step(span: f64, n: f64) -> f64 {
    let raw = span / n;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw * 0.999)
        .unwrap_or(10.0 * mag)
}

/// Multiples of `step` within `[lo, hi]`.
fn multiples(lo: f64, hi: f64, step: f64) -> Vec<f64> {
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    (first..=last).map(|k| k as f64 * step).collect()
}

impl Axis {
    /// Axis covering `values` (already checked finite and, for log scales, positive).
    fn new(scale: Scale, values: impl Iterator<Item = f64>) -> Self {
        let (mut lo, mut hi) = values
            .map(|v| scale.forward(v))
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), t| {
                (a.min(t), b.max(t))
            });
        if hi - lo < 1e-9 {
            // One distinct value: give the axis some extent around it.
            let d = if scale.is_log() {
                0.5
            } else {
                (lo.abs() * 0.1).max(1.0)
            };
            lo -= d;
            hi += d;
        }
        let pad = (hi - lo) * 0.04;
        let (lo, hi) = (lo - pad, hi + pad);
        let mut axis = Axis {
            scale,
            lo,
            hi,
            bold: Vec::new(),
            light: Vec::new(),
            step: 1.0,
        };
        axis.ticks();
        axis
    }

    fn ticks(&mut self) {
        let (lo, hi) = (self.lo, self.hi);
        if !self.scale.is_log() {
            self.step = nice_step(hi - lo, 8.0);
            self.bold = multiples(lo, hi, self.step);
            return;
        }
        let base: f64 = if self.scale == Scale::Log2 { 2.0 } else { 10.0 };
        let exps: Vec<f64> = multiples(lo, hi, 1.0);
        if exps.len() >= 2 {
            // Labelled ticks at powers of the base (every `stride`-th one when crowded);
            // light grid lines at the skipped powers, or at 2..9 x 10^k on log10 axes.
            let stride = exps.len().div_ceil(12).max(1) as i64;
            for &e in &exps {
                if (e as i64).rem_euclid(stride) == 0 {
                    self.bold.push(e);
                } else {
                    self.light.push(e);
                }
            }
            if exps.len() <= 3 {
                // Few powers in range: label intermediate values too (2, 5 x 10^k; 1.5 x 2^k).
                let mantissas: &[f64] = if base == 2.0 { &[1.5] } else { &[2.0, 5.0] };
                for k in (exps[0] as i64 - 1)..=(*exps.last().unwrap_or(&0.0) as i64) {
                    for m in mantissas {
                        let t = self.scale.forward(m * base.powi(k as i32));
                        if t >= lo && t <= hi {
                            self.bold.push(t);
                        }
                    }
                }
                self.bold.sort_by(f64::total_cmp);
            } else if base == 10.0 && stride == 1 {
                for k in (exps[0] as i64 - 1)..=(*exps.last().unwrap_or(&0.0) as i64) {
                    for m in 2..=9 {
                        let t = (f64::from(m) * 10f64.powi(k as i32)).log10();
                        if t >= lo && t <= hi {
                            self.light.push(t);
                        }
                    }
                }
            }
        } else {
            // Less than two powers in range: round numbers of the untransformed values.
            let (a, b) = (self.scale.inverse(lo), self.scale.inverse(hi));
            self.step = nice_step(b - a, 6.0);
            self.bold = multiples(a, b, self.step)
                .into_iter()
                .filter(|&v| v > 0.0)
                .map(|v| self.scale.forward(v))
                .collect();
        }
    }

    /// Tick label of plotting coordinate `t`.
    fn label(&self, t: f64) -> String {
        let v = self.scale.inverse(t);
        let binary = self.scale == Scale::Log2;
        // Suffixed units for large magnitudes: Ki/Mi/... on log2 axes, k/M/... otherwise.
        let (unit, suffixes): (f64, [&str; 5]) = if binary {
            (1024.0, ["", "Ki", "Mi", "Gi", "Ti"])
        } else {
            (1000.0, ["", "k", "M", "G", "T"])
        };
        let threshold = if binary { 1024.0 } else { 10_000.0 };
        let mut scaled = v;
        let mut i = 0;
        if v.abs() >= threshold {
            while scaled.abs() >= unit && i + 1 < suffixes.len() {
                scaled /= unit;
                i += 1;
            }
        }
        let div = unit.powi(i as i32);
        let decimals = if self.scale.is_log() && self.step == 1.0 {
            // Powers of the base and intermediate ticks: three significant digits.
            (2 - scaled.abs().log10().floor() as i32).clamp(0, 6)
        } else {
            ((-(self.step / div).log10()).ceil() as i32).clamp(0, 6)
        };
        let mut s = format!("{:.*}", decimals as usize, scaled);
        if s.contains('.') {
            s = s.trim_end_matches('0').trim_end_matches('.').to_string();
        }
        if s == "-0" {
            s = "0".into();
        }
        s + suffixes[i]
    }

    fn coord(&self) -> Ticked {
        Ticked {
            inner: (self.lo..self.hi).into(),
            bold: self.bold.clone(),
            light: self.light.clone(),
        }
    }
}

/// Linear f64 coordinate with fixed tick positions (bold: labelled, light: grid only).
struct Ticked {
    inner: RangedCoordf64,
    bold: Vec<f64>,
    light: Vec<f64>,
}

impl Ranged for Ticked {
    type ValueType = f64;
    // Only used when no label formatter is set; `render` always sets one.
    type FormatOption = DefaultFormatting;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.light.clone()
        } else {
            self.bold.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.inner.range()
    }
}

impl LineChart<'_> {
    /// Draw to `path`: SVG when it ends in `.svg`, PNG when it ends in `.png`
    /// (1024 x 640 pixels). Fails without drawing on an unknown extension, no series,
    /// a series without points or with labels not one per point, non-finite values, or values `<= 0` on a log axis; PNG
    /// output also fails when no TrueType font can be found (see [`FONT_PATHS`]).
    pub fn draw(&self, path: &Path) -> anyhow::Result<()> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        let png = match ext.as_deref() {
            Some("svg") => false,
            Some("png") => true,
            _ => bail!("chart path {} must end in .svg or .png", path.display()),
        };
        let (x, y) = self.axes()?;
        let font = load_font();
        if png {
            font.map_err(|e| anyhow!("{e}"))?;
            let root = BitMapBackend::new(path, SIZE).into_drawing_area();
            self.render(&root, &x, &y, true)?;
            root.present()?;
        } else {
            let root = SVGBackend::new(path, SIZE).into_drawing_area();
            self.render(&root, &x, &y, font.is_ok())?;
            root.present()?;
        }
        Ok(())
    }

    /// Validate the data and build both axes.
    fn axes(&self) -> anyhow::Result<(Axis, Axis)> {
        if self.series.is_empty() {
            bail!("chart {:?}: no series to draw", self.title);
        }
        for s in self.series {
            if s.points.is_empty() {
                bail!("chart {:?}: series {:?} has no points", self.title, s.name);
            }
            if !s.labels.is_empty() && s.labels.len() != s.points.len() {
                bail!(
                    "chart {:?}: series {:?} has {} point labels for {} points",
                    self.title,
                    s.name,
                    s.labels.len(),
                    s.points.len()
                );
            }
            for &(x, y) in &s.points {
                for (axis, scale, v) in [("x", self.x_scale, x), ("y", self.y_scale, y)] {
                    if !v.is_finite() {
                        bail!(
                            "chart {:?}: series {:?} has a non-finite {axis} value in point ({x}, {y})",
                            self.title,
                            s.name
                        );
                    }
                    if scale.is_log() && v <= 0.0 {
                        bail!(
                            "chart {:?}: series {:?} has {axis} = {v} in point ({x}, {y}), \
                             but the {axis} axis is logarithmic and needs values > 0",
                            self.title,
                            s.name
                        );
                    }
                }
            }
        }
        let points = || self.series.iter().flat_map(|s| s.points.iter());
        Ok((
            Axis::new(self.x_scale, points().map(|p| p.0)),
            Axis::new(self.y_scale, points().map(|p| p.1)),
        ))
    }

    /// Draw the chart on `root`. `measure`: a font is registered, so text extents can be
    /// asked of plotters; otherwise they are estimated from the character count.
    fn render<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        x: &Axis,
        y: &Axis,
        measure: bool,
    ) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        let text_width = |s: &str, px: u32| -> u32 {
            let guess = (s.chars().count() as f64 * f64::from(px) * 0.6).ceil() as u32;
            if measure {
                root.estimate_text_size(s, &TextStyle::from((FAMILY, px).into_font()))
                    .map(|(w, _)| w)
                    .unwrap_or(guess)
            } else {
                guess
            }
        };
        root.fill(&WHITE)?;
        // Title by hand: `DrawingArea::titled` measures the text, which fails without a font.
        let title_style = TextStyle::from((FAMILY, TITLE_PX).into_font())
            .color(&BLACK)
            .pos(Pos::new(HPos::Center, VPos::Top));
        root.draw(&Text::new(self.title, (SIZE.0 as i32 / 2, 8), title_style))?;
        let (_, root) = root.split_vertically(TITLE_PX + 12);

        // Legend to the right of the plot, so it never covers data.
        let swatch = 28;
        let legend_w = self
            .series
            .iter()
            .map(|s| text_width(&s.name, LEGEND_PX))
            .max()
            .unwrap_or(0)
            .min(SIZE.0 / 3)
            + swatch
            + 30;
        let (plot_area, legend_area) = root.split_horizontally(SIZE.0 - legend_w);

        let y_tick_w = y
            .bold
            .iter()
            .map(|&t| text_width(&y.label(t), TICK_PX))
            .max()
            .unwrap_or(0);
        let mut chart = ChartBuilder::on(&plot_area)
            .margin(10)
            .x_label_area_size(TICK_PX + LABEL_PX + 24)
            .y_label_area_size(y_tick_w + LABEL_PX + 24)
            .build_cartesian_2d(x.coord(), y.coord())?;
        let x_fmt = |t: &f64| x.label(*t);
        let y_fmt = |t: &f64| y.label(*t);
        chart
            .configure_mesh()
            .x_desc(self.x_label)
            .y_desc(self.y_label)
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&y_fmt)
            .axis_desc_style((FAMILY, LABEL_PX))
            .label_style((FAMILY, TICK_PX))
            .bold_line_style(BLACK.mix(0.15))
            .light_line_style(BLACK.mix(0.06))
            .draw()?;

        let plot_top =
            chart.plotting_area().get_pixel_range().1.start - plot_area.get_base_pixel().1;
        for (i, s) in self.series.iter().enumerate() {
            let c = color(i);
            let pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .map(|&(a, b)| (x.scale.forward(a), y.scale.forward(b)))
                .collect();
            chart.draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))?;
            let mk = |p, r, _| Marker::new(p, r, c, i);
            chart.draw_series(PointSeries::of_element(pts.iter().copied(), 4, c, &mk))?;
            // Each point's label just above and right of its marker, in its series' colour.
            let font = TextStyle::from((FAMILY, TICK_PX - 2).into_font()).color(&c);
            chart.draw_series(pts.iter().zip(&s.labels).map(|(&p, l)| {
                EmptyElement::at(p) + Text::new(l.clone(), (6, -(TICK_PX as i32)), font.clone())
            }))?;

            // Legend row: line with marker, then the name.
            let row = plot_top + 8 + i as i32 * (LEGEND_PX as i32 + 10);
            let x0 = 10;
            legend_area.draw(&PathElement::new(
                [(x0, row), (x0 + swatch as i32, row)],
                c.stroke_width(2),
            ))?;
            legend_area.draw(&Marker::new((x0 + swatch as i32 / 2, row), 4, c, i))?;
            let style = TextStyle::from((FAMILY, LEGEND_PX).into_font())
                .color(&BLACK)
                .pos(Pos::new(HPos::Left, VPos::Center));
            legend_area.draw(&Text::new(
                s.name.as_str(),
                (x0 + swatch as i32 + 8, row),
                style,
            ))?;
        }
        Ok(())
    }
}

/// Point marker of series `shape` at one coordinate, `r` pixels in radius: a filled
/// circle, triangle or square, or a cross, in turn (tells series apart without relying
/// on colour). A plain element rather than a composed one, so it works for any backend.
struct Marker<C> {
    at: C,
    r: i32,
    color: RGBColor,
    shape: usize,
}

impl<C> Marker<C> {
    fn new(at: C, r: u32, color: RGBColor, shape: usize) -> Self {
        Self {
            at,
            r: r as i32,
            color,
            shape,
        }
    }
}

impl<'a, C> PointCollection<'a, C> for &'a Marker<C> {
    type Point = &'a C;
    type IntoIter = std::iter::Once<&'a C>;

    fn point_iter(self) -> Self::IntoIter {
        std::iter::once(&self.at)
    }
}

impl<C, DB: DrawingBackend> Drawable<DB> for Marker<C> {
    fn draw<I: Iterator<Item = BackendCoord>>(
        &self,
        mut pos: I,
        backend: &mut DB,
        _parent_dim: (u32, u32),
    ) -> Result<(), DrawingErrorKind<DB::ErrorType>> {
        let Some((x, y)) = pos.next() else {
            return Ok(());
        };
        let (r, fill) = (self.r, self.color.filled());
        match self.shape % 4 {
            0 => backend.draw_circle((x, y), r as u32, &fill, true),
            1 => {
                let h = r + 1;
                backend.fill_polygon(
                    [(x, y - h), (x - h, y + h * 3 / 4), (x + h, y + h * 3 / 4)],
                    &fill,
                )
            }
            2 => backend.draw_rect((x - r, y - r), (x + r, y + r), &fill, true),
            _ => {
                let line = self.color.stroke_width(2);
                backend.draw_line((x - r, y - r), (x + r, y + r), &line)?;
                backend.draw_line((x - r, y + r), (x + r, y - r), &line)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Series> {
        let xs = || (3..=13).map(|k| f64::from(1u32 << k));
        vec![
            Series {
                name: "rocket encode".into(),
                points: xs().map(|x| (x, 20.0 + x / 40.0)).collect(),
                labels: Vec::new(),
            },
            Series {
                name: "rocket decode".into(),
                points: xs().map(|x| (x, 15.0 + x / 60.0)).collect(),
                labels: Vec::new(),
            },
        ]
    }

    fn chart(series: &[Series]) -> LineChart<'_> {
        LineChart {
            title: "test chart",
            x_label: "payload (bytes)",
            y_label: "ns / message",
            x_scale: Scale::Log2,
            y_scale: Scale::Log10,
            series,
        }
    }

    #[test]
    fn svg_contains_series_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chart.svg");
        let series = sample();
        chart(&series).draw(&path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("<svg"));
        for s in &series {
            assert!(svg.contains(&s.name), "{} missing", s.name);
        }
        assert!(svg.contains("\n8Ki\n"), "log2 tick labels");
    }

    #[test]
    fn png_when_a_font_exists() {
        if let Err(e) = load_font() {
            println!("skipping PNG test: {e}");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chart.png");
        let series = sample();
        chart(&series).draw(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"));
    }

    #[test]
    fn point_labels_are_drawn_and_must_be_one_per_point() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("labels.svg");
        let mut series = sample();
        series[0].labels = series[0]
            .points
            .iter()
            .map(|p| format!("at {}", p.0))
            .collect();
        chart(&series).draw(&path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        if load_font().is_ok() {
            assert!(svg.contains("at 8\n") || svg.contains("at 8<"), "a label");
            assert!(svg.contains("at 8192"), "the last label");
        }
        series[1].labels = vec!["one".into()];
        let err = chart(&series).draw(&path).unwrap_err().to_string();
        assert!(err.contains("1 point labels for 11 points"), "{err}");
    }

    #[test]
    fn bad_input_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let svg = dir.path().join("c.svg");
        let err =
            |series: &[Series], path: &Path| chart(series).draw(path).unwrap_err().to_string();
        assert!(err(&[], &svg).contains("no series"));
        let empty = [Series {
            name: "none".into(),
            points: vec![],
            labels: Vec::new(),
        }];
        assert!(err(&empty, &svg).contains("\"none\" has no points"));
        let zero = [Series {
            name: "z".into(),
            points: vec![(0.0, 1.0)],
            labels: Vec::new(),
        }];
        assert!(err(&zero, &svg).contains("logarithmic"));
        let nan = [Series {
            name: "n".into(),
            points: vec![(1.0, f64::NAN)],
            labels: Vec::new(),
        }];
        assert!(err(&nan, &svg).contains("non-finite"));
        assert!(err(&sample(), &dir.path().join("c.jpg")).contains(".svg or .png"));
        assert!(!svg.exists());
    }

    #[test]
    fn single_point_and_linear_axes() {
        let dir = tempfile::tempdir().unwrap();
        let series = [Series {
            name: "one".into(),
            points: vec![(5.0, -3.0)],
            labels: Vec::new(),
        }];
        let c = LineChart {
            x_scale: Scale::Linear,
            y_scale: Scale::Linear,
            ..chart(&series)
        };
        c.draw(&dir.path().join("one.svg")).unwrap();
    }

    #[test]
    fn tick_labels() {
        let x = Axis::new(Scale::Log2, [8.0, 1_048_576.0].into_iter());
        let labels: Vec<_> = x.bold.iter().map(|&t| x.label(t)).collect();
        // 18 powers of two: labels at powers of four, grid lines at the others.
        assert_eq!(labels.first().map(String::as_str), Some("16"));
        assert_eq!(labels.last().map(String::as_str), Some("1Mi"));
        assert!(labels.contains(&"1Ki".to_string()));
        assert_eq!(labels.len(), 9);
        assert_eq!(x.light.first(), Some(&3.0));
        let x = Axis::new(Scale::Log2, [8.0, 8192.0].into_iter());
        let labels: Vec<_> = x.bold.iter().map(|&t| x.label(t)).collect();
        assert_eq!(
            labels,
            ["8", "16", "32", "64", "128", "256", "512", "1Ki", "2Ki", "4Ki", "8Ki"]
        );
        let y = Axis::new(Scale::Log10, [3.0, 250_000.0].into_iter());
        let labels: Vec<_> = y.bold.iter().map(|&t| y.label(t)).collect();
        assert_eq!(labels, ["10", "100", "1000", "10k", "100k"]);
        // Narrow log range: round values rather than a single power.
        let y = Axis::new(Scale::Log10, [120.0, 900.0].into_iter());
        let labels: Vec<_> = y.bold.iter().map(|&t| y.label(t)).collect();
        assert!(labels.len() >= 4, "{labels:?}");
        assert!(
            labels.iter().all(|l| l.parse::<f64>().is_ok()),
            "{labels:?}"
        );
        let l = Axis::new(Scale::Linear, [0.0, 1.0].into_iter());
        let labels: Vec<_> = l.bold.iter().map(|&t| l.label(t)).collect();
        assert_eq!(labels, ["0", "0.2", "0.4", "0.6", "0.8", "1"]);
    }
}
