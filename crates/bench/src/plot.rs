//! The pictures: latency CDFs per target and, for sweeps, goodput and TTFT P95 against the
//! offered rate, one line per target; and panels of time series (the soak's). `.svg` or
//! `.png`, chosen by the file extension.
//!
//! plotters draws text with a TrueType font that must be registered at run time; the first
//! readable font among `$KVGATE_PLOT_FONT` and common system locations (DejaVu, Liberation,
//! FreeFont, Noto, macOS Helvetica/Arial) is used. Without a font the picture is still drawn,
//! without any text.

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontFamily, FontStyle};

use crate::error::BenchError;
use crate::report::TargetReport;
use kvgate_core::stats::percentile;

const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/noto/NotoSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "/Library/Fonts/Arial.ttf",
];

/// Registers a system font once; returns whether text can be drawn.
fn font_available() -> bool {
    static FONT: OnceLock<bool> = OnceLock::new();
    *FONT.get_or_init(|| {
        let env = std::env::var("KVGATE_PLOT_FONT").ok();
        let candidates = env
            .iter()
            .map(String::as_str)
            .chain(FONT_CANDIDATES.iter().copied());
        for path in candidates {
            if let Ok(bytes) = std::fs::read(path) {
                // The font table needs 'static bytes; one font per process is leaked on purpose.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if register_font(FontFamily::SansSerif.as_str(), FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

/// Something drawn on any plotters backend.
trait Picture {
    fn draw_on<DB: DrawingBackend>(&self, root: &Area<DB>, text: bool) -> Result<(), String>;
}

/// Draws `picture` to `path`, SVG or PNG by the extension.
fn render(path: &Path, size: (u32, u32), picture: &impl Picture) -> Result<(), BenchError> {
    let text = font_available();
    let err = |message: String| BenchError::Plot {
        path: path.to_owned(),
        message,
    };
    match path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("svg") => {
            let root = SVGBackend::new(path, size).into_drawing_area();
            picture.draw_on(&root, text).map_err(err)?;
            root.present().map_err(|e| err(e.to_string()))
        }
        Some("png") => {
            let root = BitMapBackend::new(path, size).into_drawing_area();
            picture.draw_on(&root, text).map_err(err)?;
            root.present().map_err(|e| err(e.to_string()))
        }
        _ => Err(BenchError::Config(format!(
            "a plot must end in .svg or .png: {}",
            path.display()
        ))),
    }
}

/// Draws the plot of `results` to `path`; `sweep` adds the rate curves.
pub fn draw(path: &Path, results: &[TargetReport], sweep: bool) -> Result<(), BenchError> {
    let size = if sweep { (1200, 900) } else { (1200, 480) };
    render(path, size, &Report { results, sweep })
}

/// One panel of a time series: a title and its points (seconds, value).
#[derive(Clone, Debug)]
pub struct Panel {
    /// What the values are, with their unit.
    pub title: String,
    /// (seconds since the start, value).
    pub points: Vec<(f64, f64)>,
}

/// Draws time series panels, two per row, to `path` (the soak's picture).
pub fn draw_series(path: &Path, panels: &[Panel]) -> Result<(), BenchError> {
    let rows = panels.len().div_ceil(2).max(1) as u32;
    render(path, (1200, 300 * rows), &Series(panels))
}

struct Series<'a>(&'a [Panel]);

impl Picture for Series<'_> {
    fn draw_on<DB: DrawingBackend>(&self, root: &Area<DB>, text: bool) -> Result<(), String> {
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let rows = self.0.len().div_ceil(2).max(1);
        let areas = root.split_evenly((rows, 2));
        for (panel, area) in self.0.iter().zip(&areas) {
            let x_max = panel
                .points
                .iter()
                .map(|p| p.0)
                .fold(0.0, f64::max)
                .max(1e-3);
            let y_max = panel
                .points
                .iter()
                .map(|p| p.1)
                .fold(0.0, f64::max)
                .max(1e-3)
                * 1.1;
            let mut chart = builder(area, text, &panel.title)
                .build_cartesian_2d(0.0..x_max, 0.0..y_max)
                .map_err(|e| e.to_string())?;
            chart
                .draw_series(LineSeries::new(
                    panel.points.iter().copied(),
                    color(0).stroke_width(2),
                ))
                .map_err(|e| e.to_string())?;
            if text {
                chart
                    .configure_mesh()
                    .x_desc("seconds")
                    .draw()
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }
}

struct Report<'a> {
    results: &'a [TargetReport],
    sweep: bool,
}

impl Picture for Report<'_> {
    fn draw_on<DB: DrawingBackend>(&self, root: &Area<DB>, text: bool) -> Result<(), String> {
        draw_on(root, self.results, self.sweep, text)
    }
}

type Area<DB> = DrawingArea<DB, Shift>;

fn draw_on<DB: DrawingBackend>(
    root: &Area<DB>,
    results: &[TargetReport],
    sweep: bool,
    text: bool,
) -> Result<(), String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let targets = target_names(results);
    if sweep {
        let (top, bottom) = root.split_vertically(450);
        let upper = top.split_evenly((1, 2));
        let lower = bottom.split_evenly((1, 2));
        let last = last_rate_results(results);
        rate_curve(
            &upper[0],
            results,
            &targets,
            text,
            "goodput (req/s) vs offered rate",
            |r| r.goodput.unwrap_or(f64::NAN),
        )?;
        rate_curve(
            &upper[1],
            results,
            &targets,
            text,
            "TTFT P95 (ms) vs offered rate",
            |r| r.ttft_ms.p95,
        )?;
        cdf(
            &lower[0],
            &last,
            text,
            "TTFT CDF at the highest rate (ms)",
            |r| &r.ttft_samples,
        )?;
        cdf(
            &lower[1],
            &last,
            text,
            "E2E CDF at the highest rate (ms)",
            |r| &r.e2e_samples,
        )?;
    } else {
        let panels = root.split_evenly((1, 2));
        let refs: Vec<&TargetReport> = results.iter().collect();
        cdf(&panels[0], &refs, text, "TTFT CDF (ms)", |r| {
            &r.ttft_samples
        })?;
        cdf(&panels[1], &refs, text, "E2E CDF (ms)", |r| &r.e2e_samples)?;
    }
    Ok(())
}

fn target_names(results: &[TargetReport]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for r in results {
        if !names.contains(&r.target) {
            names.push(r.target.clone());
        }
    }
    names
}

fn last_rate_results(results: &[TargetReport]) -> Vec<&TargetReport> {
    let top = results
        .iter()
        .filter_map(|r| r.offered_rate)
        .fold(f64::NEG_INFINITY, f64::max);
    results
        .iter()
        .filter(|r| r.offered_rate == Some(top))
        .collect()
}

fn color(i: usize) -> RGBColor {
    let c = Palette99::pick(i).to_rgba();
    RGBColor(c.0, c.1, c.2)
}

type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

fn finish<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
    text: bool,
    x_desc: &str,
    y_desc: &str,
) -> Result<(), String> {
    if text {
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .draw()
            .map_err(|e| e.to_string())?;
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerRight)
            .draw()
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn builder<'a, 'b, DB: DrawingBackend>(
    area: &'a Area<DB>,
    text: bool,
    title: &str,
) -> ChartBuilder<'a, 'b, DB> {
    let mut b = ChartBuilder::on(area);
    b.margin(15);
    if text {
        b.caption(title, (FontFamily::SansSerif, 20))
            .x_label_area_size(40)
            .y_label_area_size(60);
    }
    b
}

fn cdf<DB: DrawingBackend>(
    area: &Area<DB>,
    results: &[&TargetReport],
    text: bool,
    title: &str,
    samples: impl Fn(&TargetReport) -> &Vec<f64>,
) -> Result<(), String> {
    // Clip the x axis at the largest P99.5 so one straggler does not flatten every curve.
    let x_max = results
        .iter()
        .filter_map(|r| percentile(samples(r), 0.995))
        .fold(0.0, f64::max)
        .max(1e-3)
        * 1.05;
    let mut chart = builder(area, text, title)
        .build_cartesian_2d(0.0..x_max, 0.0..1.0)
        .map_err(|e| e.to_string())?;
    for (i, r) in results.iter().enumerate() {
        let s = samples(r);
        let n = s.len();
        if n == 0 {
            continue;
        }
        let step = (n / 1000).max(1);
        let mut points: Vec<(f64, f64)> = (0..n)
            .step_by(step)
            .map(|k| (s[k].min(x_max), (k + 1) as f64 / n as f64))
            .collect();
        points.push((s[n - 1].min(x_max), 1.0));
        let c = color(i);
        let series = chart
            .draw_series(LineSeries::new(points, c.stroke_width(2)))
            .map_err(|e| e.to_string())?;
        if text {
            series.label(r.target.clone()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
            });
        }
    }
    finish(&mut chart, text, "milliseconds", "share of requests")
}

fn rate_curve<DB: DrawingBackend>(
    area: &Area<DB>,
    results: &[TargetReport],
    targets: &[String],
    text: bool,
    title: &str,
    value: impl Fn(&TargetReport) -> f64,
) -> Result<(), String> {
    let points = |t: &str| -> Vec<(f64, f64)> {
        results
            .iter()
            .filter(|r| r.target == t)
            .filter_map(|r| Some((r.offered_rate?, value(r))))
            .filter(|(_, y)| y.is_finite())
            .collect()
    };
    let all: Vec<(f64, f64)> = targets.iter().flat_map(|t| points(t)).collect();
    let x_max = all.iter().map(|p| p.0).fold(0.0, f64::max).max(1e-3) * 1.05;
    let y_max = all.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-3) * 1.1;
    let mut chart = builder(area, text, title)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| e.to_string())?;
    for (i, t) in targets.iter().enumerate() {
        let c = color(i);
        let series = chart
            .draw_series(LineSeries::new(points(t), c.stroke_width(2)))
            .map_err(|e| e.to_string())?;
        if text {
            series.label(t.clone()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
            });
        }
    }
    finish(&mut chart, text, "offered rate (req/s)", "")
}
