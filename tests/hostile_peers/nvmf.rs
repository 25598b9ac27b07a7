//! Just enough of an NVMe/TCP host to be a hostile one, over blocking
//! sockets from a chosen source address: initialization, Connect of an
//! admin queue (enabled, one I/O queue granted) and of an I/O queue, and
//! raw read and write capsules.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};

use nvmf::capsule::{Cqe, SqeBuilder, SGL_IN_CAPSULE, SGL_TRANSPORT};
use nvmf::status::Status;
use nvmf::wire::{self, Digests, IcReq, Pdu};

use super::stall::connect_from;

pub const NQN: &str = "nqn.2026-11.org.test:hostile";
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0b5c2e3e-6f1c-4c33-9d5f-00000000f001";
pub const BS: usize = 512;
/// Entries asked for each I/O queue: the most the target offers.
pub const ENTRIES: u16 = 128;

/// The next PDU the target sends.
pub fn receive(s: &mut TcpStream) -> io::Result<Pdu> {
    let mut b = vec![0u8; wire::COMMON_LEN];
    s.read_exact(&mut b)?;
    let plen = wire::le32(&b, 4) as usize;
    if !(wire::COMMON_LEN..=64 << 20).contains(&plen) {
        return Err(io::Error::other(format!("a PDU of {plen} bytes")));
    }
    b.resize(plen, 0);
    s.read_exact(&mut b[wire::COMMON_LEN..])?;
    wire::decode(&b, Digests::default()).map_err(|f| io::Error::other(f.to_string()))
}

/// ICReq, and the target's ICResp.
pub fn initialize(s: &mut TcpStream) -> io::Result<()> {
    let req = IcReq {
        pfv: 0,
        hpda: 0,
        digests: Digests::default(),
        maxr2t: 0,
    };
    s.write_all(&wire::encode_ic_req(&req))?;
    match receive(s)? {
        Pdu::IcResp(_) => Ok(()),
        other => Err(io::Error::other(format!("ICReq answered with {other:?}"))),
    }
}

/// A command capsule with its data in the capsule, or none sent.
pub fn capsule(sqe: SqeBuilder, data: &[u8], data_in: usize) -> Vec<u8> {
    let sqe = if data.is_empty() {
        sqe.sgl(SGL_TRANSPORT, 0, data_in as u32)
    } else {
        sqe.sgl(SGL_IN_CAPSULE, 0, data.len() as u32)
    };
    wire::encode_command(&sqe.build().0, data, Digests::default())
}

/// Sends one command and reads what comes back until its completion:
/// the completion and the data read.
pub fn exchange(s: &mut TcpStream, bytes: &[u8]) -> io::Result<(Cqe, Vec<u8>)> {
    s.write_all(bytes)?;
    let mut data = Vec::new();
    loop {
        match receive(s)? {
            Pdu::Response { cqe } => return Ok((Cqe::decode(&cqe), data)),
            Pdu::C2HData(h, bytes, _) => {
                data.extend_from_slice(&bytes);
                if h.success {
                    let cqe = Cqe {
                        result: 0,
                        sq_head: 0,
                        sq_id: 0,
                        cid: h.cccid,
                        status: Status::SUCCESS,
                    };
                    return Ok((cqe, data));
                }
            }
            other => return Err(io::Error::other(format!("unexpected {other:?}"))),
        }
    }
}

fn must(c: Cqe, what: &str) -> io::Result<Cqe> {
    if c.status.is_success() {
        Ok(c)
    } else {
        Err(io::Error::other(format!(
            "{what}: status {:#x}",
            c.status.0
        )))
    }
}

/// Fabrics Connect of queue `qid` of controller `cntlid` (0xFFFF: a new
/// one) as [`HOSTNQN`]: the completion.
pub fn connect(s: &mut TcpStream, qid: u16, entries: u16, cntlid: u16) -> io::Result<Cqe> {
    let mut data = vec![0u8; 1024];
    data[..16].copy_from_slice(b"openarray-hostil");
    wire::put16(&mut data, 16, cntlid);
    data[256..256 + NQN.len()].copy_from_slice(NQN.as_bytes());
    data[512..512 + HOSTNQN.len()].copy_from_slice(HOSTNQN.as_bytes());
    let mut sqe = SqeBuilder::new(0x7F, 1).byte(4, 0x01);
    wire::put16(&mut sqe.0, 42, qid);
    wire::put16(&mut sqe.0, 44, entries - 1);
    let (c, _) = exchange(s, &capsule(sqe, &data, 0))?;
    must(c, "Connect")
}

/// A new controller's admin queue from `source`: connected, enabled,
/// one I/O queue granted. The stream and the controller's id.
pub fn admin(addr: SocketAddr, source: IpAddr) -> io::Result<(TcpStream, u16)> {
    let mut s = connect_from(addr, source, None);
    initialize(&mut s)?;
    let cntlid = connect(&mut s, 0, 32, 0xFFFF)?.result as u16;
    let cc = 1 | 6 << 16 | 4 << 20;
    let set = SqeBuilder::new(0x7F, 2)
        .byte(4, 0x00)
        .cdw(11, 0x14)
        .cdw(12, cc);
    must(exchange(&mut s, &capsule(set, &[], 0))?.0, "enable")?;
    let queues = SqeBuilder::new(0x09, 3).cdw(10, 0x07).cdw(11, 0);
    must(exchange(&mut s, &capsule(queues, &[], 0))?.0, "queues")?;
    Ok((s, cntlid))
}

/// I/O queue 1 of controller `cntlid` from `source`, with a receive
/// buffer of `recv_buffer` bytes when given.
pub fn io_queue(
    addr: SocketAddr,
    source: IpAddr,
    recv_buffer: Option<usize>,
    cntlid: u16,
) -> io::Result<TcpStream> {
    let mut s = connect_from(addr, source, recv_buffer);
    initialize(&mut s)?;
    connect(&mut s, 1, ENTRIES, cntlid)?;
    Ok(s)
}

/// A Read capsule of `blocks` at `slba` of namespace 1.
pub fn read(cid: u16, slba: u64, blocks: u32) -> Vec<u8> {
    let sqe = SqeBuilder::new(0x02, cid)
        .nsid(1)
        .cdw(10, slba as u32)
        .cdw(11, (slba >> 32) as u32)
        .cdw(12, blocks - 1);
    capsule(sqe, &[], blocks as usize * BS)
}

/// A Write capsule of `data` (in the capsule) at `slba` of namespace 1.
pub fn write(cid: u16, slba: u64, data: &[u8]) -> Vec<u8> {
    let sqe = SqeBuilder::new(0x01, cid)
        .nsid(1)
        .cdw(10, slba as u32)
        .cdw(11, (slba >> 32) as u32)
        .cdw(12, (data.len() / BS) as u32 - 1);
    capsule(sqe, data, 0)
}

/// A controller from `source` writes a pattern to LBA 0 of namespace 1
/// and reads it back.
pub fn verified_io(addr: SocketAddr, source: IpAddr) {
    let (_admin, cntlid) = admin(addr, source).expect("admin queue from the other address");
    let mut q = io_queue(addr, source, None, cntlid).expect("I/O queue");
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 11 + 7) as u8).collect();
    let (c, _) = exchange(&mut q, &write(1, 0, &pattern)).expect("Write");
    assert!(c.status.is_success(), "Write: {:#x}", c.status.0);
    let (c, data) = exchange(&mut q, &read(2, 0, 8)).expect("Read");
    assert!(c.status.is_success(), "Read: {:#x}", c.status.0);
    assert_eq!(data, pattern, "read back what was written");
}
