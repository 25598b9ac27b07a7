//! Hosts that break the protocol lose their own connection only; the
//! range locks a write shares with every other transport of the device.

mod common;

use std::time::Duration;

use common::*;
use nvmf::initiator::{expect_success, nvm, Options, Queue};
use nvmf::wire::{self, fes, kind, Digests, Pdu};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BOTH: Digests = Digests {
    header: true,
    data: true,
};

/// What the target sends on a broken connection: its termination
/// request, then the end of the stream.
async fn termination(q: &mut Queue) -> (u16, u32) {
    let pdu = tokio::time::timeout(Duration::from_secs(5), q.receive())
        .await
        .expect("an answer");
    let Ok(Pdu::Term { fes, fei, .. }) = pdu else {
        panic!("expected a C2HTermReq, got {pdu:?}");
    };
    let mut rest = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(5), q.stream.read(&mut rest))
        .await
        .unwrap();
    assert!(matches!(n, Ok(0) | Err(_)), "then the connection closes");
    (fes, fei)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_pdu_closes_only_its_connection() {
    let t = target().await;
    let mut good = host(
        t.addr,
        Options {
            io_queues: 1,
            digests: BOTH,
            ..Options::default()
        },
    )
    .await;

    // A header digest that does not match.
    let mut bad = Queue::open(t.addr, BOTH).await.unwrap();
    let sqe = nvm::flush(1).sqe.build();
    let mut pdu = wire::encode_command(&sqe.0, &[], BOTH);
    pdu[12] ^= 0xFF;
    bad.stream.write_all(&pdu).await.unwrap();
    assert_eq!(termination(&mut bad).await.0, fes::HEADER_DIGEST);

    // A PDU type hosts never send.
    let mut bad = Queue::open(t.addr, Digests::default()).await.unwrap();
    let r2t = wire::encode_r2t(1, 1, 0, 512, Digests::default());
    bad.stream.write_all(&r2t).await.unwrap();
    assert_eq!(termination(&mut bad).await, (fes::INVALID_HEADER_FIELD, 0));

    // Data for a transfer the target never asked for, on a connected queue.
    let mut h = host(t.addr, Options::default()).await;
    let q = &mut h.io[0];
    let h2c = wire::DataHeader {
        cccid: 5,
        ttag: 77,
        offset: 0,
        len: 4,
        last: true,
        success: false,
    };
    q.stream
        .write_all(&wire::encode_data(
            kind::H2C_DATA,
            &h2c,
            &[0; 4],
            Digests::default(),
            1,
        ))
        .await
        .unwrap();
    assert_eq!(termination(q).await, (fes::INVALID_HEADER_FIELD, 10));

    // A PDU longer than any the target takes.
    let mut bad = Queue::open(t.addr, Digests::default()).await.unwrap();
    let mut huge = wire::encode_command(&sqe.0, &[], Digests::default());
    wire::put32(&mut huge, 4, 1 << 30);
    bad.stream.write_all(&huge).await.unwrap();
    assert_eq!(termination(&mut bad).await.0, fes::DATA_LIMIT_EXCEEDED);

    // An ICReq of another format version.
    let mut raw = tokio::net::TcpStream::connect(t.addr).await.unwrap();
    let mut ic = wire::encode_ic_req(&wire::IcReq {
        pfv: 1,
        hpda: 0,
        digests: Digests::default(),
        maxr2t: 0,
    });
    ic[8] = 1;
    raw.write_all(&ic).await.unwrap();
    let mut term = vec![0u8; 24];
    raw.read_exact(&mut term).await.unwrap();
    assert_eq!(
        (term[0], wire::le16(&term, 8), wire::le32(&term, 10)),
        (kind::C2H_TERM, fes::INVALID_HEADER_FIELD, 8)
    );

    // The other host's queues never noticed.
    let data = pattern(8192, 5);
    let q = &mut good.io[0];
    expect_success(
        &q.one(nvm::write(1, 10, data.clone(), BS, false))
            .await
            .unwrap(),
        "write",
    )
    .unwrap();
    assert_eq!(q.one(nvm::read(1, 10, 16, BS)).await.unwrap().data, data);
    assert!(t.server.protocol_errors() >= 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_bytes_end_their_connection_and_nothing_else() {
    let t = target().await;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for round in 0..40 {
        let mut raw = tokio::net::TcpStream::connect(t.addr).await.unwrap();
        let mut bytes = Vec::new();
        if round % 2 == 0 {
            // Past initialization, so the capsule decoder sees them.
            bytes.extend(wire::encode_ic_req(&wire::IcReq {
                pfv: 0,
                hpda: 0,
                digests: Digests::default(),
                maxr2t: 0,
            }));
        }
        for _ in 0..(200 + round * 7) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            bytes.push(seed as u8);
        }
        let _ = raw.write_all(&bytes).await;
        let _ = raw.shutdown().await;
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut sink))
            .await
            .expect("the target closes");
    }
    let mut h = host(t.addr, Options::default()).await;
    expect_success(&h.io[0].one(nvm::flush(1)).await.unwrap(), "flush").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_waits_for_an_exclusive_holder_of_its_bytes() {
    let t = target().await;
    let mut h = host(t.addr, Options::default()).await;
    let backing = t.exports.devices["mem0"].clone();
    // Another transport's COMPARE AND WRITE holds bytes 4096..8192 (block 1).
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let _g = backing.locks.lock(4096, 4096, true);
        held_tx.send(()).unwrap();
        release_rx.recv().unwrap();
    });
    held_rx.recv().unwrap();
    let q = &mut h.io[0];
    // A write elsewhere goes through.
    let c = tokio::time::timeout(
        Duration::from_secs(5),
        q.one(nvm::write(2, 3, vec![1; 4096], 4096, false)),
    )
    .await;
    expect_success(&c.expect("not held back").unwrap(), "write elsewhere").unwrap();
    // One of the held bytes waits for the holder.
    {
        let write = q.one(nvm::write(2, 1, vec![2; 4096], 4096, false));
        tokio::pin!(write);
        assert!(
            tokio::time::timeout(Duration::from_millis(300), &mut write)
                .await
                .is_err(),
            "held back"
        );
        release_tx.send(()).unwrap();
        let c = tokio::time::timeout(Duration::from_secs(5), write)
            .await
            .expect("done once released");
        expect_success(&c.unwrap(), "write").unwrap();
    }
    holder.join().unwrap();
    assert_eq!(
        q.one(nvm::read(2, 1, 1, 4096)).await.unwrap().data,
        vec![2; 4096]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_write_is_atomic_against_concurrent_writes_of_another_queue() {
    let t = target().await;
    let mut h = host(
        t.addr,
        Options {
            io_queues: 2,
            ..Options::default()
        },
    )
    .await;
    let mut q1 = h.io.pop().unwrap();
    let mut q0 = h.io.pop().unwrap();
    // q1 keeps writing whole 2-block values; q0 swaps them with Compare and
    // Write. A torn pair would read as a mix.
    expect_success(
        &q0.one(nvm::write(1, 40, vec![0; 1024], BS, false))
            .await
            .unwrap(),
        "init",
    )
    .unwrap();
    let writer = tokio::spawn(async move {
        for i in 0..200u32 {
            let v = (i % 200 + 1) as u8;
            let c = q1
                .one(nvm::write(1, 40, vec![v; 1024], BS, false))
                .await
                .unwrap();
            assert!(c.status().is_success());
        }
    });
    let mut swaps = 0;
    for _ in 0..200 {
        let now = q0.one(nvm::read(1, 40, 2, BS)).await.unwrap().data;
        assert!(now.iter().all(|b| *b == now[0]), "never torn");
        let c = q0
            .run(nvm::compare_and_write(1, 40, now, vec![0xEE; 1024], BS))
            .await
            .unwrap();
        if c[0].status().is_success() {
            swaps += 1;
        }
    }
    writer.await.unwrap();
    let last = q0.one(nvm::read(1, 40, 2, BS)).await.unwrap().data;
    assert!(last.iter().all(|b| *b == last[0]));
    assert!(swaps > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_data_digest_fails_its_command_only() {
    use nvmf::capsule::SGL_IN_CAPSULE;
    use nvmf::status::Status;
    let t = target().await;
    let mut h = host(
        t.addr,
        Options {
            digests: BOTH,
            ..Options::default()
        },
    )
    .await;
    let q = &mut h.io[0];
    let mut sqe = nvm::write(1, 0, vec![9; 512], BS, false)
        .sqe
        .sgl(SGL_IN_CAPSULE, 0, 512);
    wire::put16(&mut sqe.0, 2, 500);
    let mut pdu = wire::encode_command(&sqe.0, &[9; 512], BOTH);
    let n = pdu.len();
    pdu[n - 20] ^= 1; // in the data, under its digest
    q.stream.write_all(&pdu).await.unwrap();
    let Pdu::Response { cqe } = q.receive().await.unwrap() else {
        panic!("a completion")
    };
    let cqe = nvmf::capsule::Cqe::decode(&cqe);
    assert_eq!((cqe.cid, cqe.status), (500, Status::TRANSIENT_TRANSPORT));
    assert!(!cqe.status.do_not_retry(), "the host may retry it");
    assert_eq!(
        q.one(nvm::read(1, 0, 1, BS)).await.unwrap().data,
        vec![0; 512],
        "nothing written"
    );
    expect_success(
        &q.one(nvm::write(1, 0, vec![9; 512], BS, false))
            .await
            .unwrap(),
        "the retry",
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_reads_no_answers_is_dropped_with_bounded_memory() {
    let limits = nvmf::Limits {
        outgoing_bytes: 64 << 10,
        write_deadline: Duration::from_millis(500),
        ..nvmf::Limits::default()
    };
    let t = target_with(limits).await;
    let mut good = host(t.addr, Options::default()).await;
    let h = host(t.addr, Options::default()).await;
    // Identify after Identify, 4 KiB answers each, none of them read.
    let mut admin = h.admin;
    let sender = tokio::spawn(async move {
        let mut bytes = Vec::new();
        for cid in 0..5000u16 {
            let mut sqe = nvmf::capsule::SqeBuilder::new(0x06, cid).cdw(10, 1);
            sqe = sqe.sgl(nvmf::capsule::SGL_TRANSPORT, 0, 4096);
            bytes.extend(wire::encode_command(&sqe.0, &[], Digests::default()));
        }
        let _ = admin.stream.write_all(&bytes).await;
        admin
    });
    let mut dropped = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if t.server.stalled() > 0 {
            dropped = true;
            break;
        }
    }
    assert!(dropped, "the silent host is dropped");
    sender.abort();
    expect_success(
        &good.io[0].one(nvm::flush(1)).await.unwrap(),
        "the other host goes on",
    )
    .unwrap();
}
