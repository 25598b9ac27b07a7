//! A member that a spare was rebuilt in place of, coming back: it holds
//! the array's data as it was before it failed, and nothing it says (its
//! slot, its events, the bitmap) may let it serve as in sync. It is
//! refused; added again, it becomes a spare and is rebuilt in full.

mod common;

use std::sync::Arc;
use std::time::Duration;

use block::{BlockDevice, FaultyDevice};
use common::*;
use raid::{ArrayState, AssembleError, Level, MemberState, RaidArray};

const ROWS: u64 = 64;

struct Superseded {
    level: Level,
    members: Vec<Arc<FaultyDevice>>,
    /// The spare rebuilt into slot 0.
    new: Arc<FaultyDevice>,
    expect: Vec<u8>,
}

/// Slot 0 fails, a write lands, a new device is added and rebuilt into
/// slot 0 (the array is whole again), and the array stops cleanly.
fn superseded(level: Level) -> Superseded {
    let n = members_for(level);
    let (a, members, _) = array(level, n, 0, ROWS);
    let mut expect = pattern(a.size() as usize, 1);
    a.write_at(&expect, 0, true).unwrap();
    a.fail(0).unwrap();
    let at = a.size() as usize / 3;
    let w = pattern(a.size() as usize / 2, 2);
    a.write_at(&w, at as u64, true).unwrap();
    expect[at..at + w.len()].copy_from_slice(&w);
    let new = faulty(member_size(ROWS));
    a.add(new.clone()).unwrap();
    assert!(a.wait_idle(Duration::from_secs(30)));
    assert_eq!(a.status().state, ArrayState::Clean);
    a.flush().unwrap();
    drop(a);
    Superseded {
        level,
        members,
        new,
        expect,
    }
}

impl Superseded {
    fn others(&self) -> Vec<Arc<dyn BlockDevice>> {
        devs(&self.members[1..])
    }

    /// Reads the whole array with every member but slot 0 that the level
    /// can lose failing reads: slot 0's device alone answers for its
    /// share.
    fn read_from_slot_0(&self, a: &RaidArray) {
        let mut failed = vec![false; self.members.len()];
        for (slot, m) in self.members.iter().enumerate().skip(1) {
            failed[slot] = true;
            let g = raid::Geometry {
                members: self.members.len(),
                ..a.geometry()
            };
            if g.survives(&failed) {
                m.set_fail_reads(true);
            } else {
                failed[slot] = false;
            }
        }
        let mut got = vec![0u8; self.expect.len()];
        let r = a.read_at(&mut got, 0);
        for m in &self.members[1..] {
            m.set_fail_reads(false);
        }
        r.unwrap();
        assert!(
            got == self.expect,
            "{:?}: reads differ from what was written",
            self.level
        );
    }
}

fn refused_then_rebuilt_in_full(level: Level) {
    let s = superseded(level);
    // The replacement is gone too: slot 0 is empty, the old member is
    // refused, not taken as in sync with a bitmap that no longer covers
    // its absence.
    let a = RaidArray::assemble(s.others(), options()).unwrap();
    assert_eq!(a.status().members[0].state, MemberState::Missing);
    let err = a.re_add(s.members[0].clone()).err().unwrap();
    assert!(matches!(err, AssembleError::Superseded(_, 0, _)), "{err}");
    assert!(err.to_string().contains("add it again as a spare"), "{err}");
    assert_eq!(a.status().state, ArrayState::Degraded);
    let mut got = vec![0u8; s.expect.len()];
    a.read_at(&mut got, 0).unwrap();
    assert!(got == s.expect, "{level:?}: degraded reads");
    // Added by the operator: a spare, rebuilt in full into slot 0.
    a.add(s.members[0].clone()).unwrap();
    assert!(a.wait_idle(Duration::from_secs(30)));
    assert_eq!(a.status().state, ArrayState::Clean);
    assert_eq!(a.scrub(false).unwrap().mismatches, 0);
    s.read_from_slot_0(&a);
    drop(a);

    // With the replacement back too: it holds slot 0, the old member is
    // refused again, and a normal assembly of all of them is refused
    // naming it.
    let s = superseded(level);
    let mut all = s.others();
    all.push(s.new.clone());
    let a = RaidArray::assemble(all.clone(), options()).unwrap();
    let err = a.re_add(s.members[0].clone()).err().unwrap();
    assert!(matches!(err, AssembleError::Superseded(..)), "{err}");
    assert_eq!(a.status().state, ArrayState::Clean);
    drop(a);
    all.push(s.members[0].clone());
    let err = RaidArray::assemble(all, options()).err().unwrap();
    assert!(matches!(err, AssembleError::Stale(..)), "{err}");
}

#[test]
fn raid1_refuses_a_superseded_member() {
    refused_then_rebuilt_in_full(Level::Raid1);
}

#[test]
fn raid5_refuses_a_superseded_member() {
    refused_then_rebuilt_in_full(Level::Raid5);
}

#[test]
fn raid6_refuses_a_superseded_member() {
    refused_then_rebuilt_in_full(Level::Raid6);
}

#[test]
fn raid10_refuses_a_superseded_member() {
    refused_then_rebuilt_in_full(Level::Raid10);
}

/// The bitmap's bits are cleared once the array is whole again, and the
/// superblocks say so: after a restart, an image of a member from before
/// then (it owns its slot: the same device, an old copy) has events older
/// than the bits cover and is rebuilt in full, never caught up from bits
/// that are gone.
#[test]
fn a_member_absent_since_before_the_array_was_whole_again_rebuilds_in_full() {
    let (a, members, _) = array(Level::Raid1, 2, 0, ROWS);
    let size = a.size() as usize;
    a.write_at(&pattern(size, 3), 0, true).unwrap();
    let old = copies(&members);
    // Slot 1 goes away, misses a write, and catches up: whole again.
    a.fail(1).unwrap();
    a.write_at(&pattern(size / 2, 4), 4096, true).unwrap();
    members[1].heal();
    a.re_add(members[1].clone()).unwrap();
    assert!(a.wait_idle(Duration::from_secs(30)));
    a.flush().unwrap();
    assert_eq!(a.status().bitmap.dirty_regions, 0);
    let mut expect = vec![0u8; size];
    a.read_at(&mut expect, 0).unwrap();
    drop(a);
    // Slot 1's old image comes back to an array restarted without it.
    let a = RaidArray::assemble(devs(&members[..1]), options()).unwrap();
    a.re_add(old[1].clone()).unwrap();
    assert!(a.wait_idle(Duration::from_secs(30)));
    assert_eq!(
        a.status().bitmap.last_catch_up_bytes,
        None,
        "a full rebuild"
    );
    members[0].set_fail_reads(true);
    let mut got = vec![0u8; size];
    a.read_at(&mut got, 0).unwrap();
    assert!(got == expect);
}

/// A forced assembly follows the same rule: the superseded member is
/// neither forced in nor re-added, while a member that owns its slot and
/// went away after the array was last whole catches up from the bits.
#[test]
fn a_superseded_member_stays_out_of_a_forced_assembly() {
    let s = superseded(Level::Raid5);
    let a = RaidArray::assemble(
        devs(std::slice::from_ref(&s.new))
            .into_iter()
            .chain(s.others())
            .collect(),
        options(),
    )
    .unwrap();
    let mut expect = s.expect.clone();
    // Slot 1 fails; a write; slot 2's image is taken before slot 1's
    // removal reaches it (it goes stale one event later).
    let m = &s.members;
    a.fail(1).unwrap();
    let w = pattern(8192, 6);
    a.write_at(&w, 65536, true).unwrap();
    expect[65536..65536 + 8192].copy_from_slice(&w);
    let behind = copies(&m[2..3]);
    a.remove(1).unwrap();
    drop(a);
    let devices = devs(&[s.new.clone(), m[3].clone(), behind[0].clone(), m[0].clone()]);
    let forced = RaidArray::assemble_forced(devices, options()).unwrap();
    let a = forced.array;
    let st = a.status();
    assert_eq!(st.forced.len(), 1);
    assert_eq!(
        st.forced[0].slot, 2,
        "the member behind is forced, not the superseded one"
    );
    assert_eq!(
        st.members[0].state,
        MemberState::InSync,
        "slot 0 is the new device's"
    );
    assert!(forced
        .left_out
        .iter()
        .any(|d| Arc::ptr_eq(d, &(m[0].clone() as Arc<dyn BlockDevice>))));
    let err = a.re_add(m[0].clone()).err().unwrap();
    assert!(matches!(err, AssembleError::Superseded(..)), "{err}");
    a.re_add(m[1].clone()).unwrap();
    assert!(a.wait_idle(Duration::from_secs(30)));
    assert!(a.status().bitmap.last_catch_up_bytes.is_some_and(|b| b > 0));
    assert_eq!(a.status().state, ArrayState::Clean);
    assert_eq!(a.scrub(false).unwrap().mismatches, 0);
    let mut got = vec![0u8; expect.len()];
    a.read_at(&mut got, 0).unwrap();
    assert!(got == expect);
    // Slot 1's member holds its part: lose another and read.
    m[3].set_fail_reads(true);
    a.read_at(&mut got, 0).unwrap();
    assert!(got == expect);
}
