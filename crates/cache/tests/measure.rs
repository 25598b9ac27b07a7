//! Figures, not checks: a slow backing (a `delay` device: 4 ms, 250 IOPS,
//! 150 MB/s) against the cache over it, 4 KiB random I/O from 8 threads
//! over a hot set that fits the cache. Run with
//! `cargo test -p cache --release --test measure -- --ignored --nocapture`.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use block::{BlockDevice, DelayDevice, DelayLimits, MemDevice};
use cache::{CacheDevice, CacheOptions, Mode};

const MIB: u64 = 1 << 20;
const BACKING: u64 = 256 * MIB;
const CACHE: u64 = 26 * MIB;
const HOT: u64 = 16 * MIB;
const THREADS: u64 = 8;

fn slow_disk() -> Arc<dyn BlockDevice> {
    Arc::new(DelayDevice::new(
        Arc::new(MemDevice::new(BACKING + cache::BACKING_RESERVE)),
        DelayLimits {
            latency: Duration::from_millis(4),
            iops: Some(250),
            bandwidth: Some(150 * MIB),
        },
    ))
}

/// 4 KiB operations a second over `secs`, skewed towards the start of the
/// hot set.
fn iops(dev: &Arc<dyn BlockDevice>, write: bool, secs: f64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (dev, done) = (dev.clone(), done.clone());
            std::thread::spawn(move || {
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1);
                let mut buf = vec![t as u8; 4096];
                while Instant::now() < end {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let u = (rng >> 11) as f64 / (1u64 << 53) as f64;
                    let off = ((u * u * (HOT / 4096) as f64) as u64) * 4096;
                    if write {
                        dev.write_at(&buf, off, false).unwrap();
                    } else {
                        dev.read_at(&mut buf, off).unwrap();
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    done.load(Ordering::Relaxed) as f64 / secs
}

#[test]
#[ignore]
fn hot_set_reads_and_write_back_writes_against_the_slow_backing() {
    let alone = slow_disk();
    let backing_reads = iops(&alone, false, 2.0);
    let backing_writes = iops(&alone, true, 2.0);
    let fast: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(CACHE));
    let fast_reads = iops(&fast, false, 2.0);

    let mut o = CacheOptions::new("slow");
    o.mode = Mode::WriteThrough;
    let cache =
        Arc::new(CacheDevice::open(Arc::new(MemDevice::new(CACHE)), slow_disk(), o).unwrap());
    let dev: Arc<dyn BlockDevice> = cache.clone();
    // Warm-up: read the hot set once, sequentially in 64 KiB, with the
    // cutoff off (it would rightly leave most of this stream uncached).
    cache.set_sequential_cutoff(0);
    let warm = Instant::now();
    let mut buf = vec![0; 65536];
    for off in (0..HOT).step_by(65536) {
        dev.read_at(&mut buf, off).unwrap();
    }
    let warm_secs = warm.elapsed().as_secs_f64();
    cache.set_sequential_cutoff(cache::DEFAULT_SEQUENTIAL_CUTOFF);
    let cached_reads = iops(&dev, false, 2.0);
    let read_ratio = cache.status().reads.ratio;
    cache.set_mode(Mode::WriteBack, &mut |_| {}).unwrap();
    let cached_writes = iops(&dev, true, 2.0);
    let s = cache.status();
    println!(
        "4 KiB random, {THREADS} threads, hot set {} MiB, cache {} MiB, backing {} MiB",
        HOT / MIB,
        CACHE / MIB,
        BACKING / MIB
    );
    println!("backing alone: reads {backing_reads:.0} IOPS, writes {backing_writes:.0} IOPS");
    println!("fast device alone: reads {fast_reads:.0} IOPS");
    println!("warm-up of the hot set: {warm_secs:.2} s");
    println!(
        "cache, warm: reads {cached_reads:.0} IOPS ({:.1}x the backing, {:.2}x the fast device), read hit ratio {read_ratio:.3}",
        cached_reads / backing_reads,
        cached_reads / fast_reads
    );
    println!(
        "cache, write-back: writes {cached_writes:.0} IOPS ({:.1}x the backing), dirty {} KiB, write hit ratio {:.3}",
        cached_writes / backing_writes,
        s.dirty_bytes >> 10,
        s.writes.ratio
    );
    let drain = Instant::now();
    cache.flush_dirty(&mut |_| {}).unwrap();
    let secs = drain.elapsed().as_secs_f64();
    println!(
        "write-back drain: {} KiB in {secs:.2} s ({:.1} MB/s)",
        s.dirty_bytes >> 10,
        s.dirty_bytes as f64 / secs / 1e6
    );
}
