//! A markedly slower member is named, with what it costs the stripe; only
//! for its recent foreground I/O, and only while it is in sync.

mod common;

use std::sync::Arc;
use std::time::Duration;

use block::{BlockDevice, FaultyDevice};
use common::*;
use raid::{ArrayState, Level, MemberState, RaidArray, WEAKEST_INTERVAL, WEAKEST_WINDOW};

const SLOW: Option<Duration> = Some(Duration::from_millis(2));

/// Names `devs` ssd0, ssd1, ... in the array.
fn name(a: &RaidArray, devs: &[Arc<FaultyDevice>]) {
    let names: Vec<(Arc<dyn BlockDevice>, String)> = devs
        .iter()
        .enumerate()
        .map(|(i, m)| (m.clone() as Arc<dyn BlockDevice>, format!("ssd{i}")))
        .collect();
    a.name_members(&names);
}

/// Writes the whole array, then reads it three times.
fn work(a: &RaidArray) {
    let data = pattern(a.size() as usize, 3);
    a.write_at(&data, 0, false).unwrap();
    let mut buf = vec![0u8; data.len()];
    for _ in 0..3 {
        a.read_at(&mut buf, 0).unwrap();
    }
}

fn run(level: Level, n: usize, slow: Option<usize>) -> raid::RaidStatus {
    let (a, members, _) = array(level, n, 0, 16);
    name(&a, &members);
    if let Some(s) = slow {
        members[s].set_delay(SLOW);
    }
    work(&a);
    a.status()
}

#[test]
fn the_slow_member_of_a_raid0_is_named() {
    let st = run(Level::Raid0, 4, Some(2));
    let w = st.weakest_link.expect("a finding");
    assert_eq!(w.slot, 2);
    assert_eq!(w.name, "ssd2");
    assert!(w.slower > 5.0, "{w:?}");
    assert!(
        w.finding.contains("the stripe runs at 4 x ssd2's speed"),
        "{}",
        w.finding
    );
    let io = st.members[2].io.as_ref().unwrap();
    assert!(io.read_p50_ns.unwrap() >= 2_000_000);
    assert!(io.busy_bytes_per_sec < st.members[0].io.as_ref().unwrap().busy_bytes_per_sec);
}

#[test]
fn raid5_and_raid1_findings_say_what_waits() {
    let w = run(Level::Raid5, 4, Some(1))
        .weakest_link
        .expect("a finding");
    assert!(
        w.finding.contains("the stripe runs at 3 x ssd1's speed"),
        "{}",
        w.finding
    );
    let w = run(Level::Raid1, 2, Some(0))
        .weakest_link
        .expect("a finding");
    assert!(
        w.finding.contains("every write waits for ssd0"),
        "{}",
        w.finding
    );
}

#[test]
fn equal_members_give_no_finding() {
    assert!(run(Level::Raid0, 4, None).weakest_link.is_none());
}

#[test]
fn a_spare_is_not_named_for_its_rebuild() {
    let (a, members, spares) = array(Level::Raid5, 4, 1, 16);
    let mut devs = members.clone();
    devs.push(spares[0].clone());
    name(&a, &devs);
    work(&a);
    // The rebuild's writes to the spare are slow, its later I/O is not.
    spares[0].set_delay(Some(Duration::from_millis(5)));
    a.fail(1).unwrap();
    assert!(a.wait_idle(Duration::from_secs(20)));
    let st = a.status();
    assert_eq!(st.members[1].name.as_deref(), Some("ssd4"));
    assert_eq!(st.members[1].state, MemberState::InSync);
    spares[0].set_delay(None);
    a.advance_clock(WEAKEST_INTERVAL);
    work(&a);
    let w = a.status().weakest_link;
    assert!(w.is_none(), "{w:?}");
    // A member slow for its users still is named.
    members[2].set_delay(SLOW);
    work(&a);
    let w = a.status().weakest_link.expect("a finding");
    assert_eq!(w.name, "ssd2", "{w:?}");
}

#[test]
fn a_replacement_is_not_named_for_its_copy() {
    let (a, members, _) = array(Level::Raid5, 4, 0, 16);
    work(&a);
    let new = faulty(member_size(16));
    new.set_delay(Some(Duration::from_millis(5)));
    a.replace(1, new.clone()).unwrap();
    assert!(a.wait_idle(Duration::from_secs(20)));
    let mut devs = members.clone();
    devs.push(new.clone());
    name(&a, &devs);
    let st = a.status();
    assert_eq!(st.members[1].name.as_deref(), Some("ssd4"), "{st:?}");
    new.set_delay(None);
    a.advance_clock(WEAKEST_INTERVAL);
    work(&a);
    let w = a.status().weakest_link;
    assert!(w.is_none(), "{w:?}");
}

#[test]
fn nothing_is_named_on_a_failed_array() {
    let (a, members, _) = array(Level::Raid0, 4, 0, 16);
    name(&a, &members);
    members[2].set_delay(SLOW);
    work(&a);
    assert!(a.status().weakest_link.is_some());
    members[0].set_fail_reads(true);
    assert!(a.read_at(&mut [0u8; 4096], 0).is_err());
    let st = a.status();
    assert_eq!(st.state, ArrayState::Failed);
    assert!(st.weakest_link.is_none(), "{:?}", st.weakest_link);
}

#[test]
fn a_failed_member_is_not_named() {
    let (a, members, _) = array(Level::Raid5, 4, 0, 16);
    name(&a, &members);
    members[2].set_delay(SLOW);
    work(&a);
    assert_eq!(a.status().weakest_link.expect("a finding").slot, 2);
    members[2].set_fail_reads(true);
    work(&a);
    let st = a.status();
    assert_eq!(st.members[2].state, MemberState::Failed);
    // Only the failed member is in question: on a busy host the others'
    // memory-fast means wander, so one of them may be named for a moment.
    let named = st.weakest_link.as_ref().map(|w| w.slot);
    assert_ne!(named, Some(2), "{:?}", st.weakest_link);
}

#[test]
fn the_finding_shows_its_sample() {
    let st = run(Level::Raid0, 4, Some(2));
    let w = st.weakest_link.expect("a finding");
    let ops = |slot: usize| {
        let io = st.members[slot].io.as_ref().unwrap();
        io.read_ops + io.write_ops
    };
    assert_eq!(w.ops, ops(2));
    assert_eq!(w.peers_ops, ops(0) + ops(1) + ops(3));
    assert_eq!(w.window_secs, WEAKEST_WINDOW.as_secs());
    let sample = format!(
        "over {} of its I/Os and {} of theirs in the last {} s",
        w.ops, w.peers_ops, w.window_secs
    );
    assert!(w.finding.contains(&sample), "{}", w.finding);
}

#[test]
fn a_member_slow_only_before_the_window_is_not_named() {
    let (a, members, _) = array(Level::Raid0, 4, 0, 16);
    name(&a, &members);
    members[2].set_delay(SLOW);
    work(&a);
    assert_eq!(a.status().weakest_link.expect("a finding").slot, 2);
    members[2].set_delay(None);
    a.advance_clock(WEAKEST_WINDOW);
    work(&a);
    let w = a.status().weakest_link;
    assert!(w.is_none(), "{w:?}");
}
