//! CHAP authentication of the login (RFC 1994 with the iSCSI keys of
//! RFC 7143 section 12.1.3), one-way and mutual.
//!
//! The target offers CHAP with MD5 (`CHAP_A=5`), a fresh 16-byte
//! challenge from the OS random source and a random identifier for every
//! login, so a response recorded from another login never matches again.
//! Responses are compared in constant time. For mutual CHAP the target
//! refuses a challenge equal to its own (the reflection attack) and answers
//! with the target credentials. Secrets never appear in `Debug` output or
//! in log lines.

use std::sync::Arc;

use md5::{Digest, Md5};
use rand::rngs::OsRng;
use rand::RngCore;

use crate::auth::{AuthExchange, AuthStep, Authenticator};
pub use export::{ChapCredentials, ChapRequirement, Secret, MAX_SECRET_LEN, MIN_SECRET_LEN};

/// Length of the challenge the target sends.
pub const CHALLENGE_LEN: usize = 16;
/// Longest challenge accepted from an initiator (decoded bytes).
const MAX_PEER_CHALLENGE: usize = 1024;
/// The only CHAP algorithm offered: MD5.
const ALGORITHM_MD5: &str = "5";

/// Decides which CHAP, if any, a login needs.
pub trait ChapPolicy: Send + Sync {
    /// `target` is `None` for a discovery session. `None` means the login
    /// needs no authentication.
    fn chap_for(&self, initiator: &str, target: Option<&str>) -> Option<ChapRequirement>;
}

/// The [`Authenticator`] that runs CHAP where the policy asks for it and
/// accepts `AuthMethod=None` elsewhere.
pub struct ChapAuthenticator {
    policy: Arc<dyn ChapPolicy>,
}

impl ChapAuthenticator {
    pub fn new(policy: Arc<dyn ChapPolicy>) -> ChapAuthenticator {
        ChapAuthenticator { policy }
    }
}

impl Authenticator for ChapAuthenticator {
    fn begin(&self, initiator: &str, target: Option<&str>) -> Box<dyn AuthExchange> {
        let requirement = self.policy.chap_for(initiator, target);
        let mut challenge = [0u8; CHALLENGE_LEN];
        OsRng.fill_bytes(&mut challenge);
        let mut id = [0u8; 1];
        OsRng.fill_bytes(&mut id);
        Box::new(ChapExchange::new(requirement, id[0], challenge))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Waiting for AuthMethod.
    Start,
    /// CHAP chosen; waiting for CHAP_A.
    Algorithm,
    /// Challenge sent; waiting for CHAP_N and CHAP_R.
    Challenged,
    Done,
    Failed,
}

/// One login's CHAP conversation.
pub struct ChapExchange {
    requirement: Option<ChapRequirement>,
    id: u8,
    challenge: [u8; CHALLENGE_LEN],
    state: State,
    /// Why the exchange failed, for the log (never a secret).
    failure: Option<&'static str>,
}

fn value<'a>(keys: &'a [(String, String)], name: &str) -> Option<&'a str> {
    keys.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

impl ChapExchange {
    /// An exchange with a given identifier and challenge (random in
    /// [`ChapAuthenticator`]; fixed in tests).
    pub fn new(requirement: Option<ChapRequirement>, id: u8, challenge: [u8; 16]) -> Self {
        ChapExchange {
            requirement,
            id,
            challenge,
            state: State::Start,
            failure: None,
        }
    }

    fn fail(&mut self, reason: &'static str) -> AuthStep {
        self.state = State::Failed;
        self.failure = Some(reason);
        AuthStep::Failed
    }

    /// No authentication required: choose `None`, like the plain hook.
    fn step_open(&mut self, keys: &[(String, String)]) -> AuthStep {
        let mut answers = Vec::new();
        for (key, v) in keys {
            if key == "AuthMethod" {
                if v.split(',').any(|m| m == "None") {
                    answers.push((key.clone(), "None".to_string()));
                } else {
                    return self.fail("AuthMethod offers no None, and none is required");
                }
            } else {
                answers.push((key.clone(), "Irrelevant".to_string()));
            }
        }
        self.state = State::Done;
        AuthStep::Done(answers)
    }

    fn offer_challenge(&mut self, algorithms: &str) -> AuthStep {
        if !algorithms.split(',').any(|a| a.trim() == ALGORITHM_MD5) {
            return self.fail("no CHAP_A=5 (MD5) offered");
        }
        self.state = State::Challenged;
        AuthStep::Continue(vec![
            ("CHAP_A".into(), ALGORITHM_MD5.into()),
            ("CHAP_I".into(), self.id.to_string()),
            ("CHAP_C".into(), format!("0x{}", hex(&self.challenge))),
        ])
    }

    fn check_response(&mut self, req: &ChapRequirement, keys: &[(String, String)]) -> AuthStep {
        let (Some(name), Some(response)) = (value(keys, "CHAP_N"), value(keys, "CHAP_R")) else {
            return self.fail("CHAP_N or CHAP_R missing");
        };
        let Some(response) = decode_binary(response) else {
            return self.fail("CHAP_R is not a binary value");
        };
        let expected = chap_response(self.id, req.initiator.secret.expose(), &self.challenge);
        // Compare the name and the response both, always, so timing says
        // nothing about which was wrong.
        let name_ok = constant_time_eq(name.as_bytes(), req.initiator.user.as_bytes());
        let response_ok = constant_time_eq(&response, &expected);
        if !(name_ok & response_ok) {
            // Decided after both comparisons: the log may say which.
            return self.fail(if name_ok {
                "wrong CHAP secret"
            } else {
                "unknown CHAP user"
            });
        }
        let peer_id = value(keys, "CHAP_I");
        let peer_challenge = value(keys, "CHAP_C");
        let answers = match (&req.mutual, peer_id, peer_challenge) {
            (None, None, None) => Vec::new(),
            (Some(target), Some(id), Some(challenge)) => {
                let Some(id) = parse_id(id) else {
                    return self.fail("mutual CHAP_I is not a number");
                };
                let Some(challenge) = decode_binary(challenge) else {
                    return self.fail("mutual CHAP_C is not a binary value");
                };
                if challenge.is_empty()
                    || challenge.len() > MAX_PEER_CHALLENGE
                    || challenge == self.challenge
                {
                    return self
                        .fail("mutual CHAP_C empty, too long, or the target's own challenge");
                }
                let answer = chap_response(id, target.secret.expose(), &challenge);
                vec![
                    ("CHAP_N".into(), target.user.clone()),
                    ("CHAP_R".into(), format!("0x{}", hex(&answer))),
                ]
            }
            // Mutual CHAP asked for by one side only.
            _ => return self.fail("mutual CHAP asked for by one side only"),
        };
        self.state = State::Done;
        AuthStep::Done(answers)
    }
}

impl AuthExchange for ChapExchange {
    fn step(&mut self, keys: &[(String, String)]) -> AuthStep {
        let Some(req) = self.requirement.clone() else {
            return self.step_open(keys);
        };
        match self.state {
            State::Start => {
                let Some(methods) = value(keys, "AuthMethod") else {
                    return self.fail("AuthMethod missing");
                };
                if !methods.split(',').any(|m| m == "CHAP") {
                    return self.fail("AuthMethod without CHAP");
                }
                self.state = State::Algorithm;
                match value(keys, "CHAP_A") {
                    // Algorithm offered in the same request.
                    Some(a) => match self.offer_challenge(a) {
                        AuthStep::Continue(mut more) => {
                            more.insert(0, ("AuthMethod".into(), "CHAP".into()));
                            AuthStep::Continue(more)
                        }
                        other => other,
                    },
                    None => AuthStep::Continue(vec![("AuthMethod".into(), "CHAP".into())]),
                }
            }
            State::Algorithm => match value(keys, "CHAP_A") {
                Some(a) => self.offer_challenge(a),
                None => self.fail("CHAP_A missing"),
            },
            State::Challenged => self.check_response(&req, keys),
            // Authentication is over; any further key is out of place.
            State::Done if keys.is_empty() => AuthStep::Done(Vec::new()),
            State::Done | State::Failed => {
                self.fail("authentication keys after the exchange ended")
            }
        }
    }

    fn complete(&self) -> bool {
        self.state == State::Done
    }

    fn allows_skipping_security(&self) -> bool {
        self.requirement.is_none()
    }

    fn awaits_proof(&self) -> bool {
        self.state == State::Challenged
    }

    fn failure_reason(&self) -> Option<&'static str> {
        self.failure
    }
}

/// MD5(identifier || secret || challenge), RFC 1994 section 4.1.
pub fn chap_response(id: u8, secret: &str, challenge: &[u8]) -> [u8; 16] {
    let mut h = Md5::new();
    h.update([id]);
    h.update(secret.as_bytes());
    h.update(challenge);
    h.finalize().into()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A CHAP_I value: decimal, or hexadecimal with `0x`.
fn parse_id(text: &str) -> Option<u8> {
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(h) => u8::from_str_radix(h, 16).ok(),
        None => text.parse::<u8>().ok(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A binary value of RFC 7143 5.1: `0x` hexadecimal or `0b` base64.
pub fn decode_binary(text: &str) -> Option<Vec<u8>> {
    if let Some(h) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        // An odd number of digits has an implied leading zero.
        let padded;
        let h = if h.len() % 2 == 1 {
            padded = format!("0{h}");
            padded.as_str()
        } else {
            h
        };
        return h
            .as_bytes()
            .chunks(2)
            .map(|pair| {
                let s = std::str::from_utf8(pair).ok()?;
                u8::from_str_radix(s, 16).ok()
            })
            .collect();
    }
    if let Some(b) = text.strip_prefix("0b").or_else(|| text.strip_prefix("0B")) {
        return decode_base64(b);
    }
    None
}

fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHALLENGE: [u8; 16] = [7; 16];

    fn kv(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn creds(user: &str, secret: &str) -> ChapCredentials {
        ChapCredentials {
            user: user.into(),
            secret: Secret::new(secret).unwrap(),
        }
    }

    fn one_way() -> ChapRequirement {
        ChapRequirement {
            initiator: creds("alice", "alice-secret-1"),
            mutual: None,
        }
    }

    fn mutual() -> ChapRequirement {
        ChapRequirement {
            initiator: creds("alice", "alice-secret-1"),
            mutual: Some(creds("target", "target-secret-1")),
        }
    }

    /// Runs AuthMethod and CHAP_A, returns the challenge keys.
    fn to_challenge(ex: &mut ChapExchange) -> Vec<(String, String)> {
        assert_eq!(
            ex.step(&kv(&[("AuthMethod", "CHAP,None")])),
            AuthStep::Continue(kv(&[("AuthMethod", "CHAP")]))
        );
        let AuthStep::Continue(keys) = ex.step(&kv(&[("CHAP_A", "7,5")])) else {
            panic!("expected a challenge")
        };
        keys
    }

    fn answer(secret: &str) -> String {
        format!("0x{}", hex(&chap_response(42, secret, &CHALLENGE)))
    }

    #[test]
    fn rfc1321_vectors() {
        let digest: [u8; 16] = Md5::digest(b"abc").into();
        assert_eq!(hex(&digest), "900150983cd24fb0d6963f7d28e17f72");
        // id 0, secret "", challenge "" is MD5 of one zero byte.
        assert_eq!(
            hex(&chap_response(0, "", b"")),
            "93b885adfe0da089cdf634904fd59f71"
        );
    }

    #[test]
    fn one_way_chap_succeeds_with_the_secret() {
        let mut ex = ChapExchange::new(Some(one_way()), 42, CHALLENGE);
        assert!(!ex.allows_skipping_security());
        let keys = to_challenge(&mut ex);
        assert_eq!(
            keys,
            kv(&[
                ("CHAP_A", "5"),
                ("CHAP_I", "42"),
                ("CHAP_C", &format!("0x{}", hex(&CHALLENGE))),
            ])
        );
        assert!(!ex.complete());
        let step = ex.step(&kv(&[
            ("CHAP_N", "alice"),
            ("CHAP_R", &answer("alice-secret-1")),
        ]));
        assert_eq!(step, AuthStep::Done(vec![]));
        assert!(ex.complete());
        assert_eq!(ex.step(&[]), AuthStep::Done(vec![]));
    }

    #[test]
    fn wrong_secret_name_or_shape_fails() {
        let wrong = "wrong CHAP secret";
        let unknown = "unknown CHAP user";
        let missing = "CHAP_N or CHAP_R missing";
        let garbled = "CHAP_R is not a binary value";
        for (keys, reason) in [
            (
                kv(&[("CHAP_N", "alice"), ("CHAP_R", &answer("wrong-secret-11"))]),
                wrong,
            ),
            (
                kv(&[("CHAP_N", "mallory"), ("CHAP_R", &answer("alice-secret-1"))]),
                unknown,
            ),
            (kv(&[("CHAP_N", "alice")]), missing),
            (kv(&[("CHAP_R", &answer("alice-secret-1"))]), missing),
            (kv(&[("CHAP_N", "alice"), ("CHAP_R", "0xzz")]), garbled),
            (kv(&[("CHAP_N", "alice"), ("CHAP_R", "plain")]), garbled),
        ] {
            let mut ex = ChapExchange::new(Some(one_way()), 42, CHALLENGE);
            assert!(!ex.awaits_proof());
            to_challenge(&mut ex);
            assert!(ex.awaits_proof(), "the next step checks the proof");
            assert_eq!(ex.step(&keys), AuthStep::Failed, "{keys:?}");
            assert!(!ex.complete());
            assert!(!ex.awaits_proof());
            assert_eq!(ex.failure_reason(), Some(reason));
            // A failed exchange stays failed.
            assert_eq!(
                ex.step(&kv(&[
                    ("CHAP_N", "alice"),
                    ("CHAP_R", &answer("alice-secret-1"))
                ])),
                AuthStep::Failed
            );
        }
    }

    #[test]
    fn a_response_to_another_challenge_is_refused() {
        // Recorded from a login whose challenge was different.
        let mut ex = ChapExchange::new(Some(one_way()), 42, [9; 16]);
        to_challenge(&mut ex);
        let replay = kv(&[("CHAP_N", "alice"), ("CHAP_R", &answer("alice-secret-1"))]);
        assert_eq!(ex.step(&replay), AuthStep::Failed);
    }

    #[test]
    fn none_is_refused_when_chap_is_required() {
        let mut ex = ChapExchange::new(Some(one_way()), 1, CHALLENGE);
        assert_eq!(ex.step(&kv(&[("AuthMethod", "None")])), AuthStep::Failed);
        let mut ex = ChapExchange::new(Some(one_way()), 1, CHALLENGE);
        assert_eq!(ex.step(&[]), AuthStep::Failed);
        let mut ex = ChapExchange::new(Some(one_way()), 1, CHALLENGE);
        ex.step(&kv(&[("AuthMethod", "CHAP")]));
        assert_eq!(ex.step(&kv(&[("CHAP_A", "6,7")])), AuthStep::Failed);
        // Skipping CHAP_A straight to a response is refused.
        let mut ex = ChapExchange::new(Some(one_way()), 42, CHALLENGE);
        ex.step(&kv(&[("AuthMethod", "CHAP")]));
        assert_eq!(
            ex.step(&kv(&[
                ("CHAP_N", "alice"),
                ("CHAP_R", &answer("alice-secret-1"))
            ])),
            AuthStep::Failed
        );
    }

    #[test]
    fn algorithm_in_the_first_request() {
        let mut ex = ChapExchange::new(Some(one_way()), 42, CHALLENGE);
        let AuthStep::Continue(keys) = ex.step(&kv(&[("AuthMethod", "CHAP"), ("CHAP_A", "5")]))
        else {
            panic!()
        };
        assert_eq!(keys[0], ("AuthMethod".into(), "CHAP".into()));
        assert_eq!(keys.len(), 4);
    }

    #[test]
    fn mutual_chap_answers_the_initiator_challenge() {
        let mut ex = ChapExchange::new(Some(mutual()), 42, CHALLENGE);
        to_challenge(&mut ex);
        let theirs = [3u8; 32];
        let step = ex.step(&kv(&[
            ("CHAP_N", "alice"),
            ("CHAP_R", &answer("alice-secret-1")),
            ("CHAP_I", "1"),
            ("CHAP_C", &format!("0x{}", hex(&theirs))),
        ]));
        let want = format!("0x{}", hex(&chap_response(1, "target-secret-1", &theirs)));
        assert_eq!(
            step,
            AuthStep::Done(kv(&[("CHAP_N", "target"), ("CHAP_R", &want)]))
        );
        assert!(ex.complete());
    }

    #[test]
    fn mutual_chap_mismatches_fail() {
        let good = || {
            vec![
                ("CHAP_N".to_string(), "alice".to_string()),
                ("CHAP_R".to_string(), answer("alice-secret-1")),
            ]
        };
        // Initiator asks to authenticate a target that has no credentials.
        let mut ex = ChapExchange::new(Some(one_way()), 42, CHALLENGE);
        to_challenge(&mut ex);
        let mut keys = good();
        keys.extend(kv(&[("CHAP_I", "1"), ("CHAP_C", "0x0102")]));
        assert_eq!(ex.step(&keys), AuthStep::Failed);
        // Target requires mutual CHAP, the initiator sends no challenge.
        let mut ex = ChapExchange::new(Some(mutual()), 42, CHALLENGE);
        to_challenge(&mut ex);
        assert_eq!(ex.step(&good()), AuthStep::Failed);
        // The initiator reflects the target's own challenge.
        let mut ex = ChapExchange::new(Some(mutual()), 42, CHALLENGE);
        to_challenge(&mut ex);
        let mut keys = good();
        keys.extend(kv(&[
            ("CHAP_I", "42"),
            ("CHAP_C", &format!("0x{}", hex(&CHALLENGE))),
        ]));
        assert_eq!(ex.step(&keys), AuthStep::Failed);
        // Bad identifier or empty challenge.
        for (i, c) in [("300", "0x0102"), ("x", "0x0102"), ("1", "0x")] {
            let mut ex = ChapExchange::new(Some(mutual()), 42, CHALLENGE);
            to_challenge(&mut ex);
            let mut keys = good();
            keys.extend(kv(&[("CHAP_I", i), ("CHAP_C", c)]));
            assert_eq!(ex.step(&keys), AuthStep::Failed, "{i} {c}");
        }
    }

    #[test]
    fn open_policy_behaves_like_no_authentication() {
        let mut ex = ChapExchange::new(None, 0, CHALLENGE);
        assert!(ex.allows_skipping_security());
        assert_eq!(
            ex.step(&kv(&[("AuthMethod", "CHAP,None")])),
            AuthStep::Done(kv(&[("AuthMethod", "None")]))
        );
        let mut ex = ChapExchange::new(None, 0, CHALLENGE);
        assert_eq!(ex.step(&kv(&[("AuthMethod", "CHAP")])), AuthStep::Failed);
    }

    #[test]
    fn secrets_are_checked_and_hidden() {
        assert!(Secret::new("short").is_err());
        assert!(Secret::new(&"x".repeat(256)).is_err());
        assert!(Secret::new("twelve-bytes\n").is_err());
        let s = Secret::new("twelve-bytes").unwrap();
        assert_eq!(format!("{s:?}"), "Secret(***)");
        let c = ChapCredentials {
            user: "u".into(),
            secret: s,
        };
        assert!(!format!("{c:?}").contains("twelve"));
    }

    #[test]
    fn binary_values() {
        assert_eq!(decode_binary("0x0a0B"), Some(vec![10, 11]));
        assert_eq!(decode_binary("0xabc"), Some(vec![0x0a, 0xbc]));
        assert_eq!(decode_binary("0bAQID"), Some(vec![1, 2, 3]));
        assert_eq!(decode_binary("0bAQI="), Some(vec![1, 2]));
        assert_eq!(decode_binary("0b@@"), None);
        assert_eq!(decode_binary("0x\u{e9}"), None);
        assert_eq!(decode_binary("12"), None);
    }

    #[test]
    fn authenticator_challenges_differ_between_logins() {
        struct Always;
        impl ChapPolicy for Always {
            fn chap_for(&self, _: &str, _: Option<&str>) -> Option<ChapRequirement> {
                Some(one_way())
            }
        }
        let auth = ChapAuthenticator::new(Arc::new(Always));
        let challenge = |ex: &mut Box<dyn AuthExchange>| {
            ex.step(&kv(&[("AuthMethod", "CHAP")]));
            match ex.step(&kv(&[("CHAP_A", "5")])) {
                AuthStep::Continue(keys) => keys[2].1.clone(),
                other => panic!("{other:?}"),
            }
        };
        let mut a = auth.begin("iqn.i", Some("iqn.t"));
        let mut b = auth.begin("iqn.i", Some("iqn.t"));
        assert_ne!(challenge(&mut a), challenge(&mut b));
    }
}
