//! The cache device failing under I/O.

mod common;

use std::sync::Arc;

use block::BlockDevice;
use cache::{Health, Mode};
use common::{options, pattern, read, Rig};

const MIB: u64 = 1 << 20;

#[test]
fn write_through_and_write_around_serve_every_block_from_the_backing_when_the_cache_fails() {
    for mode in [Mode::WriteThrough, Mode::WriteAround] {
        let rig = Rig::new(MIB, 4 * MIB);
        let dev = rig.open(options(mode)).unwrap();
        let mut model = vec![0u8; 4 * MIB as usize];
        for i in 0..64u64 {
            let (off, len) = (i * 40_000, 9000);
            let data = pattern(i, len);
            dev.write_at(&data, off, false).unwrap();
            model[off as usize..off as usize + len].copy_from_slice(&data);
            assert_eq!(read(&dev, off, len), data);
        }
        assert!(dev.status().occupied_lines > 0);
        rig.cache.set_fail_reads(true);
        rig.cache.set_fail_writes(true);
        assert_eq!(read(&dev, 0, 4 * MIB as usize), model, "{mode}");
        // Writes go on, to the backing.
        let data = pattern(99, 20_000);
        dev.write_at(&data, 123_456, true).unwrap();
        model[123_456..143_456].copy_from_slice(&data);
        dev.flush().unwrap();
        assert_eq!(read(&dev, 0, 4 * MIB as usize), model);
        let s = dev.status();
        assert!(matches!(
            s.health,
            Health::Failed {
                stranded_bytes: 0,
                ..
            }
        ));
        assert!(
            s.events.iter().any(|e| e.contains("cache device failed")),
            "{s:?}"
        );
        // Each event says when in UTC, as an administrator reads a time.
        let when = s.events[0].split(": ").next().unwrap();
        assert!(
            when.len() == 23 && when.ends_with(" UTC") && when.starts_with("20"),
            "{when}"
        );
        assert_eq!(read(&*rig.backing, 0, 4 * MIB as usize), model);
    }
}

#[test]
fn write_back_fails_only_the_blocks_not_written_back() {
    let rig = Rig::new(MIB, 4 * MIB);
    let dev = rig.open(options(Mode::WriteBack)).unwrap();
    dev.write_at(&pattern(1, 65536), 0, false).unwrap();
    dev.flush_dirty(&mut |_| {}).unwrap();
    dev.write_at(&pattern(2, 8192), MIB, false).unwrap();
    dev.flush().unwrap();
    rig.cache.set_fail_reads(true);
    rig.cache.set_fail_writes(true);

    assert_eq!(
        read(&dev, 0, 65536),
        pattern(1, 65536),
        "written back: served"
    );
    assert!(dev.read_at(&mut [0; 512], MIB + 4096).is_err(), "stranded");
    assert!(
        dev.read_at(&mut [0; 8192], MIB - 4096).is_err(),
        "overlaps it"
    );
    assert_eq!(read(&dev, MIB + 8192, 4096), vec![0; 4096], "its neighbour");
    assert!(
        dev.write_at(&[1; 512], MIB, false).is_err(),
        "no stale overwrite"
    );
    dev.write_at(&pattern(3, 4096), 2 * MIB, false).unwrap();
    assert_eq!(read(&dev, 2 * MIB, 4096), pattern(3, 4096));
    let health = dev.status().health;
    let Health::Failed {
        stranded_bytes,
        effect,
    } = health
    else {
        panic!("{health:?}")
    };
    assert_eq!(stranded_bytes, 8192);
    assert!(effect.contains("MEDIUM ERROR"), "{effect}");
    let json = serde_json::to_value(dev.status()).unwrap();
    assert_eq!(json["health"]["state"], "failed");
    assert_eq!(json["mode"], "writeback");
    assert!(dev.flush().is_err(), "not all acknowledged data is stable");
    assert!(dev.detach(&mut |_| {}).is_err());

    // The device comes back: what it held is served and written back.
    rig.cache.heal();
    dev.attach().unwrap();
    assert_eq!(dev.status().health, Health::Ok);
    assert_eq!(read(&dev, MIB, 8192), pattern(2, 8192));
    dev.flush_dirty(&mut |_| {}).unwrap();
    assert_eq!(read(&*rig.backing, MIB, 8192), pattern(2, 8192));
    assert_eq!(read(&*rig.backing, 2 * MIB, 4096), pattern(3, 4096));
}

#[test]
fn a_write_back_write_that_fails_on_the_cache_lands_on_the_backing() {
    let rig = Rig::new(MIB, 4 * MIB);
    let dev = rig.open(options(Mode::WriteBack)).unwrap();
    rig.cache.set_fail_writes(true);
    dev.write_at(&pattern(4, 10_000), 777, true).unwrap();
    assert_eq!(read(&dev, 777, 10_000), pattern(4, 10_000));
    assert_eq!(read(&*rig.backing, 777, 10_000), pattern(4, 10_000));
    assert!(matches!(dev.status().health, Health::Failed { .. }));
}

#[test]
fn a_cache_read_error_on_a_clean_hit_is_answered_from_the_backing() {
    let rig = Rig::new(MIB, 4 * MIB);
    let dev = rig.open(options(Mode::WriteThrough)).unwrap();
    dev.write_at(&pattern(5, 65536), 0, false).unwrap();
    rig.cache.set_fail_reads(true);
    assert_eq!(read(&dev, 0, 65536), pattern(5, 65536));
}

#[test]
fn failing_under_concurrent_io_never_panics_or_returns_stale_data() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let rig = Rig::new(512 << 10, 2 * MIB);
    let dev = Arc::new(rig.open(options(Mode::WriteBack)).unwrap());
    // The threads run until told to stop, so the failure always lands in
    // the middle of their I/O however fast the machine is.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (dev, stop, done) = (dev.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || {
                // Each thread owns every fourth 4 KiB block.
                let mut mine = std::collections::HashMap::new();
                let mut stale = 0;
                let mut i = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let block = (i * 7919 % 128) * 4 + t;
                    let off = block * 4096;
                    if i.is_multiple_of(2) {
                        let data = pattern(i * 4 + t, 4096);
                        if dev.write_at(&data, off, false).is_ok() {
                            mine.insert(block, data);
                        } else {
                            mine.remove(&block);
                        }
                    } else if let Some(want) = mine.get(&block) {
                        let mut buf = vec![0; 4096];
                        if dev.read_at(&mut buf, off).is_ok() && &buf != want {
                            stale += 1;
                        }
                    }
                    i += 1;
                    done.fetch_add(1, Ordering::SeqCst);
                }
                stale
            })
        })
        .collect();
    let wait_for = |n: u64| {
        let target = done.load(Ordering::SeqCst) + n;
        while done.load(Ordering::SeqCst) < target {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    };
    wait_for(2000);
    rig.cache.set_fail_reads(true);
    rig.cache.set_fail_writes(true);
    wait_for(2000);
    stop.store(true, Ordering::SeqCst);
    let stale: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(stale, 0);
    assert!(matches!(dev.status().health, Health::Failed { .. }));
}

#[test]
fn a_cache_that_failed_is_not_trusted_by_the_next_open() {
    // Only reads fail (the cache device takes the mark in its superblock),
    // then everything fails (only the backing's mark records it).
    for writes_fail in [false, true] {
        let rig = Rig::new(MIB, 4 * MIB);
        let dev = rig.open(options(Mode::WriteThrough)).unwrap();
        assert_eq!(read(&dev, 0, 65536), vec![0; 65536]);
        dev.flush().unwrap();
        rig.cache.set_fail_reads(true);
        rig.cache.set_fail_writes(writes_fail);
        assert_eq!(read(&dev, 0, 4096), vec![0; 4096]);
        dev.write_at(&pattern(1, 4096), 0, false).unwrap();
        dev.flush().unwrap();
        drop(dev);
        rig.cache.heal();
        rig.power_cut();
        // Nothing was stranded on it: formatted anew, serving the
        // backing's newer data rather than the stale cached copy.
        let dev = rig.open(options(Mode::WriteThrough)).unwrap();
        assert_eq!(read(&dev, 0, 4096), pattern(1, 4096), "{writes_fail}");
        let events = dev.status().events;
        assert!(
            events.iter().any(|e| e.contains("formatted anew")),
            "{events:?}"
        );
        dev.close().unwrap();
        let dev = rig.open(options(Mode::WriteThrough)).unwrap();
        assert!(dev.status().events.iter().all(|e| !e.contains("formatted")));
    }
}
