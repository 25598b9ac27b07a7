//! A host of the project's own against the target: queues with and
//! without digests, Identify, verified I/O on a file and a memory
//! device, and the statuses of what fails.

mod common;

use common::*;
use nvmf::initiator::{expect_success, nvm, verified_io, Command, Options, Queue};
use nvmf::status::Status;
use nvmf::wire::{le16, le32, le64, Digests};

const BOTH: Digests = Digests {
    header: true,
    data: true,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_io_queues_without_digests() {
    let t = target().await;
    let mut h = host(
        t.addr,
        Options {
            io_queues: 4,
            ..Options::default()
        },
    )
    .await;
    assert_eq!(h.io.len(), 4);
    verified_io(&mut h, 1, 512).await;
    verified_io(&mut h, 2, 4096).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_io_queues_with_digests_and_flow_control_off() {
    let t = target().await;
    let opts = Options {
        io_queues: 4,
        digests: BOTH,
        flow_off: true,
        ..Options::default()
    };
    let mut h = host(t.addr, opts).await;
    assert_eq!(h.admin.digests, BOTH);
    verified_io(&mut h, 1, 512).await;
    verified_io(&mut h, 2, 4096).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identify_names_the_device_as_the_scsi_side_does() {
    let t = target().await;
    // The logical unit over mem0 reports this designator.
    let naa = export::naa_from_seed("iqn.2026-11.org.openarray:t/mem0");
    t.exports.devices["mem0"].set_naa(naa);
    t.server.replace_devices(&t.exports);
    let mut h = host(t.addr, Options::default()).await;
    let c = h.identify(1, 0).await.unwrap();
    expect_success(&c, "identify controller").unwrap();
    assert_eq!(le16(&c.data, 78), h.cntlid);
    assert_eq!(&c.data[768..768 + SUBNQN.len()], SUBNQN.as_bytes());
    let list = h.identify(2, 0).await.unwrap().data;
    assert_eq!((le32(&list, 0), le32(&list, 4), le32(&list, 8)), (1, 2, 0));
    let ns = h.identify(0, 2).await.unwrap().data;
    assert_eq!(le64(&ns, 0), (8 << 20) / 4096);
    assert_eq!(ns[130], 12);
    let ids = export::NamespaceIds::from_naa(naa);
    assert_eq!(&ns[104..120], &ids.nguid);
    let d = h.identify(3, 2).await.unwrap().data;
    assert_eq!(&d[16..32], &naa, "the NGUID is the LU's NAA designator");
    assert_eq!(&d[36..52], &ids.uuid);
    let ns1 = h.identify(0, 1).await.unwrap().data;
    assert_eq!(
        &ns1[104..120],
        &export::naa_from_seed("file0"),
        "derived from the device name"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_end_with_the_status_the_spec_names() {
    let t = target().await;
    let mut h = host(t.addr, Options::default()).await;
    let q = &mut h.io[0];
    let blocks = (16 << 20) / 512;
    let c = q.one(nvm::read(1, blocks - 1, 2, 512)).await.unwrap();
    assert_eq!(c.status(), Status::LBA_OUT_OF_RANGE);
    let c = q.one(nvm::read(9, 0, 1, 512)).await.unwrap();
    assert_eq!(c.status(), Status::INVALID_NAMESPACE);
    let c = q.one(nvm::compare(1, 0, vec![1; 512], 512)).await.unwrap();
    assert_eq!(c.status(), Status::COMPARE_FAILURE);
    let c = q.one(nvm::read(1, 0, 4096, 512)).await.unwrap();
    assert_eq!(c.status(), Status::INVALID_FIELD, "longer than MDTS");
    let c = q
        .one(Command::new(
            nvmf::capsule::SqeBuilder::new(0x7D, 0).nsid(1),
        ))
        .await
        .unwrap();
    assert_eq!(c.status(), Status::INVALID_OPCODE);
    // A second of a fused pair without its first.
    let mut lone = nvm::write(1, 0, vec![0; 512], 512, false);
    lone.sqe = lone.sqe.fuse(nvmf::capsule::Fuse::Second);
    assert_eq!(q.one(lone).await.unwrap().status(), Status::FUSED_MISSING);
    // A first whose second never comes.
    let mut first = nvm::compare(1, 0, vec![0; 512], 512);
    first.sqe = first.sqe.fuse(nvmf::capsule::Fuse::First);
    let c = q.run(vec![first, nvm::read(1, 0, 1, 512)]).await.unwrap();
    assert_eq!(
        (c[0].status(), c[1].status()),
        (Status::FUSED_MISSING, Status::SUCCESS)
    );
    // A first that fails takes its second with it.
    let mut pair = nvm::compare_and_write(1, blocks, vec![0; 512], vec![1; 512], 512);
    pair[1].sqe = pair[1].sqe.cdw(10, 0); // the second names a valid range
    let c = q.run(pair).await.unwrap();
    assert_eq!(
        (c[0].status(), c[1].status()),
        (Status::LBA_OUT_OF_RANGE, Status::FUSED_FAILED)
    );
    // Failed commands are in the error log, newest first.
    let log = h.get_log(0x01, 64, false).await.unwrap();
    assert!(le64(&log.data, 0) >= 8);
    assert_eq!(le16(&log.data, 12) >> 1, Status::FUSED_FAILED.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_refuses_hosts_not_allowed_and_unknown_subsystems() {
    let t = target().await;
    let mut q = Queue::open(t.addr, Digests::default()).await.unwrap();
    let c = q
        .connect(0, 32, 0xFFFF, &who(OTHER_NQN), 0, false)
        .await
        .unwrap();
    assert_eq!(c.status(), Status::CONNECT_INVALID_HOST);
    assert_eq!(
        c.cqe.result,
        1 << 16 | 512,
        "the host NQN of the Connect data"
    );
    let c = q
        .connect(
            0,
            32,
            0xFFFF,
            &who("nqn.2026-11.org.openarray:none"),
            0,
            false,
        )
        .await
        .unwrap();
    assert_eq!(c.status(), Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(c.cqe.result, 1 << 16 | 256);
    // An I/O queue naming a controller that does not exist.
    let c = q.connect(1, 32, 999, &who(SUBNQN), 0, false).await.unwrap();
    assert_eq!(c.status(), Status::CONNECT_INVALID_PARAMETERS);
    // Commands before Connect are out of sequence.
    let c = q.one(nvm::flush(1)).await.unwrap();
    assert_eq!(c.status(), Status::COMMAND_SEQUENCE);
    // An I/O queue beyond the ones granted.
    let h = host(
        t.addr,
        Options {
            io_queues: 2,
            ..Options::default()
        },
    )
    .await;
    let mut q = Queue::open(t.addr, Digests::default()).await.unwrap();
    let c = q
        .connect(3, 32, h.cntlid, &who(SUBNQN), 0, false)
        .await
        .unwrap();
    assert_eq!(c.status(), Status::CONNECT_INVALID_PARAMETERS);
    let c = q
        .connect(2, 32, h.cntlid, &who(SUBNQN), 0, false)
        .await
        .unwrap();
    assert_eq!(
        c.status(),
        Status::CONNECT_INVALID_PARAMETERS,
        "queue 2 is connected already"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn properties_and_the_keep_alive_timeout() {
    let t = target().await;
    let mut h = host(
        t.addr,
        Options {
            kato_ms: 1000,
            ..Options::default()
        },
    )
    .await;
    let cap = h.admin.property_get(0x00, true).await.unwrap();
    assert_eq!(cap.cqe.result & 0xFFFF, 127, "MQES");
    assert_eq!(cap.cqe.result >> 37 & 1, 1, "NVM command set");
    let vs = h.admin.property_get(0x08, false).await.unwrap();
    assert_eq!(vs.cqe.result, 0x0002_0000);
    assert_eq!(
        h.admin.property_get(0x08, true).await.unwrap().status(),
        Status::INVALID_FIELD
    );
    for _ in 0..6 {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        let ka = h
            .admin
            .one(Command::new(nvmf::capsule::SqeBuilder::new(0x18, 0)))
            .await
            .unwrap();
        expect_success(&ka, "keep alive").unwrap();
    }
    assert_eq!(t.server.sessions().len(), 1, "kept alive past the timeout");
    let mut ended = false;
    for _ in 0..40 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        ended = t.server.sessions().is_empty();
        if ended {
            break;
        }
    }
    assert!(ended, "the controller ended without keep alives");
    assert!(
        h.admin.one(nvm::flush(0)).await.is_err(),
        "its connections are closed"
    );
    assert!(h.io[0].one(nvm::flush(1)).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_beyond_the_data_bound_wait_for_their_r2t() {
    let limits = nvmf::Limits {
        r2t_bytes: 256 << 10,
        ..nvmf::Limits::default()
    };
    let t = target_with(limits).await;
    let mut h = host(t.addr, Options::default()).await;
    let q = &mut h.io[0];
    // Eight 128 KiB writes at once: at most two have their data asked for.
    let writes: Vec<Command> = (0..8u64)
        .map(|i| nvm::write(1, i * 256, pattern(128 << 10, i as u8), BS, false))
        .collect();
    for c in q.run(writes).await.unwrap() {
        expect_success(&c, "write").unwrap();
    }
    for i in 0..8u64 {
        let c = q.one(nvm::read(1, i * 256, 256, BS)).await.unwrap();
        assert!(c.data == pattern(128 << 10, i as u8), "write {i} read back");
    }
}
