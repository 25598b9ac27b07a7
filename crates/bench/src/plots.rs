//! The report's PNG plots: IOPS, MB/s and p99 latency against queue depth,
//! one line per pattern (and target). Text is drawn with a font compiled
//! into the binary (DejaVu Sans Mono, fonts/LICENSE-DejaVu), so a host
//! without fontconfig or any font installed draws the same plots.

use std::path::Path;
use std::sync::Once;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use crate::matrix::Row;
use crate::spec::{Measured, Pattern};

const FONT: &str = "sans-serif";
static FONT_BYTES: &[u8] = include_bytes!("../fonts/DejaVuSansMono.ttf");
const SIZE: (u32, u32) = (900, 560);

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, FONT_BYTES)
            .unwrap_or_else(|_| panic!("the embedded font is a valid TTF"));
    });
}

struct Metric {
    file: &'static str,
    title: &'static str,
    unit: &'static str,
    value: fn(&Measured) -> f64,
}

const METRICS: [Metric; 3] = [
    Metric {
        file: "iops.png",
        title: "IOPS by queue depth",
        unit: "IOPS",
        value: |m| m.iops,
    },
    Metric {
        file: "bandwidth.png",
        title: "Throughput by queue depth",
        unit: "MB/s",
        value: |m| m.mb_per_sec(),
    },
    Metric {
        file: "latency-p99.png",
        title: "p99 latency by queue depth",
        unit: "p99 latency (us)",
        value: |m| m.p99_us,
    },
];

/// Draws every plot into `dir`; returns the file names.
pub fn draw(dir: &Path, rows: &[Row], targets: &[String]) -> Result<Vec<String>> {
    register_font();
    let mut depths: Vec<u32> = rows.iter().map(|r| r.point.depth).collect();
    depths.sort_unstable();
    depths.dedup();
    let mut files = Vec::new();
    for metric in &METRICS {
        let series = series(rows, targets, &depths, metric.value);
        draw_one(&dir.join(metric.file), metric, &depths, &series)
            .map_err(|e| anyhow!("draw {}: {e}", metric.file))?;
        files.push(metric.file.to_string());
    }
    Ok(files)
}

/// One line per pattern and target: (depth index, value) points.
fn series(
    rows: &[Row],
    targets: &[String],
    depths: &[u32],
    value: fn(&Measured) -> f64,
) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut out = Vec::new();
    for pattern in Pattern::ALL {
        for (t, target) in targets.iter().enumerate() {
            let of_pattern: Vec<&Row> =
                rows.iter().filter(|r| r.point.pattern == pattern).collect();
            let line: Vec<(f64, f64)> = of_pattern
                .iter()
                .map(|r| {
                    let x = depths.iter().position(|&d| d == r.point.depth).unwrap_or(0);
                    (x as f64, value(&r.measured[t]))
                })
                .collect();
            let Some(first) = of_pattern.first() else {
                continue;
            };
            let name = if targets.len() > 1 {
                format!("{} {}", first.point.label(), target)
            } else {
                first.point.label()
            };
            out.push((name, line));
        }
    }
    out
}

fn draw_one(
    path: &Path,
    metric: &Metric,
    depths: &[u32],
    series: &[(String, Vec<(f64, f64)>)],
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let top = series
        .iter()
        .flat_map(|(_, l)| l.iter().map(|p| p.1))
        .fold(0.0f64, f64::max)
        .max(1.0)
        * 1.1;
    let last = (depths.len().max(2) - 1) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(metric.title, (FONT, 24))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(90)
        .build_cartesian_2d(-0.2..last + 0.2, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("queue depth")
        .y_desc(metric.unit)
        .x_labels(depths.len().max(2))
        .x_label_formatter(&|x| {
            let i = x.round();
            match depths.get(i as usize) {
                Some(d) if (x - i).abs() < 1e-6 => d.to_string(),
                _ => String::new(),
            }
        })
        .y_label_formatter(&|y| {
            if top > 100.0 {
                format!("{y:.0}")
            } else {
                format!("{y:.1}")
            }
        })
        .label_style((FONT, 14))
        .draw()?;
    for (i, (name, line)) in series.iter().enumerate() {
        let colour = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                line.iter().copied(),
                colour.stroke_width(2),
            ))?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
        chart.draw_series(line.iter().map(|&p| Circle::new(p, 4, colour.filled())))?;
    }
    chart
        .configure_series_labels()
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}
