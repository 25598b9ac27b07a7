//! What the two halves of a mirror say to each other over the link.

use std::io;

use block::{DeviceError, ErrorClass};

use super::generations::Generations;
use super::Role;
use crate::link::NO_SUCH_DEVICE;
use crate::wire::{malformed, put_str, Reader};

/// A replica's state, sent as a notice at connect and whenever its role
/// or generations change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct State {
    pub role: Role,
    pub data_size: u64,
    pub generations: Generations,
    pub was_primary: bool,
    pub inconsistent: bool,
    /// Which opening of the sender's mirror this is: another value on
    /// the same session means it was opened again.
    pub incarnation: u64,
    pub node: String,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// Foreground data from the primary (generation `gen`), or resync
    /// data from the sync source.
    Write {
        gen: u64,
        offset: u64,
        fua: bool,
        resync: bool,
        data: &'a [u8],
    },
    Zeroes {
        gen: u64,
        offset: u64,
        len: u64,
    },
    Flush,
    /// The target's bitmap, for the source to copy those regions too.
    Bitmap,
    /// The resync ended: adopt these generations.
    ResyncDone {
        generations: Generations,
    },
    /// A planned failover: the peer asks this primary to demote.
    StepDown,
}

pub(crate) fn put_generations(b: &mut Vec<u8>, g: &Generations) {
    for v in [g.current, g.bitmap, g.history[0], g.history[1]] {
        b.extend_from_slice(&v.to_le_bytes());
    }
}

pub(crate) fn generations(r: &mut Reader<'_>) -> io::Result<Generations> {
    Ok(Generations {
        current: r.u64()?,
        bitmap: r.u64()?,
        history: [r.u64()?, r.u64()?],
    })
}

impl State {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![self.role as u8];
        b.extend_from_slice(&self.data_size.to_le_bytes());
        put_generations(&mut b, &self.generations);
        b.push(self.was_primary as u8 | (self.inconsistent as u8) << 1);
        b.extend_from_slice(&self.incarnation.to_le_bytes());
        put_str(&mut b, &self.node);
        b
    }

    pub fn decode(b: &[u8]) -> io::Result<State> {
        let mut r = Reader::new(b);
        let role = match r.u8()? {
            0 => Role::Secondary,
            1 => Role::Primary,
            x => return Err(malformed(format!("role {x}"))),
        };
        let data_size = r.u64()?;
        let generations = generations(&mut r)?;
        let flags = r.u8()?;
        let incarnation = r.u64()?;
        let node = r.str()?.to_string();
        r.end()?;
        Ok(State {
            role,
            data_size,
            generations,
            was_primary: flags & 1 != 0,
            inconsistent: flags & 2 != 0,
            incarnation,
            node,
        })
    }
}

impl Request<'_> {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        match self {
            Request::Write {
                gen,
                offset,
                fua,
                resync,
                data,
            } => {
                b.push(1);
                b.extend_from_slice(&gen.to_le_bytes());
                b.extend_from_slice(&offset.to_le_bytes());
                b.push(*fua as u8 | (*resync as u8) << 1);
                b.extend_from_slice(data);
            }
            Request::Zeroes { gen, offset, len } => {
                b.push(2);
                for v in [gen, offset, len] {
                    b.extend_from_slice(&v.to_le_bytes());
                }
            }
            Request::Flush => b.push(3),
            Request::Bitmap => b.push(4),
            Request::ResyncDone { generations } => {
                b.push(5);
                put_generations(&mut b, generations);
            }
            Request::StepDown => b.push(6),
        }
        b
    }

    pub fn decode(b: &[u8]) -> io::Result<Request<'_>> {
        let mut r = Reader::new(b);
        let req = match r.u8()? {
            1 => {
                let gen = r.u64()?;
                let offset = r.u64()?;
                let flags = r.u8()?;
                if flags & !3 != 0 {
                    return Err(malformed(format!("write flags {flags:#x}")));
                }
                Request::Write {
                    gen,
                    offset,
                    fua: flags & 1 != 0,
                    resync: flags & 2 != 0,
                    data: r.rest(),
                }
            }
            2 => Request::Zeroes {
                gen: r.u64()?,
                offset: r.u64()?,
                len: r.u64()?,
            },
            3 => Request::Flush,
            4 => Request::Bitmap,
            5 => Request::ResyncDone {
                generations: generations(&mut r)?,
            },
            6 => Request::StepDown,
            x => return Err(malformed(format!("mirror request {x}"))),
        };
        r.end()?;
        Ok(req)
    }
}

/// The body of a reply.
pub fn ok(data: &[u8]) -> Vec<u8> {
    let mut b = vec![0];
    b.extend_from_slice(data);
    b
}

pub fn err(e: &io::Error) -> Vec<u8> {
    let class = block::classify(e);
    let index = ErrorClass::ALL
        .iter()
        .position(|c| *c == class)
        .unwrap_or(0);
    let mut b = vec![1, index as u8];
    put_str(&mut b, &e.to_string());
    b
}

/// A reply's data, or the peer's error as this node's.
pub fn reply(body: &[u8], peer: &str) -> io::Result<Vec<u8>> {
    let mut r = Reader::new(body);
    match r.u8()? {
        0 => Ok(r.rest().to_vec()),
        1 => {
            let class = ErrorClass::ALL
                .get(r.u8()? as usize)
                .copied()
                .unwrap_or(ErrorClass::Medium);
            let why = r.str()?;
            Err(DeviceError::new(class, format!("{peer}: {why}")).into())
        }
        NO_SUCH_DEVICE => {
            let name = r.str()?;
            Err(DeviceError::new(
                ErrorClass::NotReady,
                format!("{peer} has no mirror {name:?}"),
            )
            .into())
        }
        x => Err(malformed(format!("reply status {x}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_write_with_flags(flags: u8) -> Vec<u8> {
        let mut b = vec![1];
        b.extend_from_slice(&[0; 16]);
        b.push(flags);
        b.extend_from_slice(b"data");
        b
    }

    #[test]
    fn messages_round_trip_and_junk_is_refused() {
        let s = State {
            role: Role::Primary,
            data_size: 1 << 30,
            generations: Generations {
                current: 9,
                bitmap: 8,
                history: [7, 6],
            },
            was_primary: true,
            inconsistent: false,
            incarnation: 77,
            node: "a".into(),
        };
        assert_eq!(State::decode(&s.encode()).unwrap(), s);
        let data = [5u8; 100];
        for req in [
            Request::Write {
                gen: 3,
                offset: 4096,
                fua: true,
                resync: false,
                data: &data,
            },
            Request::Zeroes {
                gen: 3,
                offset: 0,
                len: 10,
            },
            Request::Flush,
            Request::Bitmap,
            Request::ResyncDone {
                generations: s.generations,
            },
            Request::StepDown,
        ] {
            assert_eq!(Request::decode(&req.encode()).unwrap(), req);
        }
        assert!(Request::decode(&[9]).is_err());
        let mut odd = data_write_with_flags(4);
        assert!(Request::decode(&odd).is_err(), "unknown write flags");
        odd[17] = 3;
        assert!(Request::decode(&odd).is_ok());
        assert!(Request::decode(&[2, 1]).is_err());
        assert!(Request::decode(&[3, 0]).is_err());
        assert!(State::decode(&s.encode()[..20]).is_err());
        assert!(reply(&[], "b").is_err());
        let e = reply(
            &err(&DeviceError::new(ErrorClass::Fenced, "stale").into()),
            "b",
        )
        .unwrap_err();
        assert_eq!(block::classify(&e), ErrorClass::Fenced);
        assert_eq!(e.to_string(), "b: stale");
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_decode_without_a_panic_and_round_trip(
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..96)
        ) {
            if let Ok(req) = Request::decode(&data) {
                proptest::prop_assert_eq!(req.encode(), data.clone());
            }
            if let Ok(state) = State::decode(&data) {
                proptest::prop_assert_eq!(State::decode(&state.encode()).unwrap(), state);
            }
            let _ = reply(&data, "b");
        }
    }
}
