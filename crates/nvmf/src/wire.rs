//! NVMe/TCP PDUs (NVMe/TCP Transport Specification 1.0, 3.6) encoded and
//! decoded as pure functions on bytes: no I/O here, so random input can
//! drive every decoder. Input that breaks the framing is a [`Fatal`]: the
//! receiver answers it with a termination request and closes the
//! connection.

use thiserror::Error;

/// PDU types (3.6.1, figure 22).
pub mod kind {
    pub const IC_REQ: u8 = 0x00;
    pub const IC_RESP: u8 = 0x01;
    pub const H2C_TERM: u8 = 0x02;
    pub const C2H_TERM: u8 = 0x03;
    pub const CAPSULE_CMD: u8 = 0x04;
    pub const CAPSULE_RESP: u8 = 0x05;
    pub const H2C_DATA: u8 = 0x06;
    pub const C2H_DATA: u8 = 0x07;
    pub const R2T: u8 = 0x09;
}

/// Flags of the common header.
pub const FLAG_HDGST: u8 = 0x01;
pub const FLAG_DDGST: u8 = 0x02;
/// Last data PDU of a command's transfer.
pub const FLAG_LAST_PDU: u8 = 0x04;
/// C2HData: the command succeeded; no response capsule follows.
pub const FLAG_SUCCESS: u8 = 0x08;

/// Fatal error status of a termination request (3.6.2.7, figure 31).
pub mod fes {
    pub const INVALID_HEADER_FIELD: u16 = 0x01;
    pub const PDU_SEQUENCE: u16 = 0x02;
    pub const HEADER_DIGEST: u16 = 0x03;
    pub const DATA_OUT_OF_RANGE: u16 = 0x04;
    pub const DATA_LIMIT_EXCEEDED: u16 = 0x05;
    pub const UNSUPPORTED_PARAMETER: u16 = 0x06;
}

pub const COMMON_LEN: usize = 8;
pub const IC_LEN: usize = 128;
pub const TERM_LEN: usize = 24;
pub const CMD_LEN: usize = 72;
pub const RESP_LEN: usize = 24;
pub const DATA_LEN: usize = 24;
pub const SQE_LEN: usize = 64;
pub const CQE_LEN: usize = 16;
/// Most bytes of the offending header a termination request carries.
pub const TERM_MAX_DATA: usize = 128;

/// The connection ends: the termination request to send, then close.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("{reason} (fatal error status {fes:#x}, field at byte {fei})")]
pub struct Fatal {
    pub fes: u16,
    /// Fatal error information: for a bad header field, its offset.
    pub fei: u32,
    pub reason: &'static str,
}

fn fatal(fes: u16, fei: u32, reason: &'static str) -> Fatal {
    Fatal { fes, fei, reason }
}

/// The eight bytes every PDU starts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Common {
    pub kind: u8,
    pub flags: u8,
    pub hlen: u8,
    pub pdo: u8,
    pub plen: u32,
}

pub fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub fn le64(b: &[u8], at: usize) -> u64 {
    u64::from(le32(b, at)) | u64::from(le32(b, at + 4)) << 32
}

pub fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

pub fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// The common header of `b` (at least [`COMMON_LEN`] bytes).
pub fn common(b: &[u8]) -> Common {
    Common {
        kind: b[0],
        flags: b[1],
        hlen: b[2],
        pdo: b[3],
        plen: le32(b, 4),
    }
}

/// The header length each PDU type must have.
fn header_len(kind: u8) -> Option<usize> {
    Some(match kind {
        kind::IC_REQ | kind::IC_RESP => IC_LEN,
        kind::H2C_TERM | kind::C2H_TERM => TERM_LEN,
        kind::CAPSULE_CMD => CMD_LEN,
        kind::CAPSULE_RESP => RESP_LEN,
        kind::H2C_DATA | kind::C2H_DATA | kind::R2T => DATA_LEN,
        _ => return None,
    })
}

/// Which digests a connection carries, as initialization agreed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

/// CRC32C as the digests carry it.
pub fn digest(bytes: &[u8]) -> [u8; 4] {
    crc32c::crc32c(bytes).to_le_bytes()
}

/// Checks the common header of a PDU before the rest is read: its type
/// is one this side receives, its lengths are the type's and within
/// `max_plen`. Returns how many bytes the whole PDU has.
pub fn check_common(
    c: &Common,
    accepted: &[u8],
    digests: Digests,
    max_plen: u32,
) -> Result<usize, Fatal> {
    if !accepted.contains(&c.kind) {
        return Err(fatal(
            fes::INVALID_HEADER_FIELD,
            0,
            "a PDU type this side does not receive",
        ));
    }
    let Some(hlen) = header_len(c.kind) else {
        return Err(fatal(fes::INVALID_HEADER_FIELD, 0, "an unknown PDU type"));
    };
    if usize::from(c.hlen) != hlen {
        return Err(fatal(
            fes::INVALID_HEADER_FIELD,
            2,
            "a header length not its type's",
        ));
    }
    let initialization = matches!(c.kind, kind::IC_REQ | kind::IC_RESP);
    let term = matches!(c.kind, kind::H2C_TERM | kind::C2H_TERM);
    // Initialization and termination PDUs never carry digests.
    let hd = digests.header && !initialization && !term;
    if (c.flags & FLAG_HDGST != 0) != hd {
        return Err(fatal(
            fes::INVALID_HEADER_FIELD,
            1,
            "the header digest flag is not what was agreed",
        ));
    }
    let header = hlen + if hd { 4 } else { 0 };
    let plen = c.plen as usize;
    if plen < header || (initialization && plen != hlen) {
        return Err(fatal(
            fes::INVALID_HEADER_FIELD,
            4,
            "a PDU length shorter than its header",
        ));
    }
    if term && plen > TERM_LEN + TERM_MAX_DATA + 24 {
        return Err(fatal(
            fes::INVALID_HEADER_FIELD,
            4,
            "a termination request too long",
        ));
    }
    if c.plen > max_plen {
        return Err(fatal(
            fes::DATA_LIMIT_EXCEEDED,
            4,
            "a PDU longer than this side takes",
        ));
    }
    Ok(plen)
}

/// Where the data of a PDU is, and whether its digest matched.
struct DataPart<'a> {
    data: &'a [u8],
    digest_ok: bool,
}

/// The data of PDU `b` whose header part is `header` bytes long.
fn data_part<'a>(
    b: &'a [u8],
    c: &Common,
    header: usize,
    ddgst: bool,
) -> Result<DataPart<'a>, Fatal> {
    let plen = b.len();
    if plen == header {
        if c.pdo != 0 {
            return Err(fatal(
                fes::INVALID_HEADER_FIELD,
                3,
                "a data offset in a PDU without data",
            ));
        }
        return Ok(DataPart {
            data: &[],
            digest_ok: true,
        });
    }
    let pdo = usize::from(c.pdo);
    let dd = if ddgst { 4 } else { 0 };
    if pdo < header || pdo + dd > plen {
        return Err(fatal(
            fes::INVALID_HEADER_FIELD,
            3,
            "a data offset outside the PDU",
        ));
    }
    if (c.flags & FLAG_DDGST != 0) != ddgst {
        return Err(fatal(
            fes::INVALID_HEADER_FIELD,
            1,
            "the data digest flag is not what was agreed",
        ));
    }
    let data = &b[pdo..plen - dd];
    let digest_ok = !ddgst || digest(data) == b[plen - 4..plen];
    Ok(DataPart { data, digest_ok })
}

/// ICReq (3.6.2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcReq {
    pub pfv: u16,
    /// Host PDU data alignment: data in C2H PDUs starts at a multiple of
    /// `(hpda + 1) * 4` bytes.
    pub hpda: u8,
    pub digests: Digests,
    /// Most R2Ts outstanding per command, less one.
    pub maxr2t: u32,
}

/// ICResp (3.6.2.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcResp {
    pub pfv: u16,
    pub cpda: u8,
    pub digests: Digests,
    /// Most data bytes one H2CData PDU may carry.
    pub maxh2cdata: u32,
}

/// One PDU, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pdu {
    IcReq(IcReq),
    IcResp(IcResp),
    /// H2CTermReq or C2HTermReq.
    Term {
        fes: u16,
        fei: u32,
        header: Vec<u8>,
    },
    Command {
        sqe: [u8; SQE_LEN],
        data: Vec<u8>,
        digest_ok: bool,
    },
    Response {
        cqe: [u8; CQE_LEN],
    },
    H2CData(DataHeader, Vec<u8>, bool),
    C2HData(DataHeader, Vec<u8>, bool),
    R2T {
        cccid: u16,
        ttag: u16,
        offset: u32,
        len: u32,
    },
}

/// The header fields of H2CData and C2HData.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataHeader {
    pub cccid: u16,
    /// H2CData: the R2T's transfer tag; reserved in C2HData.
    pub ttag: u16,
    pub offset: u32,
    pub len: u32,
    pub last: bool,
    /// C2HData only: no response capsule follows.
    pub success: bool,
}

fn digests_field(b: u8) -> Digests {
    Digests {
        header: b & 1 != 0,
        data: b & 2 != 0,
    }
}

/// Decodes a whole PDU, `b` exactly as long as its `plen` (checked with
/// [`check_common`] first).
pub fn decode(b: &[u8], digests: Digests) -> Result<Pdu, Fatal> {
    if b.len() < COMMON_LEN {
        return Err(fatal(
            fes::INVALID_HEADER_FIELD,
            4,
            "a PDU shorter than a header",
        ));
    }
    let c = common(b);
    let Some(hlen) = header_len(c.kind) else {
        return Err(fatal(fes::INVALID_HEADER_FIELD, 0, "an unknown PDU type"));
    };
    if usize::from(c.hlen) != hlen || b.len() < hlen || c.plen as usize != b.len() {
        return Err(fatal(
            fes::INVALID_HEADER_FIELD,
            2,
            "PDU lengths that do not add up",
        ));
    }
    match c.kind {
        kind::IC_REQ => Ok(Pdu::IcReq(IcReq {
            pfv: le16(b, 8),
            hpda: b[10],
            digests: digests_field(b[11]),
            maxr2t: le32(b, 12),
        })),
        kind::IC_RESP => Ok(Pdu::IcResp(IcResp {
            pfv: le16(b, 8),
            cpda: b[10],
            digests: digests_field(b[11]),
            maxh2cdata: le32(b, 12),
        })),
        kind::H2C_TERM | kind::C2H_TERM => Ok(Pdu::Term {
            fes: le16(b, 8),
            fei: le32(b, 10),
            header: b[hlen..].to_vec(),
        }),
        _ => decode_with_digests(b, &c, hlen, digests),
    }
}

fn decode_with_digests(b: &[u8], c: &Common, hlen: usize, digests: Digests) -> Result<Pdu, Fatal> {
    let mut header = hlen;
    if digests.header {
        if c.flags & FLAG_HDGST == 0 || b.len() < hlen + 4 {
            return Err(fatal(
                fes::INVALID_HEADER_FIELD,
                1,
                "a header digest missing",
            ));
        }
        if digest(&b[..hlen]) != b[hlen..hlen + 4] {
            return Err(fatal(
                fes::HEADER_DIGEST,
                0,
                "a header digest that does not match",
            ));
        }
        header += 4;
    }
    let part = data_part(b, c, header, digests.data)?;
    let data_header = || DataHeader {
        cccid: le16(b, 8),
        ttag: le16(b, 10),
        offset: le32(b, 12),
        len: le32(b, 16),
        last: c.flags & FLAG_LAST_PDU != 0,
        success: c.flags & FLAG_SUCCESS != 0,
    };
    match c.kind {
        kind::CAPSULE_CMD => {
            let mut sqe = [0; SQE_LEN];
            sqe.copy_from_slice(&b[8..CMD_LEN]);
            Ok(Pdu::Command {
                sqe,
                data: part.data.to_vec(),
                digest_ok: part.digest_ok,
            })
        }
        kind::CAPSULE_RESP => {
            let mut cqe = [0; CQE_LEN];
            cqe.copy_from_slice(&b[8..RESP_LEN]);
            Ok(Pdu::Response { cqe })
        }
        kind::H2C_DATA | kind::C2H_DATA => {
            let h = data_header();
            if h.len as usize != part.data.len() {
                return Err(fatal(
                    fes::INVALID_HEADER_FIELD,
                    16,
                    "a data length not the PDU's",
                ));
            }
            let data = part.data.to_vec();
            Ok(if c.kind == kind::H2C_DATA {
                Pdu::H2CData(h, data, part.digest_ok)
            } else {
                Pdu::C2HData(h, data, part.digest_ok)
            })
        }
        _ => Ok(Pdu::R2T {
            cccid: le16(b, 8),
            ttag: le16(b, 10),
            offset: le32(b, 12),
            len: le32(b, 16),
        }),
    }
}

/// A PDU's bytes: `hlen` header bytes (the common header filled in here),
/// then its digest, padding to `align`, the data and its digest.
fn frame(
    kind: u8,
    flags: u8,
    mut header: Vec<u8>,
    data: &[u8],
    digests: Digests,
    align: usize,
) -> Vec<u8> {
    let hlen = header.len();
    let hd = if digests.header { 4 } else { 0 };
    let with_data = !data.is_empty();
    let pdo = if with_data {
        (hlen + hd).div_ceil(align.max(1)) * align.max(1)
    } else {
        0
    };
    let dd = if with_data && digests.data { 4 } else { 0 };
    let plen = if with_data {
        pdo + data.len() + dd
    } else {
        hlen + hd
    };
    let mut flags = flags;
    if digests.header {
        flags |= FLAG_HDGST;
    }
    if dd != 0 {
        flags |= FLAG_DDGST;
    }
    header[0] = kind;
    header[1] = flags;
    header[2] = hlen as u8;
    header[3] = pdo as u8;
    put32(&mut header, 4, plen as u32);
    let mut out = header;
    out.reserve(plen - hlen);
    if digests.header {
        let d = digest(&out[..hlen]);
        out.extend_from_slice(&d);
    }
    if with_data {
        out.resize(pdo, 0);
        out.extend_from_slice(data);
        if dd != 0 {
            out.extend_from_slice(&digest(data));
        }
    }
    out
}

fn init_pdu(kind: u8, pfv: u16, align: u8, digests: Digests, dword: u32) -> Vec<u8> {
    let mut h = vec![0; IC_LEN];
    put16(&mut h, 8, pfv);
    h[10] = align;
    h[11] = u8::from(digests.header) | u8::from(digests.data) << 1;
    put32(&mut h, 12, dword);
    frame(kind, 0, h, &[], Digests::default(), 4)
}

pub fn encode_ic_req(r: &IcReq) -> Vec<u8> {
    init_pdu(kind::IC_REQ, r.pfv, r.hpda, r.digests, r.maxr2t)
}

pub fn encode_ic_resp(r: &IcResp) -> Vec<u8> {
    init_pdu(kind::IC_RESP, r.pfv, r.cpda, r.digests, r.maxh2cdata)
}

/// A termination request of `kind` ([`kind::H2C_TERM`] or
/// [`kind::C2H_TERM`]) carrying at most [`TERM_MAX_DATA`] bytes of the
/// offending header.
pub fn encode_term(kind: u8, f: &Fatal, offending: &[u8]) -> Vec<u8> {
    let mut h = vec![0; TERM_LEN];
    put16(&mut h, 8, f.fes);
    put32(&mut h, 10, f.fei);
    let data = &offending[..offending.len().min(TERM_MAX_DATA)];
    // Its data follows the header directly: no digests, no alignment.
    let mut out = frame(kind, 0, h, &[], Digests::default(), 1);
    out.extend_from_slice(data);
    put32(&mut out, 4, (TERM_LEN + data.len()) as u32);
    out
}

pub fn encode_command(sqe: &[u8; SQE_LEN], data: &[u8], digests: Digests) -> Vec<u8> {
    let mut h = vec![0; CMD_LEN];
    h[8..].copy_from_slice(sqe);
    frame(kind::CAPSULE_CMD, 0, h, data, digests, 1)
}

pub fn encode_response(cqe: &[u8; CQE_LEN], digests: Digests) -> Vec<u8> {
    let mut h = vec![0; RESP_LEN];
    h[8..].copy_from_slice(cqe);
    frame(kind::CAPSULE_RESP, 0, h, &[], digests, 1)
}

/// H2CData or C2HData with `data`; `align` is the receiver's PDU data
/// alignment in bytes.
pub fn encode_data(
    kind: u8,
    h: &DataHeader,
    data: &[u8],
    digests: Digests,
    align: usize,
) -> Vec<u8> {
    let mut b = vec![0; DATA_LEN];
    put16(&mut b, 8, h.cccid);
    put16(&mut b, 10, h.ttag);
    put32(&mut b, 12, h.offset);
    put32(&mut b, 16, data.len() as u32);
    let mut flags = 0;
    if h.last {
        flags |= FLAG_LAST_PDU;
    }
    if h.success {
        flags |= FLAG_SUCCESS;
    }
    frame(kind, flags, b, data, digests, align)
}

pub fn encode_r2t(cccid: u16, ttag: u16, offset: u32, len: u32, digests: Digests) -> Vec<u8> {
    let mut b = vec![0; DATA_LEN];
    put16(&mut b, 8, cccid);
    put16(&mut b, 10, ttag);
    put32(&mut b, 12, offset);
    put32(&mut b, 16, len);
    frame(kind::R2T, 0, b, &[], digests, 1)
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
