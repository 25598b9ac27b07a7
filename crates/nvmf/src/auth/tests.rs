use super::*;
use crate::initiator::{negotiate, reply, success2};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0b5c2e3e-6f1c-4c33-9d5f-000000000001";
const SUB: &str = "nqn.2026-11.org.openarray:test";

fn keys(ctrl: bool) -> Arc<HostKeys> {
    Arc::new(HostKeys {
        host: Secret::new(vec![3; 32], Some(Hash::Sha256)).unwrap(),
        ctrl: ctrl.then(|| Secret::new(vec![5; 48], None).unwrap()),
    })
}

/// The explanation of the failure1 the next AUTH_Receive gets.
fn failure(t: &mut Transaction) -> u8 {
    let m = t.receive();
    assert_eq!((m.len(), m[0], m[1], m[6]), (8, 0, ID_FAILURE1, 1), "{m:?}");
    assert!(!t.authenticated());
    m[7]
}

/// A challenge after a good negotiate: (hash, seq, challenge).
fn challenged(t: &mut Transaction, tid: u16, hashes: &[u8]) -> (Hash, u32, Vec<u8>) {
    t.send(&negotiate(tid, hashes, &[0]));
    let m = t.receive();
    assert_eq!(
        (m[0], m[1], crate::wire::le16(&m, 4)),
        (1, ID_CHALLENGE, tid)
    );
    let hash = Hash::from_id(m[8]).unwrap();
    assert_eq!(
        (usize::from(m[6]), m[9], m.len()),
        (hash.size(), 0, 16 + hash.size())
    );
    (hash, le32(&m, 12), m[16..].to_vec())
}

fn host_response(hash: Hash, seq: u32, c: &[u8], tid: u16, secret: &Secret) -> Vec<u8> {
    let key = secret.transformed(HOST);
    response(hash, &key, c, seq, tid, b"HostHost", HOST, SUB)
}

#[test]
fn each_hash_authenticates_with_the_right_secret_only() {
    for id in [1u8, 2, 3] {
        let k = keys(false);
        let mut t = Transaction::new(k.clone(), HOST, SUB);
        let (hash, seq, c) = challenged(&mut t, 9, &[id]);
        assert_eq!(hash.id(), id);
        t.send(&reply(9, &host_response(hash, seq, &c, 9, &k.host), None));
        let m = t.receive();
        assert_eq!(
            (m[1], m[6], m[8], m.len()),
            (ID_SUCCESS1, hash.size() as u8, 0, 16)
        );
        assert!(t.authenticated());
        // A success2 nobody asked for changes nothing.
        t.send(&success2(9));
        assert!(t.authenticated());

        let mut t = Transaction::new(k.clone(), HOST, SUB);
        let (hash, seq, c) = challenged(&mut t, 9, &[id]);
        let wrong = Secret::new(vec![4; 32], Some(Hash::Sha256)).unwrap();
        t.send(&reply(9, &host_response(hash, seq, &c, 9, &wrong), None));
        assert_eq!(failure(&mut t), reason::FAILED);
    }
}

#[test]
fn the_strongest_offered_hash_is_chosen() {
    let mut t = Transaction::new(keys(false), HOST, SUB);
    assert_eq!(challenged(&mut t, 1, &[1, 2, 3, 9]).0, Hash::Sha512);
}

#[test]
fn the_controller_proves_its_secret_when_asked() {
    let k = keys(true);
    let mut t = Transaction::new(k.clone(), HOST, SUB);
    let (hash, seq, c) = challenged(&mut t, 4, &[2]);
    let mine = vec![0xA5; hash.size()];
    let r = host_response(hash, seq, &c, 4, &k.host);
    t.send(&reply(4, &r, Some((&mine, 77))));
    let m = t.receive();
    assert_eq!((m[1], m[8]), (ID_SUCCESS1, 1));
    let ctrl = k.ctrl.as_ref().unwrap().transformed(SUB);
    let expected = response(hash, &ctrl, &mine, 77, 4, b"Controller", SUB, HOST);
    assert_eq!(m[16..], expected[..]);
    assert!(!t.authenticated(), "not before success2");
    t.send(&success2(4));
    assert!(t.authenticated());

    // Asking a controller with no secret of its own fails.
    let k = keys(false);
    let mut t = Transaction::new(k.clone(), HOST, SUB);
    let (hash, seq, c) = challenged(&mut t, 4, &[1]);
    let r = host_response(hash, seq, &c, 4, &k.host);
    t.send(&reply(4, &r, Some((&[1; 32], 5))));
    assert_eq!(failure(&mut t), reason::FAILED);
}

#[test]
fn malformed_messages_get_the_reason_the_spec_names() {
    let k = keys(false);
    let fresh = || Transaction::new(k.clone(), HOST, SUB);
    let mut t = fresh();
    t.send(&[0, 0, 0]);
    assert_eq!(failure(&mut t), reason::INCORRECT_PAYLOAD);

    let mut t = fresh();
    let mut m = negotiate(1, &[1], &[0]);
    m.push(0);
    t.send(&m);
    assert_eq!(
        failure(&mut t),
        reason::INCORRECT_PAYLOAD,
        "length and NAPD disagree"
    );

    let mut t = fresh();
    let mut m = negotiate(1, &[1], &[0]);
    m[6] = 1;
    t.send(&m);
    assert_eq!(failure(&mut t), reason::CONCAT_MISMATCH);

    let mut t = fresh();
    let mut m = negotiate(1, &[1], &[0]);
    m[8] = 2;
    t.send(&m);
    assert_eq!(failure(&mut t), reason::PROTOCOL_UNUSABLE);

    let mut t = fresh();
    let mut m = negotiate(1, &[1], &[0]);
    m[10] = 31;
    t.send(&m);
    assert_eq!(failure(&mut t), reason::INCORRECT_PAYLOAD, "HALEN above 30");

    let mut t = fresh();
    t.send(&negotiate(1, &[0, 4, 9], &[0]));
    assert_eq!(failure(&mut t), reason::HASH_UNUSABLE);

    let mut t = fresh();
    t.send(&negotiate(1, &[1], &[1, 2, 3, 4, 5]));
    assert_eq!(failure(&mut t), reason::DHGROUP_UNUSABLE, "FFDHE only");

    // Out of order: a reply or success2 with no challenge, a receive
    // with nothing to answer, an unknown message.
    for m in [
        reply(1, &[0; 32], None),
        success2(1),
        vec![1, 0x33, 0, 0, 0, 0, 0, 0],
    ] {
        let mut t = fresh();
        t.send(&m);
        assert_eq!(failure(&mut t), reason::INCORRECT_MESSAGE);
    }
    let mut t = fresh();
    assert_eq!(failure(&mut t), reason::INCORRECT_MESSAGE);

    // Replies that do not fit the transaction.
    type MakeReply = dyn Fn(u16, &[u8]) -> Vec<u8>;
    let bad_replies: [&MakeReply; 5] = [
        &|tid, r| reply(tid + 1, r, None),
        &|tid, r| reply(tid, &r[..16], None),
        &|tid, r| {
            let mut m = reply(tid, r, None);
            m[8] = 2;
            m
        },
        &|tid, r| reply(tid, r, Some((&[1; 32], 0))),
        &|tid, r| {
            let mut m = reply(tid, r, None);
            crate::wire::put16(&mut m, 10, 4);
            m.extend_from_slice(&[1, 2, 3, 4]);
            m
        },
    ];
    for (i, bad) in bad_replies.iter().enumerate() {
        let mut t = fresh();
        let (hash, seq, c) = challenged(&mut t, 3, &[1]);
        t.send(&bad(3, &host_response(hash, seq, &c, 3, &k.host)));
        assert_eq!(failure(&mut t), reason::INCORRECT_PAYLOAD, "reply {i}");
    }

    // After a failure the host may start again.
    let mut t = fresh();
    t.send(&[9; 8]);
    failure(&mut t);
    let (hash, seq, c) = challenged(&mut t, 8, &[3]);
    t.send(&reply(8, &host_response(hash, seq, &c, 8, &k.host), None));
    assert_eq!(t.receive()[1], ID_SUCCESS1);
    assert!(t.authenticated());
}

#[test]
fn command_fields_are_checked() {
    use crate::capsule::SqeBuilder;
    let sqe = |secp: u8, spsp: u8, len: u32| {
        SqeBuilder::new(0x7F, 0)
            .byte(4, AUTH_SEND)
            .byte(41, spsp)
            .byte(42, 1)
            .byte(43, secp)
            .cdw(11, len)
            .build()
    };
    assert_eq!(check_command(&sqe(SECP, 1, 72), Some(72)), Ok(()));
    assert_eq!(check_command(&sqe(SECP, 1, 72), None), Ok(()));
    for (s, n) in [
        (sqe(0xEA, 1, 72), Some(72)),
        (sqe(SECP, 2, 72), Some(72)),
        (sqe(SECP, 1, 0), None),
        (sqe(SECP, 1, 72), Some(71)),
    ] {
        assert_eq!(check_command(&s, n), Err(Status::INVALID_FIELD));
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 2048, ..Default::default() })]

    /// Any bytes, in any step: no panic, and every AUTH_Receive answer
    /// is a challenge, a success1 or a failure1 naming a known reason.
    #[test]
    fn any_message_in_any_step_is_answered(
        msgs in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200), 1..6),
        challenged_first in proptest::prelude::any::<bool>(),
    ) {
        let k = keys(true);
        let mut t = Transaction::new(k, HOST, SUB);
        // Idle, or waiting for a reply.
        if challenged_first {
            t.send(&negotiate(1, &[1, 2, 3], &[0, 1]));
            t.receive();
        }
        for m in msgs {
            let mut m = m;
            // Often a well-formed header, so that deeper checks are reached.
            if m.len() >= 2 && m[0] % 2 == 0 {
                m[0] = m[0] % 4 / 2;
                m[1] = [ID_NEGOTIATE, ID_REPLY, ID_SUCCESS2, ID_FAILURE2][usize::from(m[1]) % 4];
            }
            t.send(&m);
            let r = t.receive();
            proptest::prop_assert!(r.len() >= 8);
            match (r[0], r[1]) {
                (TYPE_DHCHAP, ID_CHALLENGE) | (TYPE_DHCHAP, ID_SUCCESS1) => {}
                (TYPE_COMMON, ID_FAILURE1) => {
                    proptest::prop_assert!((1..=7).contains(&r[7]), "reason {}", r[7]);
                }
                other => proptest::prop_assert!(false, "{other:?}"),
            }
        }
    }
}
