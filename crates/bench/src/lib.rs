//! `openarray bench`: a fio-style matrix (4K random and 1M sequential
//! reads and writes over queue depths) against an iSCSI, NVMe/TCP or NBD URL, or
//! two of them interleaved, written up as a report folder.

pub mod engine;
pub mod fio;
pub mod iscsi_load;
pub mod iscsi_pdu;
pub mod iscsi_session;
pub mod machine;
pub mod matrix;
pub mod nbd_client;
pub mod nvmf_load;
pub mod plots;
pub mod probe;
pub mod report;
pub mod spec;
pub mod url;

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use engine::Driver;
use report::{Report, TargetRun};
use spec::Pattern;
use url::Target;

pub struct Options {
    /// The target, and the one it is compared with.
    pub urls: Vec<String>,
    pub patterns: Vec<Pattern>,
    pub depths: Vec<u32>,
    pub jobs: u32,
    /// Bytes per sequential I/O (random ones are 4 KiB).
    pub seq_block_size: u64,
    pub runtime: u64,
    /// Bytes of the device each job covers; all of it without.
    pub size: Option<u64>,
    pub out: Option<PathBuf>,
    pub destroy_data: bool,
}

/// Runs the matrix and writes the report folder; returns its path.
pub fn run(opts: &Options) -> Result<PathBuf> {
    if opts.depths.is_empty() || opts.patterns.is_empty() || opts.jobs == 0 || opts.runtime == 0 {
        bail!("the matrix is empty: give depths, patterns, jobs and runtime above zero");
    }
    if opts.seq_block_size == 0 || !opts.seq_block_size.is_multiple_of(4096) {
        bail!("the sequential block size must be a multiple of 4K");
    }
    let drivers = opts
        .urls
        .iter()
        .map(|u| Driver::choose(&Target::parse(u)?))
        .collect::<Result<Vec<_>>>()?;
    for d in &drivers {
        eprintln!("{}: {}", d.target, d.describe());
    }
    let points = spec::points(&opts.patterns, &opts.depths, opts.jobs, opts.seq_block_size);
    let plan = matrix::Plan {
        drivers: &drivers,
        points: &points,
        runtime: opts.runtime,
        size: opts.size,
        destroy_data: opts.destroy_data,
    };
    matrix::guard(&plan)?;
    let created = local_time("%Y-%m-%d %H:%M:%S");
    let dir = opts
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("bench-{}", local_time("%Y%m%d-%H%M%S"))));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let rows = matrix::run(&plan)?;
    let urls: Vec<String> = drivers.iter().map(|d| d.target.to_string()).collect();
    let plots = plots::draw(&dir, &rows, &urls)?;
    let report = Report {
        created,
        runtime_secs: opts.runtime,
        jobs: opts.jobs,
        targets: drivers
            .iter()
            .map(|d| TargetRun {
                url: d.target.to_string(),
                engine: d.describe(),
            })
            .collect(),
        machine: machine::Machine::describe(),
        rows,
        plots,
    };
    report::write(&dir, &report)?;
    print!("{}", summary(&report));
    Ok(dir)
}

/// What stdout shows: each target's table, and the ratios of a comparison.
fn summary(report: &Report) -> String {
    let mut out = String::new();
    for (t, target) in report.targets.iter().enumerate() {
        out += &format!("{} ({})\n", target.url, target.engine);
        out += &report::table(&report.rows, t);
        out.push('\n');
    }
    if report.targets.len() == 2 {
        out += &format!(
            "ratios {} / {}\n",
            report.targets[0].url, report.targets[1].url
        );
        out += &report::ratio_table(&report.rows);
    }
    out
}

/// Now in the local time zone, formatted by strftime.
fn local_time(format: &str) -> String {
    let fmt = std::ffi::CString::new(format).expect("no NUL in a format");
    let mut buf = [0u8; 64];
    // SAFETY: time/localtime_r/strftime on local, properly sized buffers.
    let len = unsafe {
        let now = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&now, &mut tm);
        libc::strftime(buf.as_mut_ptr().cast(), buf.len(), fmt.as_ptr(), &tm)
    };
    String::from_utf8_lossy(&buf[..len]).into_owned()
}
