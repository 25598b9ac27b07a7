//! Decoding what clients send and encoding what the server answers, as
//! pure functions on byte buffers: no I/O here, so a fuzz target can drive
//! every decoder directly.

use thiserror::Error;

use crate::proto::*;

/// Input that breaks the protocol: the connection that sent it ends.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("bad magic {0:#x}")]
    BadMagic(u64),
    #[error("message is {got} bytes, {want} expected")]
    Short { got: usize, want: usize },
    #[error("a payload of {len} bytes is more than the {max} allowed")]
    PayloadTooBig { len: u64, max: u64 },
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn need(b: &[u8], want: usize) -> Result<(), DecodeError> {
    if b.len() < want {
        return Err(DecodeError::Short { got: b.len(), want });
    }
    Ok(())
}

/// An option the client sent during negotiation: its code and how many
/// bytes of data follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub len: u32,
}

/// The 16-byte option header.
pub fn decode_option_header(b: &[u8]) -> Result<OptionHeader, DecodeError> {
    need(b, 16)?;
    let magic = be64(b, 0);
    if magic != IHAVEOPT {
        return Err(DecodeError::BadMagic(magic));
    }
    Ok(OptionHeader {
        option: be32(b, 8),
        len: be32(b, 12),
    })
}

/// Option data that does not follow the option's layout: answered with
/// NBD_REP_ERR_INVALID, and negotiation goes on.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{0}")]
pub struct Invalid(pub &'static str);

/// A cursor over option data that fails with [`Invalid`] instead of
/// reading past the end.
struct Fields<'a> {
    b: &'a [u8],
}

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Invalid> {
        if self.b.len() < n {
            return Err(Invalid(what));
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, Invalid> {
        Ok(be16(self.take(2, what)?, 0))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, Invalid> {
        Ok(be32(self.take(4, what)?, 0))
    }

    /// A string prefixed by its 32-bit length, at most [`MAX_STRING`].
    fn string(&mut self, what: &'static str) -> Result<String, Invalid> {
        let len = self.u32(what)? as usize;
        if len > MAX_STRING {
            return Err(Invalid("a string is longer than 4096 bytes"));
        }
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| Invalid("a string is not UTF-8"))
    }

    fn end(&self) -> Result<(), Invalid> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(Invalid("the option has trailing bytes"))
        }
    }
}

/// NBD_OPT_INFO and NBD_OPT_GO: the export and the information asked for.
#[derive(Debug, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub infos: Vec<u16>,
}

pub fn parse_info_request(data: &[u8]) -> Result<InfoRequest, Invalid> {
    let mut f = Fields { b: data };
    let name = f.string("the export name is cut short")?;
    let count = f.u16("the information count is missing")?;
    let mut infos = Vec::with_capacity((count as usize).min(f.b.len() / 2));
    for _ in 0..count {
        infos.push(f.u16("the information list is cut short")?);
    }
    f.end()?;
    Ok(InfoRequest { name, infos })
}

/// NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT.
#[derive(Debug, PartialEq, Eq)]
pub struct MetaRequest {
    pub export: String,
    pub queries: Vec<String>,
}

pub fn parse_meta_request(data: &[u8]) -> Result<MetaRequest, Invalid> {
    let mut f = Fields { b: data };
    let export = f.string("the export name is cut short")?;
    let count = f.u32("the query count is missing")?;
    let mut queries = Vec::new();
    for _ in 0..count {
        queries.push(f.string("the query list is cut short")?);
    }
    f.end()?;
    Ok(MetaRequest { export, queries })
}

/// NBD_OPT_EXPORT_NAME carries the bare name.
pub fn parse_export_name(data: &[u8]) -> Result<String, Invalid> {
    if data.len() > MAX_STRING {
        return Err(Invalid("the export name is longer than 4096 bytes"));
    }
    String::from_utf8(data.to_vec()).map_err(|_| Invalid("the export name is not UTF-8"))
}

/// A request header as it arrived, before its meaning is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    /// Effect length, or payload length where the request carries one.
    pub length: u64,
}

impl RequestHeader {
    /// Bytes of payload following the header on the wire.
    pub fn payload_len(&self, extended: bool) -> u64 {
        let carries = if extended {
            self.flags & CMD_FLAG_PAYLOAD_LEN != 0
        } else {
            self.kind == CMD_WRITE
        };
        if carries {
            self.length
        } else {
            0
        }
    }
}

/// Bytes of a request header in the negotiated mode.
pub fn request_header_len(extended: bool) -> usize {
    if extended {
        EXTENDED_REQUEST_LEN
    } else {
        REQUEST_LEN
    }
}

/// A request header, compact (28 bytes) or extended (32 bytes). A payload
/// above `max_payload` breaks the connection: it cannot be skipped
/// without reading it all.
pub fn decode_request(
    b: &[u8],
    extended: bool,
    max_payload: u64,
) -> Result<RequestHeader, DecodeError> {
    need(b, request_header_len(extended))?;
    let magic = be32(b, 0);
    let want = if extended {
        EXTENDED_REQUEST_MAGIC
    } else {
        REQUEST_MAGIC
    };
    if magic != want {
        return Err(DecodeError::BadMagic(magic as u64));
    }
    let header = RequestHeader {
        flags: be16(b, 4),
        kind: be16(b, 6),
        cookie: be64(b, 8),
        offset: be64(b, 16),
        length: if extended {
            be64(b, 24)
        } else {
            be32(b, 24) as u64
        },
    };
    let payload = header.payload_len(extended);
    if payload > max_payload {
        return Err(DecodeError::PayloadTooBig {
            len: payload,
            max: max_payload,
        });
    }
    Ok(header)
}

/// What a connection agreed to in negotiation, as far as checking
/// requests needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Agreed {
    pub size: u64,
    pub read_only: bool,
    pub structured: bool,
    pub extended: bool,
    pub block_status: bool,
    pub max_payload: u64,
}

/// A request whose meaning has been checked against the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Read {
        offset: u64,
        len: u64,
        df: bool,
    },
    Write {
        offset: u64,
        len: u64,
        fua: bool,
    },
    Disconnect,
    Flush,
    Trim {
        offset: u64,
        len: u64,
        fua: bool,
    },
    Cache {
        offset: u64,
        len: u64,
    },
    WriteZeroes {
        offset: u64,
        len: u64,
        fua: bool,
        no_hole: bool,
        fast: bool,
    },
    BlockStatus {
        offset: u64,
        len: u64,
        req_one: bool,
    },
}

/// Longest range one block status request looks at: extent lengths of
/// compact replies are 32-bit; with extended headers, a bound on the work
/// of one request. Clients ask again from where a reply stops.
const MAX_STATUS_SCAN: u64 = 0xffff_f000;
const MAX_STATUS_SCAN_EXTENDED: u64 = 1 << 34;

/// A request the server answers with an error, the connection going on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused {
    pub error: u32,
    pub why: &'static str,
}

fn refuse(error: u32, why: &'static str) -> Refused {
    Refused { error, why }
}

/// Checks a request's flags, range and payload against what was agreed.
pub fn check_request(h: &RequestHeader, s: &Agreed) -> Result<Command, Refused> {
    let payload = h.payload_len(s.extended) > 0;
    let allowed = match h.kind {
        CMD_READ => CMD_FLAG_DF,
        CMD_WRITE => CMD_FLAG_PAYLOAD_LEN,
        CMD_WRITE_ZEROES => CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
        CMD_DISC | CMD_FLUSH | CMD_TRIM | CMD_CACHE => 0,
        _ => return Err(refuse(EINVAL, "unknown command")),
    } | CMD_FLAG_FUA;
    if h.flags & !allowed != 0 {
        return Err(refuse(EINVAL, "a flag the command does not take"));
    }
    if h.kind != CMD_WRITE && payload {
        return Err(refuse(EINVAL, "a payload on a command without one"));
    }
    if h.kind == CMD_WRITE && s.extended && !payload {
        return Err(refuse(EINVAL, "a write without its payload flag"));
    }
    let (offset, len) = (h.offset, h.length);
    let ranged = !matches!(h.kind, CMD_DISC | CMD_FLUSH);
    if ranged && offset.checked_add(len).is_none_or(|end| end > s.size) {
        return Err(refuse(EINVAL, "the range is beyond the export"));
    }
    let writes = matches!(h.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && s.read_only {
        return Err(refuse(EPERM, "the export is read-only"));
    }
    let fua = h.flags & CMD_FLAG_FUA != 0;
    Ok(match h.kind {
        CMD_READ => {
            if len > s.max_payload {
                return Err(refuse(EOVERFLOW, "a read longer than the maximum payload"));
            }
            Command::Read {
                offset,
                len,
                df: h.flags & CMD_FLAG_DF != 0,
            }
        }
        CMD_WRITE => Command::Write { offset, len, fua },
        CMD_DISC => Command::Disconnect,
        CMD_FLUSH => Command::Flush,
        CMD_TRIM => Command::Trim { offset, len, fua },
        // Caching is advice: at most one payload's worth is read ahead,
        // so one request cannot keep a thread reading for long.
        CMD_CACHE => Command::Cache {
            offset,
            len: len.min(s.max_payload),
        },
        CMD_WRITE_ZEROES => Command::WriteZeroes {
            offset,
            len,
            fua,
            no_hole: h.flags & CMD_FLAG_NO_HOLE != 0,
            fast: h.flags & CMD_FLAG_FAST_ZERO != 0,
        },
        _ => {
            if !s.block_status {
                return Err(refuse(EINVAL, "block status without a metadata context"));
            }
            if len == 0 {
                return Err(refuse(EINVAL, "block status of nothing"));
            }
            let scan = if s.extended {
                MAX_STATUS_SCAN_EXTENDED
            } else {
                MAX_STATUS_SCAN
            };
            Command::BlockStatus {
                offset,
                len: len.min(scan),
                req_one: h.flags & CMD_FLAG_REQ_ONE != 0,
            }
        }
    })
}

// ---- What the server sends ----

/// The server's greeting: magic, newstyle, and its handshake flags.
pub fn greeting() -> [u8; 18] {
    let mut b = [0; 18];
    b[..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[16..].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    b
}

/// An option reply with its data.
pub fn option_reply(option: u32, kind: u32, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// NBD_INFO_EXPORT: size and transmission flags.
pub fn info_export(size: u64, flags: u16) -> Vec<u8> {
    let mut b = INFO_EXPORT.to_be_bytes().to_vec();
    b.extend_from_slice(&size.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    b
}

/// NBD_INFO_NAME or NBD_INFO_DESCRIPTION: a string.
pub fn info_text(kind: u16, text: &str) -> Vec<u8> {
    let mut b = kind.to_be_bytes().to_vec();
    b.extend_from_slice(text.as_bytes());
    b
}

/// NBD_INFO_BLOCK_SIZE: minimum, preferred, maximum payload.
pub fn info_block_size(min: u32, preferred: u32, max: u32) -> Vec<u8> {
    let mut b = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
    for v in [min, preferred, max] {
        b.extend_from_slice(&v.to_be_bytes());
    }
    b
}

/// NBD_REP_SERVER data: a name and its description.
pub fn server_entry(name: &str, description: &str) -> Vec<u8> {
    let mut b = (name.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(description.as_bytes());
    b
}

/// NBD_REP_META_CONTEXT data.
pub fn meta_context(id: u32, name: &str) -> Vec<u8> {
    let mut b = id.to_be_bytes().to_vec();
    b.extend_from_slice(name.as_bytes());
    b
}

/// The answer to NBD_OPT_EXPORT_NAME: size, flags, and 124 zeros unless
/// the client asked for none.
pub fn export_name_reply(size: u64, flags: u16, zeroes: bool) -> Vec<u8> {
    let mut b = size.to_be_bytes().to_vec();
    b.extend_from_slice(&flags.to_be_bytes());
    if zeroes {
        b.extend_from_slice(&[0; 124]);
    }
    b
}

/// How replies are framed on this connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    Simple,
    Structured,
    Extended,
}

impl Framing {
    /// The framing negotiation agreed on.
    pub fn of(agreed: &Agreed) -> Framing {
        match (agreed.extended, agreed.structured) {
            (true, _) => Framing::Extended,
            (false, true) => Framing::Structured,
            _ => Framing::Simple,
        }
    }
}

/// A simple reply header.
pub fn simple_reply(error: u32, cookie: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(16);
    put_simple_reply(&mut b, error, cookie);
    b
}

/// [`simple_reply`] appended to `b`.
pub fn put_simple_reply(b: &mut Vec<u8>, error: u32, cookie: u64) {
    b.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&error.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
}

/// The header of one reply chunk, structured (20 bytes) or extended (32
/// bytes, carrying the request's offset), with `payload` bytes after it.
pub fn chunk_header(
    extended: bool,
    flags: u16,
    kind: u16,
    cookie: u64,
    request_offset: u64,
    payload: u64,
) -> Vec<u8> {
    let mut b = Vec::with_capacity(32 + 16);
    put_chunk_header(
        &mut b,
        extended,
        flags,
        kind,
        cookie,
        request_offset,
        payload,
    );
    b
}

/// [`chunk_header`] appended to `b`.
pub fn put_chunk_header(
    b: &mut Vec<u8>,
    extended: bool,
    flags: u16,
    kind: u16,
    cookie: u64,
    request_offset: u64,
    payload: u64,
) {
    let magic = if extended {
        EXTENDED_REPLY_MAGIC
    } else {
        STRUCTURED_REPLY_MAGIC
    };
    b.extend_from_slice(&magic.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    if extended {
        b.extend_from_slice(&request_offset.to_be_bytes());
        b.extend_from_slice(&payload.to_be_bytes());
    } else {
        b.extend_from_slice(&(payload as u32).to_be_bytes());
    }
}

/// NBD_REPLY_TYPE_ERROR payload: the error and a message for a human.
pub fn error_payload(error: u32, message: &str) -> Vec<u8> {
    let message = &message.as_bytes()[..message.len().min(MAX_STRING)];
    let mut b = error.to_be_bytes().to_vec();
    b.extend_from_slice(&(message.len() as u16).to_be_bytes());
    b.extend_from_slice(message);
    b
}

/// NBD_REPLY_TYPE_OFFSET_HOLE payload.
pub fn hole_payload(offset: u64, len: u32) -> Vec<u8> {
    let mut b = offset.to_be_bytes().to_vec();
    b.extend_from_slice(&len.to_be_bytes());
    b
}

/// One extent of a block status reply: its length and state flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub len: u64,
    pub flags: u32,
}

/// A block status chunk's type and payload: 32-bit descriptors, or with
/// extended headers 64-bit ones and a count.
pub fn block_status_payload(extended: bool, context: u32, extents: &[Extent]) -> (u16, Vec<u8>) {
    let mut b = context.to_be_bytes().to_vec();
    if extended {
        b.extend_from_slice(&(extents.len() as u32).to_be_bytes());
        for e in extents {
            b.extend_from_slice(&e.len.to_be_bytes());
            b.extend_from_slice(&(e.flags as u64).to_be_bytes());
        }
        (REPLY_TYPE_BLOCK_STATUS_EXT, b)
    } else {
        for e in extents {
            b.extend_from_slice(&(e.len.min(u32::MAX as u64) as u32).to_be_bytes());
            b.extend_from_slice(&e.flags.to_be_bytes());
        }
        (REPLY_TYPE_BLOCK_STATUS, b)
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
