//! What a node and the witness say, after the node proved the pair's
//! secret with the link's handshake (the witness listens under the name
//! [`WITNESS_NAME`]). Each message is one frame of the link's format
//! (kind, length, CRC32C) of at most [`MAX_MESSAGE`] bytes; decoding
//! checks every length against the bytes there and never panics.

use std::io;
use std::time::Duration;

use super::lease::Verdict;
use crate::link::handshake::MAX_NAME;
use crate::mirror::generations::Generations;
use crate::mirror::wire::{generations, put_generations};
use crate::wire::{malformed, put_str, Reader};

/// The name the witness proves the secret under.
pub const WITNESS_NAME: &str = "witness";
/// No message is longer: two names, generations and a few numbers.
pub const MAX_MESSAGE: usize = 1024;
/// Mirror (device) names longer than this are refused.
pub const MAX_MIRROR_NAME: usize = 255;

pub(crate) const CLAIM: u8 = 1;
pub(crate) const RELEASE: u8 = 2;
pub(crate) const ANSWER: u8 = 3;

/// A node's request: the sender is the node that proved the secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Grant or renew the lease of `mirror` of the pair with `peer`.
    Claim {
        peer: String,
        mirror: String,
        generations: Generations,
        lease: Duration,
    },
    /// Give the lease up (a planned demotion).
    Release { peer: String, mirror: String },
}

/// Whether `name` can be a node's or a mirror's name here: printable,
/// no blanks (the witness's state file is one record a line).
pub fn name_ok(name: &str, max: usize) -> bool {
    !name.is_empty() && name.len() <= max && name.chars().all(|c| c.is_ascii_graphic())
}

fn names(r: &mut Reader<'_>) -> io::Result<(String, String)> {
    let peer = r.str()?.to_string();
    let mirror = r.str()?.to_string();
    if !name_ok(&peer, MAX_NAME) || !name_ok(&mirror, MAX_MIRROR_NAME) {
        return Err(malformed(
            "a node or mirror name that is empty, too long or not printable",
        ));
    }
    Ok((peer, mirror))
}

fn millis(d: Duration) -> u32 {
    d.as_millis().min(u32::MAX as u128) as u32
}

impl Request {
    /// The frame kind and payload.
    pub fn encode(&self) -> (u8, Vec<u8>) {
        let mut b = Vec::new();
        match self {
            Request::Claim {
                peer,
                mirror,
                generations,
                lease,
            } => {
                put_str(&mut b, peer);
                put_str(&mut b, mirror);
                put_generations(&mut b, generations);
                b.extend_from_slice(&millis(*lease).to_le_bytes());
                (CLAIM, b)
            }
            Request::Release { peer, mirror } => {
                put_str(&mut b, peer);
                put_str(&mut b, mirror);
                (RELEASE, b)
            }
        }
    }

    pub fn decode(kind: u8, payload: &[u8]) -> io::Result<Request> {
        let mut r = Reader::new(payload);
        let (peer, mirror) = names(&mut r)?;
        let req = match kind {
            CLAIM => Request::Claim {
                peer,
                mirror,
                generations: generations(&mut r)?,
                lease: Duration::from_millis(r.u32()?.into()),
            },
            RELEASE => Request::Release { peer, mirror },
            x => return Err(malformed(format!("witness request {x}"))),
        };
        r.end()?;
        Ok(req)
    }
}

/// The witness's answer: its verdict, or why it could not decide.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Verdict(Verdict),
    Refused(String),
}

pub fn encode_answer(a: &Answer) -> Vec<u8> {
    let mut b = Vec::new();
    match a {
        Answer::Verdict(Verdict::Granted { lease, generations }) => {
            b.push(0);
            b.extend_from_slice(&millis(*lease).to_le_bytes());
            put_generations(&mut b, generations);
        }
        Answer::Verdict(Verdict::Held { holder, left }) => {
            b.push(1);
            put_str(&mut b, holder);
            b.extend_from_slice(&millis(*left).to_le_bytes());
        }
        Answer::Verdict(Verdict::Behind {
            holder,
            generations,
        }) => {
            b.push(2);
            put_str(&mut b, holder);
            put_generations(&mut b, generations);
        }
        Answer::Verdict(Verdict::Released) => b.push(3),
        Answer::Verdict(Verdict::Full) => b.push(4),
        Answer::Refused(why) => {
            b.push(5);
            put_str(&mut b, &why[..why.len().min(MAX_MESSAGE / 2)]);
        }
    }
    b
}

pub fn decode_answer(payload: &[u8]) -> io::Result<Answer> {
    let mut r = Reader::new(payload);
    let ms =
        |r: &mut Reader<'_>| -> io::Result<Duration> { Ok(Duration::from_millis(r.u32()?.into())) };
    let a = match r.u8()? {
        0 => Answer::Verdict(Verdict::Granted {
            lease: ms(&mut r)?,
            generations: generations(&mut r)?,
        }),
        1 => Answer::Verdict(Verdict::Held {
            holder: r.str()?.to_string(),
            left: ms(&mut r)?,
        }),
        2 => Answer::Verdict(Verdict::Behind {
            holder: r.str()?.to_string(),
            generations: generations(&mut r)?,
        }),
        3 => Answer::Verdict(Verdict::Released),
        4 => Answer::Verdict(Verdict::Full),
        5 => Answer::Refused(r.str()?.to_string()),
        x => return Err(malformed(format!("witness answer {x}"))),
    };
    r.end()?;
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn gens() -> Generations {
        Generations {
            current: 11,
            bitmap: 10,
            history: [9, 8],
        }
    }

    #[test]
    fn requests_and_answers_round_trip() {
        let reqs = [
            Request::Claim {
                peer: "b".into(),
                mirror: "vm".into(),
                generations: gens(),
                lease: Duration::from_millis(3000),
            },
            Request::Release {
                peer: "b".into(),
                mirror: "vm".into(),
            },
        ];
        for r in reqs {
            let (kind, p) = r.encode();
            assert_eq!(Request::decode(kind, &p).unwrap(), r);
            assert!(Request::decode(kind, &p[..p.len() - 1]).is_err());
            let mut long = p.clone();
            long.push(0);
            assert!(Request::decode(kind, &long).is_err());
        }
        let answers = [
            Answer::Verdict(Verdict::Granted {
                lease: Duration::from_secs(3),
                generations: gens(),
            }),
            Answer::Verdict(Verdict::Held {
                holder: "a".into(),
                left: Duration::from_millis(1500),
            }),
            Answer::Verdict(Verdict::Behind {
                holder: "a".into(),
                generations: gens(),
            }),
            Answer::Verdict(Verdict::Released),
            Answer::Verdict(Verdict::Full),
            Answer::Refused("no".into()),
        ];
        for a in answers {
            assert_eq!(decode_answer(&encode_answer(&a)).unwrap(), a);
        }
    }

    #[test]
    fn names_with_blanks_or_too_long_are_refused() {
        for (peer, mirror) in [
            ("b c", "vm"),
            ("b", "v\nm"),
            ("", "vm"),
            ("b", &*"m".repeat(256)),
        ] {
            let (kind, p) = Request::Release {
                peer: peer.into(),
                mirror: mirror.into(),
            }
            .encode();
            assert!(Request::decode(kind, &p).is_err(), "{peer:?} {mirror:?}");
        }
    }

    proptest! {
        #[test]
        fn any_bytes_decode_to_a_value_or_an_error(kind in 0u8..8, b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Request::decode(kind, &b);
            let _ = decode_answer(&b);
        }
    }
}
