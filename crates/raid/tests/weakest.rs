//! A markedly slower member is named, with what it costs the stripe.

mod common;

use std::sync::Arc;
use std::time::Duration;

use block::BlockDevice;
use common::*;
use raid::Level;

fn run(level: Level, n: usize, slow: Option<usize>) -> raid::RaidStatus {
    let (a, members, _) = array(level, n, 0, 16);
    let names: Vec<(Arc<dyn BlockDevice>, String)> = members
        .iter()
        .enumerate()
        .map(|(i, m)| (m.clone() as Arc<dyn BlockDevice>, format!("ssd{i}")))
        .collect();
    a.name_members(&names);
    if let Some(s) = slow {
        members[s].set_delay(Some(Duration::from_millis(2)));
    }
    let data = pattern(a.size() as usize, 3);
    a.write_at(&data, 0, false).unwrap();
    let mut buf = vec![0u8; data.len()];
    for _ in 0..3 {
        a.read_at(&mut buf, 0).unwrap();
    }
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
