//! fio as the load engine: which fio has which engine, the command line of
//! one point, and its `--output-format=json` read back.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::spec::{Measured, Point};
use crate::url::Target;

/// Where bench/fio-libiscsi.sh keeps the fio it builds with libiscsi.
const BUILT_FIO_DIR: &str = "target/bench-tools";

/// Whether `fio` lists `engine` in `--enghelp`.
pub fn has_engine(fio: &Path, engine: &str) -> bool {
    Command::new(fio)
        .arg("--enghelp")
        .output()
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .any(|l| l.trim() == engine)
        })
        .unwrap_or(false)
}

/// The fio that has `engine`: `$OPENARRAY_FIO`, fio on PATH, then the one
/// bench/fio-libiscsi.sh builds (looked for from the current directory up,
/// so a run from anywhere in the source tree finds it).
pub fn find_with_engine(engine: &str) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(path) = std::env::var_os("OPENARRAY_FIO") {
        candidates.push(path.into());
    }
    if let Some(paths) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&paths).map(|d| d.join("fio")));
    }
    if let Ok(cwd) = std::env::current_dir() {
        for dir in cwd.ancestors() {
            if let Ok(entries) = std::fs::read_dir(dir.join(BUILT_FIO_DIR)) {
                candidates.extend(entries.flatten().map(|e| e.path().join("fio")));
            }
        }
    }
    candidates
        .into_iter()
        .find(|p| p.is_file() && has_engine(p, engine))
}

/// fio's arguments for one point against `target` with `engine`.
pub fn args(
    target: &Target,
    engine: &str,
    point: Point,
    runtime: u64,
    size: Option<u64>,
) -> Vec<String> {
    let mut args = vec![
        format!("--name={}-qd{}", point.pattern.fio_rw(), point.depth),
        format!("--ioengine={engine}"),
        format!("--rw={}", point.pattern.fio_rw()),
        format!("--bs={}", point.block_size),
        format!("--iodepth={}", point.depth),
        format!("--numjobs={}", point.jobs),
        format!("--runtime={runtime}"),
        "--time_based".into(),
        "--group_reporting".into(),
        "--direct=1".into(),
        "--randrepeat=0".into(),
        // Submission to completion: libiscsi queues inside the library,
        // and fio's clat starts only once it hands a command over.
        "--lat_percentiles=1".into(),
        "--output-format=json".into(),
    ];
    if let Some(size) = size {
        args.push(format!("--size={size}"));
    }
    if !point.pattern.is_random() && point.jobs > 1 && size.is_none() {
        // Sequential jobs each take their own stretch instead of reading
        // the same blocks one after the other.
        let share = 100 / point.jobs;
        args.push(format!("--offset_increment={share}%"));
        args.push(format!("--size={share}%"));
    }
    match target {
        Target::Nbd { .. } | Target::NbdUnix { .. } => args.push(format!("--uri={target}")),
        // fio splits --filename at ':'; the URL's own colons are escaped.
        // (NVMe/TCP URLs go to the built-in host, never to fio.)
        Target::Iscsi { .. } | Target::Nvmf { .. } => args.push(format!(
            "--filename={}",
            target.to_string().replace(':', "\\:")
        )),
    }
    args
}

/// Runs fio and reads its figures; fio's own words on failure.
pub fn run(fio: &Path, args: &[String]) -> Result<Measured> {
    let out = Command::new(fio)
        .args(args)
        .output()
        .with_context(|| format!("run {}", fio.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "fio failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            stdout.trim()
        );
    }
    parse(&stdout)
}

/// The figures of fio's JSON output (one group: `--group_reporting`).
/// Engines print lines of their own before the JSON (the nbd engine's
/// "connected"), so reading starts at the first line that opens an object.
pub fn parse(output: &str) -> Result<Measured> {
    let start = output
        .find("\n{")
        .map(|i| i + 1)
        .or_else(|| output.starts_with('{').then_some(0))
        .context("no JSON in fio's output")?;
    let doc: Value = serde_json::from_str(&output[start..]).context("fio's JSON")?;
    let job = doc["jobs"].get(0).context("fio's JSON has no job")?;
    if let Some(err) = job["error"].as_i64().filter(|&e| e != 0) {
        bail!("fio's job ended with error {err}");
    }
    // The point reads or writes only: the busy direction is its figures.
    let dir = ["read", "write"]
        .into_iter()
        .map(|d| &job[d])
        .max_by_key(|d| d["total_ios"].as_u64().unwrap_or(0))
        .expect("two directions");
    let ios = dir["total_ios"].as_u64().unwrap_or(0);
    // lat_ns has percentiles with --lat_percentiles=1; clat_ns otherwise.
    let percentiles = ["lat_ns", "clat_ns"]
        .into_iter()
        .map(|k| &dir[k]["percentile"])
        .find(|p| p.is_object())
        .unwrap_or(&Value::Null);
    let percentile = |p: &str| -> f64 { percentiles[p].as_f64().unwrap_or(0.0) / 1000.0 };
    let number = |v: &Value, what: &str| -> Result<f64> {
        v.as_f64()
            .with_context(|| format!("fio's JSON has no {what}"))
    };
    Ok(Measured {
        iops: number(&dir["iops"], "iops")?,
        bytes_per_sec: number(&dir["bw_bytes"], "bw_bytes")?,
        p50_us: percentile("50.000000"),
        p99_us: percentile("99.000000"),
        p999_us: percentile("99.900000"),
        client_cpu_pct: number(&job["usr_cpu"], "usr_cpu")? + number(&job["sys_cpu"], "sys_cpu")?,
        ios,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Pattern;

    #[test]
    fn reads_a_real_nbd_run() {
        let m = parse(include_str!("testdata/fio-nbd-randread.json")).unwrap();
        assert_eq!(m.ios, 84016);
        assert!((m.iops - 83932.067932).abs() < 1e-6, "{m:?}");
        assert_eq!(m.bytes_per_sec, 343785750.0);
        assert!((m.client_cpu_pct - 30.7).abs() < 1e-9, "{m:?}");
        assert!(
            m.p50_us > 0.0 && m.p50_us <= m.p99_us && m.p99_us <= m.p999_us,
            "{m:?}"
        );
    }

    #[test]
    fn write_figures_come_from_the_write_side() {
        let json = r#"{"jobs":[{"error":0,"usr_cpu":1.5,"sys_cpu":2.0,
            "read":{"total_ios":0,"iops":0.0,"bw_bytes":0,"clat_ns":{}},
            "write":{"total_ios":10,"iops":10.0,"bw_bytes":40960,
              "clat_ns":{"percentile":{"50.000000":1000,"99.000000":2000,"99.900000":3000}}}}]}"#;
        let m = parse(json).unwrap();
        assert_eq!(
            (m.iops, m.p50_us, m.p99_us, m.p999_us),
            (10.0, 1.0, 2.0, 3.0)
        );
        assert_eq!(m.client_cpu_pct, 3.5);
    }

    #[test]
    fn a_failed_job_or_no_json_is_an_error() {
        assert!(parse("fio: engine nbd not loadable").is_err());
        let failed = r#"{"jobs":[{"error":5,"usr_cpu":0,"sys_cpu":0,"read":{},"write":{}}]}"#;
        assert!(parse(failed).unwrap_err().to_string().contains("error 5"));
    }

    #[test]
    fn iscsi_urls_are_escaped_for_fio() {
        let target = Target::parse("iscsi://127.0.0.1:3260/iqn.x:y/0").unwrap();
        let point = Point {
            pattern: Pattern::RandWrite,
            depth: 32,
            jobs: 1,
            block_size: 4096,
        };
        let args = args(&target, "libiscsi", point, 5, None);
        assert!(args.contains(&"--filename=iscsi\\://127.0.0.1\\:3260/iqn.x\\:y/0".to_string()));
        assert!(args.contains(&"--rw=randwrite".to_string()));
        assert!(args.contains(&"--iodepth=32".to_string()));
    }
}
