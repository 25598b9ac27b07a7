//! The built-in load generator for iSCSI URLs when no fio has the
//! libiscsi engine: each job is one session keeping `depth` READ(16) or
//! WRITE(16) commands outstanding, a reader thread completing them (and
//! answering R2Ts with the data asked for), every latency kept.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Condvar, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};

use crate::iscsi_pdu::*;
use crate::iscsi_session::Session;
use crate::spec::{Measured, Point};
use crate::url::Target;

/// What writes carry: fixed non-zero bytes, so a written device is seen
/// to hold data.
static PATTERN: LazyLock<Vec<u8>> = LazyLock::new(|| vec![0xa5; 1 << 20]);

#[derive(Default)]
struct State {
    free: u32,
    max_cmd_sn: u32,
    inflight: HashMap<u32, Instant>,
    latencies_ns: Vec<u64>,
    error: Option<String>,
}

struct Job {
    session: Mutex<Session>,
    state: Mutex<State>,
    changed: Condvar,
}

impl Job {
    /// The state once `ready` holds, or the reader's error.
    fn wait(&self, ready: impl Fn(&State) -> bool) -> Result<MutexGuard<'_, State>> {
        let mut st = self.state.lock().unwrap();
        while st.error.is_none() && !ready(&st) {
            let tick = Duration::from_millis(100);
            st = self.changed.wait_timeout(st, tick).unwrap().0;
        }
        match &st.error {
            Some(e) => bail!("{e}"),
            None => Ok(st),
        }
    }
}

/// Runs `point` for `runtime` seconds with `point.jobs` sessions.
pub fn run(target: &Target, point: Point, runtime: u64, size: Option<u64>) -> Result<Measured> {
    let sessions = (0..point.jobs)
        .map(|j| Session::login(target, j as u16 + 1))
        .collect::<Result<Vec<_>>>()?;
    let cpu_before = cpu_time();
    let start = Instant::now();
    let deadline = start + Duration::from_secs(runtime);
    let results: Vec<Result<Vec<u64>>> = std::thread::scope(|s| {
        let handles: Vec<_> = sessions
            .into_iter()
            .enumerate()
            .map(|(j, session)| s.spawn(move || run_job(session, point, j as u32, deadline, size)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("a load thread panicked")))
            })
            .collect()
    });
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = cpu_time() - cpu_before;
    let mut latencies = Vec::new();
    for r in results {
        latencies.extend(r?);
    }
    measured(latencies, point, elapsed, cpu)
}

/// A point's figures from every command's latency, the wall time and
/// the client's CPU seconds it took.
pub(crate) fn measured(
    mut latencies: Vec<u64>,
    point: Point,
    elapsed: f64,
    cpu: f64,
) -> Result<Measured> {
    if latencies.is_empty() {
        bail!("no command completed");
    }
    latencies.sort_unstable();
    let pct =
        |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0;
    let ios = latencies.len() as u64;
    Ok(Measured {
        iops: ios as f64 / elapsed,
        bytes_per_sec: (ios * point.block_size) as f64 / elapsed,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        p999_us: pct(0.999),
        client_cpu_pct: cpu / elapsed * 100.0,
        ios,
    })
}

/// One session's share of the load; its latencies.
fn run_job(
    session: Session,
    point: Point,
    j: u32,
    deadline: Instant,
    size: Option<u64>,
) -> Result<Vec<u64>> {
    let bs = session.block_size as u64;
    let per_io = point.block_size / bs;
    let device_ios = session.blocks / per_io;
    let region_ios = size.map_or(device_ios, |s| (s / point.block_size).min(device_ios));
    if region_ios == 0 {
        bail!("the LUN is smaller than one {} I/O", point.label());
    }
    // Sequential jobs each start in their own stretch of the device.
    let mut cursor = (device_ios / point.jobs as u64 * j as u64) % region_ios;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64
        ^ ((j as u64 + 1) << 32)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    let mut reader = session.stream.try_clone()?;
    let job = Job {
        state: Mutex::new(State {
            free: point.depth,
            max_cmd_sn: session.max_cmd_sn,
            ..State::default()
        }),
        session: Mutex::new(session),
        changed: Condvar::new(),
    };
    let mut cmd_sn = job.session.lock().unwrap().cmd_sn;
    std::thread::scope(|s| {
        s.spawn(|| {
            if let Err(e) = complete(&job, &mut reader) {
                let mut st = job.state.lock().unwrap();
                st.error.get_or_insert(format!("{e:#}"));
                job.changed.notify_all();
            }
        });
        let issued = (|| -> Result<()> {
            while Instant::now() < deadline {
                let mut st =
                    job.wait(|st| st.free > 0 && (st.max_cmd_sn.wrapping_sub(cmd_sn) as i32) >= 0)?;
                st.free -= 1;
                drop(st);
                let index = if point.pattern.is_random() {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng % region_ios
                } else {
                    cursor = (cursor + 1) % region_ios;
                    cursor
                };
                issue(&job, point, index * per_io, per_io as u32)?;
                cmd_sn = cmd_sn.wrapping_add(1);
            }
            let st = job.wait(|st| st.free == point.depth)?;
            drop(st);
            job.session.lock().unwrap().logout_request()?;
            Ok(())
        })();
        if issued.is_err() {
            // The reader may be waiting on a target that stopped answering.
            let _ = job
                .session
                .lock()
                .unwrap()
                .stream
                .shutdown(std::net::Shutdown::Both);
        }
        issued
    })?;
    let st = job.state.into_inner().unwrap();
    Ok(st.latencies_ns)
}

fn issue(job: &Job, point: Point, lba: u64, blocks: u32) -> Result<()> {
    let mut session = job.session.lock().unwrap();
    let length = blocks * session.block_size;
    let write = point.pattern.is_write();
    let cdb = rw16(write, lba, blocks);
    let pdu = session.command_pdu(&cdb, !write, write, length);
    let n = session.negotiated;
    let immediate = if write && n.immediate_data {
        length.min(n.first_burst).min(n.segment) as usize
    } else {
        0
    };
    job.state
        .lock()
        .unwrap()
        .inflight
        .insert(pdu.itt(), Instant::now());
    session
        .stream
        .write_all(&pdu.encode(&PATTERN[..immediate]))?;
    Ok(())
}

/// The reader: completes commands, answers R2Ts and NOP-Ins, until the
/// logout response.
fn complete(job: &Job, reader: &mut std::net::TcpStream) -> Result<()> {
    loop {
        let pdu = Pdu::read(reader)?;
        let status = match pdu.opcode() {
            DATA_IN if pdu.bhs[1] & 1 != 0 => pdu.bhs[3],
            DATA_IN => continue,
            SCSI_RESPONSE => pdu.bhs[3],
            R2T => {
                send_data(job, &pdu)?;
                continue;
            }
            NOP_IN => {
                job.session.lock().unwrap().answer_nop(&pdu)?;
                continue;
            }
            LOGOUT_RESPONSE => return Ok(()),
            REJECT => bail!("the target rejected a PDU"),
            op => bail!("unexpected PDU opcode {op:#x}"),
        };
        if status != 0 {
            bail!("a command ended with SCSI status {status:#x}");
        }
        job.session.lock().unwrap().exp_stat_sn = pdu.u32_at(24).wrapping_add(1);
        let mut st = job.state.lock().unwrap();
        let started = st
            .inflight
            .remove(&pdu.itt())
            .ok_or_else(|| anyhow!("a response for unknown task {:#x}", pdu.itt()))?;
        st.latencies_ns.push(started.elapsed().as_nanos() as u64);
        st.free += 1;
        st.max_cmd_sn = pdu.u32_at(32);
        job.changed.notify_all();
    }
}

/// The Data-Out PDUs an R2T asks for, each within the target's segment.
fn send_data(job: &Job, r2t: &Pdu) -> Result<()> {
    let (ttt, offset, wanted) = (r2t.u32_at(20), r2t.u32_at(40), r2t.u32_at(44));
    let mut session = job.session.lock().unwrap();
    let segment = session.negotiated.segment.max(512);
    let mut sent = 0u32;
    let mut data_sn = 0u32;
    let mut out = Vec::new();
    while sent < wanted {
        let len = segment.min(wanted - sent);
        let mut pdu = Pdu::new(DATA_OUT);
        pdu.bhs[1] = if sent + len == wanted { FINAL } else { 0 };
        pdu.set_lun(session.lun);
        pdu.set_u32(16, r2t.itt());
        pdu.set_u32(20, ttt);
        pdu.set_u32(28, session.exp_stat_sn);
        pdu.set_u32(36, data_sn);
        pdu.set_u32(40, offset + sent);
        out.extend_from_slice(&pdu.encode(&PATTERN[..len as usize]));
        sent += len;
        data_sn += 1;
    }
    session.stream.write_all(&out)?;
    Ok(())
}

/// This process's user and system CPU seconds so far.
pub(crate) fn cpu_time() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}
