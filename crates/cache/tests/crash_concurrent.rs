//! Many threads writing, reading and flushing while background write-back,
//! eviction and commits run, then a power cut of both devices: each
//! thread's writes acknowledged before its last completed flush survive.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use block::BlockDevice;
use cache::{FormatPolicy, Mode, WritebackSettings};
use common::{options, pattern, read, Rig};

const SECTOR: u64 = 512;
const THREADS: u64 = 4;

/// What one thread knows of its sectors.
#[derive(Default, Clone)]
struct Owned {
    durable: HashMap<u64, Vec<u8>>,
    since: HashMap<u64, Vec<Vec<u8>>>,
}

#[test]
fn writes_flushed_by_their_thread_survive_a_power_cut_under_concurrent_write_back() {
    let size = 1 << 20;
    let rig = Rig::new(160 << 10, size);
    let mut owned = vec![Owned::default(); THREADS as usize];
    let mut written_back = 0;
    for round in 0..4u64 {
        let mut o = options(if round % 2 == 0 {
            Mode::WriteBack
        } else {
            Mode::WriteThrough
        });
        o.format = if round == 0 {
            FormatPolicy::IfBlank
        } else {
            FormatPolicy::Never
        };
        o.background = true;
        o.writeback = WritebackSettings {
            dirty_threshold_percent: 1,
            rate: 64 << 20,
            idle_after: Duration::from_millis(1),
        };
        let dev = Arc::new(rig.open(o).unwrap());
        let workers: Vec<_> = owned
            .drain(..)
            .enumerate()
            .map(|(t, mut mine)| {
                let dev = dev.clone();
                std::thread::spawn(move || {
                    let t = t as u64;
                    let mut seed = (round + 1) * 1000 + t;
                    // Long enough for a few background write-back ticks.
                    let start = std::time::Instant::now();
                    let mut i = 0u64;
                    while i < 1500 || start.elapsed() < Duration::from_millis(350) {
                        i += 1;
                        seed = seed
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        // Every THREADS-th sector is this thread's: all
                        // lines are shared.
                        let s = (seed >> 24) % (size / SECTOR / THREADS) * THREADS + t;
                        match i % 10 {
                            0..=5 => {
                                let data = pattern(seed, SECTOR as usize);
                                dev.write_at(&data, s * SECTOR, false).unwrap();
                                mine.since.entry(s).or_default().push(data);
                            }
                            6..=8 => {
                                let want = mine
                                    .since
                                    .get(&s)
                                    .and_then(|v| v.last())
                                    .or(mine.durable.get(&s))
                                    .cloned()
                                    .unwrap_or(vec![0; SECTOR as usize]);
                                assert_eq!(read(&*dev, s * SECTOR, SECTOR as usize), want);
                            }
                            _ => {
                                dev.flush().unwrap();
                                for (s, mut v) in mine.since.drain() {
                                    mine.durable.insert(s, v.pop().unwrap());
                                }
                            }
                        }
                    }
                    mine
                })
            })
            .collect();
        owned = workers.into_iter().map(|w| w.join().unwrap()).collect();
        let status = dev.status();
        assert!(status.evictions > 0, "{status:?}");
        written_back += status.writeback.written_bytes;
        drop(dev);
        rig.power_cut();
        let mut o = options(Mode::WriteThrough);
        o.format = FormatPolicy::Never;
        o.background = false;
        let check = rig.open(o).unwrap();
        for mine in &mut owned {
            let sectors: Vec<u64> = mine
                .durable
                .keys()
                .chain(mine.since.keys())
                .copied()
                .collect();
            for s in sectors {
                let found = read(&check, s * SECTOR, SECTOR as usize);
                let durable = mine
                    .durable
                    .get(&s)
                    .cloned()
                    .unwrap_or(vec![0; SECTOR as usize]);
                let later = mine.since.remove(&s).unwrap_or_default();
                assert!(
                    found == durable || later.contains(&found),
                    "round {round}: sector {s} lost what its thread flushed"
                );
                mine.durable.insert(s, found);
            }
        }
        check.close().unwrap();
    }
    assert!(written_back > 0, "write-back ran meanwhile");
}
