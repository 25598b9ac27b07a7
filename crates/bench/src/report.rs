//! The report folder's text: report.md (tables, the machine, the plots)
//! and results.json with the same figures for scripts.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::machine::Machine;
use crate::matrix::Row;
use crate::spec::Measured;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TargetRun {
    pub url: String,
    pub engine: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    pub created: String,
    pub runtime_secs: u64,
    pub jobs: u32,
    pub targets: Vec<TargetRun>,
    pub machine: Machine,
    pub rows: Vec<Row>,
    /// The PNG files beside report.md.
    pub plots: Vec<String>,
}

/// The figures of target `t`, one row per point.
pub fn table(rows: &[Row], t: usize) -> String {
    let mut out = String::from(
        "| pattern | QD | jobs | IOPS | MB/s | p50 µs | p99 µs | p99.9 µs | client CPU % |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for row in rows {
        let m = &row.measured[t];
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            row.point.label(),
            row.point.depth,
            row.point.jobs,
            m.iops,
            m.mb_per_sec(),
            m.p50_us,
            m.p99_us,
            m.p999_us,
            m.client_cpu_pct
        );
    }
    out
}

/// First target over second, per point: above 1 the first is faster
/// (IOPS, MB/s) or slower (latency).
pub fn ratio_table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| pattern | QD | IOPS ratio | MB/s ratio | p50 ratio | p99 ratio | p99.9 ratio |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for row in rows {
        let (a, b) = (&row.measured[0], &row.measured[1]);
        let r = |f: fn(&Measured) -> f64| ratio(f(a), f(b));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            row.point.label(),
            row.point.depth,
            r(|m| m.iops),
            r(|m| m.bytes_per_sec),
            r(|m| m.p50_us),
            r(|m| m.p99_us),
            r(|m| m.p999_us),
        );
    }
    out
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}", a / b)
    } else {
        "n/a".into()
    }
}

pub fn markdown(report: &Report) -> String {
    let mut md = format!("# openarray bench, {}\n\n", report.created);
    let _ = writeln!(
        md,
        "{} s per point, {} job(s) per point; latencies run from submission to completion.\n",
        report.runtime_secs, report.jobs
    );
    for (t, target) in report.targets.iter().enumerate() {
        let _ = writeln!(md, "## {}\n\nEngine: {}.\n", target.url, target.engine);
        md.push_str(&table(&report.rows, t));
        md.push('\n');
    }
    if report.targets.len() == 2 {
        let _ = writeln!(
            md,
            "## Ratios: {} / {}\n\nThe two targets ran interleaved, point by point.\n",
            report.targets[0].url, report.targets[1].url
        );
        md.push_str(&ratio_table(&report.rows));
        md.push('\n');
    }
    if !report.plots.is_empty() {
        md.push_str("## Plots\n\n");
        for plot in &report.plots {
            let _ = writeln!(md, "![{plot}]({plot})\n");
        }
    }
    let m = &report.machine;
    let _ = writeln!(
        md,
        "## Client machine\n\n- host: {}\n- CPU: {} ({} logical cores)\n- kernel: {}\n- memory: {:.1} GiB",
        m.hostname, m.cpu_model, m.cores, m.kernel, m.memory_gib
    );
    md
}

pub fn write(dir: &Path, report: &Report) -> Result<()> {
    std::fs::write(dir.join("report.md"), markdown(report))
        .with_context(|| format!("write {}/report.md", dir.display()))?;
    let json = serde_json::to_string_pretty(report).expect("a report serializes");
    std::fs::write(dir.join("results.json"), json + "\n")
        .with_context(|| format!("write {}/results.json", dir.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Pattern, Point};

    fn measured(iops: f64, p99: f64) -> Measured {
        Measured {
            iops,
            bytes_per_sec: iops * 4096.0,
            p50_us: p99 / 2.0,
            p99_us: p99,
            p999_us: p99 * 2.0,
            client_cpu_pct: 12.5,
            ios: iops as u64,
        }
    }

    fn rows() -> Vec<Row> {
        [1, 32]
            .into_iter()
            .map(|depth| Row {
                point: Point {
                    pattern: Pattern::RandRead,
                    depth,
                    jobs: 1,
                    block_size: 4096,
                },
                measured: vec![
                    measured(1000.0 * depth as f64, 50.0),
                    measured(500.0 * depth as f64, 100.0),
                ],
            })
            .collect()
    }

    #[test]
    fn one_line_per_point_with_its_figures() {
        let text = table(&rows(), 0);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert_eq!(
            lines[2],
            "| 4K randread | 1 | 1 | 1000 | 4.1 | 25.0 | 50.0 | 100.0 | 12.5 |"
        );
        assert!(
            lines[3].starts_with("| 4K randread | 32 | 1 | 32000 | 131.1 |"),
            "{text}"
        );
    }

    #[test]
    fn ratios_are_first_over_second() {
        let text = ratio_table(&rows());
        assert!(
            text.contains("| 4K randread | 32 | 2.00 | 2.00 | 0.50 | 0.50 | 0.50 |"),
            "{text}"
        );
        assert_eq!(ratio(1.0, 0.0), "n/a");
    }
}
