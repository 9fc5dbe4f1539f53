//! Line charts as SVG (plotters): one line per run, axes labelled, a legend. SVG text needs
//! no font files, so the charts render the same on any machine.

use crate::summary::human_bytes;
use clap::ValueEnum;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use serde::Serialize;
use std::path::Path;

/// The x axis of the loss plots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum XAxis {
    /// Optimizer steps.
    Step,
    /// Training examples seen by all nodes.
    Examples,
}

impl XAxis {
    /// The axis's label.
    pub fn label(self) -> &'static str {
        match self {
            XAxis::Step => "step",
            XAxis::Examples => "examples seen (all nodes)",
        }
    }

    /// The x of a record at `step` after `examples` examples.
    pub fn value(self, step: usize, examples: u64) -> f64 {
        match self {
            XAxis::Step => step as f64,
            XAxis::Examples => examples as f64,
        }
    }
}

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Its legend entry.
    pub label: String,
    /// `(x, y)` points, in x order.
    pub points: Vec<(f64, f64)>,
}

/// A line chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// Title above the plot.
    pub title: String,
    /// Label of the x axis.
    pub x_label: String,
    /// Label of the y axis.
    pub y_label: String,
    /// Logarithmic x axis (points with x ≤ 0 are left out).
    pub log_x: bool,
    /// X values are byte counts: ticks read `1.00 MiB`.
    pub x_bytes: bool,
    /// The lines.
    pub series: Vec<Series>,
}

/// Why a chart was not drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// No series has a point to draw.
    #[error("chart `{0}` has no points to draw")]
    Empty(String),
    /// The drawing failed (the file could not be written, say).
    #[error("cannot draw chart `{title}`: {why}")]
    Draw {
        /// The chart.
        title: String,
        /// Why.
        why: String,
    },
}

impl Chart {
    /// Draws the chart into an SVG file at `path`.
    pub fn write_svg(&self, path: &Path) -> Result<(), PlotError> {
        let series: Vec<Series> = self
            .series
            .iter()
            .map(|s| Series {
                label: s.label.clone(),
                points: s
                    .points
                    .iter()
                    .copied()
                    .filter(|&(x, y)| x.is_finite() && y.is_finite() && (!self.log_x || x > 0.0))
                    .collect(),
            })
            .collect();
        let all = series.iter().flat_map(|s| s.points.iter());
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in all {
            (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
        }
        if x0 > x1 {
            return Err(PlotError::Empty(self.title.clone()));
        }
        // Room around the data, and a non-empty range when every point is equal.
        let pad = ((y1 - y0) * 0.05).max(y1.abs() * 1e-3).max(1e-9);
        let (y0, y1) = (y0 - pad, y1 + pad);
        let draw_err = |e: String| PlotError::Draw {
            title: self.title.clone(),
            why: e,
        };
        let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(e.to_string()))?;
        if self.log_x {
            let (x0, x1) = if x1 > x0 {
                (x0, x1)
            } else {
                (x0 / 2.0, x1 * 2.0)
            };
            self.draw_on(&root, (x0..x1).log_scale(), y0..y1, &series)
        } else {
            let (x0, x1) = if x1 > x0 {
                (x0, x1)
            } else {
                (x0 - 1.0, x1 + 1.0)
            };
            self.draw_on(&root, x0..x1, y0..y1, &series)
        }
        .map_err(draw_err)?;
        root.present().map_err(|e| draw_err(e.to_string()))
    }

    fn draw_on<X>(
        &self,
        root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
        x: X,
        y: std::ops::Range<f64>,
        series: &[Series],
    ) -> Result<(), String>
    where
        X: AsRangedCoord<Value = f64>,
        X::CoordDescType: ValueFormatter<f64>,
    {
        let e = |e: DrawingAreaErrorKind<_>| e.to_string();
        let x_bytes = self.x_bytes;
        let x_tick = move |v: &f64| {
            if x_bytes { human_bytes(*v) } else { tick(*v) }
        };
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 24))
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(x, y)
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc(&self.x_label)
            .y_desc(&self.y_label)
            .x_label_formatter(&x_tick)
            .y_label_formatter(&|v| tick(*v))
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 18))
            .draw()
            .map_err(e)?;
        for (i, s) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            // Earlier lines drawn wider, so a line that coincides with a later one shows.
            let width = 2 + 2 * (series.len() - 1 - i).min(3) as u32;
            chart
                .draw_series(LineSeries::new(s.points.clone(), color.stroke_width(width)))
                .map_err(e)?
                .label(&s.label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
                });
            chart
                .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(e)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 16))
            .draw()
            .map_err(e)?;
        Ok(())
    }
}

/// Matplotlib's `tab10`: distinct and legible on white.
const COLORS: [RGBColor; 10] = [
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

/// A tick label without trailing zeros: `6`, `0.9995`, `1.5e-5`.
fn tick(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    if v.abs() >= 1e6 || v.abs() < 1e-3 {
        return format!("{v:.2e}");
    }
    let s = format!("{v:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(log_x: bool) -> Chart {
        Chart {
            title: "val loss".into(),
            x_label: "bytes sent per node".into(),
            y_label: "validation loss".into(),
            log_x,
            x_bytes: log_x,
            series: vec![
                Series {
                    label: "allreduce".into(),
                    points: vec![(0.0, 2.3), (1e6, 1.0), (1e8, 0.4)],
                },
                Series {
                    label: "diloco".into(),
                    points: vec![(1e4, 1.2), (1e6, 0.5)],
                },
            ],
        }
    }

    #[test]
    fn a_chart_has_its_labels_legend_and_lines() {
        let dir = std::env::temp_dir().join(format!("gym-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.svg");
        chart(true).write_svg(&path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        for text in [
            "val loss",
            "bytes sent per node",
            "validation loss",
            "allreduce",
            "diloco",
        ] {
            assert!(svg.contains(text), "missing {text}");
        }
        // Each series: its line and its legend mark, in its own colour; the log axis
        // drops the x = 0 point (2 + 2 points), the linear one keeps it (3 + 2).
        let lines = |svg: &str, c: &str| {
            svg.matches(&format!(
                "<polyline fill=\"none\" opacity=\"1\" stroke=\"{c}\""
            ))
            .count()
        };
        let points = |svg: &str, c: &str| {
            svg.matches(&format!("fill=\"{c}\" stroke=\"none\""))
                .count()
        };
        let (first, second) = ("#1F77B4", "#FF7F0E");
        assert_eq!((lines(&svg, first), lines(&svg, second)), (2, 2));
        assert_eq!((points(&svg, first), points(&svg, second)), (2, 2));
        chart(false).write_svg(&path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert_eq!((points(&svg, first), points(&svg, second)), (3, 2));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn ticks_read_plainly() {
        assert_eq!(tick(6.0), "6");
        assert_eq!(tick(0.9995), "0.9995");
        assert_eq!(tick(2.50), "2.5");
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(1.5e-5), "1.50e-5");
        assert_eq!(tick(2.0e7), "2.00e7");
    }

    #[test]
    fn an_empty_chart_is_an_error() {
        let mut c = chart(true);
        c.series.iter_mut().for_each(|s| s.points.clear());
        let path = std::env::temp_dir().join("gym-plot-empty.svg");
        assert!(matches!(c.write_svg(&path), Err(PlotError::Empty(_))));
    }
}
