//! What an atomic write costs next to a plain FUA write of the same
//! size on the same array: CPU time and wall time per write, RAID1, 5
//! and 6 over members in memory, and over members whose every call
//! takes 200 µs (a disk honouring FUA). CPU time per write is robust to
//! other load on the machine; wall time is not.
//!
//! `cargo run --release -p raid --example raid_atomic`

use std::sync::Arc;
use std::time::{Duration, Instant};

use block::{BlockDevice, DelayDevice, DelayLimits, MemDevice};
use raid::{Level, RaidArray, RaidOptions};

const MEMBER: u64 = 64 << 20;

/// CPU seconds this process has used (user + system), from /proc.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("read /proc/self/stat");
    // Fields after the command name, which ends with ')'.
    let rest = &stat[stat.rfind(')').expect("a command name") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

fn member(latency: Option<Duration>) -> Arc<dyn BlockDevice> {
    let mem: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(MEMBER));
    match latency {
        None => mem,
        Some(l) => {
            let limits = DelayLimits {
                latency: l,
                ..DelayLimits::default()
            };
            Arc::new(DelayDevice::new(mem, limits))
        }
    }
}

/// (CPU µs, wall µs) per write of `len` bytes, atomic or plain FUA.
fn per_write(a: &RaidArray, len: usize, atomic: bool, count: u64) -> (f64, f64) {
    let data = vec![0x5a; len];
    let span = a.size() / len as u64;
    let (cpu, wall) = (cpu_seconds(), Instant::now());
    for i in 0..count {
        let at = (i * 7919 % span) * len as u64;
        if atomic {
            a.write_atomic(&data, at, true).unwrap();
        } else {
            a.write_at(&data, at, true).unwrap();
        }
    }
    let n = count as f64;
    (
        (cpu_seconds() - cpu) * 1e6 / n,
        wall.elapsed().as_secs_f64() * 1e6 / n,
    )
}

fn main() {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average at start: {}", load.trim());
    for latency in [None, Some(Duration::from_micros(200))] {
        let where_ = latency.map_or("members in memory".to_string(), |l| {
            format!("members with {} µs calls", l.as_micros())
        });
        for (level, n) in [(Level::Raid1, 2), (Level::Raid5, 4), (Level::Raid6, 5)] {
            let members = (0..n).map(|_| member(latency)).collect();
            let opts = RaidOptions {
                assume_clean: true,
                ..RaidOptions::default()
            };
            let a = RaidArray::create(level, members, vec![], opts).unwrap();
            // Every page of the members touched once, outside the figures.
            let whole = vec![1u8; 1 << 20];
            for at in (0..a.size() / (1 << 20)).map(|m| m << 20) {
                a.write_at(&whole, at, false).unwrap();
            }
            for len in [4096, 64 << 10] {
                let count = if latency.is_some() { 1000 } else { 10_000 };
                let plain = per_write(&a, len, false, count);
                let atomic = per_write(&a, len, true, count);
                println!(
                    "{where_}, RAID{} x{n}, {:>2} KiB FUA writes: plain {:.0} µs CPU / {:.0} µs wall, \
                     atomic {:.0} µs CPU / {:.0} µs wall: {:.1}x CPU, {:.1}x wall",
                    level.number(),
                    len >> 10,
                    plain.0,
                    plain.1,
                    atomic.0,
                    atomic.1,
                    atomic.0 / plain.0,
                    atomic.1 / plain.1,
                );
            }
        }
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average at end: {}", load.trim());
}
