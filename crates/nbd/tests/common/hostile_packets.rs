//! Random and mutated NBD handshake and request packets, each kind sent
//! on its own connection to a server exporting a 64 MiB device as `v`.
//! Requests land in its upper half; a verified session may use the lower.
//! Shared by the crate's hostile-input test and the daemon's.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use nbd::proto::*;
use rand::rngs::StdRng;
use rand::Rng;

use super::raw::{string, Raw};

const MIB: u64 = 1 << 20;
/// The size of the export `v`.
pub const SIZE: u64 = 64 * MIB;

/// Sends, then half-closes and reads until the server closes, so each
/// connection ends promptly whatever state the server was left in.
pub fn finish(mut s: TcpStream) {
    let _ = s.shutdown(Shutdown::Write);
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let mut sink = [0; 64 * 1024];
    while let Ok(n) = s.read(&mut sink) {
        if n == 0 {
            break;
        }
    }
}

fn greeted(addr: SocketAddr) -> Option<TcpStream> {
    let mut s = TcpStream::connect(addr).ok()?;
    let mut greeting = [0; 18];
    s.read_exact(&mut greeting).ok()?;
    Some(s)
}

/// Random bytes where the client flags and options should be.
pub fn garbage_handshake(addr: SocketAddr, rng: &mut StdRng) -> u64 {
    let Some(mut s) = greeted(addr) else { return 0 };
    let mut b = vec![0; rng.gen_range(1..96)];
    rng.fill(&mut b[..]);
    if b.len() >= 4 && rng.gen_bool(0.5) {
        // Valid client flags, garbage after them.
        b[..4].copy_from_slice(&FLAG_C_FIXED_NEWSTYLE.to_be_bytes());
    }
    let _ = s.write_all(&b);
    finish(s);
    1
}

/// A valid option with one field mutated.
fn mutated_option(rng: &mut StdRng) -> Vec<u8> {
    let opt = *[
        OPT_GO,
        OPT_INFO,
        OPT_LIST,
        OPT_SET_META_CONTEXT,
        OPT_LIST_META_CONTEXT,
        OPT_STRUCTURED_REPLY,
        OPT_EXTENDED_HEADERS,
        OPT_STARTTLS,
        0,
        12,
        u32::MAX,
    ]
    .get(rng.gen_range(0..11))
    .unwrap();
    let mut data = match opt {
        OPT_GO | OPT_INFO => {
            let mut d = string(["v", "", "nothere"][rng.gen_range(0..3)]);
            let n: u16 = rng.gen_range(0..4);
            d.extend_from_slice(&n.to_be_bytes());
            for _ in 0..n {
                d.extend_from_slice(&rng.gen_range(0u16..5).to_be_bytes());
            }
            d
        }
        OPT_SET_META_CONTEXT | OPT_LIST_META_CONTEXT => {
            let mut d = string("v");
            d.extend_from_slice(&1u32.to_be_bytes());
            d.extend_from_slice(&string(BASE_ALLOCATION));
            d
        }
        _ => Vec::new(),
    };
    match rng.gen_range(0..6) {
        0 if !data.is_empty() => {
            let i = rng.gen_range(0..data.len());
            data[i] ^= 1 << rng.gen_range(0..8);
        }
        1 => data.truncate(rng.gen_range(0..=data.len())),
        2 => data.extend((0..rng.gen_range(1..16)).map(|_| rng.gen::<u8>())),
        _ => {}
    }
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&opt.to_be_bytes());
    let len = match rng.gen_range(0..20) {
        0 => rng.gen::<u32>(),
        1 => data.len() as u32 + 1,
        _ => data.len() as u32,
    };
    b.extend_from_slice(&len.to_be_bytes());
    b.extend_from_slice(&data);
    if rng.gen_range(0..30) == 0 {
        let i = rng.gen_range(0..8);
        b[i] ^= 0x40; // a broken magic
    }
    b
}

pub fn mutated_options(addr: SocketAddr, rng: &mut StdRng) -> u64 {
    let Some(mut s) = greeted(addr) else { return 0 };
    let _ = s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes());
    let n = rng.gen_range(1..12);
    for _ in 0..n {
        if s.write_all(&mutated_option(rng)).is_err() {
            break;
        }
    }
    finish(s);
    n + 1
}

/// A valid request with, most of the time, one field mutated.
fn mutated_request(rng: &mut StdRng, extended: bool) -> Vec<u8> {
    let kind: u16 = if rng.gen_range(0..10) == 0 {
        rng.gen_range(0..12)
    } else {
        rng.gen_range(0..8)
    };
    let kind = if kind == CMD_DISC { CMD_READ } else { kind };
    let mut flags: u16 = 0;
    let mut offset = rng.gen_range(0..SIZE / 4096) * 4096 + 32 * MIB;
    let mut len: u64 = rng.gen_range(1..=8) * 512;
    offset = offset.min(SIZE - len);
    match rng.gen_range(0..8) {
        0 => flags = rng.gen(),
        1 => offset = rng.gen(),
        2 => {
            len = if extended {
                rng.gen()
            } else {
                rng.gen::<u32>() as u64
            }
        }
        3 => len = 33 * MIB,
        4 => offset = SIZE - 1,
        _ => {}
    }
    let carries = kind == CMD_WRITE;
    if extended && carries {
        flags |= CMD_FLAG_PAYLOAD_LEN;
    }
    let magic = if extended {
        EXTENDED_REQUEST_MAGIC
    } else {
        REQUEST_MAGIC
    };
    let mut b = magic.to_be_bytes().to_vec();
    if rng.gen_range(0..40) == 0 {
        b[rng.gen_range(0..4)] ^= 0x10;
    }
    b.extend_from_slice(&flags.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&rng.gen::<u64>().to_be_bytes());
    b.extend_from_slice(&offset.to_be_bytes());
    if extended {
        b.extend_from_slice(&len.to_be_bytes());
    } else {
        b.extend_from_slice(&(len as u32).to_be_bytes());
    }
    if carries && len <= 4096 {
        b.extend((0..len).map(|_| rng.gen::<u8>()));
    }
    if rng.gen_range(0..50) == 0 {
        b.truncate(rng.gen_range(0..b.len()));
    }
    b
}

pub fn mutated_requests(addr: SocketAddr, rng: &mut StdRng) -> u64 {
    let Ok(mut c) = Raw::connect(addr) else {
        return 0;
    };
    let extended = rng.gen_bool(0.3);
    let structured = extended || rng.gen_bool(0.5);
    if c.go("v", structured, extended, structured && rng.gen_bool(0.5))
        .is_err()
    {
        return 0;
    }
    let n = rng.gen_range(10..60);
    let mut sent = 0;
    for _ in 0..n {
        if c.s.write_all(&mutated_request(rng, extended)).is_err() {
            break;
        }
        sent += 1;
    }
    finish(c.s);
    sent + 1
}

/// Sends one random kind of hostile input; returns the packets sent.
pub fn send_one(addr: SocketAddr, rng: &mut StdRng) -> u64 {
    match rng.gen_range(0..10) {
        0 | 1 => garbage_handshake(addr, rng),
        2 | 3 => mutated_options(addr, rng),
        _ => mutated_requests(addr, rng),
    }
}
