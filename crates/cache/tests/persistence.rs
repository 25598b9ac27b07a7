//! The metadata on the cache device: durability of flushed and FUA writes
//! across power cuts, warm restarts, and refusing the wrong device.

mod common;

use std::sync::Arc;

use block::{BlockDevice, MemDevice};
use cache::{CacheDevice, CacheOptions, FormatPolicy, Mode};
use common::{options, pattern, read, Rig};

const MIB: u64 = 1 << 20;

#[test]
fn flushed_write_back_data_survives_a_power_cut_of_both_devices() {
    let rig = Rig::new(MIB, 4 * MIB);
    let dev = rig.open(options(Mode::WriteBack)).unwrap();
    dev.write_at(&pattern(1, 20_000), 5000, false).unwrap();
    dev.flush().unwrap();
    dev.write_at(&pattern(2, 3000), 100_000, true).unwrap();
    dev.write_at(&pattern(3, 3000), 200_000, false).unwrap();
    assert_eq!(
        read(&*rig.backing, 5000, 100),
        vec![0; 100],
        "only on the cache"
    );
    drop(dev);
    rig.power_cut();
    let mut o = options(Mode::WriteBack);
    o.format = FormatPolicy::Never;
    let dev = rig.open(o).unwrap();
    assert_eq!(read(&dev, 5000, 20_000), pattern(1, 20_000), "flushed");
    assert_eq!(read(&dev, 100_000, 3000), pattern(2, 3000), "FUA");
    assert_eq!(read(&dev, 200_000, 3000), vec![0; 3000], "neither: lost");
    let s = dev.status();
    assert!(s.events.iter().any(|e| e.contains("unclean")), "{s:?}");
    dev.flush_dirty(&mut |_| {}).unwrap();
    assert_eq!(read(&*rig.backing, 5000, 20_000), pattern(1, 20_000));
}

#[test]
fn a_clean_restart_is_warm_and_reads_nothing_from_the_backing() {
    let rig = Rig::new(MIB, 4 * MIB);
    const LEN: usize = 48 * 4096;
    rig.backing.write_at(&pattern(4, LEN), 0, true).unwrap();
    let dev = rig.open(options(Mode::WriteThrough)).unwrap();
    assert_eq!(read(&dev, 0, LEN), pattern(4, LEN));
    let occupied = dev.status().occupied_lines;
    dev.close().unwrap();
    let dev = rig.open(options(Mode::WriteThrough)).unwrap();
    let s = dev.status();
    assert_eq!(s.occupied_lines, occupied);
    assert_eq!(s.dirty_bytes, 0, "a clean stop: clean lines stay clean");
    rig.backing.set_fail_reads(true);
    assert_eq!(read(&dev, 0, LEN), pattern(4, LEN));
    assert_eq!(dev.status().reads.miss_bytes, 0);
}

#[test]
fn after_an_unclean_stop_cached_blocks_are_written_back_before_write_through_serves() {
    let rig = Rig::new(MIB, 4 * MIB);
    let dev = rig.open(options(Mode::WriteThrough)).unwrap();
    assert_eq!(read(&dev, 0, 65536), vec![0; 65536]);
    dev.write_at(&pattern(5, 4096), 8192, false).unwrap();
    dev.flush().unwrap();
    // Written after the flush, to the cache and the backing: either may
    // keep it across the cut.
    dev.write_at(&pattern(6, 4096), 16384, false).unwrap();
    drop(dev);
    rig.power_cut();
    let dev = rig.open(options(Mode::WriteThrough)).unwrap();
    let s = dev.status();
    assert_eq!(s.dirty_bytes, 0, "written back at open: {s:?}");
    assert!(s.occupied_lines >= 16, "still warm");
    assert_eq!(read(&dev, 8192, 4096), pattern(5, 4096));
    let back = read(&dev, 16384, 4096);
    assert!(back == pattern(6, 4096) || back == vec![0; 4096]);
    assert_eq!(read(&*rig.backing, 16384, 4096), back, "the two agree");
}

#[test]
fn a_cache_of_another_backing_or_garbage_is_refused_unless_formatting_is_asked_for() {
    let rig = Rig::new(MIB, 4 * MIB);
    let dev = rig.open(options(Mode::WriteBack)).unwrap();
    dev.write_at(&pattern(1, 4096), 0, true).unwrap();
    dev.close().unwrap();

    let mut other = options(Mode::WriteBack);
    other.backing_id = "another".into();
    let err = rig.open(other.clone()).err().unwrap();
    assert!(
        err.to_string().contains("holds the cache of \"backing\""),
        "{err}"
    );
    let mut bigger_lines = options(Mode::WriteBack);
    bigger_lines.line_size = 8192;
    assert!(rig.open(bigger_lines).is_err());
    // Still the cache it was, dirty data included.
    let dev = rig.open(options(Mode::WriteBack)).unwrap();
    assert_eq!(read(&dev, 0, 4096), pattern(1, 4096));
    assert_eq!(dev.status().dirty_bytes, 4096);
    dev.close().unwrap();

    other.format = FormatPolicy::Always;
    let dev = rig.open(other).unwrap();
    assert_eq!(dev.status().occupied_lines, 0, "formatted");
    drop(dev);

    let garbage = Rig::new(MIB, 4 * MIB);
    garbage.cache.write_at(&pattern(9, 8192), 0, true).unwrap();
    assert!(garbage.open(options(Mode::WriteBack)).is_err());
    let mut never = options(Mode::WriteBack);
    never.format = FormatPolicy::Never;
    assert!(Rig::new(MIB, 4 * MIB).open(never).is_err(), "blank, never");
    let mut always = options(Mode::WriteBack);
    always.format = FormatPolicy::Always;
    garbage.open(always).unwrap();
}

#[test]
fn a_reformat_ignores_the_table_of_the_format_before() {
    let rig = Rig::new(MIB, 4 * MIB);
    let dev = rig.open(options(Mode::WriteBack)).unwrap();
    for i in 0..50 {
        dev.write_at(&pattern(i, 4096), i * 8192, false).unwrap();
    }
    dev.close().unwrap();
    let mut o = CacheOptions::new("backing");
    o.line_size = 4096;
    o.background = false;
    o.format = FormatPolicy::Always;
    let dev = rig.open(o.clone()).unwrap();
    dev.close().unwrap();
    o.format = FormatPolicy::Never;
    let dev = rig.open(o).unwrap();
    assert_eq!(dev.status().occupied_lines, 0);
    assert_eq!(read(&dev, 0, 4096), vec![0; 4096]);
}

/// A device shut down while others hold it refuses I/O and opens warm.
#[test]
fn shut_down_through_a_shared_handle_is_a_clean_close() {
    let ssd: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(4 << 20));
    let hdd: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(32 << 20));
    let mut options = CacheOptions::new("hdd");
    options.mode = Mode::WriteBack;
    let dev = Arc::new(CacheDevice::open(ssd.clone(), hdd.clone(), options.clone()).unwrap());
    dev.write_at(&[5; 8192], 65536, false).unwrap();
    dev.shut_down().unwrap();
    dev.shut_down().unwrap();
    assert!(dev.write_at(&[6; 4096], 0, false).is_err());
    assert!(dev.read_at(&mut [0; 4096], 0).is_err());
    drop(dev);
    let again = CacheDevice::open(ssd, hdd, options).unwrap();
    assert!(
        again.status().events.is_empty(),
        "{:?}",
        again.status().events
    );
    assert_eq!(again.status().dirty_bytes, 8192);
    let mut back = [0; 8192];
    again.read_at(&mut back, 65536).unwrap();
    assert_eq!(back, [5; 8192]);
}

#[test]
fn a_new_line_size_formats_a_cache_with_nothing_to_write_back_and_refuses_one_with() {
    let rig = Rig::new(MIB, 4 * MIB);
    let dev = rig.open(options(Mode::WriteBack)).unwrap();
    dev.write_at(&pattern(7, 8192), 0, false).unwrap();
    dev.close().unwrap();
    let mut wider = options(Mode::WriteBack);
    wider.line_size = 8192;
    let text = rig
        .open(wider.clone())
        .err()
        .expect("dirty: refused")
        .to_string();
    assert!(text.contains("refusing to format"), "{text}");
    // Written back by leaving write-back: now it may be formatted anew.
    let dev = rig.open(options(Mode::WriteThrough)).unwrap();
    dev.close().unwrap();
    let dev = rig.open(wider).unwrap();
    assert_eq!(dev.line_size(), 8192);
    assert_eq!(dev.status().occupied_lines, 0, "warms up again");
    assert_eq!(read(&dev, 0, 8192), pattern(7, 8192));
    dev.close().unwrap();
}
