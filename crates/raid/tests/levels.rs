//! Every level: data round-trips healthy, degraded, after a rebuild, and
//! the array fails cleanly beyond its redundancy.

mod common;

use std::time::Duration;

use block::BlockDevice;
use common::*;
use raid::{ArrayState, Level, MemberState};

const LEVELS: [Level; 5] = [
    Level::Raid0,
    Level::Raid1,
    Level::Raid10,
    Level::Raid5,
    Level::Raid6,
];

fn fill(array: &dyn BlockDevice, seed: u64) -> Vec<u8> {
    let data = pattern(array.size() as usize, seed);
    // Unaligned pieces of varied length, to cross chunks and rows.
    let mut at = 0usize;
    let mut step = 1000usize;
    while at < data.len() {
        let end = (at + step).min(data.len());
        array.write_at(&data[at..end], at as u64, false).unwrap();
        at = end;
        step = step * 7 % 30011 + 512;
    }
    data
}

fn check(array: &dyn BlockDevice, data: &[u8]) {
    let mut got = vec![0u8; data.len()];
    array.read_at(&mut got, 0).unwrap();
    assert!(got == data, "array content differs");
    // And in small unaligned reads.
    let mut at = 3usize;
    while at + 777 < data.len() {
        let mut b = vec![0u8; 777];
        array.read_at(&mut b, at as u64).unwrap();
        assert_eq!(b, data[at..at + 777]);
        at += 5000;
    }
}

#[test]
fn sizes_follow_the_level() {
    for (level, n, data_members) in [
        (Level::Raid0, 3, 3.0),
        (Level::Raid1, 3, 1.0),
        (Level::Raid10, 3, 1.5),
        (Level::Raid5, 4, 3.0),
        (Level::Raid6, 5, 3.0),
    ] {
        let (a, _, _) = array(level, n, 0, 16);
        assert_eq!(a.size(), (16.0 * data_members) as u64 * CHUNK, "{level:?}");
    }
}

#[test]
fn data_round_trips_on_every_level() {
    for level in LEVELS {
        let (a, _, _) = array(level, members_for(level), 0, 24);
        let data = fill(&a, 1);
        check(&a, &data);
    }
}

#[test]
fn parity_matches_data_after_partial_writes() {
    for level in [Level::Raid5, Level::Raid6] {
        let n = members_for(level);
        let (a, members, _) = array(level, n, 0, 16);
        let data = fill(&a, 2);
        drop(a);
        for lost in 0..n {
            let (a, members2) = reassemble_with_loss(&members, lost, level == Level::Raid6);
            check(&a, &data);
            drop(a);
            drop(members2);
        }
    }
}

/// A copy of the members, assembled, with `lost` (and the one after
/// next, when `two`) failing every read.
fn reassemble_with_loss(
    members: &[std::sync::Arc<block::FaultyDevice>],
    lost: usize,
    two: bool,
) -> (raid::RaidArray, Vec<std::sync::Arc<block::FaultyDevice>>) {
    let members = copies(members);
    let a = raid::RaidArray::assemble(devs(&members), options()).unwrap();
    let n = members.len();
    members[lost].set_fail_reads(true);
    if two {
        members[(lost + 2) % n].set_fail_reads(true);
    }
    (a, members)
}

#[test]
fn degraded_reads_and_writes_then_spare_rebuild() {
    for level in [Level::Raid1, Level::Raid10, Level::Raid5, Level::Raid6] {
        let n = members_for(level);
        let (a, members, _spares) = array(level, n, 1, 24);
        let mut data = fill(&a, 3);
        members[1].set_fail_reads(true);
        members[1].set_fail_writes(true);
        // The first read that touches member 1 fails it; data stays whole.
        check(&a, &data);
        // Writes go on while degraded (and the spare rebuilds meanwhile).
        let more = pattern(50_000, 4);
        a.write_at(&more, 12_345, false).unwrap();
        data[12_345..12_345 + 50_000].copy_from_slice(&more);
        assert!(
            a.wait_idle(Duration::from_secs(20)),
            "{level:?} rebuild did not end"
        );
        let st = a.status();
        assert_eq!(st.state, ArrayState::Clean, "{level:?}");
        assert_eq!(st.members[1].state, MemberState::InSync);
        assert!(st.member_failures >= 1);
        check(&a, &data);
        // Member 1's slot is now the spare: losing any other one (or two on
        // RAID6) still leaves every byte.
        members[0].set_fail_reads(true);
        if level == Level::Raid6 {
            members[2].set_fail_reads(true);
        }
        check(&a, &data);
    }
}

#[test]
fn beyond_redundancy_io_errors_without_panic() {
    for level in LEVELS {
        let n = members_for(level);
        let (a, members, _) = array(level, n, 0, 8);
        let lose = match level {
            Level::Raid0 => 1,
            Level::Raid1 => n,
            Level::Raid10 => 2,
            Level::Raid5 => 2,
            Level::Raid6 => 3,
        };
        for m in &members[..lose] {
            m.set_fail_reads(true);
            m.set_fail_writes(true);
        }
        let mut buf = vec![0u8; a.size() as usize];
        assert!(a.read_at(&mut buf, 0).is_err(), "{level:?}");
        assert!(a.write_at(&buf[..8192], 0, false).is_err(), "{level:?}");
        assert_eq!(a.status().state, ArrayState::Failed, "{level:?}");
    }
}

#[test]
fn raid1_reads_spread_over_copies() {
    let (a, _, _) = array(Level::Raid1, 2, 0, 8);
    let mut b = vec![0u8; 4096];
    for _ in 0..100 {
        a.read_at(&mut b, 0).unwrap();
    }
    let st = a.status();
    for m in &st.members {
        let reads = m.io.as_ref().unwrap().read_ops;
        assert!((40..=60).contains(&reads), "{reads} reads on one copy");
    }
}

#[test]
fn full_row_writes_read_nothing_and_small_writes_read_the_lesser() {
    // RAID5 over 6 members: a row is 5 chunks.
    let (a, members, _) = array(Level::Raid5, 6, 0, 8);
    let reads = || -> u64 {
        a.status()
            .members
            .iter()
            .map(|m| m.io.as_ref().unwrap().read_ops)
            .sum()
    };
    a.write_at(&pattern(5 * 4096, 1), 0, false).unwrap();
    assert_eq!(reads(), 0, "a full row needs no read");
    // One chunk of five: read-modify-write reads the chunk and P (2).
    a.write_at(&pattern(4096, 2), 0, false).unwrap();
    assert_eq!(reads(), 2);
    // Four chunks of five: reconstruct-write reads the fifth (1).
    a.write_at(&pattern(4 * 4096, 3), 0, false).unwrap();
    assert_eq!(reads(), 3);
    drop(members);
}

#[test]
fn flush_and_fua_reach_every_member() {
    let (a, members, _) = array(Level::Raid5, 4, 0, 8);
    a.write_at(&pattern(3 * 4096, 1), 0, false).unwrap();
    assert!(members.iter().any(|m| m.unflushed_bytes() > 0));
    a.flush().unwrap();
    assert!(members.iter().all(|m| m.unflushed_bytes() == 0));
    a.write_at(&pattern(3 * 4096, 2), 3 * 4096, true).unwrap();
    assert!(
        members.iter().all(|m| m.unflushed_bytes() == 0),
        "FUA left data in a cache"
    );
}

#[test]
fn concurrent_writers_keep_parity_consistent() {
    for level in [Level::Raid5, Level::Raid6, Level::Raid1] {
        let n = members_for(level);
        let (a, members, _) = array(level, n, 0, 16);
        let size = a.size();
        // Each thread owns interleaved 1 KiB blocks, so rows are shared.
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let a = &a;
                s.spawn(move || {
                    for round in 0..30u64 {
                        let mut at = t * 1024;
                        while at + 1024 <= size {
                            a.write_at(&pattern(1024, t * 1000 + round), at, false)
                                .unwrap();
                            at += 4 * 1024 * 7;
                        }
                    }
                });
            }
        });
        let mut expect = vec![0u8; size as usize];
        a.read_at(&mut expect, 0).unwrap();
        // Any member lost: reconstruction agrees with what was read.
        drop(a);
        for lost in 0..n {
            let (a, _m) = reassemble_with_loss(&members, lost, false);
            let mut got = vec![0u8; size as usize];
            a.read_at(&mut got, 0).unwrap();
            assert!(
                got == expect,
                "{level:?}: losing member {lost} changes data"
            );
        }
    }
}

#[test]
fn large_requests_spread_over_members_also_degraded() {
    for level in LEVELS {
        let n = members_for(level);
        let (a, members, _) = array(level, n, 0, 72);
        let data = pattern(a.size() as usize, 31);
        assert!(data.len() >= 256 << 10, "large enough to spread");
        a.write_at(&data, 0, false).unwrap();
        check(&a, &data);
        if level != Level::Raid0 {
            members[n - 1].set_fail_reads(true);
            members[n - 1].set_fail_writes(true);
            let more = pattern(data.len() - 8192, 32);
            a.write_at(&more, 4096, true).unwrap();
            let mut expect = data.clone();
            expect[4096..4096 + more.len()].copy_from_slice(&more);
            check(&a, &expect);
        }
    }
}

#[test]
fn a_member_slower_than_the_timeout_is_failed_and_io_goes_on() {
    let n = 4;
    let size = member_size(16);
    let members: Vec<_> = (0..n).map(|_| faulty(size)).collect();
    let opts = raid::RaidOptions {
        member_timeout: Some(Duration::from_millis(20)),
        ..options()
    };
    let a = raid::RaidArray::create(Level::Raid5, devs(&members), vec![], opts).unwrap();
    let data = fill(&a, 41);
    members[2].set_delay(Some(Duration::from_millis(50)));
    check(&a, &data);
    let st = a.status();
    assert_eq!(st.state, ArrayState::Degraded);
    assert_eq!(st.members[2].state, MemberState::Failed);
    assert!(st.members[2].io.as_ref().unwrap().errors >= 1);
}

/// Mirrors rebuild in batches with several in flight, while writes land
/// behind, inside and ahead of them: every write reaches the rebuilt
/// member, which then holds every byte alone (with the other copies of
/// its chunks gone).
#[test]
fn mirror_rebuilds_in_batches_under_writes() {
    for (level, n) in [(Level::Raid1, 2), (Level::Raid10, 4), (Level::Raid10, 3)] {
        let (a, members, _spares) = array(level, n, 1, 256);
        let mut data = fill(&a, 5);
        // 32-row batches: 8 of them, three at a time.
        a.set_sync_speed(1 << 20, 1 << 20).unwrap();
        a.fail(1).unwrap();
        let mut seed = 9;
        let mut seen = 0;
        while seed < 20 || a.status().sync.is_some() {
            seen += a.status().sync.is_some() as u32;
            seed += 1;
            let at = (seed * 7919 * 4096) % (a.size() - 65536);
            let more = pattern(20_000, seed);
            a.write_at(&more, at, false).unwrap();
            data[at as usize..at as usize + more.len()].copy_from_slice(&more);
            std::thread::sleep(Duration::from_millis(20));
        }
        a.set_sync_speed(1 << 40, 1 << 40).unwrap();
        assert!(a.wait_idle(Duration::from_secs(30)), "{level:?}");
        assert!(seen > 5, "{level:?}: the rebuild ended before the writes");
        // Slot 1's copies alone where they shared chunks with slot 0.
        members[0].set_fail_reads(true);
        check(&a, &data);
    }
}
