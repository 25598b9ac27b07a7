//! Scrub finds and repairs corruption injected into one member; on RAID6
//! it names the member.

mod common;

use block::BlockDevice;
use common::*;
use raid::{Level, RaidOptions};

/// Corrupts `chunks` chunk rows of member `victim` (at rows 0, 2, 4, ...,
/// where on a 3-member RAID10 member 1 holds second copies) and returns
/// the array's content from before.
fn corrupt_member(level: Level, victim: usize, chunks: u64) -> (raid::RaidArray, Vec<u8>, u64) {
    let n = members_for(level);
    let (a, members, _) = array(level, n, 0, 16);
    let data = pattern(a.size() as usize, 21);
    a.write_at(&data, 0, false).unwrap();
    a.flush().unwrap();
    let base = raid::superblock::data_offset(
        CHUNK,
        if level.parity() > 0 {
            options().log_slots
        } else {
            0
        },
    );
    for i in 0..chunks {
        members[victim].corrupt(base + 2 * i * CHUNK + 100, 300);
    }
    (a, data, chunks)
}

#[test]
fn scrub_finds_and_repairs_every_corruption() {
    for level in [Level::Raid1, Level::Raid10, Level::Raid5, Level::Raid6] {
        let victim = 1;
        let (a, data, n) = corrupt_member(level, victim, 4);
        let check = a.scrub(false).unwrap();
        assert_eq!(check.mismatches, n, "{level:?}: {check:?}");
        assert_eq!(check.repaired, 0);
        let again = a.scrub(false).unwrap();
        assert_eq!(again.mismatches, n, "a check changes nothing");
        let fix = a.scrub(true).unwrap();
        assert_eq!(fix.mismatches, n);
        assert_eq!(fix.repaired, n);
        let after = a.scrub(false).unwrap();
        assert_eq!(after.mismatches, 0, "{level:?}: {after:?}");
        assert_eq!(a.status().last_scrub.unwrap().mismatches, 0);
        if level == Level::Raid10 {
            // Two copies that differ: nothing says which is right, so no
            // member is blamed (a repair copies the first copy over the
            // other, and the victim holds no first copies here).
            assert!(check.wrong_members.is_empty(), "{check:?}");
            assert_eq!(check.undecided, n, "{check:?}");
        } else if level != Level::Raid5 {
            // Three mirror copies outvote the bad one; RAID6's P and Q
            // point at it.
            assert_eq!(
                check.wrong_members.keys().copied().collect::<Vec<_>>(),
                [victim],
                "{level:?}: {check:?}"
            );
            assert_eq!(check.undecided, 0);
        }
        if level == Level::Raid6 {
            assert_eq!(check.unexplained, 0);
        }
        if level != Level::Raid5 {
            // RAID5 cannot tell which chunk of a row is wrong: it makes the
            // parity match the data (see the test below).
            let mut got = vec![0u8; data.len()];
            a.read_at(&mut got, 0).unwrap();
            assert!(got == data, "{level:?}: data differs after repair");
        }
    }
}

#[test]
fn raid5_scrub_repairs_parity_from_data() {
    // RAID5 cannot tell a bad data chunk from bad parity: it rewrites the
    // parity, so corrupt only parity chunks here and expect the data back.
    let n = 4;
    let (a, members, _) = array(Level::Raid5, n, 0, 16);
    let g = a.geometry();
    let data = pattern(a.size() as usize, 22);
    a.write_at(&data, 0, false).unwrap();
    let base = raid::superblock::data_offset(CHUNK, options().log_slots);
    for row in [2u64, 7, 9] {
        members[g.p_member(row)].corrupt(base + row * CHUNK, 64);
    }
    let check = a.scrub(false).unwrap();
    assert_eq!(check.mismatches, 3);
    assert_eq!(a.scrub(true).unwrap().repaired, 3);
    assert_eq!(a.scrub(false).unwrap().mismatches, 0);
    // Parity is right again: lose a member and read everything.
    members[0].set_fail_reads(true);
    let mut got = vec![0u8; data.len()];
    a.read_at(&mut got, 0).unwrap();
    assert!(got == data);
}

/// With `scrub_every`, the array scrubs by itself once that has passed,
/// and a scrub by hand starts the period again.
#[test]
fn a_scrub_runs_on_schedule() {
    let members: Vec<_> = (0..3).map(|_| faulty(member_size(16))).collect();
    let opts = RaidOptions {
        scrub_every: Some(std::time::Duration::from_millis(300)),
        ..options()
    };
    let a = raid::RaidArray::create(Level::Raid5, devs(&members), vec![], opts).unwrap();
    assert!(a.status().last_scrub.is_none(), "not before the period");
    let started = std::time::Instant::now();
    while a.status().last_scrub.is_none() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "no scheduled scrub"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(started.elapsed() >= std::time::Duration::from_millis(200));
    assert_eq!(a.status().last_scrub.unwrap().mismatches, 0);
}

/// The superblocks keep when the last scrub ended: an array assembled
/// again goes on with the period from there, rather than starting it
/// over (which would put off a scrub forever on an array restarted more
/// often than `scrub_every`).
#[test]
fn the_scrub_schedule_survives_a_restart() {
    use std::time::{Duration, Instant};
    let members: Vec<_> = (0..3).map(|_| faulty(member_size(16))).collect();
    let every = Duration::from_secs(4);
    let opts = RaidOptions {
        scrub_every: Some(every),
        ..options()
    };
    let a = raid::RaidArray::create(Level::Raid5, devs(&members), vec![], opts.clone()).unwrap();
    a.scrub(false).unwrap();
    let scrubbed = a.status().last_scrub_at_ms;
    drop(a);
    // Most of the period passes while the array is down.
    std::thread::sleep(Duration::from_millis(2500));
    let restarted = Instant::now();
    let a = raid::RaidArray::assemble(devs(&members), opts).unwrap();
    assert_eq!(a.status().last_scrub_at_ms, scrubbed, "the time came back");
    while a.status().last_scrub.is_none() {
        assert!(
            restarted.elapsed() < Duration::from_secs(10),
            "no scheduled scrub"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Due 4 s after the scrub, 1.5 s after the restart; a schedule
    // started over would wait the whole 4 s.
    let waited = restarted.elapsed();
    assert!(waited < Duration::from_millis(3300), "{waited:?}");
    assert!(waited >= Duration::from_millis(900), "{waited:?}");
    assert!(a.status().last_scrub_at_ms > scrubbed);
}
