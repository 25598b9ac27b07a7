//! Hostile and malformed input against the real daemon while a verified
//! session keeps doing real I/O.
//!
//! One thread logs in to the "verified" target with our own initiator and
//! loops WRITE(10) of random data / READ(10) compared against a shadow copy.
//! Several attacker threads meanwhile throw at least `MIN_PDUS` random and
//! mutated PDUs over many TCP connections at a second target (a null LUN, so
//! stray writes commit no memory): noise before login, truncated headers,
//! huge DataSegmentLength, garbage AHS, mangled login keys and stages,
//! out-of-window CmdSN, unknown opcodes, Data-Out for unknown tasks and
//! lying Data-Out for solicited writes, task management and logout at random,
//! session and connection reinstatement, bad digests on connections that
//! negotiated CRC32C, bit-flipped valid PDUs, pipelined bursts that are never
//! read, and idle half-sent connections. Mutations start from the valid PDUs
//! our initiator builds.
//!
//! Asserted: the verified session never sees an error or a miscompare and
//! its whole LUN reads back right at the end; the daemon stays alive, never
//! logs "panicked", still serves discovery and new sessions; its RSS stays
//! under a fixed cap and does not keep growing in the second half of the run.
//!
//! OPENARRAY_FUZZ_SEED=<n> replays a seed (the run prints the one it used).

#[path = "bad_input/attacker.rs"]
mod attacker;
mod common;
#[path = "bad_input/session_attacks.rs"]
mod session_attacks;
#[path = "bad_input/verified.rs"]
mod verified;

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use attacker::{Attacker, Counters};
use common::iscsi::Session;
use common::rng::Rng;
use common::Daemon;
use verified::{verified_io, verified_params};

const VERIFIED_IQN: &str = "iqn.2024-01.org.openarray.test:verified";
const VERIFIED_LUN: u64 = 0;
const FUZZ_IQN: &str = "iqn.2024-01.org.openarray.test:fuzz";
const MIN_PDUS: u64 = 100_000;
const MIN_RUN: Duration = Duration::from_secs(30);
const MAX_RUN: Duration = Duration::from_secs(90);
const ATTACKERS: u64 = 3;
/// Idle connections each attacker keeps open at a time.
const PARKED_PER_ATTACKER: usize = 48;
const RSS_CAP_KIB: u64 = 1536 * 1024;
/// Allowed rise of the peak RSS from the first to the second half.
const RSS_GROWTH_SLACK_KIB: u64 = 64 * 1024;
/// Largest verified transfer, in blocks.
const MAX_VERIFIED_BLOCKS: u64 = 128;

fn config() -> String {
    format!(
        r#"
[[device]]
name = "verified"
kind = "mem"
size = "32M"

[[device]]
name = "scratch"
kind = "null"
size = "1G"

[[target]]
name = "{VERIFIED_IQN}"

[[target.lun]]
lun = 0
device = "verified"

[[target]]
name = "{FUZZ_IQN}"

[[target.lun]]
lun = 0
device = "scratch"
"#
    )
}

fn seed() -> u64 {
    std::env::var("OPENARRAY_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
}

#[test]
fn survives_hostile_pdus_while_verified_io_runs() {
    let seed = seed();
    println!("bad_input: seed {seed} (replay with OPENARRAY_FUZZ_SEED={seed})");
    let mut daemon = Daemon::start_with_config(&config());
    let addr = daemon.addr();
    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(Counters::default());

    let (ready_tx, ready_rx) = mpsc::channel();
    let verifier = {
        let stop = stop.clone();
        thread::spawn(move || verified_io(addr, seed, &stop, ready_tx))
    };
    if ready_rx.recv_timeout(Duration::from_secs(120)).is_err() {
        stop.store(true, Relaxed);
        let v = verifier.join().expect("verifier thread");
        panic!(
            "verified session never got going: {:?}\n{}",
            v.error,
            daemon.log()
        );
    }

    let attackers: Vec<_> = (0..ATTACKERS)
        .map(|id| {
            let (stop, counters) = (stop.clone(), counters.clone());
            let rng = Rng::new(seed ^ (id + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            thread::spawn(move || {
                let mut a = Attacker::new(id, addr, rng, counters);
                a.run(&stop);
            })
        })
        .collect();

    let start = Instant::now();
    let mut rss: Vec<(Duration, u64)> = Vec::new();
    let mut died = false;
    loop {
        thread::sleep(Duration::from_millis(250));
        if !daemon.alive() {
            died = true;
            break;
        }
        if let Some(kib) = daemon.rss_kib() {
            rss.push((start.elapsed(), kib));
        }
        let pdus = counters.pdus.load(Relaxed);
        let elapsed = start.elapsed();
        if verifier.is_finished() || (pdus >= MIN_PDUS && elapsed >= MIN_RUN) || elapsed >= MAX_RUN
        {
            break;
        }
    }
    let run_time = start.elapsed();
    stop.store(true, Relaxed);
    for a in attackers {
        a.join().expect("attacker thread panicked");
    }
    let verified = verifier.join().expect("verifier thread panicked");

    let c = &counters;
    println!(
        "bad_input: {:.1} s, {} PDUs sent over {} connections ({} logins, {} refused, {} dropped by the target), \
         {} verified I/Os, {} of {} solicited writes got their R2T",
        run_time.as_secs_f64(),
        c.pdus.load(Relaxed),
        c.connections.load(Relaxed),
        c.logins.load(Relaxed),
        c.login_failures.load(Relaxed),
        c.closed_by_target.load(Relaxed),
        verified.ios,
        c.r2ts.load(Relaxed),
        c.r2t_waits.load(Relaxed)
    );
    let peak = rss.iter().map(|r| r.1).max().unwrap_or(0);
    println!(
        "bad_input: daemon RSS {} KiB at start of attack, peak {peak} KiB, {} KiB at end",
        rss.first().map(|r| r.1).unwrap_or(0),
        rss.last().map(|r| r.1).unwrap_or(0)
    );

    let log = daemon.log();
    assert!(!died, "daemon died during the attack:\n{}", tail(&log));
    assert!(
        !log.contains("panicked"),
        "daemon panicked:\n{}",
        tail(&log)
    );
    assert_eq!(verified.error, None, "verified session failed");
    assert!(
        c.pdus.load(Relaxed) >= MIN_PDUS,
        "only {} PDUs sent in {run_time:?}",
        c.pdus.load(Relaxed)
    );
    assert!(
        c.logins.load(Relaxed) > 0,
        "no attacker login succeeded: full-feature attacks never ran"
    );

    assert!(
        peak < RSS_CAP_KIB,
        "daemon RSS peaked at {peak} KiB (cap {RSS_CAP_KIB} KiB)"
    );
    let half = run_time / 2;
    let first_peak = rss
        .iter()
        .filter(|r| r.0 < half)
        .map(|r| r.1)
        .max()
        .unwrap_or(0);
    let second_peak = rss
        .iter()
        .filter(|r| r.0 >= half)
        .map(|r| r.1)
        .max()
        .unwrap_or(0);
    assert!(
        second_peak <= first_peak + RSS_GROWTH_SLACK_KIB,
        "daemon RSS kept growing: peak {first_peak} KiB in the first half, {second_peak} KiB in the second"
    );

    // Still serving: discovery lists both targets, and the verified LUN
    // holds exactly what the verified session last wrote.
    let targets = daemon.targets();
    assert!(
        targets.iter().any(|t| t == VERIFIED_IQN) && targets.iter().any(|t| t == FUZZ_IQN),
        "discovery after the attack: {targets:?}"
    );
    let mut s = Session::login(addr, &verified_params(), Duration::from_secs(30))
        .expect("log in after the attack");
    let bs = verified.block_size;
    let chunk = MAX_VERIFIED_BLOCKS as usize * bs as usize;
    for (i, want) in verified.shadow.chunks(chunk).enumerate() {
        let lba = (i * MAX_VERIFIED_BLOCKS as usize) as u32;
        let got = s
            .read10(VERIFIED_LUN, lba, (want.len() / bs as usize) as u16, bs)
            .expect("final read");
        assert!(got == want, "final contents differ at LBA {lba}");
    }
    s.logout().expect("logout after the attack");
    assert!(
        daemon.alive(),
        "daemon died at the end:\n{}",
        tail(&daemon.log())
    );
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}
