//! In-band authentication with DH-HMAC-CHAP (Base 2.0, 8.13): a queue
//! of a host with a configured secret carries AUTH_Send and
//! AUTH_Receive commands only until the host has proved it knows its
//! secret (and, when it asks, the target has proved it knows the
//! controller's). Each queue authenticates on its own.
//!
//! The NULL Diffie-Hellman group is the one offered: a host that offers
//! only FFDHE groups is refused with "DH group not usable".

mod key;

use std::sync::Arc;

pub use key::{read_secret, Hash, Secret};

use crate::capsule::Sqe;
use crate::config::HostConfig;
use crate::status::Status;
use crate::wire::{le16, le32, put16, put32};

/// Fabrics command types.
pub const AUTH_SEND: u8 = 0x05;
pub const AUTH_RECEIVE: u8 = 0x06;
/// Security protocol: NVMe in-band authentication (SPC-5).
pub const SECP: u8 = 0xE9;

/// Message types and ids (Base 2.0, figures 596 and 597).
pub const TYPE_COMMON: u8 = 0x00;
pub const TYPE_DHCHAP: u8 = 0x01;
pub const ID_NEGOTIATE: u8 = 0x00;
pub const ID_CHALLENGE: u8 = 0x01;
pub const ID_REPLY: u8 = 0x02;
pub const ID_SUCCESS1: u8 = 0x03;
pub const ID_SUCCESS2: u8 = 0x04;
pub const ID_FAILURE2: u8 = 0xF0;
pub const ID_FAILURE1: u8 = 0xF1;
/// The protocol id of DH-HMAC-CHAP in a negotiate descriptor.
pub const PROTOCOL_DHCHAP: u8 = 0x01;
pub const DH_NULL: u8 = 0x00;
/// Failure reason code: authentication failure; and its explanations.
pub const REASON_FAILURE: u8 = 0x01;
pub mod reason {
    pub const FAILED: u8 = 0x01;
    pub const PROTOCOL_UNUSABLE: u8 = 0x02;
    pub const CONCAT_MISMATCH: u8 = 0x03;
    pub const HASH_UNUSABLE: u8 = 0x04;
    pub const DHGROUP_UNUSABLE: u8 = 0x05;
    pub const INCORRECT_PAYLOAD: u8 = 0x06;
    pub const INCORRECT_MESSAGE: u8 = 0x07;
}

/// The most an AUTH_Send may carry: a negotiate with 255 descriptors.
pub const MAX_MESSAGE: usize = 8 + 255 * 64;

/// A host's secrets: its own, and the controller's when the host may
/// ask the target to authenticate too.
#[derive(Debug)]
pub struct HostKeys {
    pub host: Secret,
    pub ctrl: Option<Secret>,
}

impl HostKeys {
    pub fn read(h: &HostConfig) -> Result<HostKeys, String> {
        Ok(HostKeys {
            host: read_secret(&h.dhchap_secret_file)?,
            ctrl: h
                .dhchap_ctrl_secret_file
                .as_ref()
                .map(read_secret)
                .transpose()?,
        })
    }
}

/// A response (Base 2.0, 8.13.5.5): the HMAC under `key` (transformed)
/// of the challenge, the sequence number, the transaction id, the
/// secure channel flag (none), who answers, and the two NQNs.
#[allow(clippy::too_many_arguments)]
pub fn response(
    hash: Hash,
    key: &[u8],
    challenge: &[u8],
    seq: u32,
    tid: u16,
    who: &[u8],
    first_nqn: &str,
    second_nqn: &str,
) -> Vec<u8> {
    hash.hmac(
        key,
        &[
            challenge,
            &seq.to_le_bytes(),
            &tid.to_le_bytes(),
            &[0],
            who,
            first_nqn.as_bytes(),
            &[0],
            second_nqn.as_bytes(),
        ],
    )
}

/// Compares without stopping at the first difference.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The fields of AUTH_Send and AUTH_Receive (Fabrics 2.0, 6.1 and 6.2):
/// the security protocol, and a length that is not zero (for AUTH_Send,
/// the data's length).
pub fn check_command(sqe: &Sqe, data_len: Option<usize>) -> Result<(), Status> {
    let b = &sqe.0;
    let len = le32(b, 44);
    if b[43] != SECP || b[41] != 0x01 || b[42] != 0x01 || len == 0 {
        return Err(Status::INVALID_FIELD);
    }
    match data_len {
        Some(n) if n != len as usize => Err(Status::INVALID_FIELD),
        _ => Ok(()),
    }
}

/// The commands a queue that must authenticate may run before it has.
pub fn allowed_before(sqe: &Sqe) -> bool {
    sqe.opcode() == crate::fabrics::OPCODE
        && matches!(
            sqe.fctype(),
            AUTH_SEND | AUTH_RECEIVE | crate::fabrics::DISCONNECT
        )
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    /// Waiting for a negotiate.
    Idle,
    /// The next AUTH_Receive gets the challenge.
    Challenge,
    /// Waiting for the host's reply.
    Reply,
    /// The next AUTH_Receive gets success1.
    Success1,
    /// Waiting for the host's success2 (or failure2).
    Success2,
    /// The next AUTH_Receive gets failure1 with this explanation.
    Failure1(u8),
}

/// One queue's authentication, as the controller runs it.
pub struct Transaction {
    keys: Arc<HostKeys>,
    host_nqn: String,
    subnqn: String,
    step: Step,
    tid: u16,
    hash: Hash,
    challenge: Vec<u8>,
    seq: u32,
    /// The controller's response, when the host asked for one.
    ctrl_response: Option<Vec<u8>>,
    authenticated: bool,
}

impl Transaction {
    pub fn new(keys: Arc<HostKeys>, host_nqn: &str, subnqn: &str) -> Transaction {
        Transaction {
            keys,
            host_nqn: host_nqn.into(),
            subnqn: subnqn.into(),
            step: Step::Idle,
            tid: 0,
            hash: Hash::Sha256,
            challenge: Vec::new(),
            seq: 0,
            ctrl_response: None,
            authenticated: false,
        }
    }

    pub fn authenticated(&self) -> bool {
        self.authenticated
    }

    /// The failure the next AUTH_Receive reports; authentication ends.
    fn fail(&mut self, why: u8) {
        tracing::info!(host = %self.host_nqn, subsystem = %self.subnqn, reason = why,
            "nvmf: authentication failed");
        self.step = Step::Failure1(why);
        self.authenticated = false;
        self.ctrl_response = None;
    }

    /// An AUTH_Send's message. Its command succeeds whatever the
    /// message; a bad one is answered by the next AUTH_Receive.
    pub fn send(&mut self, msg: &[u8]) {
        if msg.len() < 8 {
            return self.fail(reason::INCORRECT_PAYLOAD);
        }
        match (msg[0], msg[1]) {
            (TYPE_COMMON, ID_NEGOTIATE) => self.negotiate(msg),
            (TYPE_DHCHAP, ID_REPLY) if self.step == Step::Reply => self.reply(msg),
            (TYPE_DHCHAP, ID_SUCCESS2) if self.step == Step::Success2 => {
                if msg.len() != 16 || le16(msg, 4) != self.tid {
                    return self.fail(reason::INCORRECT_PAYLOAD);
                }
                self.step = Step::Idle;
                self.authenticated = true;
            }
            // A success2 after a one-way success (a host closing every
            // transaction the same way) changes nothing.
            (TYPE_DHCHAP, ID_SUCCESS2)
                if self.step == Step::Idle && self.authenticated && le16(msg, 4) == self.tid => {}
            (TYPE_COMMON, ID_FAILURE2) if self.step == Step::Success2 => {
                tracing::info!(host = %self.host_nqn, "nvmf: the host refused the controller's response");
                self.step = Step::Idle;
                self.authenticated = false;
            }
            _ => self.fail(reason::INCORRECT_MESSAGE),
        }
    }

    fn negotiate(&mut self, msg: &[u8]) {
        self.tid = le16(msg, 4);
        let napd = usize::from(msg[7]);
        if msg.len() != 8 + 64 * napd {
            return self.fail(reason::INCORRECT_PAYLOAD);
        }
        if msg[6] != 0 {
            return self.fail(reason::CONCAT_MISMATCH);
        }
        let Some(d) = msg[8..].chunks(64).find(|d| d[0] == PROTOCOL_DHCHAP) else {
            return self.fail(reason::PROTOCOL_UNUSABLE);
        };
        let (halen, dhlen) = (usize::from(d[2]), usize::from(d[3]));
        if halen > 30 || dhlen > 30 {
            return self.fail(reason::INCORRECT_PAYLOAD);
        }
        let hashes = &d[4..4 + halen];
        // The strongest hash the host offers.
        let Some(hash) = [Hash::Sha512, Hash::Sha384, Hash::Sha256]
            .into_iter()
            .find(|h| hashes.contains(&h.id()))
        else {
            return self.fail(reason::HASH_UNUSABLE);
        };
        if !d[34..34 + dhlen].contains(&DH_NULL) {
            return self.fail(reason::DHGROUP_UNUSABLE);
        }
        self.hash = hash;
        self.step = Step::Challenge;
    }

    fn reply(&mut self, msg: &[u8]) {
        let hl = self.hash.size();
        if msg.len() < 16 || usize::from(msg[6]) != hl {
            return self.fail(reason::INCORRECT_PAYLOAD);
        }
        let cvalid = msg[8];
        let dhvlen = usize::from(le16(msg, 10));
        let seq2 = le32(msg, 12);
        if msg.len() != 16 + 2 * hl + dhvlen
            || le16(msg, 4) != self.tid
            || dhvlen != 0
            || cvalid > 1
            || (cvalid == 1 && seq2 == 0)
        {
            return self.fail(reason::INCORRECT_PAYLOAD);
        }
        let expected = response(
            self.hash,
            &self.keys.host.transformed(&self.host_nqn),
            &self.challenge,
            self.seq,
            self.tid,
            b"HostHost",
            &self.host_nqn,
            &self.subnqn,
        );
        if !same(&msg[16..16 + hl], &expected) {
            return self.fail(reason::FAILED);
        }
        self.ctrl_response = None;
        if cvalid == 1 {
            let Some(ctrl) = &self.keys.ctrl else {
                // Asked to prove a secret the target was not given.
                return self.fail(reason::FAILED);
            };
            self.ctrl_response = Some(response(
                self.hash,
                &ctrl.transformed(&self.subnqn),
                &msg[16 + hl..16 + 2 * hl],
                seq2,
                self.tid,
                b"Controller",
                &self.subnqn,
                &self.host_nqn,
            ));
        }
        self.step = Step::Success1;
    }

    /// What an AUTH_Receive gets.
    pub fn receive(&mut self) -> Vec<u8> {
        let hl = self.hash.size();
        match std::mem::replace(&mut self.step, Step::Idle) {
            Step::Challenge => {
                self.challenge = (0..hl).map(|_| rand::random::<u8>()).collect();
                self.seq = rand::random::<u32>().max(1);
                let mut m = vec![0u8; 16];
                m[0] = TYPE_DHCHAP;
                m[1] = ID_CHALLENGE;
                put16(&mut m, 4, self.tid);
                m[6] = hl as u8;
                m[8] = self.hash.id();
                m[9] = DH_NULL;
                put32(&mut m, 12, self.seq);
                m.extend_from_slice(&self.challenge);
                self.step = Step::Reply;
                m
            }
            Step::Success1 => {
                let mut m = vec![0u8; 16];
                m[0] = TYPE_DHCHAP;
                m[1] = ID_SUCCESS1;
                put16(&mut m, 4, self.tid);
                // Linux's host reads the hash length whether or not a
                // response follows.
                m[6] = hl as u8;
                match self.ctrl_response.take() {
                    Some(r) => {
                        m[8] = 1;
                        m.extend_from_slice(&r);
                        self.step = Step::Success2;
                    }
                    None => self.authenticated = true,
                }
                m
            }
            Step::Failure1(why) => self.failure1(why),
            _ => {
                self.fail(reason::INCORRECT_MESSAGE);
                self.step = Step::Idle;
                self.failure1(reason::INCORRECT_MESSAGE)
            }
        }
    }

    fn failure1(&self, why: u8) -> Vec<u8> {
        let mut m = vec![0u8; 8];
        m[0] = TYPE_COMMON;
        m[1] = ID_FAILURE1;
        put16(&mut m, 4, self.tid);
        m[6] = REASON_FAILURE;
        m[7] = why;
        m
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
