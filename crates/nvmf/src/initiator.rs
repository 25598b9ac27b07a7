//! A small NVMe/TCP host, written from the specifications for tests of
//! this crate and of the daemon: queues over TCP with or without
//! digests, Connect, commands with in-capsule data or data sent on R2T,
//! and raw PDUs for tests of what the target does with bad ones.

mod auth;
mod discover;
mod verify;

use std::io;
use std::net::SocketAddr;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::capsule::{Cqe, Fuse, SqeBuilder, SGL_IN_CAPSULE, SGL_TRANSPORT};
use crate::connection::{read_pdu, ReadError};
use crate::status::Status;
use crate::wire::{self, kind, DataHeader, Digests, IcReq, Pdu};

pub use auth::{failure2, must_authenticate, negotiate, reply, success2, AuthFailure, HostAuth};
pub use discover::{DiscoveryEntry, DiscoveryLog};
pub use verify::{pattern, verified_io};

const TARGET_SENDS: &[u8] = &[
    kind::IC_RESP,
    kind::C2H_TERM,
    kind::CAPSULE_RESP,
    kind::C2H_DATA,
    kind::R2T,
];

/// A command to run: its entry (the id is given when it is sent), the
/// data it sends and the length of the data it reads.
#[derive(Clone, Debug)]
pub struct Command {
    pub sqe: SqeBuilder,
    pub data_out: Vec<u8>,
    pub data_in: usize,
}

impl Command {
    pub fn new(sqe: SqeBuilder) -> Command {
        Command {
            sqe,
            data_out: Vec::new(),
            data_in: 0,
        }
    }

    pub fn sending(mut self, data: Vec<u8>) -> Command {
        self.data_out = data;
        self
    }

    pub fn reading(mut self, len: usize) -> Command {
        self.data_in = len;
        self
    }
}

/// A command's end: its completion and the data it read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub cqe: Cqe,
    pub data: Vec<u8>,
}

impl Completion {
    pub fn status(&self) -> Status {
        self.cqe.status
    }
}

fn failed(what: String) -> io::Error {
    io::Error::other(what)
}

/// One queue: one TCP connection.
pub struct Queue {
    pub stream: TcpStream,
    pub digests: Digests,
    pub maxh2cdata: u32,
    /// Data up to this long goes in the capsule; longer waits for R2T.
    pub in_capsule: usize,
    next_cid: u16,
}

impl Queue {
    /// Connects and initializes (ICReq/ICResp) asking for `digests`.
    pub async fn open(addr: SocketAddr, digests: Digests) -> io::Result<Queue> {
        let mut stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let req = IcReq {
            pfv: 0,
            hpda: 0,
            digests,
            maxr2t: 0,
        };
        stream.write_all(&wire::encode_ic_req(&req)).await?;
        let resp = match read_pdu(&mut stream, TARGET_SENDS, Digests::default(), 1 << 20).await {
            Ok(Pdu::IcResp(r)) => r,
            Ok(other) => return Err(failed(format!("initialization answered with {other:?}"))),
            Err(ReadError::Io(e)) => return Err(e),
            Err(ReadError::Fatal(f, _)) => return Err(failed(f.to_string())),
        };
        Ok(Queue {
            stream,
            digests: resp.digests,
            maxh2cdata: resp.maxh2cdata,
            in_capsule: 8192,
            next_cid: 1,
        })
    }

    /// The next PDU from the target.
    pub async fn receive(&mut self) -> io::Result<Pdu> {
        match read_pdu(&mut self.stream, TARGET_SENDS, self.digests, 64 << 20).await {
            Ok(p) => Ok(p),
            Err(ReadError::Io(e)) => Err(e),
            Err(ReadError::Fatal(f, _)) => Err(failed(f.to_string())),
        }
    }

    /// Sends `cmds` in order, then answers R2Ts and gathers data until
    /// every one of them has completed; completions in `cmds`' order.
    pub async fn run(&mut self, cmds: Vec<Command>) -> io::Result<Vec<Completion>> {
        let mut cids = Vec::new();
        for c in &cmds {
            let cid = self.next_cid;
            self.next_cid = self.next_cid.wrapping_add(1).max(1);
            cids.push(cid);
            let mut sqe = c.sqe;
            wire::put16(&mut sqe.0, 2, cid);
            let pdu = if c.data_out.is_empty() {
                let sqe = sqe.sgl(SGL_TRANSPORT, 0, c.data_in as u32).build();
                wire::encode_command(&sqe.0, &[], self.digests)
            } else if c.data_out.len() <= self.in_capsule {
                let sqe = sqe.sgl(SGL_IN_CAPSULE, 0, c.data_out.len() as u32).build();
                wire::encode_command(&sqe.0, &c.data_out, self.digests)
            } else {
                let sqe = sqe.sgl(SGL_TRANSPORT, 0, c.data_out.len() as u32).build();
                wire::encode_command(&sqe.0, &[], self.digests)
            };
            self.stream.write_all(&pdu).await?;
        }
        let mut done: Vec<Option<Completion>> = vec![None; cmds.len()];
        let mut data: Vec<Vec<u8>> = vec![Vec::new(); cmds.len()];
        let at = |cid: u16| cids.iter().position(|c| *c == cid);
        while done.iter().any(Option::is_none) {
            match self.receive().await? {
                Pdu::R2T {
                    cccid,
                    ttag,
                    offset,
                    len,
                } => {
                    let i = at(cccid)
                        .ok_or_else(|| failed(format!("R2T for unknown command {cccid}")))?;
                    self.send_data(
                        cccid,
                        ttag,
                        &cmds[i].data_out,
                        offset as usize,
                        len as usize,
                    )
                    .await?;
                }
                Pdu::C2HData(h, bytes, digest_ok) => {
                    let i = at(h.cccid)
                        .ok_or_else(|| failed(format!("data for unknown command {}", h.cccid)))?;
                    if !digest_ok || h.offset as usize != data[i].len() {
                        return Err(failed("read data out of order or with a bad digest".into()));
                    }
                    data[i].extend_from_slice(&bytes);
                    if h.success {
                        let cqe = Cqe {
                            result: 0,
                            sq_head: 0,
                            sq_id: 0,
                            cid: h.cccid,
                            status: Status::SUCCESS,
                        };
                        done[i] = Some(Completion {
                            cqe,
                            data: std::mem::take(&mut data[i]),
                        });
                    }
                }
                Pdu::Response { cqe } => {
                    let cqe = Cqe::decode(&cqe);
                    let i = at(cqe.cid).ok_or_else(|| {
                        failed(format!("completion of unknown command {}", cqe.cid))
                    })?;
                    done[i] = Some(Completion {
                        cqe,
                        data: std::mem::take(&mut data[i]),
                    });
                }
                Pdu::Term { fes, fei, .. } => {
                    return Err(failed(format!(
                        "the target ended the connection: status {fes:#x} at {fei}"
                    )))
                }
                other => return Err(failed(format!("unexpected {other:?}"))),
            }
        }
        Ok(done.into_iter().flatten().collect())
    }

    async fn send_data(
        &mut self,
        cid: u16,
        ttag: u16,
        data: &[u8],
        offset: usize,
        len: usize,
    ) -> io::Result<()> {
        let end = (offset + len).min(data.len());
        let step = self.maxh2cdata.max(1) as usize;
        let mut at = offset;
        while at < end {
            let n = step.min(end - at);
            let h = DataHeader {
                cccid: cid,
                ttag,
                offset: at as u32,
                len: n as u32,
                last: at + n == end,
                success: false,
            };
            let pdu = wire::encode_data(kind::H2C_DATA, &h, &data[at..at + n], self.digests, 1);
            self.stream.write_all(&pdu).await?;
            at += n;
        }
        Ok(())
    }

    /// Runs one command.
    pub async fn one(&mut self, cmd: Command) -> io::Result<Completion> {
        let mut c = self.run(vec![cmd]).await?;
        c.pop().ok_or_else(|| failed("no completion".into()))
    }

    /// Fabrics Connect of queue `qid` with `entries` entries.
    pub async fn connect(
        &mut self,
        qid: u16,
        entries: u16,
        cntlid: u16,
        who: &Who,
        kato_ms: u32,
        flow_off: bool,
    ) -> io::Result<Completion> {
        let mut data = vec![0u8; 1024];
        data[..16].copy_from_slice(&who.host_id);
        wire::put16(&mut data, 16, cntlid);
        data[256..256 + who.subnqn.len()].copy_from_slice(who.subnqn.as_bytes());
        data[512..512 + who.host_nqn.len()].copy_from_slice(who.host_nqn.as_bytes());
        let mut sqe = SqeBuilder::new(0x7F, 0).byte(4, 0x01).cdw(12, kato_ms);
        wire::put16(&mut sqe.0, 42, qid);
        wire::put16(&mut sqe.0, 44, entries - 1);
        sqe.0[46] = u8::from(flow_off) << 2;
        self.one(Command::new(sqe).sending(data)).await
    }

    /// Authenticates when Connect's answer `c` asks for it.
    async fn authenticate_if_asked(
        &mut self,
        c: &Completion,
        who: &Who,
        auth: Option<&HostAuth>,
        tid: u16,
    ) -> io::Result<()> {
        match auth {
            Some(a) if must_authenticate(c) => match self.authenticate(who, a, tid).await? {
                Ok(()) => Ok(()),
                Err(f) => Err(failed(format!("authentication failed: {f:?}"))),
            },
            _ => Ok(()),
        }
    }

    pub async fn property_get(&mut self, offset: u32, wide: bool) -> io::Result<Completion> {
        let sqe = SqeBuilder::new(0x7F, 0)
            .byte(4, 0x04)
            .byte(40, u8::from(wide))
            .cdw(11, offset);
        self.one(Command::new(sqe)).await
    }

    pub async fn property_set(&mut self, offset: u32, value: u32) -> io::Result<Completion> {
        let sqe = SqeBuilder::new(0x7F, 0)
            .byte(4, 0x00)
            .cdw(11, offset)
            .cdw(12, value);
        self.one(Command::new(sqe)).await
    }
}

/// Who connects: the host and the subsystem it asks for.
#[derive(Clone, Debug)]
pub struct Who {
    pub host_nqn: String,
    pub host_id: [u8; 16],
    pub subnqn: String,
}

/// How a [`Host`] connects.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub digests: Digests,
    pub io_queues: u16,
    pub kato_ms: u32,
    /// Ask for SQ flow control off (completions of reads may be folded
    /// into their data).
    pub flow_off: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            digests: Digests::default(),
            io_queues: 1,
            kato_ms: 0,
            flow_off: false,
        }
    }
}

/// A controller of a subsystem: its admin queue and I/O queues.
pub struct Host {
    pub admin: Queue,
    pub io: Vec<Queue>,
    pub cntlid: u16,
    pub who: Who,
}

/// An error from a completion that should have succeeded.
pub fn expect_success(c: &Completion, what: &str) -> io::Result<()> {
    if c.status().is_success() {
        Ok(())
    } else {
        Err(failed(format!("{what}: status {:#x}", c.status().0)))
    }
}

impl Host {
    /// Connects an admin queue, enables the controller, asks for the I/O
    /// queues and connects them.
    pub async fn connect(addr: SocketAddr, who: Who, opts: Options) -> io::Result<Host> {
        Host::connect_auth(addr, who, opts, None).await
    }

    /// As [`Host::connect`], authenticating each queue with `auth` when
    /// the target asks.
    pub async fn connect_auth(
        addr: SocketAddr,
        who: Who,
        opts: Options,
        auth: Option<&HostAuth>,
    ) -> io::Result<Host> {
        let mut admin = Queue::open(addr, opts.digests).await?;
        let c = admin
            .connect(0, 32, 0xFFFF, &who, opts.kato_ms, opts.flow_off)
            .await?;
        expect_success(&c, "admin Connect")?;
        let cntlid = c.cqe.result as u16;
        admin.authenticate_if_asked(&c, &who, auth, 1).await?;
        let cc = 1 | 6 << 16 | 4 << 20;
        expect_success(&admin.property_set(0x14, cc).await?, "enable")?;
        let csts = admin.property_get(0x1C, false).await?;
        if csts.cqe.result & 1 == 0 {
            return Err(failed("the controller is not ready".into()));
        }
        if opts.io_queues > 0 {
            let n = u32::from(opts.io_queues - 1);
            let c = admin
                .one(Command::new(
                    SqeBuilder::new(0x09, 0).cdw(10, 0x07).cdw(11, n | n << 16),
                ))
                .await?;
            expect_success(&c, "Set Features, Number of Queues")?;
        }
        let mut io = Vec::new();
        for qid in 1..=opts.io_queues {
            let mut q = Queue::open(addr, opts.digests).await?;
            let c = q.connect(qid, 128, cntlid, &who, 0, opts.flow_off).await?;
            expect_success(&c, "I/O Connect")?;
            q.authenticate_if_asked(&c, &who, auth, qid + 1).await?;
            io.push(q);
        }
        Ok(Host {
            admin,
            io,
            cntlid,
            who,
        })
    }

    pub async fn identify(&mut self, cns: u8, nsid: u32) -> io::Result<Completion> {
        let sqe = SqeBuilder::new(0x06, 0).nsid(nsid).cdw(10, u32::from(cns));
        self.admin.one(Command::new(sqe).reading(4096)).await
    }

    pub async fn get_log(&mut self, lid: u8, len: usize, retain: bool) -> io::Result<Completion> {
        let dwords = (len / 4 - 1) as u32;
        let cdw10 = u32::from(lid) | u32::from(retain) << 15 | (dwords & 0xFFFF) << 16;
        let sqe = SqeBuilder::new(0x02, 0)
            .nsid(0xFFFF_FFFF)
            .cdw(10, cdw10)
            .cdw(11, dwords >> 16);
        self.admin.one(Command::new(sqe).reading(len)).await
    }
}

/// NVM command entries.
pub mod nvm {
    use super::*;

    fn rw(op: u8, nsid: u32, slba: u64, blocks: u32) -> SqeBuilder {
        SqeBuilder::new(op, 0)
            .nsid(nsid)
            .cdw(10, slba as u32)
            .cdw(11, (slba >> 32) as u32)
            .cdw(12, blocks - 1)
    }

    pub fn read(nsid: u32, slba: u64, blocks: u32, bs: usize) -> Command {
        Command::new(rw(0x02, nsid, slba, blocks)).reading(blocks as usize * bs)
    }

    pub fn write(nsid: u32, slba: u64, data: Vec<u8>, bs: usize, fua: bool) -> Command {
        let blocks = (data.len() / bs) as u32;
        let sqe = rw(0x01, nsid, slba, blocks);
        let sqe = sqe.cdw(12, sqe.build().cdw(12) | u32::from(fua) << 30);
        Command::new(sqe).sending(data)
    }

    pub fn compare(nsid: u32, slba: u64, data: Vec<u8>, bs: usize) -> Command {
        let blocks = (data.len() / bs) as u32;
        Command::new(rw(0x05, nsid, slba, blocks)).sending(data)
    }

    pub fn flush(nsid: u32) -> Command {
        Command::new(SqeBuilder::new(0x00, 0).nsid(nsid))
    }

    pub fn write_zeroes(nsid: u32, slba: u64, blocks: u32, deallocate: bool) -> Command {
        let sqe = rw(0x08, nsid, slba, blocks);
        Command::new(sqe.cdw(12, (blocks - 1) | u32::from(deallocate) << 25))
    }

    /// Dataset Management deallocating `ranges` (first block, blocks).
    pub fn deallocate(nsid: u32, ranges: &[(u64, u32)]) -> Command {
        let mut data = vec![0u8; 16 * ranges.len()];
        for (i, (slba, blocks)) in ranges.iter().enumerate() {
            wire::put32(&mut data, i * 16 + 4, *blocks);
            wire::put64(&mut data, i * 16 + 8, *slba);
        }
        let sqe = SqeBuilder::new(0x09, 0)
            .nsid(nsid)
            .cdw(10, ranges.len() as u32 - 1)
            .cdw(11, 1 << 2);
        Command::new(sqe).sending(data)
    }

    /// A fused Compare and Write: both commands, to run together.
    pub fn compare_and_write(
        nsid: u32,
        slba: u64,
        expect: Vec<u8>,
        new: Vec<u8>,
        bs: usize,
    ) -> Vec<Command> {
        let mut cmp = compare(nsid, slba, expect, bs);
        cmp.sqe = cmp.sqe.fuse(Fuse::First);
        let mut wr = write(nsid, slba, new, bs, false);
        wr.sqe = wr.sqe.fuse(Fuse::Second);
        vec![cmp, wr]
    }
}
