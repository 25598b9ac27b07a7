//! Framing a command's outcome as the bytes of its reply.

use bytes::Bytes;

use crate::handshake::ALLOCATION_CONTEXT;
use crate::ops::{Outcome, Piece};
use crate::proto::*;
use crate::wire::{self, Framing};

/// The request a reply answers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Answering {
    pub cookie: u64,
    pub offset: u64,
}

/// The reply to `req` as buffers to write one after another.
pub(crate) fn encode(framing: Framing, req: Answering, outcome: Outcome) -> Vec<Bytes> {
    match framing {
        Framing::Simple => simple(req, outcome),
        Framing::Structured | Framing::Extended => structured(framing, req, outcome),
    }
}

fn done(framing: Framing, req: Answering) -> Vec<Bytes> {
    let mut b = Vec::with_capacity(32);
    put_done(framing, req, &mut b);
    vec![b.into()]
}

/// Appends the reply to a success without payload (`Outcome::Done`) to
/// `b`. It is a simple reply wherever structured replies allow one (any
/// request but a READ, which always ends in `Outcome::Read`): 16 bytes
/// that libnbd takes with one `recv`, where a chunk header costs it two.
/// Extended headers allow no simple reply.
pub(crate) fn put_done(framing: Framing, req: Answering, b: &mut Vec<u8>) {
    match framing {
        Framing::Simple | Framing::Structured => wire::put_simple_reply(b, 0, req.cookie),
        Framing::Extended => wire::put_chunk_header(
            b,
            true,
            REPLY_FLAG_DONE,
            REPLY_TYPE_NONE,
            req.cookie,
            req.offset,
            0,
        ),
    }
}

fn simple(req: Answering, outcome: Outcome) -> Vec<Bytes> {
    match outcome {
        Outcome::Done => done(Framing::Simple, req),
        Outcome::Failed { error, .. } => vec![wire::simple_reply(error, req.cookie).into()],
        // Simple replies carry a read as one run of bytes, holes as zeros.
        Outcome::Read { buf, .. } => vec![wire::simple_reply(0, req.cookie).into(), buf.into()],
        // Block status is only agreed with structured replies.
        Outcome::Extents(_) => vec![wire::simple_reply(EINVAL, req.cookie).into()],
    }
}

/// `framing` is structured or extended.
fn structured(framing: Framing, req: Answering, outcome: Outcome) -> Vec<Bytes> {
    let ext = framing == Framing::Extended;
    let header = |flags, kind, len: usize| -> Bytes {
        wire::chunk_header(ext, flags, kind, req.cookie, req.offset, len as u64).into()
    };
    match outcome {
        Outcome::Done => done(framing, req),
        Outcome::Failed { error, message } => {
            let p = wire::error_payload(error, &message);
            vec![header(REPLY_FLAG_DONE, REPLY_TYPE_ERROR, p.len()), p.into()]
        }
        Outcome::Extents(extents) => {
            let (kind, p) = wire::block_status_payload(ext, ALLOCATION_CONTEXT, &extents);
            vec![header(REPLY_FLAG_DONE, kind, p.len()), p.into()]
        }
        Outcome::Read { buf, pieces } => {
            if pieces.is_empty() {
                return vec![header(REPLY_FLAG_DONE, REPLY_TYPE_NONE, 0)];
            }
            let buf = Bytes::from(buf);
            let last = pieces.len() - 1;
            let mut out = Vec::with_capacity(pieces.len() * 3);
            for (i, piece) in pieces.into_iter().enumerate() {
                let flags = if i == last { REPLY_FLAG_DONE } else { 0 };
                match piece {
                    Piece::Data { at, len } => {
                        out.push(header(flags, REPLY_TYPE_OFFSET_DATA, 8 + len));
                        let offset = req.offset + at as u64;
                        out.push(Bytes::copy_from_slice(&offset.to_be_bytes()));
                        out.push(buf.slice(at..at + len));
                    }
                    Piece::Hole { at, len } => {
                        out.push(header(flags, REPLY_TYPE_OFFSET_HOLE, 12));
                        let p = wire::hole_payload(req.offset + at as u64, len as u32);
                        out.push(p.into());
                    }
                }
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answering(cookie: u64, offset: u64) -> Answering {
        Answering { cookie, offset }
    }

    fn join(parts: Vec<Bytes>) -> Vec<u8> {
        parts.iter().flat_map(|b| b.iter().copied()).collect()
    }

    #[test]
    fn a_sparse_read_is_data_then_a_final_hole() {
        let req = answering(9, 1000);
        let outcome = Outcome::Read {
            buf: vec![5; 30],
            pieces: vec![
                Piece::Data { at: 0, len: 10 },
                Piece::Hole { at: 10, len: 20 },
            ],
        };
        let b = join(encode(Framing::Structured, req, outcome));
        // Data chunk: 20-byte header, 8-byte offset, 10 bytes.
        assert_eq!(&b[0..4], &STRUCTURED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&b[4..6], &0u16.to_be_bytes());
        assert_eq!(&b[6..8], &REPLY_TYPE_OFFSET_DATA.to_be_bytes());
        assert_eq!(&b[16..20], &18u32.to_be_bytes());
        assert_eq!(&b[20..28], &1000u64.to_be_bytes());
        assert_eq!(&b[28..38], &[5; 10]);
        // Hole chunk, marked done.
        let h = &b[38..];
        assert_eq!(&h[4..6], &REPLY_FLAG_DONE.to_be_bytes());
        assert_eq!(&h[6..8], &REPLY_TYPE_OFFSET_HOLE.to_be_bytes());
        assert_eq!(&h[20..28], &1010u64.to_be_bytes());
        assert_eq!(&h[28..32], &20u32.to_be_bytes());
        assert_eq!(h.len(), 32);
    }

    /// A success without payload is a simple reply unless headers are
    /// extended; extended replies carry the request's offset.
    #[test]
    fn extended_replies_carry_the_request_offset() {
        let req = answering(1, 4096);
        let b = join(encode(Framing::Extended, req, Outcome::Done));
        assert_eq!(b.len(), 32);
        assert_eq!(&b[0..4], &EXTENDED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&b[16..24], &4096u64.to_be_bytes());
        let simple = join(encode(Framing::Structured, req, Outcome::Done));
        assert_eq!(simple, wire::simple_reply(0, 1));
        // Errors keep their message in a chunk.
        let failed = Outcome::Failed {
            error: EIO,
            message: "gone".into(),
        };
        let chunk = join(encode(Framing::Structured, req, failed));
        assert_eq!(&chunk[0..4], &STRUCTURED_REPLY_MAGIC.to_be_bytes());
        let b = join(encode(
            Framing::Simple,
            req,
            Outcome::Failed {
                error: EIO,
                message: String::new(),
            },
        ));
        assert_eq!(&b[4..8], &EIO.to_be_bytes());
    }
}
