use std::collections::BTreeMap;

use peer_limits::OutgoingBudget;
use tokio::sync::mpsc;

use super::*;
use crate::capsule::Cqe;
use crate::outbox::Out;
use crate::wire::{self, Digests, Pdu};

pub(crate) fn subsystem() -> Arc<Subsystem> {
    Arc::new(Subsystem {
        nqn: "nqn.2026-11.org.openarray:t".into(),
        allow_hosts: vec!["*".into()],
        namespaces: BTreeMap::new(),
        hosts: BTreeMap::new(),
    })
}

pub(crate) fn controller() -> Controller {
    Controller::new(
        7,
        subsystem(),
        "nqn.2026-11.org.host:h".into(),
        [1; 16],
        "peer".into(),
        Duration::ZERO,
        4,
    )
}

/// An admin queue's sending side, and what it sent.
pub(crate) fn admin_queue(ctrl: &Controller) -> mpsc::UnboundedReceiver<Out> {
    let (tx, rx) = mpsc::unbounded_channel();
    let c = Arc::new(Completer::new(
        tx,
        Digests::default(),
        4,
        Arc::new(OutgoingBudget::new(1 << 20)),
        Default::default(),
    ));
    ctrl.set_admin(c);
    rx
}

pub(crate) fn completions(rx: &mut mpsc::UnboundedReceiver<Out>) -> Vec<Cqe> {
    let mut out = Vec::new();
    while let Ok(o) = rx.try_recv() {
        if let Ok(Pdu::Response { cqe }) = wire::decode(&o.bytes, Digests::default()) {
            out.push(Cqe::decode(&cqe));
        }
    }
    out
}

#[test]
fn enabling_and_shutting_down_show_in_csts() {
    let c = controller();
    assert_eq!(c.property(PROP_CSTS, 0), Some(0));
    assert_eq!(
        c.set_cc(1),
        Err(Status::INVALID_FIELD),
        "entry sizes must be given"
    );
    let cc = 1 | 6 << 16 | 4 << 20;
    c.set_cc(cc).unwrap();
    assert!(c.ready());
    assert_eq!(c.property(PROP_CC, 0), Some(u64::from(cc)));
    c.set_cc(cc | 1 << 14).unwrap();
    assert_eq!(
        c.property(PROP_CSTS, 0),
        Some(1 | 2 << 2),
        "shutdown complete"
    );
    c.set_cc(0).unwrap();
    assert!(!c.ready());
    assert_eq!(c.property(PROP_VS, 0), Some(0x0002_0000));
    assert_eq!(c.property(0x30, 0), None);
}

#[test]
fn events_wait_for_a_request_and_are_masked_until_their_log_is_read() {
    let c = controller();
    let mut rx = admin_queue(&c);
    c.set_aec(AEC_NS_ATTRIBUTE);
    // No request held: the event waits for one.
    c.replace_subsystem(subsystem(), &[3]);
    assert_eq!(c.add_aer(10), Ok(Some(Event::NS_ATTRIBUTE_CHANGED)));
    // Masked until the changed namespace log is read.
    assert_eq!(c.add_aer(11), Ok(None));
    c.replace_subsystem(subsystem(), &[4]);
    assert!(completions(&mut rx).is_empty());
    assert_eq!(c.changed_namespaces(false), vec![3, 4]);
    assert_eq!(
        c.changed_namespaces(false),
        Vec::<u32>::new(),
        "read clears"
    );
    c.log_read(LOG_CHANGED_NS);
    c.replace_subsystem(subsystem(), &[5]);
    let done = completions(&mut rx);
    assert_eq!(done.len(), 1);
    assert_eq!(
        (done[0].cid, done[0].result),
        (11, u64::from(Event::NS_ATTRIBUTE_CHANGED.0))
    );
    assert_eq!(done[0].result >> 16 & 0xFF, u64::from(LOG_CHANGED_NS));
}

#[test]
fn ana_change_notices_follow_their_configuration_bit() {
    let c = controller();
    let mut rx = admin_queue(&c);
    c.set_aec(AEC_ANA_CHANGE);
    assert_eq!(c.add_aer(1), Ok(None));
    c.replace_subsystem(subsystem(), &[1]);
    let done = completions(&mut rx);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].result, u64::from(Event::ANA_CHANGED.0));
    assert_eq!(c.ana_changes(), 1);
}

#[test]
fn requests_beyond_the_limit_are_refused_and_held_ones_abort() {
    let c = controller();
    for cid in 0..AER_LIMIT as u16 {
        assert_eq!(c.add_aer(cid), Ok(None));
    }
    assert_eq!(c.add_aer(99), Err(Status::AER_LIMIT));
    assert!(c.abort_aer(0));
    assert!(!c.abort_aer(0));
    assert_eq!(c.add_aer(99), Ok(None));
}

#[test]
fn queues_are_granted_once_within_the_limit() {
    let c = controller();
    assert_eq!(c.grant_queues(15 | 15 << 16), 3 | 3 << 16);
    assert_eq!(c.grant_queues(1 | 1 << 16), 3 | 3 << 16, "granted once");
    assert_eq!(c.queues_granted(), 3 | 3 << 16);
    assert!(c.claim_qid(1) && !c.claim_qid(1));
    c.release_qid(1);
    assert!(c.claim_qid(1));
}

#[test]
fn the_keep_alive_timer_expires_without_keep_alives() {
    let c = controller();
    assert!(!c.keep_alive_expired(), "no timeout set");
    c.set_kato(Duration::from_millis(300));
    std::thread::sleep(Duration::from_millis(200));
    c.keep_alive();
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !c.keep_alive_expired(),
        "400 ms after the timer started, 200 after the last"
    );
    std::thread::sleep(Duration::from_millis(150));
    assert!(c.keep_alive_expired());
}

#[test]
fn the_error_log_keeps_the_newest_entries() {
    let c = controller();
    for i in 0..(ERROR_LOG_ENTRIES as u16 + 5) {
        c.log_error(1, i, Status::LBA_OUT_OF_RANGE, 1, u64::from(i));
    }
    let e = c.errors();
    assert_eq!(e.len(), ERROR_LOG_ENTRIES);
    assert_eq!(e[0].count, ERROR_LOG_ENTRIES as u64 + 5);
    assert_eq!(e[0].lba, ERROR_LOG_ENTRIES as u64 + 4);
}
