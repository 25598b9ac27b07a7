//! Verified I/O in the background: a thread logs in with our own initiator
//! and writes, reads back and compares one LUN round after round while the
//! test changes the daemon around it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::iscsi::{rw10_cdb, Completion, LoginParams, Session};

/// Rounds a session must verify before a stop request is honoured, so a
/// stop right after the start still proves the I/O path works.
const MIN_ROUNDS: u64 = 20;

/// How long a finished test waits for the I/O thread to end: a hang is a
/// failure, not a stuck test run.
const END_LIMIT: Duration = Duration::from_secs(60);

/// What one I/O session saw.
#[derive(Debug, Default)]
pub struct IoOutcome {
    /// Rounds of write + read back + compare that succeeded.
    pub rounds: u64,
    /// A unit attention REPORTED LUNS DATA HAS CHANGED arrived.
    pub luns_changed: bool,
    /// Commands ended with LOGICAL UNIT NOT SUPPORTED (the LUN was removed).
    pub lun_gone: bool,
}

/// ASC and ASCQ of fixed or descriptor format sense data.
pub fn asc(c: &Completion) -> (u8, u8) {
    let at = |i: usize| c.sense.get(i).copied().unwrap_or(0);
    match at(0) & 0x7f {
        0x72 | 0x73 => (at(2), at(3)),
        _ => (at(12), at(13)),
    }
}

/// One command, retried past unit attentions (noting a changed LUN map).
fn command(
    s: &mut Session,
    lun: u64,
    cdb: &[u8],
    data: &[u8],
    read_len: usize,
    seen: &mut IoOutcome,
) -> Result<Completion, String> {
    for _ in 0..8 {
        let c = s
            .command(lun, cdb, data, read_len)
            .map_err(|e| format!("round {}: {e}", seen.rounds))?;
        if c.sense_key() != Some(6) {
            return Ok(c);
        }
        if asc(&c) == (0x3f, 0x0e) {
            seen.luns_changed = true;
        }
    }
    Err("unit attentions kept coming".into())
}

/// Where and as whom the I/O runs.
struct Plan {
    addr: SocketAddr,
    initiator: String,
    target: String,
    lun: u64,
    /// Run until the LUN is removed; then the only acceptable failure is
    /// LOGICAL UNIT NOT SUPPORTED.
    until_gone: bool,
}

/// Writes, reads back and compares until `stop` (and at least
/// `MIN_ROUNDS`), or with `until_gone` until the LUN is removed.
fn run(plan: &Plan, stop: &AtomicBool, progress: &AtomicU64) -> Result<IoOutcome, String> {
    // One session per LUN: the same ISID would reinstate (end) the other.
    let mut params = LoginParams::normal(&plan.initiator, &plan.target);
    params.isid[5] = plan.lun as u8;
    let mut s = Session::login(plan.addr, &params, Duration::from_secs(10))
        .map_err(|e| format!("login: {e}"))?;
    let lun = plan.lun;
    let mut seen = IoOutcome::default();
    let gone = |c: &Completion| c.sense_key() == Some(0x05) && asc(c) == (0x25, 0x00);
    while plan.until_gone || !stop.load(Ordering::Relaxed) || seen.rounds < MIN_ROUNDS {
        let lba = (seen.rounds % 64) as u32 * 8;
        let data: Vec<u8> = (0..4096u32)
            .map(|i| (i as u64 * 13 + seen.rounds * 5 + lun) as u8)
            .collect();
        let w = command(&mut s, lun, &rw10_cdb(0x2a, lba, 8), &data, 0, &mut seen)?;
        let r = command(&mut s, lun, &rw10_cdb(0x28, lba, 8), &[], 4096, &mut seen)?;
        if plan.until_gone && (gone(&w) || gone(&r)) {
            seen.lun_gone = true;
            break;
        }
        if w.status != 0 || r.status != 0 {
            return Err(format!(
                "round {}: status {:#x}/{:#x}, sense {:02x?} {:02x?}",
                seen.rounds, w.status, r.status, w.sense, r.sense
            ));
        }
        if r.data != data {
            return Err(format!("round {}: data read back differs", seen.rounds));
        }
        seen.rounds += 1;
        progress.store(seen.rounds, Ordering::Relaxed);
    }
    s.logout().map_err(|e| format!("logout: {e}"))?;
    Ok(seen)
}

/// Verified I/O on one LUN in a thread of its own.
pub struct BackgroundIo {
    stop: Arc<AtomicBool>,
    progress: Arc<AtomicU64>,
    thread: JoinHandle<Result<IoOutcome, String>>,
}

impl BackgroundIo {
    /// I/O on `lun` of `target` at 127.0.0.1:`port` as `initiator` until
    /// `finish` (and at least `MIN_ROUNDS` rounds).
    pub fn start(port: u16, initiator: &str, target: &str, lun: u64) -> BackgroundIo {
        BackgroundIo::spawn(port, initiator, target, lun, false)
    }

    /// I/O on `lun` until the LUN is removed (`IoOutcome::lun_gone`).
    pub fn until_gone(port: u16, initiator: &str, target: &str, lun: u64) -> BackgroundIo {
        BackgroundIo::spawn(port, initiator, target, lun, true)
    }

    fn spawn(port: u16, initiator: &str, target: &str, lun: u64, until_gone: bool) -> Self {
        let plan = Plan {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            initiator: initiator.to_string(),
            target: target.to_string(),
            lun,
            until_gone,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let progress = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, progress) = (stop.clone(), progress.clone());
            std::thread::spawn(move || run(&plan, &stop, &progress))
        };
        BackgroundIo {
            stop,
            progress,
            thread,
        }
    }

    /// Rounds verified so far.
    pub fn rounds(&self) -> u64 {
        self.progress.load(Ordering::Relaxed)
    }

    /// Block until at least `rounds` rounds were verified; panics if the
    /// I/O ends or makes no progress for a minute.
    pub fn wait_rounds(&self, rounds: u64) {
        let start = Instant::now();
        while self.progress.load(Ordering::Relaxed) < rounds {
            assert!(!self.thread.is_finished(), "the I/O ended early");
            assert!(start.elapsed() < END_LIMIT, "no I/O progress");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Ask the I/O to stop and wait for its outcome; a thread that does not
    /// end within a minute is an error (a hang), as is a panic in it.
    pub fn finish(self) -> Result<IoOutcome, String> {
        self.stop.store(true, Ordering::Relaxed);
        let start = Instant::now();
        while !self.thread.is_finished() {
            if start.elapsed() > END_LIMIT {
                return Err("the I/O did not end".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.thread
            .join()
            .map_err(|_| "the I/O thread panicked".to_string())?
    }
}
