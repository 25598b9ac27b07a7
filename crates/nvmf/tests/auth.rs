//! DH-HMAC-CHAP over the wire: a host with a configured secret
//! authenticates every queue before anything else, with each hash and
//! both ways; a wrong secret, or none, leaves it without I/O.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::*;
use nvmf::auth::{reason, Hash, Secret};
use nvmf::initiator::{
    expect_success, must_authenticate, negotiate, nvm, AuthFailure, Host, HostAuth, Options, Queue,
};
use nvmf::status::Status;
use nvmf::wire::Digests;
use nvmf::{HostConfig, Limits};

fn host_secret() -> Secret {
    Secret::new((0..48).collect(), Some(Hash::Sha384)).unwrap()
}

fn ctrl_secret() -> Secret {
    Secret::new(vec![0x5C; 32], None).unwrap()
}

fn write_secret(dir: &Path, name: &str, s: &Secret) -> String {
    let p = dir.join(name);
    std::fs::write(&p, format!("{}\n", s.encode())).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p.display().to_string()
}

/// A target whose first subsystem makes HOSTNQN authenticate, with a
/// controller secret when `bidirectional`.
async fn target_auth(bidirectional: bool) -> Target {
    target_of(Limits::default(), |c, dir| {
        c.subsystems[0].hosts.push(HostConfig {
            nqn: HOSTNQN.into(),
            dhchap_secret_file: write_secret(dir, "host.key", &host_secret()),
            dhchap_ctrl_secret_file: bidirectional
                .then(|| write_secret(dir, "ctrl.key", &ctrl_secret())),
        });
    })
    .await
}

async fn verified_write_read(h: &mut Host) {
    let q = &mut h.io[0];
    let data = pattern(2 * BS, 3);
    expect_success(
        &q.one(nvm::write(1, 8, data.clone(), BS, false))
            .await
            .unwrap(),
        "write",
    )
    .unwrap();
    let c = q.one(nvm::read(1, 8, 2, BS)).await.unwrap();
    expect_success(&c, "read").unwrap();
    assert_eq!(c.data, data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_hash_authenticates_every_queue_and_then_io_runs() {
    let t = target_auth(false).await;
    for hash in [1u8, 2, 3] {
        let mut a = HostAuth::new(host_secret());
        a.hashes = vec![hash];
        let opts = Options {
            io_queues: 2,
            ..Options::default()
        };
        let mut h = Host::connect_auth(t.addr, who(SUBNQN), opts, Some(&a))
            .await
            .unwrap();
        verified_write_read(&mut h).await;
    }
    // Linux's offer (every hash and group) is answered with SHA-512 and
    // the NULL group.
    let mut q = Queue::open(t.addr, Digests::default()).await.unwrap();
    let c = q
        .connect(0, 32, 0xFFFF, &who(SUBNQN), 0, false)
        .await
        .unwrap();
    assert!(must_authenticate(&c), "AUTHREQ.ATR: {:#x}", c.cqe.result);
    let a = HostAuth::new(host_secret());
    assert_eq!(q.authenticate(&who(SUBNQN), &a, 1).await.unwrap(), Ok(()));
    // A host the subsystem does not ask to authenticate is not asked.
    let mut q = Queue::open(t.addr, Digests::default()).await.unwrap();
    let mut other = who(SUBNQN);
    other.host_nqn = "nqn.2014-08.org.nvmexpress:uuid:someone-else".into();
    let c = q.connect(0, 32, 0xFFFF, &other, 0, false).await.unwrap();
    expect_success(&c, "Connect").unwrap();
    assert!(!must_authenticate(&c));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_or_none_gets_no_io() {
    let t = target_auth(false).await;
    let wrong = HostAuth::new(Secret::new((1..49).collect(), Some(Hash::Sha384)).unwrap());
    let e = Host::connect_auth(t.addr, who(SUBNQN), Options::default(), Some(&wrong))
        .await
        .err()
        .expect("refused");
    assert!(e.to_string().contains("Refused(1)"), "{e}");

    let mut q = Queue::open(t.addr, Digests::default()).await.unwrap();
    let c = q
        .connect(0, 32, 0xFFFF, &who(SUBNQN), 0, false)
        .await
        .unwrap();
    let cntlid = c.cqe.result as u16;
    assert_eq!(
        q.authenticate(&who(SUBNQN), &wrong, 7).await.unwrap(),
        Err(AuthFailure::Refused(reason::FAILED))
    );
    // Nothing but authentication reaches the controller: not its
    // properties, not an admin command.
    let c = q.property_set(0x14, 1 | 6 << 16 | 4 << 20).await.unwrap();
    assert_eq!(c.status(), Status::AUTH_REQUIRED);
    let c = q.property_get(0x1C, false).await.unwrap();
    assert_eq!(c.status(), Status::AUTH_REQUIRED);
    let c = q
        .one(
            nvmf::initiator::Command::new(nvmf::capsule::SqeBuilder::new(0x06, 0).cdw(10, 1))
                .reading(4096),
        )
        .await
        .unwrap();
    assert_eq!(c.status(), Status::AUTH_REQUIRED);
    // Nor does an I/O queue of that controller that does not
    // authenticate.
    let mut io = Queue::open(t.addr, Digests::default()).await.unwrap();
    let c = io
        .connect(1, 32, cntlid, &who(SUBNQN), 0, false)
        .await
        .unwrap();
    if c.status().is_success() {
        assert!(must_authenticate(&c));
        let c = io.one(nvm::read(1, 0, 1, BS)).await.unwrap();
        assert_eq!(c.status(), Status::AUTH_REQUIRED);
    }
    // The right secret on the same queue still works afterwards.
    let right = HostAuth::new(host_secret());
    assert_eq!(
        q.authenticate(&who(SUBNQN), &right, 8).await.unwrap(),
        Ok(())
    );
    let c = q.property_get(0x1C, false).await.unwrap();
    expect_success(&c, "Property Get").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_authenticates_when_the_host_asks() {
    let t = target_auth(true).await;
    let mut a = HostAuth::new(host_secret());
    a.ctrl_secret = Some(ctrl_secret());
    let mut h = Host::connect_auth(t.addr, who(SUBNQN), Options::default(), Some(&a))
        .await
        .unwrap();
    verified_write_read(&mut h).await;

    // A host expecting another controller secret refuses the target's
    // proof, and is left unauthenticated.
    let mut q = Queue::open(t.addr, Digests::default()).await.unwrap();
    q.connect(0, 32, 0xFFFF, &who(SUBNQN), 0, false)
        .await
        .unwrap();
    a.ctrl_secret = Some(Secret::new(vec![0x5D; 32], None).unwrap());
    assert_eq!(
        q.authenticate(&who(SUBNQN), &a, 3).await.unwrap(),
        Err(AuthFailure::Controller)
    );
    let c = q.property_get(0x1C, false).await.unwrap();
    assert_eq!(c.status(), Status::AUTH_REQUIRED);

    // Without a controller secret configured, asking for one fails.
    let t = target_auth(false).await;
    a.ctrl_secret = Some(ctrl_secret());
    let mut q = Queue::open(t.addr, Digests::default()).await.unwrap();
    q.connect(0, 32, 0xFFFF, &who(SUBNQN), 0, false)
        .await
        .unwrap();
    assert_eq!(
        q.authenticate(&who(SUBNQN), &a, 3).await.unwrap(),
        Err(AuthFailure::Refused(reason::FAILED))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_authentication_gets_its_failure_reason_and_the_target_holds() {
    let t = target_auth(false).await;
    let mut q = Queue::open(t.addr, Digests::default()).await.unwrap();
    q.connect(0, 32, 0xFFFF, &who(SUBNQN), 0, false)
        .await
        .unwrap();
    let failure1 = |data: &[u8]| (data.len(), data[1], data[6], data[7]);
    for (msg, why) in [
        (vec![1, 2, 3], reason::INCORRECT_PAYLOAD),
        (negotiate(1, &[1], &[1, 2]), reason::DHGROUP_UNUSABLE),
        (negotiate(1, &[7], &[0]), reason::HASH_UNUSABLE),
        (
            vec![0x01, 0x02, 0, 0, 1, 0, 0, 0],
            reason::INCORRECT_MESSAGE,
        ),
        (vec![0xFF; 4096], reason::INCORRECT_MESSAGE),
    ] {
        let c = q.auth_send(msg).await.unwrap();
        expect_success(&c, "AUTH_Send").unwrap();
        let c = q.auth_receive(64).await.unwrap();
        expect_success(&c, "AUTH_Receive").unwrap();
        assert_eq!(failure1(&c.data), (8, 0xF1, 1, why));
    }
    // A command whose own fields are wrong: Invalid Field.
    let sqe = nvmf::capsule::SqeBuilder::new(0x7F, 0)
        .byte(4, 0x05)
        .byte(43, 0xEA)
        .cdw(11, 8);
    let c = q
        .one(nvmf::initiator::Command::new(sqe).sending(vec![0; 8]))
        .await
        .unwrap();
    assert_eq!(c.status(), Status::INVALID_FIELD);
    // The connection still works, and authenticates.
    let a = HostAuth::new(host_secret());
    assert_eq!(q.authenticate(&who(SUBNQN), &a, 2).await.unwrap(), Ok(()));
    assert_eq!(t.server.protocol_errors(), 0);
    // Authentication commands on a queue with nothing to authenticate.
    let mut other = Queue::open(t.addr, Digests::default()).await.unwrap();
    let mut w = who(OTHER_NQN);
    w.host_nqn = "nqn.2026-11.org.example:only-this-host".into();
    let c = other.connect(0, 32, 0xFFFF, &w, 0, false).await.unwrap();
    expect_success(&c, "Connect").unwrap();
    let c = other.auth_receive(64).await.unwrap();
    assert_eq!(c.status(), Status::COMMAND_SEQUENCE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_secret_file_is_unreadable_is_refused() {
    let t = target_of(Limits::default(), |c, dir| {
        let f = write_secret(dir, "host.key", &host_secret());
        c.subsystems[0].hosts.push(HostConfig {
            nqn: HOSTNQN.into(),
            dhchap_secret_file: f.clone(),
            dhchap_ctrl_secret_file: None,
        });
    })
    .await;
    let f = t.config.subsystems[0].hosts[0].dhchap_secret_file.clone();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    let errors = t
        .config
        .validate(&t.exports.devices.keys().cloned().collect());
    assert_eq!(errors.len(), 1);
    assert_eq!(
        errors[0].field,
        "nvmf.subsystem[0].host[0].dhchap_secret_file"
    );
    assert!(errors[0].why.contains("mode 0644"), "{}", errors[0]);
    // Read again on the next change: the host is refused, not let in
    // without a secret.
    t.server.reconfigure(&t.config).await.unwrap();
    let mut q = Queue::open(t.addr, Digests::default()).await.unwrap();
    let c = q
        .connect(0, 32, 0xFFFF, &who(SUBNQN), 0, false)
        .await
        .unwrap();
    assert_eq!(c.status(), Status::CONNECT_INVALID_HOST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_that_does_not_authenticate_in_time_is_closed() {
    let limits = Limits {
        connect_timeout: std::time::Duration::from_millis(300),
        ..Limits::default()
    };
    let t = target_of(limits, |c, dir| {
        c.subsystems[0].hosts.push(HostConfig {
            nqn: HOSTNQN.into(),
            dhchap_secret_file: write_secret(dir, "host.key", &host_secret()),
            dhchap_ctrl_secret_file: None,
        });
    })
    .await;
    let mut q = Queue::open(t.addr, Digests::default()).await.unwrap();
    let c = q
        .connect(0, 32, 0xFFFF, &who(SUBNQN), 0, false)
        .await
        .unwrap();
    assert!(must_authenticate(&c));
    let end = tokio::time::timeout(std::time::Duration::from_secs(3), q.receive()).await;
    assert!(matches!(end, Ok(Err(_))), "closed: {end:?}");

    // One that authenticates stays.
    let mut q = Queue::open(t.addr, Digests::default()).await.unwrap();
    q.connect(0, 32, 0xFFFF, &who(SUBNQN), 0, false)
        .await
        .unwrap();
    let a = HostAuth::new(host_secret());
    assert_eq!(q.authenticate(&who(SUBNQN), &a, 1).await.unwrap(), Ok(()));
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    expect_success(&q.property_get(0x1C, false).await.unwrap(), "Property Get").unwrap();
}
