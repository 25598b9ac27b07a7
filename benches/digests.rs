//! What header and data digests cost the target. No client on this kind of
//! machine negotiates data digests (libiscsi has none), so this drives the
//! daemon with the initiator of the integration tests: one session at
//! QD32 on the embedded default's LUN, 4K random reads, 4K random writes
//! (immediate data) and 64K random reads, each with digests off, on the
//! header only, and on header and data. It prints IOPS and the CPU per I/O
//! of the target (all its threads, from /proc) and of this initiator; with
//! `--tsv FILE` it also appends the figures as rows of bench/matrix.sh's
//! results.
//!
//!     cargo bench --bench digests -- [--seconds N] [--rounds N] [--tsv FILE]
//!
//! The settings take turns round after round; the round with the most
//! IOPS of each is reported.
//!
//! Every command must end GOOD and every digest must check, or the run
//! stops with the reason.

// Built without the test harness, the shared module's unit tests are
// dropped but their imports are not.
#[allow(unused_imports)]
#[path = "../tests/common/mod.rs"]
mod common;

use std::fs::OpenOptions;
use std::io::{self, BufReader, Write};
use std::time::{Duration, Instant};

use clap::Parser;
use common::iscsi::{final_status, op, read_pdu, rw10_cdb, Digests, LoginParams, Session};
use common::rng::Rng;
use common::Daemon;

const DEPTH: usize = 32;
const STATUS_GOOD: u8 = 0;

struct Load {
    name: &'static str,
    write: bool,
    bytes: usize,
}

const LOADS: [Load; 3] = [
    Load {
        name: "4k-randread",
        write: false,
        bytes: 4096,
    },
    Load {
        name: "4k-randwrite",
        write: true,
        bytes: 4096,
    },
    Load {
        name: "64k-randread",
        write: false,
        bytes: 65536,
    },
];

const SETTINGS: [(&str, Digests); 3] = [
    (
        "none",
        Digests {
            header: false,
            data: false,
        },
    ),
    (
        "header",
        Digests {
            header: true,
            data: false,
        },
    ),
    (
        "header+data",
        Digests {
            header: true,
            data: true,
        },
    ),
];

/// How long a run issues commands.
#[derive(Clone, Copy)]
enum Span {
    Seconds(f64),
    /// Every slot of the LUN once, in order: writing it all before the
    /// timed runs, so no run pays for the memory the LUN first takes.
    EachSlotOnce,
}

/// What one run measured.
struct Figures {
    ios: u64,
    seconds: f64,
    target_ticks: u64,
    initiator_ticks: u64,
}

impl Figures {
    fn iops(&self) -> f64 {
        self.ios as f64 / self.seconds
    }
}

/// What header and data digests cost the target.
#[derive(Parser)]
struct Args {
    /// Seconds of each timed run.
    #[arg(long, default_value_t = 5.0, value_parser = positive_seconds)]
    seconds: f64,
    /// Rounds; the settings take turns in each.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Append the figures to this file as rows of bench/matrix.sh's results.
    #[arg(long)]
    tsv: Option<String>,
    /// Passed by `cargo bench` to every bench target.
    #[arg(long, hide = true)]
    bench: bool,
}

fn positive_seconds(value: &str) -> Result<f64, String> {
    value
        .parse()
        .ok()
        .filter(|s: &f64| *s > 0.0)
        .ok_or(format!("{value} is not a positive number"))
}

fn main() {
    let args = Args::parse();
    // The daemon is dropped (and so killed) before the process exits.
    if let Err(message) = measure(args) {
        eprintln!("digests: {message}");
        std::process::exit(1);
    }
}

fn measure(args: Args) -> Result<(), String> {
    let daemon = Daemon::start();
    let target = daemon.first_target();
    let fill = Load {
        name: "fill",
        write: true,
        bytes: 65536,
    };
    run(&daemon, &target, SETTINGS[0].1, &fill, Span::EachSlotOnce)
        .map_err(|e| format!("writing the LUN before the runs: {e}"))?;

    // The settings take turns, round after round, so each sees the same
    // load from the rest of the machine; the best round of each is kept.
    let mut best: Vec<Vec<Option<Figures>>> =
        LOADS.iter().map(|_| vec![None, None, None]).collect();
    for _ in 0..args.rounds {
        for (load, kept) in LOADS.iter().zip(&mut best) {
            for ((setting, digests), kept) in SETTINGS.iter().zip(kept) {
                let fig = run(
                    &daemon,
                    &target,
                    *digests,
                    load,
                    Span::Seconds(args.seconds),
                )
                .map_err(|e| format!("{} with {setting} digests: {e}", load.name))?;
                if kept.as_ref().is_none_or(|k| fig.iops() > k.iops()) {
                    *kept = Some(fig);
                }
            }
        }
    }

    let ticks_per_second = clock_ticks();
    println!(
        "one session, QD{DEPTH}, {} s a run, best of {} rounds, against {target}",
        args.seconds, args.rounds
    );
    println!(
        "| load | digests | IOPS | MB/s | target µs CPU/IO | CPU vs none | initiator µs CPU/IO |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for (load, kept) in LOADS.iter().zip(&best) {
        let mut baseline = None;
        for ((setting, _), fig) in SETTINGS.iter().zip(kept.iter().flatten()) {
            let per_io = |ticks: u64| ticks as f64 * 1e6 / ticks_per_second / fig.ios as f64;
            let target_cpu = per_io(fig.target_ticks);
            let initiator_cpu = per_io(fig.initiator_ticks);
            let iops = fig.iops();
            let mbps = iops * load.bytes as f64 / 1e6;
            let base = *baseline.get_or_insert(target_cpu);
            println!(
                "| {} | {setting} | {iops:.0} | {mbps:.1} | {target_cpu:.1} | {:+.0} % | {initiator_cpu:.1} |",
                load.name,
                (target_cpu / base - 1.0) * 100.0
            );
            rows.push(format!(
                "digests\topenarray\t{}-{setting}\t{DEPTH}\t{iops:.0}\t{mbps:.1}\t-\t-\t-\t-\t{target_cpu:.1}\t{initiator_cpu:.1}\t-",
                load.name
            ));
        }
    }
    if let Some(path) = args.tsv {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| rows.iter().try_for_each(|row| writeln!(f, "{row}")))
            .map_err(|e| format!("cannot append to {path}: {e}"))?;
    }
    Ok(())
}

/// One session with `digests`, `load` at QD32 for `span`.
fn run(
    daemon: &Daemon,
    target: &str,
    digests: Digests,
    load: &Load,
    span: Span,
) -> io::Result<Figures> {
    let params = LoginParams {
        digests,
        ..LoginParams::normal("iqn.2024-01.org.openarray:digest-bench", target)
    };
    let mut s = Session::login(daemon.addr(), &params, Duration::from_secs(10))?;
    if s.digests != digests {
        return Err(io::Error::other(format!(
            "asked for {digests:?}, the target agreed to {:?}",
            s.digests
        )));
    }
    if load.write && (!s.immediate_data || s.first_burst.min(s.target_max_recv) < load.bytes) {
        return Err(io::Error::other(
            "the target takes no immediate data of a whole write",
        ));
    }
    let (blocks, block_size) = s.read_capacity(0)?;
    let per_io = (load.bytes / block_size as usize) as u64;
    let slots = (blocks / per_io).min(u32::MAX as u64 / per_io);
    let mut reader = BufReader::with_capacity(1 << 20, s.stream.try_clone()?);
    let mut rng = Rng::new(0x0d16_e575);
    let payload = vec![0x5a; if load.write { load.bytes } else { 0 }];
    let mut outgoing = Vec::new();

    let mut next_slot = 0;
    let mut issue = |s: &mut Session, outgoing: &mut Vec<u8>| {
        let slot = match span {
            Span::Seconds(_) => rng.below(slots),
            Span::EachSlotOnce => next_slot,
        };
        next_slot += 1;
        let lba = (slot * per_io) as u32;
        let opcode = if load.write { 0x2a } else { 0x28 };
        let cdb = rw10_cdb(opcode, lba, per_io as u16);
        let read_len = if load.write { 0 } else { load.bytes };
        let mut pdu = s.command_pdu(0, &cdb, payload.len(), read_len);
        pdu.data.clone_from(&payload);
        outgoing.extend_from_slice(&pdu.encode(s.digests));
        s.cmd_sn = s.cmd_sn.wrapping_add(1);
    };

    let target_stat = format!("/proc/{}/stat", daemon.pid());
    let target_before = cpu_ticks(&target_stat)?;
    let initiator_before = cpu_ticks("/proc/self/stat")?;
    let started = Instant::now();
    let more = |issued: u64| match span {
        Span::Seconds(seconds) => started.elapsed().as_secs_f64() < seconds,
        Span::EachSlotOnce => issued < slots,
    };
    let mut issued = 0u64;
    while issued < DEPTH as u64 && more(issued) {
        issue(&mut s, &mut outgoing);
        issued += 1;
    }
    let mut in_flight = issued;
    let mut ios = 0u64;
    while in_flight > 0 {
        if reader.buffer().is_empty() && !outgoing.is_empty() {
            s.stream.write_all(&outgoing)?;
            outgoing.clear();
        }
        let pdu = read_pdu(&mut reader, s.digests, 1 << 20)?;
        if pdu.opcode() == op::NOP_IN {
            s.answer_nop_in(&pdu)?;
            continue;
        }
        let Some(status) = final_status(&pdu)? else {
            continue;
        };
        if status != STATUS_GOOD {
            return Err(io::Error::other(format!(
                "a command ended with status {status:#x}"
            )));
        }
        s.exp_stat_sn = pdu.u32_at(24).wrapping_add(1);
        ios += 1;
        in_flight -= 1;
        if more(issued) {
            issue(&mut s, &mut outgoing);
            issued += 1;
            in_flight += 1;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let figures = Figures {
        ios,
        seconds: elapsed,
        target_ticks: cpu_ticks(&target_stat)? - target_before,
        initiator_ticks: cpu_ticks("/proc/self/stat")? - initiator_before,
    };
    s.logout()?;
    Ok(figures)
}

/// utime + stime of a process (all its threads) from its stat file.
fn cpu_ticks(stat: &str) -> io::Result<u64> {
    let text = std::fs::read_to_string(stat)?;
    // Fields after the command name, which is in parentheses and may hold
    // spaces: state is the first, utime and stime the 12th and 13th.
    let fields: Vec<&str> = text
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    match (field(11), field(12)) {
        (Some(utime), Some(stime)) => Ok(utime + stime),
        _ => Err(io::Error::other(format!("{stat}: no utime and stime"))),
    }
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}
