//! The built-in load generator for nvme+tcp:// URLs. The nvmf crate's
//! host connects the controller (admin queue, Connect, enable, number of
//! queues) and its I/O queues; each I/O queue, one TCP connection as a
//! real host has one per CPU, then becomes a blocking socket driven by a
//! thread of its own that keeps its share of the depth outstanding,
//! completing commands, answering R2Ts, and sending what it has to send
//! in one write once the PDUs already received are handled.

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nvmf::capsule::{Cqe, SGL_IN_CAPSULE, SGL_TRANSPORT};
use nvmf::initiator::{nvm, Host, Options, Who};
use nvmf::wire::{self, kind, DataHeader, Digests, Pdu};

use crate::probe::BlockReader;
use crate::spec::{Measured, Point};
use crate::url::Target;

/// What writes carry, as the iSCSI engine's.
static PATTERN: LazyLock<Vec<u8>> = LazyLock::new(|| vec![0xa5; 1 << 20]);

const TARGET_SENDS: &[u8] = &[
    kind::C2H_TERM,
    kind::CAPSULE_RESP,
    kind::C2H_DATA,
    kind::R2T,
];

/// Entries each I/O queue is connected with; a queue keeps fewer
/// commands than that outstanding.
const QUEUE_ENTRIES: u32 = 128;

/// One I/O queue as a blocking socket.
pub struct IoQueue {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    digests: Digests,
    maxh2cdata: usize,
    in_capsule: usize,
    pdu: Vec<u8>,
}

impl IoQueue {
    /// The next PDU from the target.
    fn receive(&mut self) -> Result<Pdu> {
        let mut head = [0u8; wire::COMMON_LEN];
        self.reader.read_exact(&mut head)?;
        let c = wire::common(&head);
        let plen = wire::check_common(&c, TARGET_SENDS, self.digests, 64 << 20)
            .map_err(|f| anyhow!("a bad PDU from the target: {}", f.reason))?;
        self.pdu.clear();
        self.pdu.extend_from_slice(&head);
        self.pdu.resize(plen, 0);
        self.reader.read_exact(&mut self.pdu[wire::COMMON_LEN..])?;
        wire::decode(&self.pdu, self.digests)
            .map_err(|f| anyhow!("a bad PDU from the target: {}", f.reason))
    }

    /// Appends to `out` the capsule of a read or write of `blocks` at
    /// `lba` with id `cid`.
    fn command(&self, out: &mut Vec<u8>, io: &Io, cid: u16, lba: u64) {
        let len = io.blocks as usize * io.lba_size;
        let (mut sqe, data) = if io.write {
            let c = nvm::write(io.nsid, lba, Vec::new(), io.lba_size, false);
            (c.sqe.cdw(12, io.blocks - 1), &PATTERN[..len])
        } else {
            (nvm::read(io.nsid, lba, io.blocks, io.lba_size).sqe, &[][..])
        };
        wire::put16(&mut sqe.0, 2, cid);
        let pdu = if io.write && len <= self.in_capsule {
            let sqe = sqe.sgl(SGL_IN_CAPSULE, 0, len as u32).build();
            wire::encode_command(&sqe.0, data, self.digests)
        } else {
            let sqe = sqe.sgl(SGL_TRANSPORT, 0, len as u32).build();
            wire::encode_command(&sqe.0, &[], self.digests)
        };
        out.extend_from_slice(&pdu);
    }

    /// Appends to `out` the H2CData PDUs an R2T asks for.
    fn data(&self, out: &mut Vec<u8>, cid: u16, ttag: u16, offset: u32, len: u32) {
        let (mut at, end) = (offset as usize, (offset + len) as usize);
        while at < end {
            let n = self.maxh2cdata.min(end - at);
            let h = DataHeader {
                cccid: cid,
                ttag,
                offset: at as u32,
                len: n as u32,
                last: at + n == end,
                success: false,
            };
            let data = &PATTERN[at % PATTERN.len()..][..n];
            out.extend(wire::encode_data(kind::H2C_DATA, &h, data, self.digests, 1));
            at += n;
        }
    }
}

/// A controller of the URL's subsystem with its namespace's geometry.
pub struct Session {
    /// Kept open (and idle) while the I/O queues are used.
    _admin: TcpStream,
    pub queues: Vec<IoQueue>,
    pub nsid: u32,
    pub lba_size: usize,
    pub blocks: u64,
}

impl Session {
    pub fn connect(target: &Target, io_queues: u16) -> Result<Session> {
        let Target::Nvmf {
            subnqn, nsid: n, ..
        } = target
        else {
            bail!("{target} is not an NVMe/TCP URL");
        };
        let nsid = *n;
        let addr = resolve(target)?;
        let who = Who {
            host_nqn: format!("nqn.2014-08.org.nvmexpress:uuid:{}", host_uuid()),
            host_id: *b"openarray-bench\0",
            subnqn: subnqn.clone(),
        };
        let opts = Options {
            io_queues,
            // Reads end with their last data PDU, as Linux asks for too.
            flow_off: true,
            ..Options::default()
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()?;
        rt.block_on(async move {
            let mut host = Host::connect(addr, who, opts)
                .await
                .with_context(|| format!("connect to {target}"))?;
            let id = host.identify(0, nsid).await?;
            if !id.status().is_success() || id.data.len() < 4096 {
                bail!("{target}: Identify Namespace answered {:#x}", id.status().0);
            }
            let blocks = wire::le64(&id.data, 0);
            let format = usize::from(id.data[26] & 0x0f);
            let lba_size = 1usize << id.data[128 + 4 * format + 2];
            if blocks == 0 {
                bail!("{target}: namespace {nsid} is not active");
            }
            let queues = host
                .io
                .drain(..)
                .map(|q| {
                    let stream = q.stream.into_std()?;
                    stream.set_nonblocking(false)?;
                    Ok(IoQueue {
                        reader: BufReader::with_capacity(256 << 10, stream.try_clone()?),
                        writer: stream,
                        digests: q.digests,
                        maxh2cdata: q.maxh2cdata.max(4096) as usize,
                        in_capsule: q.in_capsule,
                        pdu: Vec::new(),
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let admin = host.admin.stream.into_std()?;
            Ok(Session {
                _admin: admin,
                queues,
                nsid,
                lba_size,
                blocks,
            })
        })
    }

    pub fn size(&self) -> u64 {
        self.blocks * self.lba_size as u64
    }
}

fn resolve(target: &Target) -> Result<SocketAddr> {
    let addr = target.addr().unwrap_or_default();
    addr.to_socket_addrs()
        .with_context(|| format!("resolve {addr}"))?
        .next()
        .with_context(|| format!("{addr} resolves to nothing"))
}

/// A host NQN's UUID, different per process so runs do not collide.
fn host_uuid() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let p = std::process::id();
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        p,
        (t >> 48) as u16,
        (t >> 36) as u16 & 0xfff,
        (t >> 24) as u16 & 0xfff,
        t & 0xffff_ffff_ffff
    )
}

impl BlockReader for Session {
    fn size(&self) -> u64 {
        Session::size(self)
    }

    fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>> {
        let io = Io {
            nsid: self.nsid,
            lba_size: self.lba_size,
            blocks: len / self.lba_size as u32,
            write: false,
        };
        let q = self.queues.first_mut().context("no I/O queue")?;
        let mut out = Vec::new();
        q.command(&mut out, &io, 1, offset / io.lba_size as u64);
        q.writer.write_all(&out)?;
        let mut data = Vec::with_capacity(len as usize);
        loop {
            match q.receive()? {
                Pdu::C2HData(h, bytes, _) => {
                    data.extend_from_slice(&bytes);
                    if h.success {
                        return Ok(data);
                    }
                }
                Pdu::Response { cqe } => {
                    let cqe = Cqe::decode(&cqe);
                    if !cqe.status.is_success() {
                        bail!("a read ended with status {:#x}", cqe.status.0);
                    }
                    return Ok(data);
                }
                other => bail!("unexpected {other:?}"),
            }
        }
    }
}

/// What each command of a point is.
#[derive(Clone, Copy)]
struct Io {
    nsid: u32,
    lba_size: usize,
    blocks: u32,
    write: bool,
}

/// I/O queues for `point`: as many as the jobs, or the cores when more,
/// never more than the commands outstanding.
pub fn queues_for(point: Point) -> u32 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let total = point.depth * point.jobs;
    point.jobs.max(cores).min(total).max(1)
}

/// Runs `point` for `runtime` seconds: `jobs × depth` commands kept
/// outstanding, spread over [`queues_for`] queues.
pub fn run(target: &Target, point: Point, runtime: u64, size: Option<u64>) -> Result<Measured> {
    let queues = queues_for(point);
    let total = point.depth * point.jobs;
    let session = Session::connect(target, queues as u16)?;
    let lba_size = session.lba_size as u64;
    if !point.block_size.is_multiple_of(lba_size) {
        bail!(
            "{} is not a multiple of the {lba_size}-byte LBA",
            point.label()
        );
    }
    let io = Io {
        nsid: session.nsid,
        lba_size: session.lba_size,
        blocks: (point.block_size / lba_size) as u32,
        write: point.pattern.is_write(),
    };
    let device_ios = session.blocks / u64::from(io.blocks);
    let region_ios = size.map_or(device_ios, |s| (s / point.block_size).min(device_ios));
    if region_ios == 0 {
        bail!("the namespace is smaller than one {} I/O", point.label());
    }
    let cpu_before = crate::iscsi_load::cpu_time();
    let start = Instant::now();
    let deadline = start + Duration::from_secs(runtime);
    let results: Vec<Result<Vec<u64>>> = std::thread::scope(|s| {
        let handles: Vec<_> = session
            .queues
            .into_iter()
            .enumerate()
            .map(|(i, q)| {
                let i = i as u32;
                let depth = total / queues + u32::from(i < total % queues);
                let first = device_ios / u64::from(queues) * u64::from(i) % region_ios;
                let lanes = Lanes {
                    depth: depth.min(QUEUE_ENTRIES - 1),
                    random: point.pattern.is_random(),
                    region_ios,
                    cursor: first,
                    seed: u64::from(i) + 1,
                };
                s.spawn(move || run_queue(q, io, lanes, deadline))
            })
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
    let cpu = crate::iscsi_load::cpu_time() - cpu_before;
    let mut latencies = Vec::new();
    for r in results {
        latencies.extend(r?);
    }
    crate::iscsi_load::measured(latencies, point, elapsed, cpu)
}

/// Where one queue's commands go.
struct Lanes {
    depth: u32,
    random: bool,
    region_ios: u64,
    cursor: u64,
    seed: u64,
}

impl Lanes {
    fn next(&mut self) -> u64 {
        if self.random {
            self.seed ^= self.seed << 13;
            self.seed ^= self.seed >> 7;
            self.seed ^= self.seed << 17;
            self.seed % self.region_ios
        } else {
            self.cursor = (self.cursor + 1) % self.region_ios;
            self.cursor
        }
    }
}

/// One queue's share of the load until `deadline`; its latencies.
fn run_queue(mut q: IoQueue, io: Io, mut lanes: Lanes, deadline: Instant) -> Result<Vec<u64>> {
    lanes.seed ^= std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    lanes.seed = lanes.seed.max(1);
    let per_io = u64::from(io.blocks);
    // Command ids are 1..=depth; started[cid - 1] is when it was sent.
    let mut started: Vec<Option<Instant>> = vec![None; lanes.depth as usize];
    let mut out = Vec::new();
    for cid in 1..=lanes.depth as u16 {
        q.command(&mut out, &io, cid, lanes.next() * per_io);
        started[cid as usize - 1] = Some(Instant::now());
    }
    let mut inflight = lanes.depth;
    let mut latencies = Vec::new();
    while inflight > 0 {
        if q.reader.buffer().is_empty() && !out.is_empty() {
            q.writer.write_all(&out)?;
            out.clear();
        }
        let cid = match q.receive()? {
            Pdu::C2HData(h, _, _) if h.success => h.cccid,
            Pdu::C2HData(..) => continue,
            Pdu::R2T {
                cccid,
                ttag,
                offset,
                len,
            } => {
                q.data(&mut out, cccid, ttag, offset, len);
                continue;
            }
            Pdu::Response { cqe } => {
                let cqe = Cqe::decode(&cqe);
                if !cqe.status.is_success() {
                    bail!("a command ended with status {:#x}", cqe.status.0);
                }
                cqe.cid
            }
            Pdu::Term { fes, fei, .. } => {
                bail!("the target ended the connection: status {fes:#x} at {fei}")
            }
            other => bail!("unexpected {other:?}"),
        };
        let sent = started
            .get_mut(usize::from(cid).wrapping_sub(1))
            .and_then(Option::take)
            .ok_or_else(|| anyhow!("a completion for unknown command {cid}"))?;
        latencies.push(sent.elapsed().as_nanos() as u64);
        if Instant::now() < deadline {
            q.command(&mut out, &io, cid, lanes.next() * per_io);
            started[usize::from(cid) - 1] = Some(Instant::now());
        } else {
            inflight -= 1;
        }
    }
    Ok(latencies)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Pattern;

    #[test]
    fn queues_spread_the_depth_and_never_exceed_it() {
        let p = |depth, jobs| Point {
            pattern: Pattern::RandRead,
            depth,
            jobs,
            block_size: 4096,
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        assert_eq!(queues_for(p(1, 1)), 1);
        assert_eq!(queues_for(p(32, 1)), cores.min(32));
        assert_eq!(queues_for(p(1, 4)), 4);
        assert_eq!(queues_for(p(2, 64)), 64);
    }
}
