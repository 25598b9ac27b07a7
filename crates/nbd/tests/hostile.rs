//! 100,000 random and mutated handshake and request packets against the
//! server while a verified session keeps running beside them.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use block::MemDevice;
use common::raw::Raw;
use common::{export, hostile_packets, rss_bytes, Running};
use nbd::proto::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const MIB: u64 = 1 << 20;
const SIZE: u64 = hostile_packets::SIZE;
const PACKETS: u64 = 100_000;

static PANICS: AtomicUsize = AtomicUsize::new(0);

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
                    let n = hostile_packets::send_one(addr, &mut rng);
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
