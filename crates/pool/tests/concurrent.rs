//! Writers on disjoint parts of one volume while snapshots are taken and
//! deleted and the pool is flushed: every writer's data survives, and the
//! unit ownership stays exact.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use block::{BlockDevice, MemDevice};
use pool::{MetadataLocation, Pool};

const UNIT: u64 = 4096;
const WRITERS: u64 = 4;
const REGION: u64 = 8 * UNIT;

/// A small deterministic generator, so each writer's sequence is its own.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn writers_snapshots_and_flushes_interleave_safely() {
    let data: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(400 * UNIT));
    let meta = MetadataLocation::Device(Arc::new(MemDevice::new(32 << 20)));
    let pool = Pool::create("c", vec![data], &meta, UNIT).unwrap();
    pool.create_volume("v", WRITERS * REGION).unwrap();
    let stop = Arc::new(AtomicBool::new(false));

    let snapshotter = {
        let pool = pool.clone();
        let stop = stop.clone();
        thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                pool.snapshot("v", &format!("s{n}")).unwrap();
                if n > 2 {
                    pool.delete(&format!("s{}", n - 2)).unwrap();
                }
                pool.flush().unwrap();
            }
            n
        })
    };

    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let pool = pool.clone();
            thread::spawn(move || {
                let dev = pool.volume("v").unwrap();
                let base = w * REGION;
                let mut model = vec![0u8; REGION as usize];
                let mut rng = 0x9E37_79B9_7F4A_7C15 ^ (w + 1);
                for i in 0..3000u64 {
                    let off = next(&mut rng) % (REGION / 512) * 512;
                    let len = (1 + next(&mut rng) % 16) * 512;
                    let len = len.min(REGION - off);
                    if i % 7 == 0 {
                        dev.discard(base + off, len).unwrap();
                        model[off as usize..(off + len) as usize].fill(0);
                    } else {
                        let byte = (next(&mut rng) % 255 + 1) as u8;
                        dev.write_at(&vec![byte; len as usize], base + off, i % 50 == 0)
                            .unwrap();
                        model[off as usize..(off + len) as usize].fill(byte);
                    }
                }
                let mut got = vec![0u8; REGION as usize];
                dev.read_at(&mut got, base).unwrap();
                assert!(got == model, "writer {w} lost data");
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let snapshots = snapshotter.join().unwrap();
    assert!(snapshots > 0);

    let report = pool.check().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    for v in pool.volumes() {
        if v.name != "v" {
            pool.delete(&v.name).unwrap();
        }
    }
    pool.flush().unwrap();
    let space = pool.space();
    assert_eq!(
        space.used_units,
        pool.volume_info("v").unwrap().mapped_units
    );
    assert!(pool.check().unwrap().is_clean());
}

#[test]
fn first_writes_racing_into_one_unit_all_land() {
    let data: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(200 * UNIT));
    let meta = MetadataLocation::Device(Arc::new(MemDevice::new(32 << 20)));
    let pool = Pool::create("r", vec![data], &meta, UNIT).unwrap();
    const UNITS: u64 = 16;
    const SECTORS: u64 = UNIT / 512;
    for round in 0..40 {
        let name = format!("v{round}");
        pool.create_volume(&name, UNITS * UNIT).unwrap();
        let threads: Vec<_> = (0..WRITERS)
            .map(|w| {
                let dev = pool.volume(&name).unwrap();
                thread::spawn(move || {
                    // Writer w owns every sector s with s % WRITERS == w.
                    for unit in 0..UNITS {
                        for s in (w..SECTORS).step_by(WRITERS as usize) {
                            let byte = (w + 1) as u8;
                            dev.write_at(&[byte; 512], unit * UNIT + s * 512, false)
                                .unwrap();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let dev = pool.volume(&name).unwrap();
        let mut got = vec![0u8; (UNITS * UNIT) as usize];
        dev.read_at(&mut got, 0).unwrap();
        for (i, sector) in got.chunks(512).enumerate() {
            let want = (i as u64 % SECTORS % WRITERS + 1) as u8;
            assert!(
                sector.iter().all(|&b| b == want),
                "round {round} sector {i}"
            );
        }
        assert_eq!(pool.volume_info(&name).unwrap().mapped_units, UNITS);
        pool.delete(&name).unwrap();
        let report = pool.check().unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
    }
    assert_eq!(pool.space().used_units, 0);
}
