//! Assembly from superblocks, the write-intent bitmap's resync and
//! catch-up sizes, rebuild progress and throttle, manual operations.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use block::BlockDevice;
use common::*;
use raid::{ArrayState, AssembleError, Level, MemberState, RaidArray, RaidOptions};

#[test]
fn assembles_from_members_in_any_order() {
    let (a, members, spares) = array(Level::Raid6, 5, 1, 16);
    let id = a.array_id();
    let data = pattern(a.size() as usize, 7);
    a.write_at(&data, 0, false).unwrap();
    a.flush().unwrap();
    drop(a);
    let mut shuffled = devs(&members);
    shuffled.reverse();
    shuffled.swap(0, 2);
    shuffled.insert(2, spares[0].clone());
    let a = RaidArray::assemble(shuffled, options()).unwrap();
    assert_eq!(a.array_id(), id);
    let mut got = vec![0u8; data.len()];
    a.read_at(&mut got, 0).unwrap();
    assert!(got == data);
    let st = a.status();
    assert_eq!(st.state, ArrayState::Clean);
    assert_eq!(
        st.members
            .iter()
            .filter(|m| m.state == MemberState::Spare)
            .count(),
        1
    );
}

#[test]
fn refuses_foreign_blank_and_too_few_members() {
    let (a, members, _) = array(Level::Raid5, 3, 0, 8);
    let (b, others, _) = array(Level::Raid5, 3, 0, 8);
    drop((a, b));
    let mut mixed = devs(&members[..2]);
    mixed.push(others[2].clone());
    let err = RaidArray::assemble(mixed, options()).err().unwrap();
    assert!(matches!(err, AssembleError::Foreign(..)), "{err}");
    assert!(
        err.to_string().contains("belongs to another array"),
        "{err}"
    );

    let mut with_blank = devs(&members[..2]);
    with_blank.push(faulty(member_size(16)));
    let err = RaidArray::assemble(with_blank, options()).err().unwrap();
    assert!(matches!(err, AssembleError::NoSuperblock(_)), "{err}");

    let err = RaidArray::assemble(devs(&members[..1]), options())
        .err()
        .unwrap();
    assert!(
        matches!(err, AssembleError::TooFew(ref s) if s.len() == 2),
        "{err}"
    );
}

#[test]
fn a_stale_member_is_refused_then_catches_up_only_what_it_missed() {
    let rows = 256; // 64 bitmap regions of 4 rows
    let (a, members, _) = array(Level::Raid5, 4, 0, rows);
    let data = pattern(a.size() as usize, 1);
    a.write_at(&data, 0, false).unwrap();
    a.flush().unwrap();
    assert_eq!(
        a.status().bitmap.dirty_regions,
        0,
        "a flush cleans the bitmap"
    );
    // Member 2 goes away; two small writes land meanwhile.
    members[2].set_fail_writes(true);
    members[2].set_fail_reads(true);
    let mut expect = data.clone();
    for at in [5000u64, 400_000] {
        let w = pattern(3000, at);
        a.write_at(&w, at, false).unwrap();
        expect[at as usize..at as usize + 3000].copy_from_slice(&w);
    }
    a.flush().unwrap();
    assert_eq!(a.status().state, ArrayState::Degraded);
    let dirty = a.status().bitmap.dirty_regions;
    assert!((1..=4).contains(&dirty), "{dirty} regions dirty");
    drop(a);
    members[2].heal();

    let err = RaidArray::assemble(devs(&members), options())
        .err()
        .unwrap();
    assert!(matches!(err, AssembleError::Stale(..)), "{err}");
    assert!(err.to_string().contains("re-add"), "{err}");

    let mut without = devs(&members);
    without.remove(2);
    let a = RaidArray::assemble(without, options()).unwrap();
    assert_eq!(a.status().members[2].state, MemberState::Missing);
    a.re_add(members[2].clone()).unwrap();
    assert!(a.wait_idle(Duration::from_secs(10)));
    let st = a.status();
    assert_eq!(st.state, ArrayState::Clean);
    let caught_up = st.bitmap.last_catch_up_bytes.unwrap();
    let region = st.bitmap.region_bytes;
    assert_eq!(caught_up, dirty * region);
    assert!(
        caught_up * 10 < rows * CHUNK,
        "caught up {caught_up} bytes, not a fraction"
    );
    // Member 2's data is whole again: lose another member and read.
    members[0].set_fail_reads(true);
    let mut got = vec![0u8; expect.len()];
    a.read_at(&mut got, 0).unwrap();
    assert!(got == expect);
}

#[test]
fn after_an_unclean_stop_only_dirty_regions_resync() {
    let rows = 256;
    let (a, members, _) = array(Level::Raid1, 2, 0, rows);
    a.write_at(&pattern(a.size() as usize, 2), 0, false)
        .unwrap();
    a.flush().unwrap();
    // Two writes left unflushed, then the power goes.
    a.write_at(&pattern(100, 3), 10_000, false).unwrap();
    a.write_at(&pattern(100, 4), 700_000, false).unwrap();
    let expect_regions = a.status().bitmap.dirty_regions;
    assert_eq!(expect_regions, 2);
    drop(a);
    for m in &members {
        m.drop_unflushed();
    }
    let a = RaidArray::assemble(devs(&members), options()).unwrap();
    assert!(a.wait_idle(Duration::from_secs(10)));
    let st = a.status();
    let resynced = st.bitmap.last_resync_bytes.unwrap();
    assert_eq!(resynced, expect_regions * st.bitmap.region_bytes);
    assert!(resynced * 10 < rows * CHUNK);
    a.flush().unwrap();
    assert_eq!(a.status().bitmap.dirty_regions, 0);
}

#[test]
fn rebuild_runs_in_the_background_with_progress_and_its_speed_cap() {
    let rows = 64;
    let size = member_size(rows);
    let members: Vec<_> = (0..3).map(|_| faulty(size)).collect();
    let opts = RaidOptions {
        sync_speed_min: 64 << 10,
        sync_speed_max: 512 << 10, // 256 KiB takes about half a second
        ..options()
    };
    let a = RaidArray::create(Level::Raid5, devs(&members), vec![], opts).unwrap();
    let data = pattern(a.size() as usize, 5);
    a.write_at(&data, 0, false).unwrap();
    a.fail(1).unwrap();
    assert_eq!(a.status().state, ArrayState::Degraded);
    let started = Instant::now();
    a.add(faulty(size)).unwrap();
    let mut saw_progress = false;
    while !a.wait_idle(Duration::from_millis(20)) {
        let st = a.status();
        if let Some(p) = st.sync {
            assert_eq!(p.kind, "rebuild");
            assert_eq!(p.slot, Some(1));
            assert_eq!(st.state, ArrayState::Rebuilding);
            saw_progress |= p.done_bytes > 0 && p.done_bytes < p.total_bytes;
        }
        // Foreground I/O goes on meanwhile.
        let mut b = vec![0u8; 4096];
        a.read_at(&mut b, 8192).unwrap();
        assert_eq!(b, data[8192..12288]);
    }
    let took = started.elapsed();
    assert!(saw_progress);
    assert!(
        took >= Duration::from_millis(300),
        "rebuild of 256 KiB took only {took:?}"
    );
    members[0].set_fail_reads(true);
    let mut got = vec![0u8; data.len()];
    a.read_at(&mut got, 0).unwrap();
    assert!(got == data);
}

#[test]
fn manual_fail_remove_add_and_replace() {
    let (a, members, _) = array(Level::Raid1, 2, 0, 16);
    let data = pattern(a.size() as usize, 9);
    a.write_at(&data, 0, false).unwrap();
    assert!(a.remove(0).is_err(), "an active member is not removed");
    a.fail(0).unwrap();
    let removed = a.remove(0).unwrap();
    assert!(Arc::ptr_eq(
        &removed,
        &(members[0].clone() as Arc<dyn BlockDevice>)
    ));
    assert_eq!(a.status().members[0].state, MemberState::Missing);
    a.add(faulty(member_size(16))).unwrap();
    assert!(a.wait_idle(Duration::from_secs(10)));
    assert_eq!(a.status().state, ArrayState::Clean);
    // Replace member 1 by a new device; the data survives losing slot 0.
    a.replace(1, faulty(member_size(16))).unwrap();
    assert!(a.wait_idle(Duration::from_secs(10)));
    let st = a.status();
    assert_eq!(st.state, ArrayState::Clean);
    assert!(st.events > 3);
    let mut got = vec![0u8; data.len()];
    a.read_at(&mut got, 0).unwrap();
    assert!(got == data);
    let json = serde_json::to_string(&st).unwrap();
    assert!(json.contains("\"state\":\"clean\""), "{json}");
}

#[test]
fn sync_speed_limits_change_live_and_show_in_status() {
    let (a, _, _) = array(Level::Raid5, 3, 0, 16);
    a.set_sync_speed(2 << 20, 50 << 20).unwrap();
    let st = a.status();
    assert_eq!((st.sync_speed_min, st.sync_speed_max), (2 << 20, 50 << 20));
    let e = a.set_sync_speed(8 << 20, 4 << 20).unwrap_err();
    assert!(e.to_string().contains("at most the maximum"), "{e}");
    assert!(a.set_sync_speed(0, 0).is_err());
    assert_eq!(
        a.sync_speed(),
        (2 << 20, 50 << 20),
        "a refused change changes nothing"
    );
}

/// A new array over members never written (sparse files) has nothing to
/// resync: they read as zeros, whose parity is zeros. Writing it would
/// allocate every member in full. Members that hold anything resync.
#[test]
fn unwritten_members_need_no_initial_resync() {
    let dir = tempfile::tempdir().unwrap();
    let open = |name: &str| -> Arc<dyn BlockDevice> {
        let opts = block::FileOptions {
            direct: false,
            read_only: false,
            create_size: Some(member_size(256)),
        };
        Arc::new(block::FileDevice::open(&dir.path().join(name), opts).unwrap())
    };
    let members: Vec<_> = ["a", "b", "c", "d"].iter().map(|n| open(n)).collect();
    let resyncing = RaidOptions {
        assume_clean: false,
        ..options()
    };
    let a = RaidArray::create(Level::Raid5, members.clone(), vec![], resyncing.clone()).unwrap();
    assert!(a.wait_idle(Duration::from_secs(10)));
    let parity_written = |a: &RaidArray| -> u64 {
        let st = a.status();
        st.members
            .iter()
            .filter_map(|m| Some(m.io.as_ref()?.write_bytes))
            .sum()
    };
    assert_eq!(parity_written(&a), 0, "nothing resynced");
    let used: u64 = ["a", "b", "c", "d"]
        .iter()
        .map(|n| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(dir.path().join(n)).unwrap().blocks() * 512
        })
        .sum();
    assert!(
        used < 4 * (4 << 20),
        "{used} bytes allocated over the members"
    );
    let mut got = vec![1u8; a.size() as usize];
    a.read_at(&mut got, 0).unwrap();
    assert!(got.iter().all(|b| *b == 0));
    drop(a);
    // One member written where the data lives: a full resync.
    let written: Vec<_> = ["e", "f", "g", "h"].iter().map(|n| open(n)).collect();
    written[2]
        .write_at(&[7; 4096], member_size(256) - 8192, true)
        .unwrap();
    let a = RaidArray::create(Level::Raid5, written, vec![], resyncing).unwrap();
    assert!(a.wait_idle(Duration::from_secs(30)));
    assert!(parity_written(&a) >= 1 << 20, "a full resync");
    assert_eq!(a.scrub(false).unwrap().mismatches, 0);
}
