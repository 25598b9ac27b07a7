//! The modes, switching between them, detach and attach, write-back
//! merging, and many threads at once.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use block::BlockDevice;
use cache::{CacheDevice, Mode, PolicyKind, WritebackSettings};
use common::{options, pattern, read, Rig};

const MIB: u64 = 1 << 20;

#[test]
fn write_through_caches_reads_and_writes_reach_both() {
    let rig = Rig::new(MIB, 4 * MIB);
    let dev = rig.open(options(Mode::WriteThrough)).unwrap();
    let data = pattern(1, 10_000);
    dev.write_at(&data, 3000, false).unwrap();
    assert_eq!(
        read(&*rig.backing, 3000, 10_000),
        data,
        "on the backing at once"
    );
    assert_eq!(read(&dev, 3000, 10_000), data);
    let before = rig.backing_counts.reads.load(Ordering::Relaxed);
    assert_eq!(read(&dev, 3000, 10_000), data);
    assert_eq!(read(&dev, 4096, 4096), data[1096..5192]);
    let s = dev.status();
    assert_eq!(
        rig.backing_counts.reads.load(Ordering::Relaxed),
        before,
        "served from the cache: {s:?}"
    );
    assert!(s.reads.hit_bytes >= 14_096);
    assert!(s.occupied_lines >= 3);
    assert_eq!(s.dirty_bytes, 0);
}

#[test]
fn write_back_keeps_writes_on_the_cache_until_written_back_in_merged_writes() {
    let rig = Rig::new(MIB, 4 * MIB);
    let dev = rig.open(options(Mode::WriteBack)).unwrap();
    // Sixteen neighbouring lines, written out of order.
    for i in (0..16u64).rev() {
        dev.write_at(&pattern(i, 4096), MIB + i * 4096, false)
            .unwrap();
    }
    assert_eq!(read(&*rig.backing, MIB, 4096), vec![0; 4096], "not yet");
    assert_eq!(dev.status().dirty_bytes, 16 * 4096);
    let writes = rig.backing_counts.writes.load(Ordering::Relaxed);
    rig.backing.flush().unwrap();
    let writes_before = rig.backing_counts.writes.load(Ordering::Relaxed) - writes;
    assert_eq!(writes_before, 0);
    let base = rig.backing_counts.writes.load(Ordering::Relaxed);
    assert_eq!(dev.write_back(u64::MAX).unwrap(), 16 * 4096);
    assert_eq!(
        rig.backing_counts.writes.load(Ordering::Relaxed) - base,
        1,
        "one sequential write to the backing"
    );
    for i in 0..16u64 {
        assert_eq!(read(&*rig.backing, MIB + i * 4096, 4096), pattern(i, 4096));
    }
    let s = dev.status();
    assert_eq!(s.dirty_bytes, 0);
    assert_eq!(s.writeback.written_bytes, 16 * 4096);
}

#[test]
fn write_around_invalidates_and_none_admits_nothing() {
    let rig = Rig::new(MIB, 4 * MIB);
    let dev = rig.open(options(Mode::WriteAround)).unwrap();
    rig.backing.write_at(&pattern(5, 8192), 0, false).unwrap();
    assert_eq!(read(&dev, 0, 8192), pattern(5, 8192));
    assert_eq!(dev.status().occupied_lines, 2, "reads are cached");
    dev.write_at(&pattern(6, 1000), 100, false).unwrap();
    let mut expect = pattern(5, 8192);
    expect[100..1100].copy_from_slice(&pattern(6, 1000));
    assert_eq!(read(&*rig.backing, 0, 8192), expect);
    assert_eq!(read(&dev, 0, 8192), expect);
    dev.write_at(&pattern(7, 4096), 4096, false).unwrap();
    assert_eq!(
        dev.status().occupied_lines,
        1,
        "a line written whole is dropped"
    );
    expect[4096..].copy_from_slice(&pattern(7, 4096));
    assert_eq!(read(&dev, 0, 8192), expect);

    dev.set_mode(Mode::None, &mut |_| {}).unwrap();
    assert_eq!(read(&dev, 65536, 8192), vec![0; 8192]);
    let s = dev.status();
    assert_eq!(s.occupied_lines, 2, "nothing new: {s:?}");
    assert_eq!(s.mode, Mode::None);
}

#[test]
fn partial_writes_complete_sub_blocks_from_cache_or_backing() {
    let rig = Rig::new(MIB, 4 * MIB);
    let old = pattern(9, 65536);
    rig.backing.write_at(&old, 0, false).unwrap();
    let dev = rig.open(options(Mode::WriteBack)).unwrap();
    let mut expect = old.clone();
    for (off, len, seed) in [(1, 3, 1u64), (700, 2000, 2), (4000, 200, 3), (511, 2, 4)] {
        let data = pattern(seed, len);
        dev.write_at(&data, off as u64, false).unwrap();
        expect[off..off + len].copy_from_slice(&data);
        assert_eq!(read(&dev, 0, 65536), expect);
    }
    dev.flush_dirty(&mut |_| {}).unwrap();
    assert_eq!(read(&*rig.backing, 0, 65536), expect);
}

#[test]
fn leaving_write_back_writes_back_first_with_progress() {
    let rig = Rig::new(MIB, 4 * MIB);
    let dev = rig.open(options(Mode::WriteBack)).unwrap();
    for i in 0..40u64 {
        dev.write_at(&pattern(i, 4096), i * 3 * 4096, false)
            .unwrap();
    }
    let mut seen = Vec::new();
    dev.set_mode(Mode::WriteThrough, &mut |p| seen.push(p))
        .unwrap();
    assert_eq!(seen.first().unwrap().dirty_bytes_left, 40 * 4096);
    assert_eq!(seen.last().unwrap().dirty_bytes_left, 0);
    assert_eq!(seen.last().unwrap().written_bytes, 40 * 4096);
    for i in 0..40u64 {
        assert_eq!(read(&*rig.backing, i * 3 * 4096, 4096), pattern(i, 4096));
    }
    assert_eq!(dev.mode(), Mode::WriteThrough);
    assert!(dev
        .status()
        .events
        .iter()
        .any(|e| e.contains("writeback -> writethrough")));
}

#[test]
fn detach_writes_back_then_serves_from_the_backing_alone_and_attach_comes_back_cold() {
    let rig = Rig::new(MIB, 4 * MIB);
    let dev = rig.open(options(Mode::WriteBack)).unwrap();
    dev.write_at(&pattern(1, 50_000), 12_345, false).unwrap();
    dev.detach(&mut |_| {}).unwrap();
    assert_eq!(read(&*rig.backing, 12_345, 50_000), pattern(1, 50_000));
    let s = dev.status();
    assert!(!s.attached);
    assert_eq!(s.occupied_lines, 0);
    // The cache device can go: nothing is read from it.
    rig.cache.set_fail_reads(true);
    rig.cache.set_fail_writes(true);
    dev.write_at(&pattern(2, 4096), 0, false).unwrap();
    assert_eq!(read(&dev, 0, 4096), pattern(2, 4096));
    assert_eq!(dev.status().health, cache::Health::Ok);
    rig.cache.heal();
    dev.attach().unwrap();
    assert!(dev.status().attached);
    assert_eq!(read(&dev, 0, 4096), pattern(2, 4096));
    assert_eq!(read(&dev, 12_345, 50_000), pattern(1, 50_000));
    assert!(dev.status().occupied_lines > 0);
}

#[test]
fn eviction_under_pressure_keeps_every_block_right() {
    // 30-odd lines of cache for 256 lines of backing.
    let rig = Rig::new(160 << 10, MIB);
    let dev = rig.open(options(Mode::WriteBack)).unwrap();
    assert!(dev.capacity_lines() < 40);
    let mut model = vec![0u8; MIB as usize];
    let mut seed = 1u64;
    for round in 0..3000u64 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let off = (seed >> 20) % (MIB - 9000);
        let len = 1 + (seed >> 45) % 9000;
        if round % 3 == 0 {
            let data = pattern(round, len as usize);
            dev.write_at(&data, off, round % 7 == 0).unwrap();
            model[off as usize..(off + len) as usize].copy_from_slice(&data);
        } else {
            assert_eq!(
                read(&dev, off, len as usize),
                &model[off as usize..(off + len) as usize]
            );
        }
        if round % 97 == 0 {
            dev.write_back(64 << 10).unwrap();
        }
    }
    let s = dev.status();
    assert!(s.evictions > 100, "{s:?}");
    dev.flush_dirty(&mut |_| {}).unwrap();
    assert_eq!(read(&*rig.backing, 0, MIB as usize), model);
}

#[test]
fn many_threads_sharing_lines_and_a_mode_switcher() {
    let rig = Rig::new(256 << 10, 2 * MIB);
    let mut o = options(Mode::WriteBack);
    o.background = true;
    o.writeback.dirty_threshold_percent = 5;
    let dev = Arc::new(rig.open(o).unwrap());
    const THREADS: u64 = 6;
    const SECTOR: u64 = 512;
    let sectors = 2 * MIB / SECTOR;
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let dev = dev.clone();
            std::thread::spawn(move || {
                // This thread owns every sector s with s % THREADS == t,
                // so it shares every line with the others.
                let mut mine = std::collections::HashMap::new();
                let mut seed = t + 1;
                for i in 0..3000u64 {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let s = ((seed >> 24) % (sectors / THREADS)) * THREADS + t;
                    if i % 2 == 0 {
                        let data = pattern(seed, SECTOR as usize);
                        dev.write_at(&data, s * SECTOR, false).unwrap();
                        mine.insert(s, data);
                    } else if let Some(want) = mine.get(&s) {
                        assert_eq!(
                            &read(&*dev, s * SECTOR, SECTOR as usize),
                            want,
                            "sector {s}"
                        );
                    }
                }
                mine
            })
        })
        .collect();
    let switcher = {
        let dev = dev.clone();
        std::thread::spawn(move || {
            for m in [
                Mode::WriteThrough,
                Mode::WriteAround,
                Mode::WriteBack,
                Mode::None,
                Mode::WriteBack,
            ] {
                std::thread::sleep(std::time::Duration::from_millis(30));
                dev.set_mode(m, &mut |_| {}).unwrap();
            }
        })
    };
    let owned: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    switcher.join().unwrap();
    dev.flush_dirty(&mut |_| {}).unwrap();
    for mine in owned {
        for (s, want) in mine {
            assert_eq!(read(&*dev, s * SECTOR, SECTOR as usize), want);
            assert_eq!(read(&*rig.backing, s * SECTOR, SECTOR as usize), want);
        }
    }
}

/// Hot-set hit ratio before and after a scan of the whole backing, in
/// 4 KiB reads with no cutoff, through the device.
fn hit_ratio_around_a_scan(policy: PolicyKind) -> (f64, f64, CacheDevice, Rig) {
    let rig = Rig::new(MIB, 16 * MIB);
    let mut o = options(Mode::WriteThrough);
    o.line_size = 16384;
    o.policy = policy;
    let dev = rig.open(o).unwrap();
    let hot = dev.capacity_lines() as u64 / 2;
    let hot_pass = |dev: &CacheDevice| {
        let before = dev.status().reads;
        for round in 0..3 {
            for l in 0..hot {
                let _ = read(dev, (l * 7 + round) % hot * 16384, 4096);
            }
        }
        let after = dev.status().reads;
        (after.hit_bytes - before.hit_bytes) as f64
            / ((after.hit_bytes + after.miss_bytes) - (before.hit_bytes + before.miss_bytes)) as f64
    };
    hot_pass(&dev);
    let warm = hot_pass(&dev);
    for off in (0..16 * MIB).step_by(4096) {
        let _ = read(&dev, off, 4096);
    }
    let after_scan = hot_pass(&dev);
    (warm, after_scan, dev, rig)
}

#[test]
fn a_scan_keeps_the_hot_set_under_2q_not_under_lru_and_the_cutoff_bypasses_streams() {
    let (warm, after_scan, dev, _rig) = hit_ratio_around_a_scan(PolicyKind::TwoQ);
    let (lru_warm, lru_after, _, _) = hit_ratio_around_a_scan(PolicyKind::Lru);
    println!("hot-set hit ratio, before -> after a scan: 2Q {warm:.3} -> {after_scan:.3}, LRU {lru_warm:.3} -> {lru_after:.3}");
    assert!(warm > 0.99, "{warm}");
    assert!(
        after_scan >= 0.9 * warm,
        "hot set kept through the scan: {after_scan}"
    );
    assert!(lru_warm > 0.99);
    assert!(lru_after < 0.9 * lru_warm, "LRU flushed it: {lru_after}");

    // With a cutoff, the stream stops being cached after 256 KiB.
    dev.set_sequential_cutoff(256 << 10);
    let s0 = dev.status();
    for off in (0..8 * MIB).step_by(65536) {
        let _ = read(&dev, off, 65536);
    }
    let s1 = dev.status();
    assert!(s1.bypassed_bytes - s0.bypassed_bytes >= 7 * MIB, "{s1:?}");
}

#[test]
fn background_write_back_drains_above_the_threshold_and_when_idle() {
    let rig = Rig::new(MIB, 4 * MIB);
    let mut o = options(Mode::WriteBack);
    o.background = true;
    o.writeback = WritebackSettings {
        dirty_threshold_percent: 5,
        rate: 4 << 20,
        idle_after: std::time::Duration::from_secs(3600),
    };
    let dev = rig.open(o).unwrap();
    let capacity = dev.capacity_lines() as u64 * 4096;
    let lines = capacity / 4096 / 2;
    for i in 0..lines {
        dev.write_at(&pattern(i, 4096), i * 4096, false).unwrap();
    }
    let threshold = capacity / 100 * 5;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while dev.status().dirty_bytes > threshold && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let s = dev.status();
    assert!(s.dirty_bytes <= threshold, "{s:?}");
    assert!(s.dirty_bytes > 0, "stops at the threshold: {s:?}");
    assert!(s.writeback.rate_bytes_per_sec > 0);
    // Idle: the rest goes too.
    dev.set_writeback(WritebackSettings {
        idle_after: std::time::Duration::from_millis(100),
        ..o_settings()
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while dev.status().dirty_bytes > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(dev.status().dirty_bytes, 0);
    for i in 0..lines {
        assert_eq!(read(&*rig.backing, i * 4096, 4096), pattern(i, 4096));
    }
}

fn o_settings() -> WritebackSettings {
    WritebackSettings {
        dirty_threshold_percent: 5,
        rate: 4 << 20,
        idle_after: std::time::Duration::from_secs(3600),
    }
}

#[test]
fn discard_drops_what_it_covers_but_a_partly_covered_dirty_sub_block_keeps_its_data() {
    let rig = Rig::new(MIB, 4 * MIB);
    let dev = rig.open(options(Mode::WriteBack)).unwrap();
    let data = pattern(1, 8192);
    dev.write_at(&data, 0, false).unwrap();
    dev.discard(100, 4000).unwrap();
    let back = read(&dev, 0, 8192);
    assert_eq!(back[..512], data[..512], "partly covered and dirty: kept");
    assert_eq!(
        back[512..4096],
        vec![0; 3584],
        "covered: the backing's zeros"
    );
    assert_eq!(back[4096..], data[4096..]);
    assert_eq!(dev.status().dirty_bytes, 512 + 4096);
    dev.flush_dirty(&mut |_| {}).unwrap();
    assert_eq!(read(&*rig.backing, 0, 8192), back);
}

#[test]
fn the_cutoff_follows_each_initiators_streams() {
    let rig = Rig::new(MIB, 4 * MIB);
    let mut o = options(Mode::WriteThrough);
    o.sequential_cutoff = 64 << 10;
    let dev = rig.open(o).unwrap();
    let mut buf = vec![0; 4096];
    for i in 0..32u64 {
        dev.read_stream(Some(1), &mut buf, i * 4096).unwrap();
        dev.read_stream(Some(2), &mut buf, 2 * MIB + i * 4096)
            .unwrap();
    }
    let s = dev.status();
    assert_eq!(s.bypassed_bytes, (2 * (128 - 64)) << 10, "{s:?}");
    // Another initiator reading on where the first stopped starts afresh.
    dev.read_stream(Some(3), &mut buf, 32 * 4096).unwrap();
    assert_eq!(dev.status().bypassed_bytes, s.bypassed_bytes);
    dev.write_stream(Some(1), &buf, 32 * 4096, false).unwrap();
    assert_eq!(
        dev.status().bypassed_bytes,
        s.bypassed_bytes + 4096,
        "the write continues stream 1"
    );
}

/// A thin backing's holes show through, except where the cache holds data
/// not yet written back.
#[test]
fn allocation_is_the_backings_but_dirty_blocks_are_mapped() {
    use block::{Allocation, MemDevice};
    let ssd: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(4 << 20));
    let hdd: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(32 << 20));
    let mut o = cache::CacheOptions::new("hdd");
    o.mode = cache::Mode::WriteBack;
    o.background = false;
    let dev = cache::CacheDevice::open(ssd, hdd.clone(), o).unwrap();
    assert!(dev.capabilities().thin == hdd.capabilities().thin);
    let whole = 1 << 20;
    let (before, _) = dev.allocation(0, whole).unwrap();
    dev.write_at(&[9; 4096], 128 << 10, false).unwrap();
    assert_eq!(before, Allocation::Deallocated, "a RAM disk is thin");
    assert_eq!(
        dev.allocation(0, whole).unwrap(),
        (Allocation::Deallocated, 128 << 10)
    );
    let (state, n) = dev.allocation(128 << 10, whole).unwrap();
    assert_eq!(state, Allocation::Mapped);
    assert!(n >= 4096, "{n}");
    dev.flush_dirty(&mut |_| {}).unwrap();
    assert_eq!(
        dev.allocation(128 << 10, 4096).unwrap(),
        hdd.allocation(128 << 10, 4096).unwrap()
    );
}

/// Zeroing drops whole sub-blocks from the cache and zeroes them on the
/// backing; the partial ones at the edges are written.
#[test]
fn write_zeroes_over_dirty_data_reads_back_zeros_everywhere() {
    use block::MemDevice;
    let ssd: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(4 << 20));
    let hdd: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(32 << 20));
    for mode in Mode::ALL {
        let mut o = cache::CacheOptions::new("hdd");
        o.mode = mode;
        o.background = false;
        o.format = cache::FormatPolicy::Always;
        let dev = CacheDevice::open(ssd.clone(), hdd.clone(), o).unwrap();
        dev.write_at(&[7; 65536], 0, false).unwrap();
        dev.read_at(&mut [0; 65536], 0).unwrap();
        dev.write_zeroes(512, 60 << 10).unwrap();
        let mut back = vec![0; 65536];
        dev.read_at(&mut back, 0).unwrap();
        let want: Vec<u8> = (0..65536)
            .map(|i| {
                if (512..512 + (60 << 10)).contains(&i) {
                    0
                } else {
                    7
                }
            })
            .collect();
        assert!(back == want, "{mode}: cached");
        dev.flush_dirty(&mut |_| {}).unwrap();
        hdd.read_at(&mut back, 0).unwrap();
        assert!(back == want, "{mode}: on the backing");
    }
}
