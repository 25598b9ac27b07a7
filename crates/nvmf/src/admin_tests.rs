use std::collections::BTreeMap;
use std::sync::Arc;

use block::MemDevice;
use export::Backing;

use super::*;
use crate::capsule::{SqeBuilder, SGL_TRANSPORT};
use crate::controller::tests::{admin_queue, completions};
use crate::subsystem::{Namespace, Subsystem};
use crate::wire::{le16, le32, le64};

const OFFER: Offer = Offer {
    mdts: 8,
    queue_entries: 128,
    in_capsule: 8192,
};

fn setup() -> (Controller, Arc<Backing>) {
    let backing = Backing::new(Arc::new(MemDevice::new(1 << 20)), true);
    backing.set_naa(export::naa_from_seed("mem0"));
    let ns = Namespace {
        backing: backing.clone(),
        block_size: 512,
        ids: backing.namespace_ids("mem0"),
    };
    let sub = Arc::new(Subsystem {
        nqn: "nqn.2026-11.org.openarray:t".into(),
        allow_hosts: vec!["*".into()],
        namespaces: BTreeMap::from([(1, Arc::new(ns))]),
        hosts: BTreeMap::new(),
    });
    let c = Controller::new(
        3,
        sub,
        "nqn.2026-11.org.host:h".into(),
        [0; 16],
        "p".into(),
        Duration::ZERO,
        4,
    );
    c.set_cc(1 | 6 << 16 | 4 << 20).unwrap();
    (c, backing)
}

fn cmd(op: u8, nsid: u32, cdw10: u32, cdw11: u32) -> Sqe {
    SqeBuilder::new(op, 5)
        .nsid(nsid)
        .cdw(10, cdw10)
        .cdw(11, cdw11)
        .sgl(SGL_TRANSPORT, 0, 4096)
        .build()
}

fn ok(r: Reply) -> (u64, Vec<u8>) {
    match r {
        Reply::Done {
            status,
            result,
            data,
        } => {
            assert_eq!(status, Status::SUCCESS);
            (result, data)
        }
        Reply::Held => panic!("held"),
    }
}

fn status(r: Reply) -> Status {
    match r {
        Reply::Done { status, .. } => status,
        Reply::Held => panic!("held"),
    }
}

#[test]
fn identify_reports_the_controller_and_the_namespace() {
    let (c, _) = setup();
    let (_, id) = ok(run(&c, &cmd(OP_IDENTIFY, 0, 1, 0), &OFFER));
    assert_eq!(le16(&id, 78), 3, "cntlid");
    assert_eq!(le32(&id, 80), 0x0002_0000);
    assert_eq!(&id[24..33], b"openarray");
    assert_eq!(id[77], 8, "MDTS");
    assert_eq!(le32(&id, 516), crate::config::MAX_NSID);
    assert_eq!(&id[768..768 + 27], b"nqn.2026-11.org.openarray:t");
    assert_eq!(le32(&id, 1792), (64 + 8192) / 16, "IOCCSZ");
    assert_eq!(le16(&id, 522) & 1, 1, "Compare and Write");

    let (_, ns) = ok(run(&c, &cmd(OP_IDENTIFY, 1, 0, 0), &OFFER));
    assert_eq!(le64(&ns, 0), 2048);
    assert_eq!(ns[130], 9, "512-byte blocks");
    assert_eq!(ns[33] & 7, 1, "deallocated blocks read as zeros");
    let ids = export::NamespaceIds::from_naa(export::naa_from_seed("mem0"));
    assert_eq!(&ns[104..120], &ids.nguid);
    assert_eq!(&ns[120..128], &ids.eui64);

    let (_, list) = ok(run(&c, &cmd(OP_IDENTIFY, 0, 2, 0), &OFFER));
    assert_eq!((le32(&list, 0), le32(&list, 4)), (1, 0));
    let (_, list) = ok(run(&c, &cmd(OP_IDENTIFY, 1, 2, 0), &OFFER));
    assert_eq!(le32(&list, 0), 0, "ids above 1: none");

    let (_, d) = ok(run(&c, &cmd(OP_IDENTIFY, 1, 3, 0), &OFFER));
    assert_eq!((d[0], d[1]), (1, 8));
    assert_eq!(&d[4..12], &ids.eui64);
    assert_eq!((d[12], d[13]), (2, 16));
    assert_eq!(&d[16..32], &ids.nguid);
    assert_eq!((d[32], d[33]), (3, 16));
    assert_eq!(&d[36..52], &ids.uuid);

    let (_, indep) = ok(run(&c, &cmd(OP_IDENTIFY, 1, 8, 0), &OFFER));
    assert_eq!(
        (indep[0], le32(&indep, 4), indep[13]),
        (1, 1, 1),
        "thin, ANA group 1, ready"
    );

    let (_, nvm) = ok(run(&c, &cmd(OP_IDENTIFY, 0, 6, 0), &OFFER));
    assert!(nvm.iter().all(|b| *b == 0), "no limits of its own");
    assert_eq!(
        status(run(&c, &cmd(OP_IDENTIFY, 0, 6, 2 << 24), &OFFER)),
        Status::INVALID_FIELD
    );

    let (_, inactive) = ok(run(&c, &cmd(OP_IDENTIFY, 9, 0, 0), &OFFER));
    assert!(inactive.iter().all(|b| *b == 0));
    assert_eq!(
        status(run(&c, &cmd(OP_IDENTIFY, 9, 3, 0), &OFFER)),
        Status::INVALID_NAMESPACE
    );
    assert_eq!(
        status(run(&c, &cmd(OP_IDENTIFY, 0, 0x55, 0), &OFFER)),
        Status::INVALID_FIELD
    );
}

#[test]
fn log_pages_and_their_offsets() {
    let (c, _) = setup();
    let log = |lid: u8, dwords: u32, offset: u32| {
        let c = cmd(
            OP_GET_LOG_PAGE,
            0xFFFF_FFFF,
            u32::from(lid) | (dwords - 1) << 16,
            0,
        );
        SqeBuilder(c.0).cdw(12, offset).build()
    };
    let (_, ana) = ok(run(&c, &log(0x0C, 16, 0), &OFFER));
    assert_eq!(ana.len(), 64);
    assert_eq!(le16(&ana, 8), 1, "one group");
    assert_eq!((le32(&ana, 16), le32(&ana, 20), ana[32]), (1, 1, 1));
    assert_eq!(le32(&ana, 48), 1, "namespace 1 in it");
    c.log_error(1, 9, Status::LBA_OUT_OF_RANGE, 1, 77);
    let (_, err) = ok(run(&c, &log(0x01, 16, 0), &OFFER));
    assert_eq!((le64(&err, 0), le16(&err, 10), le64(&err, 16)), (1, 9, 77));
    assert_eq!(le16(&err, 12) >> 1, Status::LBA_OUT_OF_RANGE.0);
    let (_, smart) = ok(run(&c, &log(0x02, 128, 0), &OFFER));
    assert_eq!((smart.len(), smart[3]), (512, 100));
    assert_eq!(
        status(run(&c, &log(0x7F, 16, 0), &OFFER)),
        Status::INVALID_LOG_PAGE
    );
    let (_, part) = ok(run(&c, &log(0x0C, 4, 16), &OFFER));
    assert_eq!(le32(&part, 0), 1, "the group descriptor, from byte 16");
}

#[test]
fn the_volatile_write_cache_feature_is_the_shared_backings() {
    let (c, backing) = setup();
    assert_eq!(ok(run(&c, &cmd(OP_GET_FEATURES, 1, 0x06, 0), &OFFER)).0, 1);
    ok(run(&c, &cmd(OP_SET_FEATURES, 0, 0x06, 0), &OFFER));
    assert!(!backing.write_cache());
    assert_eq!(ok(run(&c, &cmd(OP_GET_FEATURES, 1, 0x06, 0), &OFFER)).0, 0);
    backing.set_write_cache(true); // as MODE SELECT of a LUN over it would
    assert_eq!(ok(run(&c, &cmd(OP_GET_FEATURES, 1, 0x06, 0), &OFFER)).0, 1);
    assert_eq!(
        status(run(&c, &cmd(OP_SET_FEATURES, 0, 0x06 | 1 << 31, 1), &OFFER)),
        Status::NOT_SAVEABLE
    );
}

#[test]
fn features_keep_their_values() {
    let (c, _) = setup();
    assert_eq!(
        ok(run(&c, &cmd(OP_SET_FEATURES, 0, 0x07, 9 | 9 << 16), &OFFER)).0,
        3 | 3 << 16
    );
    assert_eq!(
        ok(run(&c, &cmd(OP_GET_FEATURES, 0, 0x07, 0), &OFFER)).0,
        3 | 3 << 16
    );
    ok(run(&c, &cmd(OP_SET_FEATURES, 0, 0x0F, 5000), &OFFER));
    assert_eq!(
        ok(run(&c, &cmd(OP_GET_FEATURES, 0, 0x0F, 0), &OFFER)).0,
        5000
    );
    ok(run(&c, &cmd(OP_SET_FEATURES, 0, 0x0B, 1 << 8), &OFFER));
    assert_eq!(
        ok(run(&c, &cmd(OP_GET_FEATURES, 0, 0x0B, 0), &OFFER)).0,
        1 << 8
    );
    assert_eq!(
        status(run(&c, &cmd(OP_SET_FEATURES, 0, 0x42, 0), &OFFER)),
        Status::INVALID_FIELD
    );
}

#[test]
fn abort_takes_back_a_held_event_request_only() {
    let (c, _) = setup();
    let mut rx = admin_queue(&c);
    let aer = SqeBuilder::new(OP_ASYNC_EVENT, 40).build();
    assert_eq!(run(&c, &aer, &OFFER), Reply::Held);
    assert_eq!(
        ok(run(&c, &cmd(OP_ABORT, 0, 40 << 16, 0), &OFFER)).0,
        0,
        "aborted"
    );
    let done = completions(&mut rx);
    assert_eq!((done[0].cid, done[0].status), (40, Status::ABORT_REQUESTED));
    assert_eq!(
        ok(run(&c, &cmd(OP_ABORT, 0, 41 << 16 | 1, 0), &OFFER)).0,
        1,
        "not aborted"
    );
}

#[test]
fn commands_wait_for_the_controller_to_be_enabled() {
    let (c, _) = setup();
    c.set_cc(0).unwrap();
    assert_eq!(
        status(run(&c, &cmd(OP_IDENTIFY, 0, 1, 0), &OFFER)),
        Status::COMMAND_SEQUENCE
    );
    assert_eq!(
        status(run(&c, &cmd(OP_KEEP_ALIVE, 0, 0, 0), &OFFER)),
        Status::SUCCESS
    );
}
