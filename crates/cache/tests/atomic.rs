//! Atomic writes through the cache: power is cut after every possible
//! number of device writes and flushes during one, with the unflushed
//! writes kept, lost or torn at random (`Torn`), and the range must read
//! entirely as before or entirely as written after the restart; once the
//! call returned, entirely as written. A plain write in place fails the
//! same check, which shows the check can fail.

mod common;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use block::BlockDevice;
use cache::{CacheDevice, FormatPolicy, Mode};
use common::{options, pattern, read, Torn};

const LINE: u64 = 4096;
const SIZE: u64 = 4 << 20;
/// Over 169 slots a table block: the lines' old slots and the fresh ones
/// lie in different blocks.
const CACHE: u64 = 3 << 20;
/// Unaligned, across five lines, some cached dirty, some clean, some not.
const AT: u64 = 10 * LINE + 1000;
const LEN: usize = 4 * LINE as usize - 512;

struct Rig {
    cache: Arc<Torn>,
    backing: Arc<Torn>,
    power: Arc<AtomicI64>,
}

impl Rig {
    fn new() -> Rig {
        let power = Arc::new(AtomicI64::new(-1));
        Rig {
            cache: Arc::new(Torn::new(CACHE, power.clone())),
            backing: Arc::new(Torn::new(SIZE + cache::BACKING_RESERVE, power.clone())),
            power,
        }
    }

    fn open(&self, mode: Mode, format: FormatPolicy) -> CacheDevice {
        let mut o = options(mode);
        o.line_size = LINE;
        o.format = format;
        CacheDevice::open(self.cache.clone(), self.backing.clone(), o).expect("the cache opens")
    }
}

/// The state before the atomic write: the range holds `old`, its first
/// lines dirty in the cache, one clean there, its last not cached, and
/// many other lines cached after them, so fresh slots come from another
/// table block than the old ones.
fn prepare(rig: &Rig, mode: Mode, old: &[u8]) -> CacheDevice {
    let dev = rig.open(Mode::WriteBack, FormatPolicy::IfBlank);
    // The first lines' newest data is on the cache only.
    let head = (12 * LINE - AT) as usize;
    dev.write_at(&old[head..], AT + head as u64, false).unwrap();
    dev.flush_dirty(&mut |_| {}).unwrap();
    dev.write_at(&old[..head], AT, false).unwrap();
    for line in 100..320 {
        dev.write_at(&pattern(line, 512), line * LINE, false)
            .unwrap();
    }
    dev.flush().unwrap();
    dev.close().unwrap();
    let dev = rig.open(mode, FormatPolicy::Never);
    // The last line leaves the cache (write-around drops clean blocks).
    if mode == Mode::WriteBack {
        let last = (AT + LEN as u64) / LINE * LINE;
        let keep = read(&dev, last, LINE as usize);
        dev.write_at(&keep, last, false).unwrap();
    }
    dev
}

/// Cuts power after `budget` device calls of an atomic write (or a plain
/// one with `in_place`); what the range reads after the restart, and
/// whether the call returned before the cut.
fn cut_during(mode: Mode, budget: i64, seed: u64, in_place: bool) -> (Vec<u8>, bool, bool) {
    let rig = Rig::new();
    let (old, new) = (pattern(1, LEN), pattern(2, LEN));
    let dev = prepare(&rig, mode, &old);
    rig.power.store(budget, Ordering::SeqCst);
    let result = if in_place {
        dev.write_at(&new, AT, false)
    } else {
        dev.write_atomic(&new, AT, false)
    };
    let out = rig.power.load(Ordering::SeqCst) == 0;
    drop(dev);
    let mut s = seed;
    rig.cache.power_cut(&mut s);
    rig.backing.power_cut(&mut s);
    rig.power.store(-1, Ordering::SeqCst);
    let dev = rig.open(mode, FormatPolicy::Never);
    let got = read(&dev, AT, LEN);
    if mode != Mode::WriteBack {
        // The open wrote back what the crash left dirty: the backing alone
        // holds the same.
        let mut back = vec![0; LEN];
        rig.backing.read_at(&mut back, AT).unwrap();
        assert_eq!(back, got, "the backing holds what the cache serves");
    }
    (got, result.is_ok() && !out, out)
}

fn all_or_nothing(mode: Mode) {
    let (old, new) = (pattern(1, LEN), pattern(2, LEN));
    let mut budget = 0;
    let mut seen = (0, 0);
    loop {
        let mut done = false;
        for seed in 0..4 {
            let (got, returned, out) = cut_during(mode, budget, seed * 7919 + budget as u64, false);
            if returned {
                assert!(got == new, "{mode}: returned, yet not all new");
                done = !out;
            } else {
                assert!(
                    got == old || got == new,
                    "{mode}: power cut after {budget} calls left a mix"
                );
            }
            if got == new {
                seen.1 += 1;
            } else {
                seen.0 += 1;
            }
        }
        if done {
            break;
        }
        budget += 1;
        assert!(budget < 200, "the write never completes");
    }
    assert!(seen.0 > 0 && seen.1 > 0, "both outcomes seen: {seen:?}");
}

#[test]
fn an_atomic_write_survives_a_power_cut_whole_or_not_at_all_in_write_back() {
    all_or_nothing(Mode::WriteBack);
}

#[test]
fn an_atomic_write_survives_a_power_cut_whole_or_not_at_all_in_write_through() {
    all_or_nothing(Mode::WriteThrough);
}

#[test]
fn an_atomic_write_survives_a_power_cut_whole_or_not_at_all_in_write_around() {
    all_or_nothing(Mode::WriteAround);
}

#[test]
fn a_write_in_place_can_be_left_half_done_by_a_power_cut() {
    let (old, new) = (pattern(1, LEN), pattern(2, LEN));
    let mixed = (0..12).any(|budget| {
        (0..4).any(|seed| {
            let (got, _, _) = cut_during(Mode::WriteBack, budget, seed * 31 + 5, true);
            got != old && got != new
        })
    });
    assert!(mixed, "the check tells a torn write from an atomic one");
}

#[test]
fn atomic_writes_land_whole_and_write_through_ends_on_the_backing() {
    let rig = Rig::new();
    let dev = rig.open(Mode::WriteThrough, FormatPolicy::IfBlank);
    let limits = dev.atomic_writes().expect("the cache offers atomic writes");
    assert_eq!(limits.max_bytes, 64 * LINE);
    let data = pattern(9, LEN);
    dev.write_atomic(&data, AT, true).unwrap();
    assert_eq!(read(&dev, AT, LEN), data);
    let mut back = vec![0; LEN];
    rig.backing.read_at(&mut back, AT).unwrap();
    assert_eq!(back, data, "written through at once");
    assert_eq!(dev.status().dirty_bytes, 0);
    let too_long = vec![0; 64 * LINE as usize + 512];
    let e = dev.write_atomic(&too_long, 0, false).unwrap_err();
    assert!(e.to_string().contains("outside the device's limits"), "{e}");
}

#[test]
fn atomic_writes_find_room_when_the_cache_is_full_of_clean_lines() {
    let rig = Rig::new();
    let dev = rig.open(Mode::WriteThrough, FormatPolicy::IfBlank);
    let lines = dev.capacity_lines() as u64;
    for line in 0..lines + 50 {
        dev.write_at(&pattern(line, 512), line * LINE, false)
            .unwrap();
    }
    for round in 0..20u64 {
        let data = pattern(100 + round, LEN);
        let at = AT + round * 7 * LINE;
        dev.write_atomic(&data, at, false).unwrap();
        assert_eq!(read(&dev, at, LEN), data);
    }
    dev.close().unwrap();
    let dev = rig.open(Mode::WriteThrough, FormatPolicy::Never);
    assert_eq!(read(&dev, AT, LEN), pattern(100, LEN));
}
