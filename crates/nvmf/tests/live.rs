//! Changing what the target serves while hosts are connected: the
//! subsystem table, the listen set, and sessions as the admin API sees
//! them.

mod common;

use std::time::Duration;

use common::*;
use export::Frontend;
use nvmf::capsule::SqeBuilder;
use nvmf::initiator::{expect_success, nvm, Command, Options, Queue};
use nvmf::status::Status;
use nvmf::wire::{le32, Digests, Pdu};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_added_completes_the_held_event_request() {
    let t = target().await;
    let mut h = host(t.addr, Options::default()).await;
    // Namespace attribute notices on; an event request held.
    let aec = SqeBuilder::new(0x09, 0).cdw(10, 0x0B).cdw(11, 1 << 8);
    expect_success(
        &h.admin.one(Command::new(aec)).await.unwrap(),
        "async event config",
    )
    .unwrap();
    let aer = wire_command(&mut h.admin, SqeBuilder::new(0x0C, 0), 900).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(200), h.admin.receive())
            .await
            .is_err(),
        "held"
    );

    let mut config = t.config.clone();
    config.subsystems[0]
        .namespaces
        .push(namespace(3, "mem0", 512));
    t.server.reconfigure(&config).await.unwrap();
    let Pdu::Response { cqe } = h.admin.receive().await.unwrap() else {
        panic!("a completion")
    };
    let cqe = nvmf::capsule::Cqe::decode(&cqe);
    assert_eq!((cqe.cid, cqe.status), (aer, Status::SUCCESS));
    assert_eq!(cqe.result & 7, 2, "a notice");
    assert_eq!(
        cqe.result >> 16 & 0xFF,
        0x04,
        "read the changed namespace list"
    );
    let log = h.get_log(0x04, 4096, false).await.unwrap();
    assert_eq!((le32(&log.data, 0), le32(&log.data, 4)), (3, 0));
    let list = h.identify(2, 0).await.unwrap().data;
    assert_eq!((le32(&list, 0), le32(&list, 4), le32(&list, 8)), (1, 2, 3));
    expect_success(
        &h.io[0].one(nvm::read(3, 0, 1, BS)).await.unwrap(),
        "read the new namespace",
    )
    .unwrap();

    // Removed again: its commands fail, the others go on.
    t.server.reconfigure(&t.config).await.unwrap();
    assert_eq!(
        h.io[0].one(nvm::read(3, 0, 1, BS)).await.unwrap().status(),
        Status::INVALID_NAMESPACE
    );
    expect_success(&h.io[0].one(nvm::read(1, 0, 1, BS)).await.unwrap(), "read").unwrap();
}

/// Sends `sqe` as command `cid` without waiting for its completion.
async fn wire_command(q: &mut Queue, sqe: SqeBuilder, cid: u16) -> u16 {
    use tokio::io::AsyncWriteExt;
    let mut sqe = sqe.sgl(nvmf::capsule::SGL_TRANSPORT, 0, 0);
    nvmf::wire::put16(&mut sqe.0, 2, cid);
    let pdu = nvmf::wire::encode_command(&sqe.0, &[], q.digests);
    q.stream.write_all(&pdu).await.unwrap();
    cid
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_listed_and_ended_through_the_frontend() {
    let t = target().await;
    let frontend: &dyn Frontend = &t.server;
    assert_eq!(frontend.transport(), "nvme-tcp");
    let mut h = host(
        t.addr,
        Options {
            io_queues: 3,
            ..Options::default()
        },
    )
    .await;
    let sessions = frontend.sessions();
    assert_eq!(sessions.len(), 1);
    let s = &sessions[0];
    assert_eq!(s["id"], format!("nvme-{}", h.cntlid));
    assert_eq!(s["transport"], "nvme-tcp");
    assert_eq!(s["host_nqn"], HOSTNQN);
    assert_eq!(s["subsystem"], SUBNQN);
    assert_eq!(s["queues"], 4);
    assert!(s["peer"].as_str().unwrap().starts_with("127.0.0.1:"));
    assert_eq!(frontend.end_session("nvme-9999"), None);
    assert_eq!(frontend.end_session("nbd-1"), None);
    let ended = frontend.end_session(&format!("nvme-{}", h.cntlid)).unwrap();
    assert_eq!(ended["closed"], true);
    assert!(
        h.io[0].one(nvm::flush(1)).await.is_err(),
        "its queues are closed"
    );
    assert!(frontend.sessions().is_empty());

    // A host the allow list no longer admits is denied access, and
    // ended on request.
    let mut h = host(t.addr, Options::default()).await;
    let mut config = t.config.clone();
    config.subsystems[0].allow_hosts = vec!["nqn.2026-11.org.example:someone-else".into()];
    t.server.reconfigure(&config).await.unwrap();
    let c = h.io[0].one(nvm::read(1, 0, 1, BS)).await.unwrap();
    assert_eq!(c.status(), Status::ACCESS_DENIED);
    assert_eq!(frontend.end_refused_sessions(), 1);
    assert!(frontend.sessions().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listen_set_changes_live() {
    let t = target().await;
    let mut h = host(t.addr, Options::default()).await;
    let mut config = t.config.clone();
    config.listen = vec!["127.0.0.2:0".into()];
    t.server.reconfigure(&config).await.unwrap();
    let addrs = t.server.local_addrs().await;
    assert_eq!(addrs.len(), 1);
    assert_eq!(addrs[0].ip().to_string(), "127.0.0.2");
    // Connections of the old listener go on; new ones go to the new one.
    expect_success(&h.io[0].one(nvm::flush(1)).await.unwrap(), "flush").unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        Queue::open(t.addr, Digests::default()).await.is_err(),
        "no longer listening there"
    );
    let mut h2 = host(addrs[0], Options::default()).await;
    expect_success(&h2.io[0].one(nvm::flush(1)).await.unwrap(), "flush").unwrap();
    // A subsystem removed ends its controllers.
    config.subsystems.remove(0);
    t.server.reconfigure(&config).await.unwrap();
    assert!(h2.io[0].one(nvm::flush(1)).await.is_err());
}
