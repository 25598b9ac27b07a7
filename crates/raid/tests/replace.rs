//! `replace`: the new device is copied beside the member it replaces,
//! which stays in sync and keeps serving; it takes the slot only when
//! complete, and the old member is released.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use block::BlockDevice;
use common::*;
use raid::{ArrayState, AssembleError, Level, MemberState, RaidArray};

const ROWS: u64 = 256;

/// Waits until the replacement of `slot` has copied at least `bytes`.
fn copied_at_least(a: &RaidArray, bytes: u64) {
    let start = Instant::now();
    loop {
        let st = a.status();
        let r = st
            .members
            .iter()
            .find(|m| m.state == MemberState::Replacement)
            .expect("a replacement under way");
        if r.recovered_bytes.unwrap_or(0) >= bytes {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn read_all(a: &RaidArray) -> Vec<u8> {
    let mut got = vec![0u8; a.size() as usize];
    a.read_at(&mut got, 0).unwrap();
    got
}

/// On every redundant level: writes while the copy runs read back; the
/// old member serves until the end, then leaves; with the new one in
/// its slot the array survives losing any other member.
#[test]
fn copies_beside_the_old_member_then_swaps() {
    for level in [Level::Raid1, Level::Raid10, Level::Raid5, Level::Raid6] {
        let n = members_for(level);
        let (a, members, _) = array(level, n, 0, ROWS);
        let mut data = pattern(a.size() as usize, 3);
        a.write_at(&data, 0, false).unwrap();
        // Slow, so that writes land on both sides of the copy's progress.
        a.set_sync_speed(64 << 10, 256 << 10).unwrap();
        let new = faulty(member_size(ROWS));
        a.replace(1, new.clone()).unwrap();
        let st = a.status();
        assert_eq!(st.state, ArrayState::Clean, "{level:?}: {st:?}");
        assert_eq!(st.members[1].state, MemberState::InSync);
        let shown = st.members.iter().find(|m| m.replacing == Some(1));
        assert!(shown.is_some(), "{level:?}: {st:?}");
        assert!(st.members[1].replaced_by.is_some());
        copied_at_least(&a, 16 * CHUNK);
        let sync = a.status().sync.expect("progress shown");
        assert_eq!((sync.kind, sync.slot), ("replace", Some(1)));
        // Below and above the copy's progress.
        for at in [CHUNK, a.size() - 8 * CHUNK, a.size() / 2] {
            let bytes = pattern(3 * CHUNK as usize, at);
            a.write_at(&bytes, at, false).unwrap();
            data[at as usize..at as usize + bytes.len()].copy_from_slice(&bytes);
        }
        // The old member still takes reads and writes.
        assert!(members[1].read_at(&mut [0u8; 512], 0).is_ok());
        a.set_sync_speed(1 << 40, 1 << 40).unwrap();
        assert!(a.wait_idle(Duration::from_secs(20)));
        let st = a.status();
        assert_eq!(st.state, ArrayState::Clean, "{level:?}");
        assert_eq!(st.members.len(), n, "the old member left: {st:?}");
        assert!(read_all(&a) == data, "{level:?}");
        // The new member is in slot 1: the array stands without any one
        // of the others.
        let other = if level == Level::Raid10 { 0 } else { 2 };
        members[other].set_fail_reads(true);
        members[other].set_fail_writes(true);
        assert!(read_all(&a) == data, "{level:?} without slot {other}");
        // And without the old member too, which no longer matters.
        members[1].set_fail_reads(true);
        assert!(read_all(&a) == data, "{level:?} after the old member went");
    }
}

/// RAID5: a second member lost during the copy leaves the data intact,
/// because the old member is still in; the copy goes on.
#[test]
fn another_member_lost_during_the_copy_leaves_raid5_intact() {
    let (a, members, _) = array(Level::Raid5, 4, 0, ROWS);
    let mut data = pattern(a.size() as usize, 5);
    a.write_at(&data, 0, false).unwrap();
    a.set_sync_speed(64 << 10, 256 << 10).unwrap();
    a.replace(1, faulty(member_size(ROWS))).unwrap();
    copied_at_least(&a, 32 * CHUNK);
    a.fail(2).unwrap();
    assert_eq!(a.status().state, ArrayState::Degraded);
    assert!(read_all(&a) == data);
    let bytes = pattern(40 * CHUNK as usize, 11);
    a.write_at(&bytes, 100 * CHUNK, false).unwrap();
    data[100 * CHUNK as usize..100 * CHUNK as usize + bytes.len()].copy_from_slice(&bytes);
    a.set_sync_speed(1 << 40, 1 << 40).unwrap();
    assert!(a.wait_idle(Duration::from_secs(20)));
    let st = a.status();
    assert_eq!(st.state, ArrayState::Degraded, "{st:?}");
    assert_eq!(st.members[1].state, MemberState::InSync);
    assert_eq!(st.members[2].state, MemberState::Failed);
    drop(members);
    assert!(read_all(&a) == data);
}

/// The old member failing during the copy: the replacement takes its
/// slot and rebuilds only what it has not got.
#[test]
fn the_old_member_failing_turns_the_copy_into_a_rebuild() {
    for level in [Level::Raid1, Level::Raid5] {
        let (a, members, _) = array(level, members_for(level), 0, ROWS);
        let mut data = pattern(a.size() as usize, 7);
        a.write_at(&data, 0, false).unwrap();
        a.set_sync_speed(64 << 10, 256 << 10).unwrap();
        a.replace(0, faulty(member_size(ROWS))).unwrap();
        copied_at_least(&a, 32 * CHUNK);
        members[0].set_fail_writes(true);
        let bytes = pattern(8 * CHUNK as usize, 13);
        a.write_at(&bytes, 0, false).unwrap();
        data[..bytes.len()].copy_from_slice(&bytes);
        let st = a.status();
        assert_eq!(st.members[0].state, MemberState::Recovering, "{st:?}");
        a.set_sync_speed(1 << 40, 1 << 40).unwrap();
        assert!(a.wait_idle(Duration::from_secs(20)));
        assert_eq!(a.status().state, ArrayState::Clean);
        members[1].set_fail_reads(true);
        assert!(read_all(&a) == data, "{level:?}");
    }
}

/// A stop in the middle: the replacement's superblock brings it back
/// beside the old member and the copy starts over. Once done, the old
/// member never assembles again.
#[test]
fn a_restart_in_the_middle_starts_the_copy_over_and_the_released_member_stays_out() {
    let (a, members, _) = array(Level::Raid6, 5, 0, ROWS);
    let data = pattern(a.size() as usize, 9);
    a.write_at(&data, 0, false).unwrap();
    a.set_sync_speed(64 << 10, 256 << 10).unwrap();
    let new = faulty(member_size(ROWS));
    a.replace(3, new.clone()).unwrap();
    copied_at_least(&a, 16 * CHUNK);
    a.flush().unwrap();
    drop(a);

    let mut all = devs(&members);
    all.push(new.clone());
    // Slow from the start, so that the copy is seen under way.
    let slow = raid::RaidOptions {
        sync_speed_min: 64 << 10,
        sync_speed_max: 256 << 10,
        ..options()
    };
    let a = RaidArray::assemble(all.clone(), slow).unwrap();
    let st = a.status();
    assert_eq!(st.state, ArrayState::Clean);
    let r = st.members.iter().find(|m| m.replacing == Some(3));
    assert!(r.is_some(), "{st:?}");
    assert!(read_all(&a) == data);
    a.set_sync_speed(1 << 40, 1 << 40).unwrap();
    assert!(a.wait_idle(Duration::from_secs(20)));
    assert_eq!(a.status().members.len(), 5);
    a.flush().unwrap();
    drop(a);

    let err = RaidArray::assemble(all, options()).err().unwrap();
    assert!(matches!(err, AssembleError::Released(_)), "{err}");
    let mut now = devs(&members);
    now[3] = new.clone() as Arc<dyn BlockDevice>;
    let a = RaidArray::assemble(now, options()).unwrap();
    assert_eq!(a.status().state, ArrayState::Clean);
    assert!(read_all(&a) == data);
    assert!(a.re_add(members[3].clone()).is_err());
}

/// A replacement that fails is dropped; the old member stays, the array
/// whole, and a replace can start again.
#[test]
fn a_failing_replacement_is_dropped() {
    let (a, members, _) = array(Level::Raid5, 3, 1, ROWS);
    let data = pattern(a.size() as usize, 1);
    a.write_at(&data, 0, false).unwrap();
    a.set_sync_speed(64 << 10, 256 << 10).unwrap();
    let bad = faulty(member_size(ROWS));
    a.replace(2, bad.clone()).unwrap();
    let e = a.replace(2, faulty(member_size(ROWS))).unwrap_err();
    assert!(e.to_string().contains("already being replaced"), "{e}");
    // Nor is a device of the array taken for another's place.
    let e = a.replace(0, bad.clone()).unwrap_err();
    assert!(e.to_string().contains("already in this array"), "{e}");
    let e = a.replace(0, members[1].clone()).unwrap_err();
    assert!(e.to_string().contains("already in this array"), "{e}");
    copied_at_least(&a, 8 * CHUNK);
    bad.set_fail_writes(true);
    a.write_at(&data[..4096], 0, false).unwrap();
    let start = Instant::now();
    while a.status().members.iter().any(|m| m.replacing.is_some()) {
        assert!(start.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(10));
    }
    let st = a.status();
    assert_eq!(st.state, ArrayState::Clean, "{st:?}");
    // The hot spare, by name.
    let spare = st
        .members
        .iter()
        .find(|m| m.state == MemberState::Spare)
        .and_then(|m| m.name.clone())
        .unwrap();
    let dev = a.spare_named(&spare).unwrap();
    a.replace(2, dev).unwrap();
    a.set_sync_speed(1 << 40, 1 << 40).unwrap();
    assert!(a.wait_idle(Duration::from_secs(20)));
    let st = a.status();
    assert_eq!(st.members.len(), 3, "the spare took the slot: {st:?}");
    assert_eq!(st.members[2].name.as_deref(), Some(spare.as_str()));
    assert!(read_all(&a) == data);
}
