//! The discovery controller as `nvme discover` uses it: its Identify,
//! the log's entries for what the host may connect to, the generation
//! counter and the change event, and the listeners that answer it.

mod common;

use std::time::Duration;

use common::*;
use nvmf::capsule::{Cqe, SqeBuilder};
use nvmf::initiator::{expect_success, Command, Host, Options, Queue, Who};
use nvmf::status::Status;
use nvmf::wire::{le16, le32, Digests, Pdu};
use nvmf::DISCOVERY_NQN;

const OTHER_HOST: &str = "nqn.2026-11.org.example:only-this-host";

fn disc_who(host: &str) -> Who {
    Who {
        host_nqn: host.into(),
        host_id: [7; 16],
        subnqn: DISCOVERY_NQN.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_lists_each_subsystem_the_host_may_reach_as_nvme_discover_reads_it() {
    let t = target().await;
    let mut h = Host::discovery(t.addr, HOSTNQN, Options::default())
        .await
        .unwrap();
    let id = h.identify(1, 0).await.unwrap();
    expect_success(&id, "Identify").unwrap();
    assert_eq!(id.data[111], 2, "CNTRLTYPE: discovery");
    assert!(id.data[768..].starts_with(DISCOVERY_NQN.as_bytes()));
    assert_eq!(le32(&id.data, 92) >> 31, 1, "OAES: discovery log changes");
    assert_eq!(id.data[261] & 1 << 2, 1 << 2, "log page offsets");
    assert_eq!(le16(&id.data, 320), 1, "KAS");
    assert!(
        le32(&id.data, 1792) >= 4 && le32(&id.data, 1796) == 1,
        "IOCCSZ, IORCSZ"
    );
    assert_ne!(le16(&id.data, 514), 0, "MAXCMD");
    let log = h.discovery_log().await.unwrap();
    assert_eq!(log.genctr, t.server.discovery_generation());
    assert_eq!(
        log.entries.len(),
        1,
        "the other subsystem admits another host"
    );
    let e = &log.entries[0];
    assert_eq!(e.subnqn, SUBNQN);
    assert_eq!((e.trtype, e.adrfam, e.subtype), (3, 1, 2));
    assert_eq!(e.treq & 3, 2, "secure channel not required");
    assert_eq!((e.portid, e.cntlid, e.sectype), (1, 0xFFFF, 0));
    assert_eq!(e.traddr, "127.0.0.1");
    assert_eq!(e.trsvcid, t.addr.port().to_string());
    assert!(e.asqsz >= 32);

    // What the entry says is where the host connects.
    let mut io = Host::connect(
        format!("{}:{}", e.traddr, e.trsvcid).parse().unwrap(),
        who(&e.subnqn),
        Options::default(),
    )
    .await
    .unwrap();
    expect_success(&io.identify(1, 0).await.unwrap(), "Identify").unwrap();

    // Commands a discovery controller has not: I/O queue counts,
    // namespaces, other logs.
    let c = h
        .admin
        .one(Command::new(
            SqeBuilder::new(0x09, 0).cdw(10, 0x07).cdw(11, 0),
        ))
        .await
        .unwrap();
    assert_eq!(c.status(), Status::INVALID_FIELD);
    assert_eq!(
        h.identify(0, 1).await.unwrap().status(),
        Status::INVALID_FIELD
    );
    assert_eq!(
        h.get_log(0x02, 512, false).await.unwrap().status(),
        Status::INVALID_LOG_PAGE
    );
    let ka = h
        .admin
        .one(Command::new(SqeBuilder::new(0x18, 0)))
        .await
        .unwrap();
    expect_success(&ka, "Keep Alive").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_sees_only_the_subsystems_that_admit_it() {
    let t = target().await;
    let log = Host::discover(t.addr, OTHER_HOST).await.unwrap();
    let nqns: Vec<&str> = log.entries.iter().map(|e| e.subnqn.as_str()).collect();
    assert_eq!(nqns, vec![OTHER_NQN]);
    let log = Host::discover(t.addr, "nqn.2026-11.org.example:stranger")
        .await
        .unwrap();
    assert!(log.entries.is_empty(), "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_moves_the_generation_and_tells_hosts_that_asked() {
    let t = target().await;
    let mut h = Host::discovery(t.addr, HOSTNQN, Options::default())
        .await
        .unwrap();
    let before = h.discovery_log().await.unwrap();
    // Discovery log change notices on; an event request held.
    let aec = SqeBuilder::new(0x09, 0).cdw(10, 0x0B).cdw(11, 1 << 31);
    expect_success(&h.admin.one(Command::new(aec)).await.unwrap(), "AEC").unwrap();
    let aer = wire_command(&mut h.admin, SqeBuilder::new(0x0C, 0), 900).await;

    // A reconfiguration that changes nothing listed moves nothing.
    t.server.reconfigure(&t.config).await.unwrap();
    assert_eq!(t.server.discovery_generation(), before.genctr);

    let mut config = t.config.clone();
    config.subsystems[1].allow_hosts.push("*".into());
    t.server.reconfigure(&config).await.unwrap();
    let Pdu::Response { cqe } = tokio::time::timeout(Duration::from_secs(5), h.admin.receive())
        .await
        .expect("the event")
        .unwrap()
    else {
        panic!("a completion")
    };
    let cqe = Cqe::decode(&cqe);
    assert_eq!((cqe.cid, cqe.status), (aer, Status::SUCCESS));
    assert_eq!(cqe.result & 7, 2, "a notice");
    assert_eq!(cqe.result >> 8 & 0xFF, 0xF0, "discovery log page change");
    assert_eq!(cqe.result >> 16 & 0xFF, 0x70);
    let after = h.discovery_log().await.unwrap();
    assert_eq!(after.genctr, before.genctr + 1);
    assert_eq!(after.entries.len(), 2, "{after:?}");
    assert!(after.entries.iter().any(|e| e.subnqn == OTHER_NQN));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discovery_listener_answers_discovery_only() {
    let t = target_of(nvmf::Limits::default(), |c, _| {
        // Another address: one port 0 twice is one listener.
        c.discovery_listen = vec!["127.0.0.2:0".into()];
    })
    .await;
    let addrs = t.server.local_addrs().await;
    assert_eq!(addrs.len(), 2);
    let disc = *addrs.iter().find(|a| **a != t.addr).unwrap();
    let log = Host::discover(disc, HOSTNQN).await.unwrap();
    assert_eq!(log.entries.len(), 1, "the discovery listener is not listed");
    assert_eq!(log.entries[0].trsvcid, t.addr.port().to_string());

    let mut q = Queue::open(disc, Digests::default()).await.unwrap();
    let c = q
        .connect(0, 32, 0xFFFF, &who(SUBNQN), 0, false)
        .await
        .unwrap();
    assert_eq!(c.status(), Status::CONNECT_INVALID_PARAMETERS);
    // A discovery controller has no I/O queues.
    let mut q = Queue::open(t.addr, Digests::default()).await.unwrap();
    let c = q
        .connect(1, 32, 1, &disc_who(HOSTNQN), 0, false)
        .await
        .unwrap();
    assert_eq!(c.status(), Status::CONNECT_INVALID_PARAMETERS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discovery_controller_whose_host_stops_keeping_alive_ends() {
    let t = target().await;
    let mut q = Queue::open(t.addr, Digests::default()).await.unwrap();
    let c = q
        .connect(0, 32, 0xFFFF, &disc_who(HOSTNQN), 300, false)
        .await
        .unwrap();
    expect_success(&c, "Connect").unwrap();
    assert_eq!(t.server.sessions().len(), 1);
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(t.server.sessions().is_empty());
}

async fn wire_command(q: &mut Queue, sqe: SqeBuilder, cid: u16) -> u16 {
    use tokio::io::AsyncWriteExt;
    let mut sqe = sqe.sgl(nvmf::capsule::SGL_TRANSPORT, 0, 0);
    nvmf::wire::put16(&mut sqe.0, 2, cid);
    let pdu = nvmf::wire::encode_command(&sqe.0, &[], q.digests);
    q.stream.write_all(&pdu).await.unwrap();
    cid
}
