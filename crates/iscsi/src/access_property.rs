//! Property test of the login path with CHAP and initiator groups: an
//! initiator that does not know the secret never reaches the full feature
//! phase, whatever it sends and however it reacts to the target's
//! challenges (wrong secrets, responses to other challenges, reflected
//! challenges, stage games, skipping the security stage), and an
//! initiator outside every group never logs in to a guarded target.

use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use scsi_api::testing::NoLuns;

use crate::access::{AccessList, AccessPolicy, Group, InitiatorPattern, TargetAccess};
use crate::auth_chap::{
    chap_response, ChapAuthenticator, ChapCredentials, ChapRequirement, Secret,
};
use crate::login::{LoginMachine, LoginStep, TargetDirectory, TargetInfo};
use crate::negotiation::TargetLimits;
use crate::pdu::initiator::LoginRequest;
use crate::text;

const SECRET: &str = "the-real-secret";
const CHAP_TARGET: &str = "iqn.t:chap";
const GROUP_TARGET: &str = "iqn.t:groups";
const MEMBER: &str = "iqn.i:member";
const STRANGER: &str = "iqn.i:stranger";

fn requirement(mutual: bool) -> ChapRequirement {
    ChapRequirement {
        initiator: ChapCredentials {
            user: "alice".into(),
            secret: Secret::new(SECRET).unwrap(),
        },
        mutual: mutual.then(|| ChapCredentials {
            user: "array".into(),
            secret: Secret::new("the-target-secret").unwrap(),
        }),
    }
}

fn access(mutual: bool) -> Arc<AccessList> {
    let mut list = AccessList::new();
    list.set_target(
        CHAP_TARGET,
        TargetAccess {
            groups: Vec::new(),
            default_view: Some(Arc::new(NoLuns)),
            chap: Some(requirement(mutual)),
        },
    );
    list.set_target(
        GROUP_TARGET,
        TargetAccess {
            groups: vec![Group {
                name: "members".into(),
                members: vec![InitiatorPattern::new("iqn.i:mem*")],
                view: Arc::new(NoLuns),
                chap: None,
            }],
            default_view: None,
            chap: None,
        },
    );
    list.discovery_chap = Some(requirement(mutual));
    Arc::new(list)
}

struct Directory(Arc<AccessList>);
impl TargetDirectory for Directory {
    fn target_info(&self, name: &str) -> Option<TargetInfo> {
        [CHAP_TARGET, GROUP_TARGET]
            .contains(&name)
            .then_some(TargetInfo {
                portal_group: 1,
                alias: None,
            })
    }
    fn admits(&self, initiator: &str, name: &str) -> bool {
        !self.0.admit(initiator, name).is_refused()
    }
}

/// One key an attacker may send; values that depend on the target's last
/// challenge are computed when the request is built.
#[derive(Clone, Debug)]
enum Key {
    Initiator(u8),
    Target(u8),
    Discovery,
    AuthMethod(u8),
    ChapA(u8),
    ChapN(bool),
    /// 0 random, 1 wrong secret on the live challenge, 2 the right secret
    /// on another challenge (a replay), 3 empty, 4 malformed.
    ChapR(u8, [u8; 16]),
    /// Mutual CHAP challenge: random, or the target's own reflected.
    ChapIc(bool, [u8; 16]),
    Operational,
}

fn key() -> impl Strategy<Value = Key> {
    prop_oneof![
        (0u8..3).prop_map(Key::Initiator),
        (0u8..3).prop_map(Key::Target),
        Just(Key::Discovery),
        (0u8..4).prop_map(Key::AuthMethod),
        (0u8..3).prop_map(Key::ChapA),
        any::<bool>().prop_map(Key::ChapN),
        ((0u8..5), any::<[u8; 16]>()).prop_map(|(k, b)| Key::ChapR(k, b)),
        (any::<bool>(), any::<[u8; 16]>()).prop_map(|(r, b)| Key::ChapIc(r, b)),
        Just(Key::Operational),
    ]
}

#[derive(Clone, Debug)]
struct Request {
    csg: u8,
    nsg: u8,
    transit: bool,
    keys: Vec<Key>,
}

/// A login's first request: who to what, with authentication offered;
/// later ones may be anything, but mostly stay in the security stage so
/// that the exchange gets as far as the challenge.
fn opening() -> impl Strategy<Value = Request> {
    (
        0u8..3,
        prop_oneof![(0u8..3).prop_map(Key::Target), Just(Key::Discovery)],
        0u8..4,
        any::<bool>(),
    )
        .prop_map(|(initiator, target, method, transit)| Request {
            csg: 0,
            nsg: 1,
            transit,
            keys: vec![Key::Initiator(initiator), target, Key::AuthMethod(method)],
        })
}

/// Any request at all.
fn raw_request() -> impl Strategy<Value = Request> {
    (
        0u8..4,
        0u8..4,
        any::<bool>(),
        proptest::collection::vec(key(), 0..6),
    )
        .prop_map(|(csg, nsg, transit, keys)| Request {
            csg,
            nsg,
            transit,
            keys,
        })
}

/// Moves that follow the protocol (algorithm, response, operational
/// stage) with attacker-chosen values, mixed with arbitrary requests, so
/// most logins get as far as answering a challenge.
fn request() -> impl Strategy<Value = Request> {
    let algorithm = (0u8..3).prop_map(|a| Request {
        csg: 0,
        nsg: 1,
        transit: false,
        keys: vec![Key::ChapA(a)],
    });
    let respond = (
        any::<bool>(),
        (0u8..5),
        any::<[u8; 16]>(),
        proptest::option::of((any::<bool>(), any::<[u8; 16]>())),
        prop_oneof![Just(1u8), Just(3u8)],
        any::<bool>(),
    )
        .prop_map(|(name, kind, bytes, mutual, nsg, transit)| {
            let mut keys = vec![Key::ChapN(name), Key::ChapR(kind, bytes)];
            if let Some((reflect, challenge)) = mutual {
                keys.push(Key::ChapIc(reflect, challenge));
            }
            Request {
                csg: 0,
                nsg,
                transit,
                keys,
            }
        });
    let operational = any::<bool>().prop_map(|transit| Request {
        csg: 1,
        nsg: 3,
        transit,
        keys: vec![Key::Operational],
    });
    prop_oneof![
        3 => algorithm,
        4 => respond,
        2 => operational,
        2 => raw_request(),
    ]
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The target's last CHAP_I and CHAP_C, as an attacker watching sees them.
#[derive(Default)]
struct Seen {
    id: u8,
    challenge: Vec<u8>,
}

fn encode(keys: &[Key], seen: &Seen) -> Vec<u8> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for k in keys {
        let (name, value) = match k {
            Key::Initiator(i) => (
                "InitiatorName",
                [MEMBER, STRANGER, "iqn.i:memXYZ"][usize::from(*i)].to_string(),
            ),
            Key::Target(t) => (
                "TargetName",
                [CHAP_TARGET, GROUP_TARGET, "iqn.t:none"][usize::from(*t)].to_string(),
            ),
            Key::Discovery => ("SessionType", "Discovery".to_string()),
            Key::AuthMethod(m) => (
                "AuthMethod",
                ["CHAP", "None", "CHAP,None", "SRP"][usize::from(*m)].to_string(),
            ),
            Key::ChapA(a) => ("CHAP_A", ["5", "7", "7,5"][usize::from(*a)].to_string()),
            Key::ChapN(right) => (
                "CHAP_N",
                if *right { "alice" } else { "mallory" }.to_string(),
            ),
            Key::ChapR(kind, bytes) => {
                let value = match kind {
                    0 => format!("0x{}", hex(bytes)),
                    1 => format!(
                        "0x{}",
                        hex(&chap_response(seen.id, "not-the-secret", &seen.challenge))
                    ),
                    2 => {
                        // A response that was right for some other challenge.
                        let mut other = seen.challenge.clone();
                        other.push(bytes[0]);
                        format!("0x{}", hex(&chap_response(seen.id, SECRET, &other)))
                    }
                    3 => "0x".to_string(),
                    _ => "zz".to_string(),
                };
                ("CHAP_R", value)
            }
            Key::ChapIc(reflect, bytes) => {
                let challenge = if *reflect {
                    seen.challenge.clone()
                } else {
                    bytes.to_vec()
                };
                pairs.push(("CHAP_I".into(), seen.id.to_string()));
                ("CHAP_C", format!("0x{}", hex(&challenge)))
            }
            Key::Operational => ("MaxBurstLength", "65536".to_string()),
        };
        // A repeated key would only end the login early; keep the first.
        if !pairs.iter().any(|(n, _)| n == name) {
            pairs.push((name.to_string(), value));
        }
    }
    text::encode(&pairs)
}

fn login_request(r: &Request, data: Vec<u8>) -> LoginRequest {
    LoginRequest {
        transit: r.transit,
        continue_: false,
        csg: r.csg,
        nsg: r.nsg,
        version_max: 0,
        version_min: 0,
        isid: [0x80, 0, 0, 0, 0, 1],
        tsih: 0,
        itt: 1,
        cid: 0,
        cmdsn: 1,
        exp_statsn: 0,
        data: Bytes::from(data),
    }
}

/// Runs one login; returns the initiator and target names of a login that
/// reached the full feature phase.
fn attempt(requests: &[Request], mutual: bool) -> Option<(String, Option<String>)> {
    let list = access(mutual);
    let directory = Directory(list.clone());
    let mut machine = LoginMachine::new(
        TargetLimits::default(),
        Arc::new(ChapAuthenticator::new(list)),
        1,
        16,
    );
    let mut seen = Seen::default();
    for r in requests {
        let req = login_request(r, encode(&r.keys, &seen));
        match machine.step(&req, &directory) {
            LoginStep::Reply(reply) => {
                for (k, v) in text::parse(&reply.text).unwrap_or_default() {
                    match k.as_str() {
                        "CHAP_I" => seen.id = v.parse().unwrap_or(0),
                        "CHAP_C" => {
                            seen.challenge = crate::auth_chap::decode_binary(&v).unwrap_or_default()
                        }
                        _ => {}
                    }
                }
            }
            LoginStep::Fail(..) => return None,
            LoginStep::Complete(_, result) => {
                return Some((result.initiator_name, result.target_name))
            }
        }
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn no_way_in_without_the_secret(
        first in opening(),
        rest in proptest::collection::vec(request(), 0..7),
        mutual in any::<bool>(),
    ) {
        let mut requests = vec![first];
        requests.extend(rest);
        if let Some((initiator, target)) = attempt(&requests, mutual) {
            // The only door without a secret: a group member logging in
            // to the target guarded by groups alone.
            prop_assert_eq!(target.as_deref(), Some(GROUP_TARGET));
            prop_assert!(initiator.starts_with("iqn.i:mem"), "{}", initiator);
        }
    }
}

/// The harness can log in with the secret, so the property above is not
/// vacuous.
#[test]
fn the_secret_opens_the_door() {
    let list = access(false);
    let directory = Directory(list.clone());
    let mut machine = LoginMachine::new(
        TargetLimits::default(),
        Arc::new(ChapAuthenticator::new(list)),
        1,
        16,
    );
    let first = Request {
        csg: 0,
        nsg: 1,
        transit: true,
        keys: vec![Key::Initiator(1), Key::Target(0), Key::AuthMethod(2)],
    };
    let mut seen = Seen::default();
    let step = machine.step(
        &login_request(&first, encode(&first.keys, &seen)),
        &directory,
    );
    assert!(matches!(step, LoginStep::Reply(_)));
    let algorithm = Request {
        csg: 0,
        nsg: 1,
        transit: false,
        keys: vec![Key::ChapA(0)],
    };
    let LoginStep::Reply(reply) = machine.step(
        &login_request(&algorithm, encode(&algorithm.keys, &seen)),
        &directory,
    ) else {
        panic!("expected a challenge")
    };
    for (k, v) in text::parse(&reply.text).unwrap() {
        match k.as_str() {
            "CHAP_I" => seen.id = v.parse().unwrap(),
            "CHAP_C" => seen.challenge = crate::auth_chap::decode_binary(&v).unwrap(),
            _ => {}
        }
    }
    let answer = text::encode(&[
        ("CHAP_N".to_string(), "alice".to_string()),
        (
            "CHAP_R".to_string(),
            format!(
                "0x{}",
                hex(&chap_response(seen.id, SECRET, &seen.challenge))
            ),
        ),
    ]);
    let respond = Request {
        csg: 0,
        nsg: 3,
        transit: true,
        keys: vec![],
    };
    let step = machine.step(&login_request(&respond, answer), &directory);
    let LoginStep::Complete(_, result) = step else {
        panic!("expected to log in: {step:?}")
    };
    assert_eq!(result.target_name.as_deref(), Some(CHAP_TARGET));
}
