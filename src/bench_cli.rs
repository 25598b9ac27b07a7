//! `openarray bench`: the benchmark matrix of the bench crate against an
//! iSCSI, NVMe/TCP or NBD URL, from the command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

#[derive(Args)]
pub struct BenchArgs {
    /// iscsi://HOST[:PORT]/IQN/LUN, nvme+tcp://HOST[:PORT]/SUBNQN/NSID,
    /// nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH.
    #[arg(value_name = "URL")]
    url: String,
    /// Also run the matrix against URL2, point by point in turn with URL,
    /// and report URL / URL2 per row.
    #[arg(long, value_name = "URL2")]
    compare: Option<String>,
    /// Queue depths, comma-separated.
    #[arg(long, value_name = "N,N,..", value_delimiter = ',', default_values_t = [1, 32, 128])]
    depths: Vec<u32>,
    /// Patterns, comma-separated: randread and randwrite (4K), seqread and
    /// seqwrite (1M).
    #[arg(
        long,
        value_name = "P,P,..",
        value_delimiter = ',',
        default_values_t = ["randread".to_string(), "randwrite".into(), "seqread".into(), "seqwrite".into()]
    )]
    patterns: Vec<String>,
    /// Jobs per point (fio's numjobs; sessions or connections).
    #[arg(long, value_name = "N", default_value_t = 1)]
    jobs: u32,
    /// Bytes per sequential I/O, such as 4M (random I/O is 4K).
    #[arg(long, value_name = "SIZE", default_value = "1M", value_parser = control::parse_size)]
    seq_block_size: u64,
    /// Seconds per point.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    runtime: u64,
    /// Bytes of the device each job covers, such as 1G (default: all).
    #[arg(long, alias = "region", value_name = "SIZE", value_parser = control::parse_size)]
    size: Option<u64>,
    /// The report folder (default: bench-YYYYmmdd-HHMMSS).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Write patterns overwrite the device: allow them on a device that
    /// holds data.
    #[arg(long)]
    destroy_data: bool,
}

pub fn run(args: BenchArgs) -> ExitCode {
    let patterns = match args
        .patterns
        .iter()
        .map(|p| bench::spec::Pattern::parse(p))
        .collect::<anyhow::Result<Vec<_>>>()
    {
        Ok(p) => p,
        Err(e) => return crate::output::fail(&crate::output::Usage(e.to_string()).into()),
    };
    let opts = bench::Options {
        urls: std::iter::once(args.url).chain(args.compare).collect(),
        patterns,
        depths: args.depths,
        jobs: args.jobs,
        seq_block_size: args.seq_block_size,
        runtime: args.runtime,
        size: args.size,
        out: args.out,
        destroy_data: args.destroy_data,
    };
    match bench::run(&opts) {
        Ok(dir) => {
            eprintln!("report: {}", dir.join("report.md").display());
            ExitCode::SUCCESS
        }
        Err(e) => crate::output::fail(&e),
    }
}
