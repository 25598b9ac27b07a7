//! Two mirrors over real TCP on 127.0.0.1: replication, durability,
//! degraded service, resync, split brain.

mod common;

use block::{classify, BlockDevice, ErrorClass};
use common::pair::{options, pattern, primary_a, wait, Pair, DEVICE};
use ha::{Connection, Role};

const REGION: u64 = 64 << 10;

#[test]
fn writes_on_the_primary_are_on_the_secondarys_device() {
    let p = primary_a(options());
    let size = p.a.m().size();
    assert!(size < DEVICE && size > DEVICE - (64 << 10));
    // The first promotion of a new pair copied the primary whole.
    assert_eq!(p.a.status().resync_copied_bytes, size);
    let a = p.a.m();
    a.write_at(&pattern(1, 4096), 0, false).unwrap();
    a.write_at(&pattern(2, 3 << 20), 4096 * 3, false).unwrap(); // several frames
    a.write_at(&pattern(3, 512), size - 512, true).unwrap();
    a.write_zeroes(8192, 4096).unwrap();
    a.flush().unwrap();
    let mut back = vec![0u8; 4096];
    a.read_at(&mut back, 0).unwrap();
    assert!(back == pattern(1, 4096));
    assert!(p.a.data() == p.b.data(), "replicas differ");

    // The secondary serves nothing and takes no local writes.
    let b = p.b.m();
    assert_eq!(
        classify(&b.write_at(&[1; 512], 0, false).unwrap_err()),
        ErrorClass::Fenced
    );
    assert!(b.read_at(&mut back, 0).is_err());
    let s = p.b.status();
    assert_eq!(
        (s.role, s.peer_role),
        (Role::Secondary, Some(Role::Primary))
    );
    assert_eq!(s.generations, p.a.status().generations);
    // A promotion while the peer is primary is refused.
    assert_eq!(classify(&b.promote().unwrap_err()), ErrorClass::Fenced);
}

#[test]
fn an_acknowledged_durable_write_survives_a_power_cut_of_either_side() {
    let mut p = primary_a(options());
    let a = p.a.m();
    // A flush reaches stable storage on both sides.
    a.write_at(&pattern(8, 4096), 200_000, false).unwrap();
    a.flush().unwrap();
    p.a.disk.drop_unflushed();
    p.b.disk.drop_unflushed();
    for (side, data) in [("a", p.a.data()), ("b", p.b.data())] {
        assert!(
            data[200_000..204_096] == pattern(8, 4096)[..],
            "flushed write on {side}"
        );
    }
    // So does a FUA write, with no flush after it.
    a.write_at(&pattern(7, 8192), 65536, true).unwrap();
    // Acknowledged, neither FUA nor flushed: a power cut may take it.
    a.write_at(&pattern(9, 4096), 300_000, false).unwrap();
    assert!(p.b.data()[300_000..304_096] == pattern(9, 4096)[..]);
    p.b.power_cut();
    p.a.power_cut();
    for (side, data) in [("a", p.a.data()), ("b", p.b.data())] {
        assert!(
            data[65536..73728] == pattern(7, 8192)[..],
            "FUA write on {side}"
        );
        // The devices do lose what was not made stable: without FUA and
        // flushes passed on, the checks above would fail the same way.
        assert!(
            data[300_000..304_096] != pattern(9, 4096)[..],
            "unflushed write on {side}"
        );
    }
}

/// Cuts the link and waits until the primary has seen it.
fn cut(p: &Pair) {
    p.proxy.cut();
    wait("the cut", || {
        p.a.status().connection == Connection::Disconnected
            && p.b.status().connection == Connection::Disconnected
    });
}

#[test]
fn a_cut_link_degrades_the_primary_and_a_resync_copies_only_what_it_wrote() {
    let p = primary_a(options());
    // Slow enough to write during the resync.
    p.a.m().set_resync_rate(256 << 10);
    let before = p.a.status();
    cut(&p);
    let a = p.a.m();
    a.write_at(&pattern(1, 4096), 0, false).unwrap();
    a.write_at(&pattern(2, 8192), 5 * REGION - 4096, false)
        .unwrap(); // two regions
    a.write_at(&pattern(3, 100), 20 * REGION + 7, true).unwrap();
    a.flush().unwrap();
    let s = p.a.status();
    assert!(s.degraded);
    assert_eq!(s.out_of_sync_bytes, 4 * REGION);
    assert_ne!(s.generations.current, before.generations.current);
    assert_eq!(s.generations.bitmap, before.generations.current);
    assert!(p.a.data() != p.b.data());

    p.proxy.heal();
    // Once the resync has chosen its regions: a write before that is in
    // the activity log, so it would be one more region to copy.
    wait("the resync to choose its regions", || {
        let s = p.a.status();
        s.connection == Connection::Connected || s.resync.is_some_and(|r| r.total_bytes > 0)
    });
    // Foreground writes go on during the resync, into copied and
    // uncopied regions alike.
    a.write_at(&pattern(4, 4096), 20 * REGION, false).unwrap();
    a.write_at(&pattern(5, 4096), 40 * REGION, false).unwrap();
    p.wait_both(Connection::Connected);
    a.flush().unwrap();
    let s = p.a.status();
    assert_eq!(
        s.resync_copied_bytes - before.resync_copied_bytes,
        4 * REGION
    );
    assert_eq!(s.out_of_sync_bytes, 0);
    assert!(!s.degraded);
    assert_eq!(p.b.status().generations, s.generations);
    assert!(p.a.data() == p.b.data(), "replicas differ after the resync");
}

#[test]
fn a_primary_restarted_while_alone_keeps_its_bitmap() {
    let mut p = primary_a(options());
    let copied = p.a.status().resync_copied_bytes;
    cut(&p);
    p.a.m()
        .write_at(&pattern(6, 4096), 3 * REGION, false)
        .unwrap();
    p.a.m()
        .write_at(&pattern(7, 4096), 9 * REGION, true)
        .unwrap();
    p.a.m().flush().unwrap();
    let alone = p.a.status();
    p.a.power_cut();
    p.a.reopen(options());
    let back = p.a.status();
    assert_eq!(back.out_of_sync_bytes, 2 * REGION);
    assert_eq!(back.generations, alone.generations);
    assert_eq!(
        back.role,
        Role::Secondary,
        "a restarted node waits to be promoted"
    );
    p.a.m().promote().unwrap();
    p.proxy.heal();
    p.wait_both(Connection::Connected);
    // The reopened mirror counts from zero.
    assert_eq!(p.a.status().resync_copied_bytes, 2 * REGION);
    assert!(copied > 0);
    assert!(p.a.data() == p.b.data());
}

#[test]
fn a_primary_that_crashed_mid_write_copies_the_regions_it_was_writing() {
    let mut p = primary_a(options());
    // Written to both, flushed by neither: the region's bit is on disk.
    p.a.m()
        .write_at(&pattern(5, 4096), 30 * REGION, false)
        .unwrap();
    p.a.power_cut();
    assert!(p.a.data() != p.b.data(), "a lost the write, b has it");
    // Reopened while the link stays up: the pair pairs anew, and the
    // replica that was primary copies what it may have been writing.
    p.a.reopen(options());
    p.wait_both(Connection::Connected);
    assert_eq!(p.a.status().resync_copied_bytes, REGION);
    assert!(p.a.data() == p.b.data());
    assert_eq!(p.b.status().peer_role, Some(Role::Secondary));
}

#[test]
fn both_writing_apart_is_a_split_brain_that_nothing_resyncs() {
    let p = primary_a(options());
    let copied = p.a.status().resync_copied_bytes;
    cut(&p);
    p.a.m().write_at(&pattern(1, 4096), 0, false).unwrap();
    p.b.m().promote().unwrap();
    p.b.m().write_at(&pattern(2, 4096), 0, false).unwrap();
    let (da, db) = (p.a.data(), p.b.data());
    assert!(da != db);
    p.proxy.heal();
    p.wait_both(Connection::SplitBrain);
    for s in [p.a.status(), p.b.status()] {
        let why = s.problem.unwrap();
        assert!(
            why.contains("split brain") && why.contains("operator"),
            "{why}"
        );
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(p.a.status().resync_copied_bytes, copied);
    assert_eq!(p.b.status().resync_copied_bytes, 0);
    assert!(p.a.data() == da && p.b.data() == db, "nothing was copied");
    // Both go on alone.
    p.a.m().write_at(&pattern(3, 4096), 4096, false).unwrap();
    assert!(p.a.status().degraded);
}

#[test]
fn a_primary_older_than_the_peer_is_refused_and_resyncs_once_demoted() {
    let p = primary_a(options());
    cut(&p);
    // b takes over and writes; a stays primary without writing.
    p.b.m().promote().unwrap();
    p.b.m().write_at(&pattern(4, 4096), REGION, false).unwrap();
    p.b.m().demote().unwrap();
    p.proxy.heal();
    wait("the refusal", || {
        p.a.status().connection == Connection::Refused
    });
    let why = p.a.status().problem.unwrap();
    assert!(why.contains("newer data"), "{why}");
    assert!(p.a.status().degraded, "its writes would not reach b");
    assert_eq!(p.b.status().connection, Connection::Refused);
    // Demoted, it takes b's writes.
    p.a.m().demote().unwrap();
    p.wait_both(Connection::Connected);
    assert!(p.a.data()[REGION as usize..][..4096] == pattern(4, 4096)[..]);
    assert!(p.a.data() == p.b.data());
}

#[test]
fn a_role_watcher_hears_moves_on_either_node_and_a_lost_peer() {
    use ha::mirror::{RoleWatcher, Roles};
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    struct Heard(Mutex<Vec<Roles>>);
    impl RoleWatcher for Heard {
        fn roles_changed(&self, roles: Roles) {
            self.0.lock().unwrap().push(roles);
        }
    }
    let last = |h: &Heard| h.0.lock().unwrap().last().copied();
    let roles = |local, peer| Some(Roles { local, peer });

    let p = primary_a(options());
    let heard = Arc::new(Heard::default());
    p.b.m().watch_roles(Some(heard.clone()));
    // Told at once of where the pair stands.
    assert_eq!(last(&heard), roles(Role::Secondary, Some(Role::Primary)));
    p.a.m().demote().unwrap();
    wait("a's demotion heard", || {
        last(&heard) == roles(Role::Secondary, Some(Role::Secondary))
    });
    p.b.m().promote().unwrap();
    assert_eq!(last(&heard), roles(Role::Primary, Some(Role::Secondary)));
    cut(&p);
    wait("the peer lost", || {
        last(&heard) == roles(Role::Primary, None)
    });
    // No change, no call.
    let told = heard.0.lock().unwrap().len();
    p.b.m().promote().unwrap();
    assert_eq!(heard.0.lock().unwrap().len(), told);
}
