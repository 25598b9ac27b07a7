//! The host's side of DH-HMAC-CHAP: the messages it sends, and a whole
//! transaction on one queue.

use std::io;

use crate::auth::{self, response, Hash, Secret};
use crate::capsule::SqeBuilder;
use crate::wire::{le16, le32, put16, put32};

use super::{failed, Command, Completion, Queue, Who};

/// How a host authenticates: its secret, the controller's when it asks
/// the target to authenticate too, and what it offers.
#[derive(Clone, Debug)]
pub struct HostAuth {
    pub secret: Secret,
    pub ctrl_secret: Option<Secret>,
    /// Hash ids offered, in the host's order.
    pub hashes: Vec<u8>,
    /// DH group ids offered.
    pub dhgroups: Vec<u8>,
}

impl HostAuth {
    /// Offering what Linux's host offers: every hash, every group.
    pub fn new(secret: Secret) -> HostAuth {
        HostAuth {
            secret,
            ctrl_secret: None,
            hashes: vec![1, 2, 3],
            dhgroups: vec![0, 1, 2, 3, 4, 5],
        }
    }
}

/// Why a transaction did not succeed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthFailure {
    /// The target's failure1: its reason code explanation.
    Refused(u8),
    /// The controller's response was wrong (the host sent failure2).
    Controller,
}

/// AUTH_Negotiate with one DH-HMAC-CHAP descriptor.
pub fn negotiate(tid: u16, hashes: &[u8], dhgroups: &[u8]) -> Vec<u8> {
    let mut m = vec![0u8; 8 + 64];
    m[0] = auth::TYPE_COMMON;
    m[1] = auth::ID_NEGOTIATE;
    put16(&mut m, 4, tid);
    m[7] = 1;
    let d = &mut m[8..];
    d[0] = auth::PROTOCOL_DHCHAP;
    d[2] = hashes.len() as u8;
    d[3] = dhgroups.len() as u8;
    d[4..4 + hashes.len()].copy_from_slice(hashes);
    d[34..34 + dhgroups.len()].copy_from_slice(dhgroups);
    m
}

/// DH-HMAC-CHAP_Reply: the response, and the host's challenge (with
/// its sequence number) when it wants the controller's response.
pub fn reply(tid: u16, rval: &[u8], challenge: Option<(&[u8], u32)>) -> Vec<u8> {
    let hl = rval.len();
    let mut m = vec![0u8; 16 + 2 * hl];
    m[0] = auth::TYPE_DHCHAP;
    m[1] = auth::ID_REPLY;
    put16(&mut m, 4, tid);
    m[6] = hl as u8;
    m[16..16 + hl].copy_from_slice(rval);
    if let Some((c, seq)) = challenge {
        m[8] = 1;
        put32(&mut m, 12, seq);
        m[16 + hl..].copy_from_slice(c);
    }
    m
}

pub fn success2(tid: u16) -> Vec<u8> {
    let mut m = vec![0u8; 16];
    m[0] = auth::TYPE_DHCHAP;
    m[1] = auth::ID_SUCCESS2;
    put16(&mut m, 4, tid);
    m
}

pub fn failure2(tid: u16, why: u8) -> Vec<u8> {
    let mut m = vec![0u8; 8];
    m[0] = auth::TYPE_COMMON;
    m[1] = auth::ID_FAILURE2;
    put16(&mut m, 4, tid);
    m[6] = auth::REASON_FAILURE;
    m[7] = why;
    m
}

fn auth_sqe(fctype: u8, len: u32) -> SqeBuilder {
    SqeBuilder::new(0x7F, 0)
        .byte(4, fctype)
        .byte(41, 1)
        .byte(42, 1)
        .byte(43, auth::SECP)
        .cdw(11, len)
}

impl Queue {
    /// AUTH_Send of `msg`.
    pub async fn auth_send(&mut self, msg: Vec<u8>) -> io::Result<Completion> {
        let sqe = auth_sqe(auth::AUTH_SEND, msg.len() as u32);
        self.one(Command::new(sqe).sending(msg)).await
    }

    /// AUTH_Receive of at most `len` bytes.
    pub async fn auth_receive(&mut self, len: u32) -> io::Result<Completion> {
        self.one(Command::new(auth_sqe(auth::AUTH_RECEIVE, len)).reading(len as usize))
            .await
    }

    async fn auth_message(&mut self) -> io::Result<Vec<u8>> {
        let c = self.auth_receive(4096).await?;
        super::expect_success(&c, "AUTH_Receive")?;
        if c.data.len() < 8 {
            return Err(failed(format!("a {}-byte message", c.data.len())));
        }
        Ok(c.data)
    }

    /// A whole transaction with id `tid`: negotiate, challenge, reply,
    /// success1 (checking the controller's response when asked for),
    /// success2.
    pub async fn authenticate(
        &mut self,
        who: &Who,
        a: &HostAuth,
        tid: u16,
    ) -> io::Result<Result<(), AuthFailure>> {
        let sent = self
            .auth_send(negotiate(tid, &a.hashes, &a.dhgroups))
            .await?;
        super::expect_success(&sent, "AUTH_Send, negotiate")?;
        let m = self.auth_message().await?;
        if m[1] == auth::ID_FAILURE1 {
            return Ok(Err(AuthFailure::Refused(m[7])));
        }
        let hash = Hash::from_id(m[8]).ok_or_else(|| failed(format!("hash {}", m[8])))?;
        let hl = usize::from(m[6]);
        if m[1] != auth::ID_CHALLENGE || hl != hash.size() || m.len() < 16 + hl || m[9] != 0 {
            return Err(failed("not a challenge of the NULL group".into()));
        }
        if le16(&m, 4) != tid {
            return Err(failed("the challenge names another transaction".into()));
        }
        let rval = response(
            hash,
            &a.secret.transformed(&who.host_nqn),
            &m[16..16 + hl],
            le32(&m, 12),
            tid,
            b"HostHost",
            &who.host_nqn,
            &who.subnqn,
        );
        let mine: Vec<u8> = (0..hl).map(|_| rand::random::<u8>()).collect();
        let seq2 = rand::random::<u32>().max(1);
        let challenge = a.ctrl_secret.as_ref().map(|_| (&mine[..], seq2));
        let sent = self.auth_send(reply(tid, &rval, challenge)).await?;
        super::expect_success(&sent, "AUTH_Send, reply")?;
        let m = self.auth_message().await?;
        if m[1] == auth::ID_FAILURE1 {
            return Ok(Err(AuthFailure::Refused(m[7])));
        }
        if m[1] != auth::ID_SUCCESS1 {
            return Err(failed(format!("message {:#x} for success1", m[1])));
        }
        let Some(ctrl) = &a.ctrl_secret else {
            return Ok(Ok(()));
        };
        let expected = response(
            hash,
            &ctrl.transformed(&who.subnqn),
            &mine,
            seq2,
            tid,
            b"Controller",
            &who.subnqn,
            &who.host_nqn,
        );
        if m[8] != 1 || m.len() < 16 + hl || m[16..16 + hl] != expected[..] {
            let c = self.auth_send(failure2(tid, auth::reason::FAILED)).await?;
            super::expect_success(&c, "AUTH_Send, failure2")?;
            return Ok(Err(AuthFailure::Controller));
        }
        let c = self.auth_send(success2(tid)).await?;
        super::expect_success(&c, "AUTH_Send, success2")?;
        Ok(Ok(()))
    }
}

/// Connect's dword 0 asks the host to authenticate (AUTHREQ.ATR).
pub fn must_authenticate(connect: &Completion) -> bool {
    connect.cqe.result & 1 << 17 != 0
}
