//! Charts of the scenarios, drawn with plotters into an SVG and a PNG of the same
//! layout: a title and a subtitle (machine, durability, emulation, commit), one
//! or more panels (lines or grouped bars), and one legend for all of them (a
//! series keeps its colour in every panel).
//!
//! Text is set in DejaVu Sans, compiled in (the `dejavu` crate), so the charts
//! render the same on a machine without any font installed.

use super::BenchResult;
use plotters::coord::combinators::WithKeyPoints;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{register_font, FontStyle};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A line series.
#[derive(Clone, Debug, Default)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

impl Series {
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.into(),
            points,
        }
    }
}

/// A panel of lines. Linear axes start at zero; on a log axis points that are
/// not positive are left out.
#[derive(Clone, Debug)]
pub struct Lines {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_log: bool,
    pub y_log: bool,
    pub series: Vec<Series>,
    /// A right-hand axis (label, series); linear axes only.
    pub y2: Option<(String, Vec<Series>)>,
    /// Vertical marks: a thin line at x with a label at the top.
    pub marks: Vec<(f64, String)>,
    /// A dot on every point (off for dense series such as CDFs).
    pub markers: bool,
}

impl Default for Lines {
    fn default() -> Lines {
        Lines {
            title: String::new(),
            x_label: String::new(),
            y_label: String::new(),
            x_log: false,
            y_log: false,
            series: Vec::new(),
            y2: None,
            marks: Vec::new(),
            markers: true,
        }
    }
}

/// A panel of grouped bars: one group per label, one bar per series in each.
#[derive(Clone, Debug, Default)]
pub struct Bars {
    pub title: String,
    pub y_label: String,
    pub groups: Vec<String>,
    /// (series name, one value per group; None = no bar).
    pub series: Vec<(String, Vec<Option<f64>>)>,
}

#[derive(Clone, Debug)]
pub enum Panel {
    Lines(Lines),
    Bars(Bars),
}

#[derive(Clone, Debug)]
pub struct Chart {
    pub title: String,
    pub subtitle: String,
    pub panels: Vec<Panel>,
}

const TITLE_H: u32 = 66;
const LEGEND_ROW_H: u32 = 24;

/// Width of a legend entry: the line sample, the name (DejaVu Sans at 15 px is
/// under 9 px per character on average) and a gap.
fn legend_item_w(name: &str) -> i32 {
    36 + (name.chars().count() as f64 * 8.6) as i32 + 28
}
/// Tableau 10: distinguishable, also in grey print.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

impl Chart {
    fn columns(&self) -> u32 {
        if self.panels.len() > 1 {
            2
        } else {
            1
        }
    }

    fn width(&self) -> u32 {
        if self.columns() == 1 {
            1100
        } else {
            1400
        }
    }

    /// Every series name, in order of first appearance (legend order, colours).
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        let mut add = |n: &str| {
            if !names.iter().any(|m| m == n) {
                names.push(n.to_string());
            }
        };
        for p in &self.panels {
            match p {
                Panel::Lines(l) => {
                    l.series.iter().for_each(|s| add(&s.name));
                    if let Some((_, s2)) = &l.y2 {
                        s2.iter().for_each(|s| add(&s.name));
                    }
                }
                Panel::Bars(b) => b.series.iter().for_each(|(n, _)| add(n)),
            }
        }
        names
    }

    /// Where each legend entry goes: (x, row), entries flowing left to right.
    fn legend_layout(&self) -> Vec<(i32, i32)> {
        let right = self.width() as i32 - 16;
        let (mut x, mut row) = (16, 0);
        self.names()
            .iter()
            .map(|n| {
                let w = legend_item_w(n);
                if x > 16 && x + w > right {
                    x = 16;
                    row += 1;
                }
                let at = (x, row);
                x += w;
                at
            })
            .collect()
    }

    fn legend_h(&self) -> u32 {
        let rows = self.legend_layout().last().map_or(0, |&(_, r)| r + 1);
        rows as u32 * LEGEND_ROW_H + 18
    }

    fn size(&self) -> (u32, u32) {
        let rows = (self.panels.len() as u32).div_ceil(self.columns()).max(1);
        let panel_h = if self.columns() == 1 { 580 } else { 470 };
        (self.width(), TITLE_H + rows * panel_h + self.legend_h())
    }
}

/// DejaVu Sans as plotters' "sans-serif" (once per process).
fn register_fonts() -> BenchResult<()> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let bad = |_| "the compiled-in DejaVu Sans font did not parse".to_string();
        register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular()).map_err(bad)?;
        register_font("sans-serif", FontStyle::Bold, dejavu::sans::bold()).map_err(bad)?;
        Ok(())
    })
    .clone()
}

/// Writes `dir/name.svg` and `dir/name.png`.
pub fn write(chart: &Chart, dir: &Path, name: &str) -> BenchResult<(PathBuf, PathBuf)> {
    register_fonts()?;
    let size = chart.size();
    let svg = dir.join(format!("{name}.svg"));
    let png = dir.join(format!("{name}.png"));
    {
        let root = SVGBackend::new(&svg, size).into_drawing_area();
        draw(&root, chart)
            .and_then(|()| root.present().map_err(err))
            .map_err(|e| format!("{}: {e}", svg.display()))?;
    }
    {
        let root = BitMapBackend::new(&png, size).into_drawing_area();
        draw(&root, chart)
            .and_then(|()| root.present().map_err(err))
            .map_err(|e| format!("{}: {e}", png.display()))?;
    }
    Ok((svg, png))
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// `1234567.0` -> `1.23M`; small numbers keep up to two significant decimals.
pub fn short(v: f64) -> String {
    let a = v.abs();
    let (x, unit) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e4 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let s = if x == x.round() || x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else if x.abs() >= 0.01 {
        format!("{x:.2}")
    } else {
        format!("{x:.1e}")
    };
    let s = if s.contains('.') && !s.contains('e') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    format!("{s}{unit}")
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, c: &Chart) -> Result<(), String> {
    root.fill(&WHITE).map_err(err)?;
    let names = c.names();
    let color = |name: &str| {
        let i = names.iter().position(|n| n == name).unwrap_or(0);
        PALETTE[i % PALETTE.len()]
    };
    let (_, h) = root.dim_in_pixel();
    let (top, rest) = root.split_vertically(TITLE_H);
    top.draw(&Text::new(
        c.title.clone(),
        (16, 10),
        ("sans-serif", 22)
            .into_font()
            .style(FontStyle::Bold)
            .color(&BLACK),
    ))
    .map_err(err)?;
    top.draw(&Text::new(
        c.subtitle.clone(),
        (16, 40),
        ("sans-serif", 14).into_font().color(&RGBColor(80, 80, 80)),
    ))
    .map_err(err)?;
    let body_h = h - TITLE_H - c.legend_h();
    let (body, legend) = rest.split_vertically(body_h);
    let cols = c.columns() as usize;
    let rows = c.panels.len().div_ceil(cols).max(1);
    let areas = body.split_evenly((rows, cols));
    for (area, p) in areas.iter().zip(&c.panels) {
        match p {
            Panel::Lines(l) => lines(area, l, &color)?,
            Panel::Bars(b) => bars(area, b, &color)?,
        }
    }
    for (name, (x, row)) in names.iter().zip(c.legend_layout()) {
        let y = 12 + row * LEGEND_ROW_H as i32;
        let col = color(name);
        legend
            .draw(&PathElement::new(
                vec![(x, y), (x + 28, y)],
                col.stroke_width(3),
            ))
            .map_err(err)?;
        legend
            .draw(&Circle::new((x + 14, y), 4, col.filled()))
            .map_err(err)?;
        legend
            .draw(&Text::new(
                name.clone(),
                (x + 36, y - 8),
                ("sans-serif", 15).into_font().color(&BLACK),
            ))
            .map_err(err)?;
    }
    Ok(())
}

/// The axis range of `vals`: from zero (or the smallest value if negative) on a
/// linear axis, a factor beyond both ends on a log axis.
fn span(vals: impl Iterator<Item = f64>, log: bool) -> (f64, f64) {
    let (lo, hi) = vals
        .filter(|v| v.is_finite() && (!log || *v > 0.0))
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if !lo.is_finite() {
        return if log { (1.0, 10.0) } else { (0.0, 1.0) };
    }
    if log {
        (lo / 1.6, hi * 1.6)
    } else {
        let lo = lo.min(0.0);
        let pad = if hi > lo { (hi - lo) * 0.08 } else { 1.0 };
        (lo, hi + pad)
    }
}

fn keep(p: &Lines) -> impl Fn(&(f64, f64)) -> bool + '_ {
    |&(x, y)| x.is_finite() && y.is_finite() && (!p.x_log || x > 0.0) && (!p.y_log || y > 0.0)
}

fn lines<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &Lines,
    color: &dyn Fn(&str) -> RGBColor,
) -> Result<(), String> {
    let pts = || p.series.iter().flat_map(|s| s.points.iter().copied());
    let (x0, x1) = span(pts().map(|q| q.0), p.x_log);
    let (y0, y1) = span(pts().map(|q| q.1), p.y_log);
    if let Some(y2) = &p.y2 {
        return dual(area, p, (x0..x1, y0..y1), y2, color);
    }
    match (p.x_log, p.y_log) {
        (false, false) => lines_in(area, p, x0..x1, y0..y1, color),
        (true, false) => lines_in(area, p, log_axis(x0, x1), y0..y1, color),
        (false, true) => lines_in(area, p, x0..x1, log_axis(y0, y1), color),
        (true, true) => lines_in(area, p, log_axis(x0, x1), log_axis(y0, y1), color),
    }
}

/// A log axis with ticks at 1-2-5 steps (more when the range is narrow, powers
/// of ten only when it is wide) and light lines at every integer multiple.
fn log_axis(lo: f64, hi: f64) -> WithKeyPoints<LogCoord<f64>> {
    let (bold, light) = log_ticks(lo, hi);
    (lo..hi)
        .log_scale()
        .with_key_points(bold)
        .with_light_points(light)
}

fn log_ticks(lo: f64, hi: f64) -> (Vec<f64>, Vec<f64>) {
    let first = lo.log10().floor() as i32;
    let last = hi.log10().ceil() as i32;
    let at = |ms: &[f64]| -> Vec<f64> {
        (first..=last)
            // m / 10^-k rather than m * 10^k: 0.6, not 0.6000000000000001.
            .flat_map(|k| {
                ms.iter().map(move |m| {
                    if k >= 0 {
                        m * 10f64.powi(k)
                    } else {
                        m / 10f64.powi(-k)
                    }
                })
            })
            .filter(|v| (lo..=hi).contains(v))
            .collect()
    };
    let all: Vec<f64> = (1..=9).map(f64::from).collect();
    let mut bold = at(&[1.0, 2.0, 5.0]);
    if bold.len() > 8 {
        bold = at(&[1.0]);
    } else if bold.len() < 3 {
        bold = at(&all);
    }
    let light = at(&all).into_iter().filter(|v| !bold.contains(v)).collect();
    (bold, light)
}

type Ctx2<'a, 'b, DB, X, Y> = ChartContext<'a, DB, Cartesian2d<X, Y>>;

fn builder<'a, 'b, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    title: &'b str,
) -> ChartBuilder<'a, 'b, DB> {
    let mut b = ChartBuilder::on(area);
    b.caption(title, ("sans-serif", 17))
        .margin(14)
        .x_label_area_size(50)
        .y_label_area_size(80);
    b
}

fn lines_in<DB, X, Y>(
    area: &DrawingArea<DB, Shift>,
    p: &Lines,
    x: X,
    y: Y,
    color: &dyn Fn(&str) -> RGBColor,
) -> Result<(), String>
where
    DB: DrawingBackend,
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = builder(area, &p.title)
        .build_cartesian_2d(x, y)
        .map_err(err)?;
    mesh(&mut chart, &p.x_label, &p.y_label)?;
    series(&mut chart, p, color)?;
    marks(&mut chart, &p.marks)
}

/// Lines with a right-hand axis (linear axes).
fn dual<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &Lines,
    (x, y): (std::ops::Range<f64>, std::ops::Range<f64>),
    (label2, series2): &(String, Vec<Series>),
    color: &dyn Fn(&str) -> RGBColor,
) -> Result<(), String> {
    let (a, b) = span(
        series2.iter().flat_map(|s| s.points.iter().map(|q| q.1)),
        false,
    );
    let mut chart = builder(area, &p.title)
        .right_y_label_area_size(70)
        .build_cartesian_2d(x.clone(), y)
        .map_err(err)?
        .set_secondary_coord(x, a..b);
    mesh(&mut chart, &p.x_label, &p.y_label)?;
    chart
        .configure_secondary_axes()
        .y_desc(label2.as_str())
        .y_label_formatter(&|v| short(*v))
        .axis_desc_style(("sans-serif", 15))
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    series(&mut chart, p, color)?;
    for s in series2 {
        let c = color(&s.name);
        chart
            .draw_secondary_series(LineSeries::new(s.points.clone(), c.stroke_width(2)))
            .map_err(err)?;
        if p.markers {
            chart
                .draw_secondary_series(s.points.iter().map(|&q| Circle::new(q, 3, c.filled())))
                .map_err(err)?;
        }
    }
    marks(&mut chart, &p.marks)
}

fn mesh<DB, X, Y>(
    chart: &mut Ctx2<'_, '_, DB, X, Y>,
    x_label: &str,
    y_label: &str,
) -> Result<(), String>
where
    DB: DrawingBackend,
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&|v| short(*v))
        .y_label_formatter(&|v| short(*v))
        .axis_desc_style(("sans-serif", 15))
        .label_style(("sans-serif", 13))
        .light_line_style(BLACK.mix(0.04))
        .bold_line_style(BLACK.mix(0.12))
        .draw()
        .map_err(err)
}

fn series<DB, X, Y>(
    chart: &mut Ctx2<'_, '_, DB, X, Y>,
    p: &Lines,
    color: &dyn Fn(&str) -> RGBColor,
) -> Result<(), String>
where
    DB: DrawingBackend,
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    for s in &p.series {
        let c = color(&s.name);
        let pts: Vec<(f64, f64)> = s.points.iter().copied().filter(keep(p)).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
            .map_err(err)?;
        if p.markers {
            chart
                .draw_series(pts.iter().map(|&q| Circle::new(q, 4, c.filled())))
                .map_err(err)?;
        }
    }
    Ok(())
}

fn marks<DB, X, Y>(
    chart: &mut Ctx2<'_, '_, DB, X, Y>,
    marks: &[(f64, String)],
) -> Result<(), String>
where
    DB: DrawingBackend,
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    if marks.is_empty() {
        return Ok(());
    }
    let y = chart.y_range();
    let grey = RGBColor(120, 120, 120);
    for (x, label) in marks {
        chart
            .draw_series(LineSeries::new(
                vec![(*x, y.start), (*x, y.end)],
                grey.mix(0.5).stroke_width(1),
            ))
            .map_err(err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                label.clone(),
                (*x, y.end),
                ("sans-serif", 13).into_font().color(&grey),
            )))
            .map_err(err)?;
    }
    Ok(())
}

fn bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    b: &Bars,
    color: &dyn Fn(&str) -> RGBColor,
) -> Result<(), String> {
    let n = b.groups.len().max(1);
    let (_, top) = span(
        b.series
            .iter()
            .flat_map(|(_, v)| v.iter().flatten().copied()),
        false,
    );
    let mut chart = builder(area, &b.title)
        .build_cartesian_2d(-0.5..n as f64 - 0.5, 0.0..top * 1.08)
        .map_err(err)?;
    let group = |v: &f64| {
        let r = v.round();
        if (v - r).abs() < 1e-6 && r >= 0.0 && (r as usize) < b.groups.len() {
            b.groups[r as usize].clone()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&group)
        .y_desc(b.y_label.as_str())
        .y_label_formatter(&|v| short(*v))
        .axis_desc_style(("sans-serif", 15))
        .label_style(("sans-serif", 13))
        .light_line_style(BLACK.mix(0.04))
        .bold_line_style(BLACK.mix(0.12))
        .draw()
        .map_err(err)?;
    let w = 0.8 / b.series.len().max(1) as f64;
    for (j, (name, vals)) in b.series.iter().enumerate() {
        let c = color(name);
        let bars: Vec<(f64, f64)> = vals
            .iter()
            .enumerate()
            .filter_map(|(i, v)| {
                v.filter(|v| v.is_finite())
                    .map(|v| (i as f64 - 0.4 + j as f64 * w, v))
            })
            .collect();
        chart
            .draw_series(
                bars.iter()
                    .map(|&(x0, v)| Rectangle::new([(x0, 0.0), (x0 + w * 0.9, v)], c.filled())),
            )
            .map_err(err)?;
        chart
            .draw_series(bars.iter().map(|&(x0, v)| {
                Text::new(
                    short(v),
                    (x0, v),
                    ("sans-serif", 11)
                        .into_font()
                        .color(&BLACK)
                        .pos(Pos::new(HPos::Left, VPos::Bottom)),
                )
            }))
            .map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_numbers() {
        assert_eq!(short(0.0), "0");
        assert_eq!(short(2.5), "2.5");
        assert_eq!(short(0.126), "0.13");
        assert_eq!(short(15.26), "15.3");
        assert_eq!(short(1000.0), "1000");
        assert_eq!(short(12_500.0), "12.5k");
        assert_eq!(short(3_000_000.0), "3M");
        assert_eq!(short(0.001), "1.0e-3");
    }

    #[test]
    fn log_ticks_fit_the_range() {
        let (bold, light) = log_ticks(0.4, 1.6);
        assert_eq!(bold, vec![0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]);
        assert!(light.is_empty());
        let (bold, light) = log_ticks(0.6, 25.0);
        assert_eq!(bold, vec![1.0, 2.0, 5.0, 10.0, 20.0]);
        assert!(light.contains(&3.0) && light.contains(&0.7));
        let (bold, _) = log_ticks(50.0, 2e7);
        assert_eq!(bold, vec![100.0, 1e3, 1e4, 1e5, 1e6, 1e7]);
    }

    #[test]
    fn spans() {
        assert_eq!(span([2.0, 4.0].into_iter(), false), (0.0, 4.0 + 4.0 * 0.08));
        let (a, b) = span([10.0, 1000.0, -1.0].into_iter(), true);
        assert!(a < 10.0 && a > 0.0 && b > 1000.0);
        assert_eq!(span(std::iter::empty(), true), (1.0, 10.0));
    }
}
