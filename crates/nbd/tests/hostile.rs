//! 100,000 random and mutated handshake and request packets against the
//! server while a verified session keeps running beside them.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use block::MemDevice;
use common::raw::{string, Raw};
use common::{export, rss_bytes, Running};
use nbd::proto::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const MIB: u64 = 1 << 20;
const SIZE: u64 = 64 * MIB;
const PACKETS: u64 = 100_000;

static PANICS: AtomicUsize = AtomicUsize::new(0);

/// Sends, then half-closes and reads until the server closes, so each
/// connection ends promptly whatever state the server was left in.
fn finish(mut s: TcpStream) {
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
fn garbage_handshake(addr: SocketAddr, rng: &mut StdRng) -> u64 {
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

fn mutated_options(addr: SocketAddr, rng: &mut StdRng) -> u64 {
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

fn mutated_requests(addr: SocketAddr, rng: &mut StdRng) -> u64 {
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

/// Writes, reads back and compares its own region until told to stop.
fn verified_session(addr: SocketAddr, stop: Arc<AtomicBool>, ops: Arc<AtomicU64>) {
    let mut c = Raw::connect(addr).unwrap();
    c.go("v", true, false, true).unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let mut cookie = 0;
    while !stop.load(Ordering::Relaxed) {
        let offset = rng.gen_range(0..(16 * MIB / 4096)) * 4096;
        let len = rng.gen_range(1..=16) * 4096;
        let mut data = vec![0; len as usize];
        rng.fill(&mut data[..]);
        cookie += 1;
        let fua = if cookie % 7 == 0 { CMD_FLAG_FUA } else { 0 };
        assert_eq!(c.command(CMD_WRITE, fua, cookie, offset, len, &data), 0);
        cookie += 1;
        assert!(
            c.read(cookie, offset, len as usize).unwrap() == data,
            "the verified session read back other data"
        );
        if cookie % 50 == 0 {
            cookie += 1;
            assert_eq!(c.command(CMD_FLUSH, 0, cookie, 0, 0, &[]), 0);
        }
        ops.fetch_add(1, Ordering::Relaxed);
    }
    c.request(CMD_DISC, 0, cookie + 1, 0, 0, &[]);
}

#[test]
fn hostile_packets_never_disturb_a_verified_session() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        default_hook(info);
    }));
    let dev = Arc::new(MemDevice::new(SIZE));
    let srv = Running::start(vec![("v", export(dev))]);
    let addr = srv.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let verified_ops = Arc::new(AtomicU64::new(0));
    let verifier = {
        let (stop, ops) = (stop.clone(), verified_ops.clone());
        std::thread::spawn(move || verified_session(addr, stop, ops))
    };
    let sent = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let rss_start = rss_bytes();
    let peak_rss = Arc::new(AtomicU64::new(rss_start));
    let workers: Vec<_> = (0..4u64)
        .map(|w| {
            let (sent, peak) = (sent.clone(), peak_rss.clone());
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(1000 + w);
                while sent.load(Ordering::Relaxed) < PACKETS {
                    let n = match rng.gen_range(0..10) {
                        0 | 1 => garbage_handshake(addr, &mut rng),
                        2 | 3 => mutated_options(addr, &mut rng),
                        _ => mutated_requests(addr, &mut rng),
                    };
                    sent.fetch_add(n, Ordering::Relaxed);
                    peak.fetch_max(rss_bytes(), Ordering::Relaxed);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    verifier.join().expect("the verified session failed");
    let elapsed = started.elapsed();
    // Every hostile connection is gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    let stats = loop {
        let s = srv.server.stats();
        if (s.open_connections == 0 && s.negotiating == 0) || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let peak = peak_rss.load(Ordering::Relaxed);
    eprintln!(
        "{} packets in {elapsed:?}; verified session: {} write+read pairs; rss {} -> peak {} MiB; {stats:?}",
        sent.load(Ordering::Relaxed),
        verified_ops.load(Ordering::Relaxed),
        rss_start >> 20,
        peak >> 20
    );
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "something panicked");
    assert!(sent.load(Ordering::Relaxed) >= PACKETS);
    assert!(verified_ops.load(Ordering::Relaxed) > 100);
    assert_eq!(
        (stats.open_connections, stats.negotiating),
        (0, 0),
        "connections left open"
    );
    assert!(
        stats.protocol_errors > 100,
        "malformed input was not noticed: {stats:?}"
    );
    // The device (64 MiB) plus per-connection buffers; not growing with
    // the number of packets.
    assert!(
        peak - rss_start < 512 * MIB,
        "memory grew by {} MiB",
        (peak - rss_start) >> 20
    );
}
