//! Forced assembly: members fail one after another while the array runs,
//! so that after the restart too few are at the newest events; normal
//! assembly refuses, forced assembly takes the freshest stale member and
//! serves every write acknowledged before the array failed.

mod common;

use std::time::Duration;

use block::BlockDevice;
use common::*;
use raid::{ArrayState, AssembleError, ForcedMember, Level, RaidArray};

/// Writes `len` bytes of a fresh pattern at `at` and keeps `expect` in step.
fn write(a: &RaidArray, expect: &mut [u8], at: u64, len: usize, seed: u64) {
    let w = pattern(len, seed);
    a.write_at(&w, at, false).unwrap();
    expect[at as usize..at as usize + len].copy_from_slice(&w);
}

fn read_all(a: &RaidArray) -> Vec<u8> {
    let mut got = vec![0u8; a.size() as usize];
    a.read_at(&mut got, 0).unwrap();
    got
}

/// `level` over `n` members: members 0.. fail one by one with writes
/// between, up to the redundancy; then one more goes away unnoticed and
/// misses the next superblock update, which fails the array.
fn members_fail_one_by_one_then_forced_assembly_brings_the_array_back(level: Level, n: usize) {
    let rows = 64;
    let (a, members, _) = array(level, n, 0, rows);
    let redundancy = level.parity();
    let row_bytes = CHUNK as usize * (n - redundancy);
    let mut expect = pattern(a.size() as usize, 1);
    a.write_at(&expect, 0, false).unwrap();
    a.flush().unwrap();
    for (gone, m) in members.iter().enumerate().take(redundancy) {
        m.set_fail_writes(true);
        m.set_fail_reads(true);
        // Whole rows: every member sees the write, the failing one fails.
        let at = (gone * 7 * row_bytes) as u64;
        write(&a, &mut expect, at, 3 * row_bytes, 10 + gone as u64);
        write(&a, &mut expect, at + 40_000, 5000, 20 + gone as u64);
        a.flush().unwrap();
        assert_eq!(a.status().state, ArrayState::Degraded);
    }
    // The next member goes away unnoticed; the superblock update of
    // taking out the first failed member cannot reach it.
    let last = redundancy;
    members[last].set_fail_writes(true);
    members[last].set_fail_reads(true);
    a.remove(0).unwrap();
    assert_eq!(a.status().state, ArrayState::Failed);
    assert!(a.write_at(&[1; 4096], 0, false).is_err());
    drop(a);
    for m in &members {
        m.heal();
    }

    let err = RaidArray::assemble(devs(&members), options())
        .err()
        .unwrap();
    assert!(matches!(err, AssembleError::Stale(..)), "{err}");
    let fresh = devs(&members[last + 1..]);
    let err = RaidArray::assemble(fresh, options()).err().unwrap();
    assert!(
        matches!(err, AssembleError::TooFew(ref s) if s.len() == redundancy + 1),
        "{err}"
    );

    let forced = RaidArray::assemble_forced(devs(&members), options()).unwrap();
    let a = forced.array;
    let st = a.status();
    assert_eq!(st.forced.len(), 1, "{:?}", st.forced);
    let ForcedMember { slot, gap, .. } = st.forced[0].clone();
    assert_eq!(
        (slot, gap),
        (last, 1),
        "the freshest stale member is forced"
    );
    assert_eq!(forced.left_out.len(), redundancy, "the oldest stay out");
    assert_eq!(st.state, ArrayState::Degraded);
    assert!(read_all(&a) == expect, "acknowledged writes are served");

    for dev in forced.left_out {
        a.re_add(dev).unwrap();
    }
    assert!(a.wait_idle(Duration::from_secs(20)));
    let st = a.status();
    assert_eq!(st.state, ArrayState::Clean);
    assert!(st.bitmap.last_catch_up_bytes.is_some());
    assert!(
        st.bitmap.last_resync_bytes.is_some_and(|b| b > 0),
        "the regions dirty in the forced members' bitmaps are resynced"
    );
    let scrub = a.scrub(false).unwrap();
    assert_eq!(scrub.mismatches, 0, "{scrub:?}");
    assert!(read_all(&a) == expect);
    drop(a);
    // Every member is current now: a normal assembly takes them all.
    let a = RaidArray::assemble(devs(&members), options()).unwrap();
    assert!(a.wait_idle(Duration::from_secs(20)));
    assert_eq!(a.status().state, ArrayState::Clean);
    assert!(a.status().forced.is_empty());
    // The re-added members hold their part: lose others and read.
    for m in &members[n - redundancy..] {
        m.set_fail_reads(true);
    }
    assert!(read_all(&a) == expect, "the caught-up members are current");
}

#[test]
fn raid5_whose_members_failed_one_by_one_is_forced_back_from_the_freshest() {
    members_fail_one_by_one_then_forced_assembly_brings_the_array_back(Level::Raid5, 4);
}

#[test]
fn raid6_whose_members_failed_one_by_one_is_forced_back_from_the_freshest() {
    members_fail_one_by_one_then_forced_assembly_brings_the_array_back(Level::Raid6, 5);
}

#[test]
fn too_few_even_with_every_stale_member_is_still_refused() {
    let (a, members, _) = array(Level::Raid5, 4, 0, 16);
    a.write_at(&pattern(4096, 3), 0, false).unwrap();
    drop(a);
    let err = RaidArray::assemble_forced(devs(&members[..2]), options())
        .err()
        .unwrap();
    assert!(matches!(err, AssembleError::TooFew(_)), "{err}");
}
