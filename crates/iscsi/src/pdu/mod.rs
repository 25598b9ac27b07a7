//! PDU framing: BHS, AHS, data segment with padding, and CRC32C digests.
//!
//! Everything here is pure: [`decode`] takes bytes and returns a PDU or a
//! typed error, [`encode`] does the reverse. The connection reader uses the
//! same helpers ([`frame_lengths`], [`verify_header_digest`],
//! [`verify_data_digest`]) while streaming from the socket.

mod bhs;
pub mod initiator;
pub mod target;

pub use bhs::{Bhs, Opcode, BHS_LEN, RESERVED_TAG};

use bytes::Bytes;

/// Length of a CRC32C digest on the wire.
pub const DIGEST_LEN: usize = 4;

/// Largest data segment accepted on a login PDU (RFC 7143 default
/// MaxRecvDataSegmentLength, which applies until the full feature phase).
pub const LOGIN_MAX_DATA_SEGMENT: u32 = 8192;

/// Largest MaxRecvDataSegmentLength the protocol allows (2^24 - 1).
pub const MAX_DATA_SEGMENT_LIMIT: u32 = (1 << 24) - 1;

/// How PDUs are framed on one connection at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Framing {
    pub header_digest: bool,
    pub data_digest: bool,
    /// Largest DataSegmentLength we accept; bigger PDUs are refused before
    /// any of their data is read.
    pub max_data_segment: u32,
}

impl Framing {
    /// Framing during login: no digests, default segment limit.
    pub const LOGIN: Framing = Framing {
        header_digest: false,
        data_digest: false,
        max_data_segment: LOGIN_MAX_DATA_SEGMENT,
    };
}

/// Errors found while framing or parsing a PDU.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    #[error("header digest mismatch")]
    HeaderDigest,
    #[error("data digest mismatch")]
    DataDigest,
    #[error("data segment of {len} bytes exceeds the limit of {max}")]
    DataSegmentTooLong { len: u32, max: u32 },
    #[error("unsupported opcode {0:#04x}")]
    UnsupportedOpcode(u8),
    #[error("malformed additional header segment")]
    BadAhs,
    #[error("invalid PDU field: {0}")]
    InvalidField(&'static str),
}

/// One PDU as framed on the wire, digests already checked and removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pdu {
    pub bhs: Bhs,
    /// Additional header segments, a multiple of 4 bytes.
    pub ahs: Vec<u8>,
    /// Data segment without padding.
    pub data: Bytes,
}

impl Pdu {
    /// A PDU's header alone, its lengths as they came: for a PDU whose
    /// data went elsewhere as it arrived, or is still arriving.
    pub fn header_only(bhs: Bhs) -> Pdu {
        Pdu {
            bhs,
            ahs: Vec::new(),
            data: Bytes::new(),
        }
    }

    pub fn new(bhs: Bhs, data: Bytes) -> Pdu {
        let mut bhs = bhs;
        bhs.set_data_segment_len(data.len() as u32);
        bhs.set_total_ahs_len_bytes(0);
        Pdu {
            bhs,
            ahs: Vec::new(),
            data,
        }
    }
}

/// Sizes of the parts that follow a BHS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameLengths {
    pub ahs: usize,
    /// Header digest bytes (0 or 4), which follow the AHS.
    pub header_digest: usize,
    /// Data segment length without padding.
    pub data: usize,
    /// Padding bytes after the data.
    pub padding: usize,
    /// Data digest bytes (0 or 4, only present when there is data).
    pub data_digest: usize,
}

impl FrameLengths {
    /// Bytes after the BHS up to and including the header digest.
    pub fn header_rest(&self) -> usize {
        self.ahs + self.header_digest
    }

    /// Bytes of data, padding and data digest.
    pub fn data_part(&self) -> usize {
        self.data + self.padding + self.data_digest
    }

    pub fn total(&self) -> usize {
        BHS_LEN + self.header_rest() + self.data_part()
    }
}

/// Padding needed to bring `len` to a multiple of 4.
pub fn padding_for(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// Work out the frame sizes from a BHS, refusing over-long data segments.
pub fn frame_lengths(bhs: &Bhs, framing: &Framing) -> Result<FrameLengths, PduError> {
    let dsl = bhs.data_segment_len();
    if dsl > framing.max_data_segment {
        return Err(PduError::DataSegmentTooLong {
            len: dsl,
            max: framing.max_data_segment,
        });
    }
    let data = dsl as usize;
    Ok(FrameLengths {
        ahs: bhs.total_ahs_len(),
        header_digest: if framing.header_digest { DIGEST_LEN } else { 0 },
        data,
        padding: padding_for(data),
        data_digest: if framing.data_digest && data > 0 {
            DIGEST_LEN
        } else {
            0
        },
    })
}

/// CRC32C as iSCSI sends it: the standard Castagnoli CRC, little-endian.
pub fn crc32c_parts(parts: &[&[u8]]) -> u32 {
    parts
        .iter()
        .fold(0u32, |crc, p| crc32c::crc32c_append(crc, p))
}

/// Check a header digest over BHS + AHS.
pub fn verify_header_digest(bhs: &Bhs, ahs: &[u8], digest: &[u8]) -> Result<(), PduError> {
    let want = crc32c_parts(&[&bhs.0, ahs]);
    if digest.len() == DIGEST_LEN && digest == want.to_le_bytes() {
        Ok(())
    } else {
        Err(PduError::HeaderDigest)
    }
}

/// Check a data digest over data + padding.
pub fn verify_data_digest(data_padded: &[u8], digest: &[u8]) -> Result<(), PduError> {
    let want = crc32c_parts(&[data_padded]);
    if digest.len() == DIGEST_LEN && digest == want.to_le_bytes() {
        Ok(())
    } else {
        Err(PduError::DataDigest)
    }
}

/// Outcome of [`decode`] on a byte buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// At least this many bytes in total are needed before the PDU can be decoded.
    Incomplete { needed: usize },
    /// A whole PDU and how many bytes of the buffer it used.
    Complete { pdu: Pdu, consumed: usize },
}

/// Decode one PDU from the front of `buf`.
///
/// Never panics; refuses a DataSegmentLength above `framing.max_data_segment`
/// as soon as the BHS is available, so a caller never buffers more than the
/// limit allows.
pub fn decode(buf: &[u8], framing: &Framing) -> Result<Decoded, PduError> {
    let Some(head) = buf.get(..BHS_LEN) else {
        return Ok(Decoded::Incomplete { needed: BHS_LEN });
    };
    let mut raw = [0u8; BHS_LEN];
    raw.copy_from_slice(head);
    let bhs = Bhs(raw);
    let lens = frame_lengths(&bhs, framing)?;
    let total = lens.total();
    if buf.len() < total {
        return Ok(Decoded::Incomplete { needed: total });
    }
    let mut at = BHS_LEN;
    let ahs = &buf[at..at + lens.ahs];
    at += lens.ahs;
    if lens.header_digest > 0 {
        verify_header_digest(&bhs, ahs, &buf[at..at + DIGEST_LEN])?;
        at += DIGEST_LEN;
    }
    let data_padded = &buf[at..at + lens.data + lens.padding];
    at += lens.data + lens.padding;
    if lens.data_digest > 0 {
        verify_data_digest(data_padded, &buf[at..at + DIGEST_LEN])?;
        at += DIGEST_LEN;
    }
    let pdu = Pdu {
        bhs,
        ahs: ahs.to_vec(),
        data: Bytes::copy_from_slice(&data_padded[..lens.data]),
    };
    Ok(Decoded::Complete { pdu, consumed: at })
}

/// The bytes that precede the data segment (BHS, AHS, header digest).
/// DataSegmentLength and TotalAHSLength are set from the PDU's contents.
pub fn encode_header(bhs: &Bhs, ahs: &[u8], data_len: usize, header_digest: bool) -> Vec<u8> {
    let bhs = with_lengths(bhs, ahs.len(), data_len);
    let mut out = Vec::with_capacity(BHS_LEN + ahs.len() + DIGEST_LEN);
    out.extend_from_slice(&bhs.0);
    out.extend_from_slice(ahs);
    if header_digest {
        out.extend_from_slice(&crc32c_parts(&[&bhs.0, ahs]).to_le_bytes());
    }
    out
}

/// An outgoing PDU's header as it goes on the wire, held in place: the
/// BHS and, with header digests, its CRC32C (no AHS: the target sends none).
pub struct WireHeader {
    bytes: [u8; BHS_LEN + DIGEST_LEN],
    len: usize,
}

impl WireHeader {
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// [`encode_header`] without an AHS and without allocating.
pub fn wire_header(bhs: &Bhs, data_len: usize, header_digest: bool) -> WireHeader {
    let bhs = with_lengths(bhs, 0, data_len);
    let mut bytes = [0; BHS_LEN + DIGEST_LEN];
    bytes[..BHS_LEN].copy_from_slice(&bhs.0);
    let len = if header_digest {
        bytes[BHS_LEN..].copy_from_slice(&crc32c_parts(&[&bhs.0]).to_le_bytes());
        BHS_LEN + DIGEST_LEN
    } else {
        BHS_LEN
    };
    WireHeader { bytes, len }
}

/// `bhs` with TotalAHSLength and DataSegmentLength set to these lengths.
fn with_lengths(bhs: &Bhs, ahs_len: usize, data_len: usize) -> Bhs {
    let mut bhs = *bhs;
    bhs.set_data_segment_len(data_len as u32);
    bhs.set_total_ahs_len_bytes(ahs_len);
    bhs
}

/// The bytes that follow the data segment: padding and data digest.
/// Returns a small array and how many of its bytes are used.
pub fn encode_trailer(data: &[u8], data_digest: bool) -> ([u8; 8], usize) {
    let pad = padding_for(data.len());
    let mut out = [0u8; 8];
    let mut n = pad;
    if data_digest && !data.is_empty() {
        let crc = crc32c_parts(&[data, &[0u8; 3][..pad]]);
        out[pad..pad + DIGEST_LEN].copy_from_slice(&crc.to_le_bytes());
        n += DIGEST_LEN;
    }
    (out, n)
}

/// Encode a whole PDU into one buffer.
pub fn encode(pdu: &Pdu, framing: &Framing) -> Vec<u8> {
    let mut out = encode_header(&pdu.bhs, &pdu.ahs, pdu.data.len(), framing.header_digest);
    out.extend_from_slice(&pdu.data);
    let (trailer, n) = encode_trailer(&pdu.data, framing.data_digest);
    out.extend_from_slice(&trailer[..n]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const DIGESTS: Framing = Framing {
        header_digest: true,
        data_digest: true,
        max_data_segment: 65536,
    };

    fn sample(data: &[u8]) -> Pdu {
        let mut bhs = Bhs::new(Opcode::NopOut, 0x80);
        bhs.set_immediate(true);
        bhs.set_itt(42);
        Pdu::new(bhs, Bytes::copy_from_slice(data))
    }

    #[test]
    fn wire_header_is_the_encoded_header() {
        let pdu = sample(b"hello");
        for digest in [false, true] {
            assert_eq!(
                wire_header(&pdu.bhs, 5, digest).as_slice(),
                &encode_header(&pdu.bhs, &[], 5, digest)[..]
            );
        }
    }

    #[test]
    fn round_trip_without_digests() {
        for len in [0usize, 1, 2, 3, 4, 5, 1000] {
            let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let pdu = sample(&data);
            let wire = encode(&pdu, &Framing::LOGIN);
            assert_eq!(wire.len(), 48 + len + padding_for(len));
            assert_eq!(wire.len() % 4, 0);
            match decode(&wire, &Framing::LOGIN).unwrap() {
                Decoded::Complete {
                    pdu: back,
                    consumed,
                } => {
                    assert_eq!(consumed, wire.len());
                    assert_eq!(back, pdu);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    #[test]
    fn round_trip_with_digests_and_ahs() {
        let mut pdu = sample(b"hello");
        pdu.ahs = vec![0, 5, 2, 0, 0, 0, 1, 0];
        pdu.bhs.set_total_ahs_len_bytes(8);
        let wire = encode(&pdu, &DIGESTS);
        assert_eq!(wire.len(), 48 + 8 + 4 + 8 + 4);
        let Decoded::Complete {
            pdu: back,
            consumed,
        } = decode(&wire, &DIGESTS).unwrap()
        else {
            panic!("incomplete")
        };
        assert_eq!(consumed, wire.len());
        assert_eq!(back, pdu);
    }

    #[test]
    fn no_data_digest_when_no_data() {
        let pdu = sample(b"");
        let wire = encode(&pdu, &DIGESTS);
        assert_eq!(wire.len(), 48 + 4);
    }

    #[test]
    fn known_crc32c_value() {
        // RFC 3720 B.4: 32 bytes of zeros give aa 36 91 8a on the wire.
        assert_eq!(
            crc32c_parts(&[&[0u8; 32]]).to_le_bytes(),
            [0xaa, 0x36, 0x91, 0x8a]
        );
    }

    #[test]
    fn digest_errors_are_reported() {
        let pdu = sample(b"data");
        let mut wire = encode(&pdu, &DIGESTS);
        let last = wire.len() - 1;
        wire[last] ^= 1;
        assert_eq!(decode(&wire, &DIGESTS), Err(PduError::DataDigest));
        let mut wire = encode(&pdu, &DIGESTS);
        wire[20] ^= 1;
        assert_eq!(decode(&wire, &DIGESTS), Err(PduError::HeaderDigest));
    }

    #[test]
    fn incomplete_and_limits() {
        let pdu = sample(&[7u8; 100]);
        let wire = encode(&pdu, &Framing::LOGIN);
        assert_eq!(
            decode(&wire[..10], &Framing::LOGIN),
            Ok(Decoded::Incomplete { needed: 48 })
        );
        assert_eq!(
            decode(&wire[..60], &Framing::LOGIN),
            Ok(Decoded::Incomplete { needed: 148 })
        );
        let small = Framing {
            max_data_segment: 99,
            ..Framing::LOGIN
        };
        assert_eq!(
            decode(&wire[..48], &small),
            Err(PduError::DataSegmentTooLong { len: 100, max: 99 })
        );
    }

    proptest! {
        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600),
                                hd in any::<bool>(), dd in any::<bool>(), max in 0u32..1024) {
            let framing = Framing { header_digest: hd, data_digest: dd, max_data_segment: max };
            if let Ok(Decoded::Complete { pdu, consumed }) = decode(&bytes, &framing) {
                prop_assert!(consumed <= bytes.len());
                let _ = initiator::Request::parse(pdu);
            }
        }

        #[test]
        fn encode_decode_round_trip(data in proptest::collection::vec(any::<u8>(), 0..300),
                                    itt in any::<u32>(), hd in any::<bool>(), dd in any::<bool>()) {
            let framing = Framing { header_digest: hd, data_digest: dd, max_data_segment: 300 };
            let mut pdu = sample(&data);
            pdu.bhs.set_itt(itt);
            let wire = encode(&pdu, &framing);
            prop_assert_eq!(decode(&wire, &framing), Ok(Decoded::Complete { pdu, consumed: wire.len() }));
        }
    }
}
