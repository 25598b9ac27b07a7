//! `openarray stat`: iostat for the array. Every interval it reads the
//! daemon's counters (`GET /v1/stats`), subtracts the previous reading and
//! prints, per target, LUN and initiator that did I/O: commands and
//! megabytes per second, latency percentiles of the interval's commands
//! (from the histograms, not averages) and the mean queue depth.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use clap::Args;
use stats::{EntrySnapshot, OpSnapshot};

use crate::api_client::{call, ApiArgs, Endpoint};

#[derive(Args)]
pub struct StatArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// Seconds between reports.
    #[arg(long, short, value_name = "SECONDS", default_value_t = 1.0)]
    interval: f64,
    /// Stop after this many reports (default: run until interrupted).
    #[arg(long, short = 'n', value_name = "N")]
    count: Option<u64>,
    /// Only this target (IQN).
    #[arg(long, value_name = "IQN")]
    target: Option<String>,
    /// Only this LUN.
    #[arg(long, value_name = "LUN")]
    lun: Option<u64>,
    /// Only this initiator (IQN).
    #[arg(long, value_name = "IQN")]
    initiator: Option<String>,
    /// Also list LUNs and initiators without I/O in the interval.
    #[arg(long)]
    all: bool,
}

impl StatArgs {
    fn wants(&self, e: &EntrySnapshot) -> bool {
        self.target
            .as_deref()
            .is_none_or(|t| t.eq_ignore_ascii_case(&e.target))
            && self.lun.is_none_or(|l| l == e.lun)
            && self
                .initiator
                .as_deref()
                .is_none_or(|i| i.eq_ignore_ascii_case(&e.initiator))
    }
}

fn fetch(api: &Endpoint) -> anyhow::Result<Vec<EntrySnapshot>> {
    let (status, json) = call(api, "GET", "/v1/stats", b"", None)?;
    if status != 200 {
        return Err(anyhow!(
            "{}",
            json["error"].as_str().unwrap_or("the daemon refused")
        ));
    }
    serde_json::from_value(json["entries"].clone()).context("malformed statistics from the daemon")
}

type Key = (String, u64, String);

fn key(e: &EntrySnapshot) -> Key {
    (e.target.clone(), e.lun, e.initiator.clone())
}

/// Microseconds, as a column: `-` without samples.
fn micros(op: &OpSnapshot, q: f64) -> String {
    match op.latency.quantile(q) {
        Some(ns) => format!("{:.1}", ns as f64 / 1000.0),
        None => "-".into(),
    }
}

const HEADER: &str = "  lun initiator                                   r/s      w/s   rMB/s   wMB/s  r_p50us  r_p99us r_p999us  w_p50us  w_p99us w_p999us  aqu-sz  inflight";

/// One report: what happened between `before` and `now`, `seconds` apart.
fn report(
    args: &StatArgs,
    before: &[EntrySnapshot],
    now: &[EntrySnapshot],
    seconds: f64,
) -> String {
    let earlier: HashMap<Key, &EntrySnapshot> = before.iter().map(|e| (key(e), e)).collect();
    let empty = EntrySnapshot::default();
    let mut out = String::new();
    let mut target = None;
    for e in now.iter().filter(|e| args.wants(e)) {
        let d = e.since(earlier.get(&key(e)).copied().unwrap_or(&empty));
        let busy = d.read.commands + d.write.commands + d.other.commands > 0;
        if !busy && !args.all && e.in_flight == 0 {
            continue;
        }
        if target != Some(&e.target) {
            out.push_str(&format!("target {}\n{HEADER}\n", e.target));
            target = Some(&e.target);
        }
        let rate = |n: u64| n as f64 / seconds;
        out.push_str(&format!(
            "{:>5} {:<40} {:>8.1} {:>8.1} {:>7.2} {:>7.2} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7.2} {:>9}\n",
            e.lun,
            e.initiator,
            rate(d.read.commands),
            rate(d.write.commands),
            rate(d.read.bytes) / 1e6,
            rate(d.write.bytes) / 1e6,
            micros(&d.read, 0.5),
            micros(&d.read, 0.99),
            micros(&d.read, 0.999),
            micros(&d.write, 0.5),
            micros(&d.write, 0.99),
            micros(&d.write, 0.999),
            d.mean_queue_depth(seconds),
            e.in_flight,
        ));
    }
    if out.is_empty() {
        out.push_str("no I/O\n");
    }
    out
}

fn run_inner(args: &StatArgs) -> anyhow::Result<()> {
    if !(args.interval.is_finite() && args.interval > 0.0) {
        return Err(anyhow!("--interval must be a positive number of seconds"));
    }
    let interval = Duration::from_secs_f64(args.interval);
    let api = args.api.endpoint()?;
    let mut before = fetch(&api)?;
    let mut taken = Instant::now();
    let mut reports = 0;
    while args.count.is_none_or(|n| reports < n) {
        std::thread::sleep(interval.saturating_sub(taken.elapsed()));
        let now = fetch(&api)?;
        let at = Instant::now();
        let seconds = at.duration_since(taken).as_secs_f64();
        print!("{}", report(args, &before, &now, seconds));
        println!();
        before = now;
        taken = at;
        reports += 1;
    }
    Ok(())
}

pub fn run(args: StatArgs) -> ExitCode {
    match run_inner(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => crate::output::fail(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stats::{LunStats, OpKind};
    use std::path::PathBuf;

    fn args() -> StatArgs {
        StatArgs {
            api: ApiArgs {
                socket: PathBuf::new(),
                api: None,
                token_file: None,
            },
            interval: 1.0,
            count: None,
            target: None,
            lun: None,
            initiator: None,
            all: false,
        }
    }

    #[test]
    fn reports_the_interval_per_lun_and_initiator() {
        let busy = LunStats::default();
        let idle = LunStats::default();
        for _ in 0..10 {
            busy.begin();
            busy.end(OpKind::Read, 4096, 100_000, true);
        }
        idle.begin();
        idle.end(OpKind::Read, 512, 1_000, true);
        let before = vec![
            busy.snapshot("iqn.t", 0, "iqn.a"),
            idle.snapshot("iqn.t", 1, "iqn.b"),
        ];
        for _ in 0..200 {
            busy.begin();
            busy.end(OpKind::Read, 4096, 1_000_000, true);
            busy.begin();
            busy.end(OpKind::Write, 8192, 2_000_000, true);
        }
        let now = vec![
            busy.snapshot("iqn.t", 0, "iqn.a"),
            idle.snapshot("iqn.t", 1, "iqn.b"),
        ];
        let text = report(&args(), &before, &now, 2.0);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "target iqn.t");
        assert_eq!(lines.len(), 3, "{text}");
        let cols: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(&cols[..6], ["0", "iqn.a", "100.0", "100.0", "0.41", "0.82"]);
        // Percentiles of this interval only: 1 ms reads, not the earlier 100 us.
        let p50: f64 = cols[6].parse().unwrap();
        assert!((1000.0..1070.0).contains(&p50), "{text}");
        let w_p999: f64 = cols[11].parse().unwrap();
        assert!((2000.0..2130.0).contains(&w_p999), "{text}");
        // 200 x 1 ms + 200 x 2 ms in 2 s: 0.3 in flight on average.
        assert_eq!(cols[12], "0.30");

        let mut all = args();
        all.all = true;
        assert_eq!(report(&all, &before, &now, 2.0).lines().count(), 4);
        let mut other = args();
        other.lun = Some(7);
        assert_eq!(report(&other, &before, &now, 2.0), "no I/O\n");
    }
}
