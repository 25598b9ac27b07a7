//! Typed views of the PDUs an initiator sends (RFC 7143 section 11).

use bytes::Bytes;

use super::{Bhs, Opcode, Pdu, PduError};

/// AHS type carrying CDB bytes beyond the 16 in the BHS.
const AHS_EXTENDED_CDB: u8 = 1;
/// AHS type carrying the expected bidirectional read data length.
const AHS_BIDI_READ_LENGTH: u8 = 2;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NopOut {
    pub immediate: bool,
    pub lun: [u8; 8],
    pub itt: u32,
    pub ttt: u32,
    pub cmdsn: u32,
    pub exp_statsn: u32,
    pub data: Bytes,
}

/// A CDB held in place: 16 bytes or fewer need no allocation per command
/// (an extended CDB AHS makes it longer).
pub type Cdb = smallvec::SmallVec<[u8; 16]>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScsiCommand {
    pub immediate: bool,
    /// No unsolicited Data-Out follows.
    pub final_: bool,
    pub read: bool,
    pub write: bool,
    /// Task attribute (3 bits).
    pub attr: u8,
    pub lun: [u8; 8],
    pub itt: u32,
    /// Expected Data Transfer Length.
    pub edtl: u32,
    pub cmdsn: u32,
    pub exp_statsn: u32,
    /// The whole CDB: 16 bytes from the BHS plus any extended CDB AHS.
    pub cdb: Cdb,
    /// Expected bidirectional read length, when the AHS is present.
    pub bidi_read_len: Option<u32>,
    /// Immediate data.
    pub data: Bytes,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskMgmtRequest {
    pub immediate: bool,
    pub function: u8,
    pub lun: [u8; 8],
    pub itt: u32,
    pub referenced_tag: u32,
    pub cmdsn: u32,
    pub exp_statsn: u32,
    pub ref_cmdsn: u32,
    pub exp_datasn: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoginRequest {
    pub transit: bool,
    pub continue_: bool,
    pub csg: u8,
    pub nsg: u8,
    pub version_max: u8,
    pub version_min: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: u32,
    pub cid: u16,
    pub cmdsn: u32,
    pub exp_statsn: u32,
    pub data: Bytes,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextRequest {
    pub immediate: bool,
    pub final_: bool,
    pub continue_: bool,
    pub lun: [u8; 8],
    pub itt: u32,
    pub ttt: u32,
    pub cmdsn: u32,
    pub exp_statsn: u32,
    pub data: Bytes,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataOut {
    pub final_: bool,
    pub lun: [u8; 8],
    pub itt: u32,
    pub ttt: u32,
    pub exp_statsn: u32,
    pub datasn: u32,
    pub buffer_offset: u32,
    pub data: Bytes,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogoutRequest {
    pub immediate: bool,
    pub reason: u8,
    pub itt: u32,
    pub cid: u16,
    pub cmdsn: u32,
    pub exp_statsn: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnackRequest {
    pub kind: u8,
    pub itt: u32,
}

/// Any PDU an initiator may send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    NopOut(NopOut),
    ScsiCommand(ScsiCommand),
    TaskMgmt(TaskMgmtRequest),
    Login(LoginRequest),
    Text(TextRequest),
    DataOut(DataOut),
    Logout(LogoutRequest),
    Snack(SnackRequest),
}

impl Request {
    /// Interpret a framed PDU. Target-side opcodes and reserved opcodes are
    /// [`PduError::UnsupportedOpcode`].
    pub fn parse(pdu: Pdu) -> Result<Request, PduError> {
        let b = pdu.bhs;
        let op = b
            .opcode()
            .ok_or(PduError::UnsupportedOpcode(b.opcode_raw()))?;
        Ok(match op {
            Opcode::NopOut => Request::NopOut(NopOut {
                immediate: b.immediate(),
                lun: b.lun_bytes(),
                itt: b.itt(),
                ttt: b.u32_at(20),
                cmdsn: b.u32_at(24),
                exp_statsn: b.u32_at(28),
                data: pdu.data,
            }),
            Opcode::ScsiCommand => {
                Request::ScsiCommand(parse_scsi_command(&b, &pdu.ahs, pdu.data)?)
            }
            Opcode::TaskMgmtRequest => Request::TaskMgmt(TaskMgmtRequest {
                immediate: b.immediate(),
                function: b.flags() & 0x7f,
                lun: b.lun_bytes(),
                itt: b.itt(),
                referenced_tag: b.u32_at(20),
                cmdsn: b.u32_at(24),
                exp_statsn: b.u32_at(28),
                ref_cmdsn: b.u32_at(32),
                exp_datasn: b.u32_at(36),
            }),
            Opcode::LoginRequest => {
                let mut isid = [0u8; 6];
                isid.copy_from_slice(&b.0[8..14]);
                Request::Login(LoginRequest {
                    transit: b.flags() & 0x80 != 0,
                    continue_: b.flags() & 0x40 != 0,
                    csg: (b.flags() >> 2) & 0x3,
                    nsg: b.flags() & 0x3,
                    version_max: b.byte(2),
                    version_min: b.byte(3),
                    isid,
                    tsih: b.u16_at(14),
                    itt: b.itt(),
                    cid: b.u16_at(20),
                    cmdsn: b.u32_at(24),
                    exp_statsn: b.u32_at(28),
                    data: pdu.data,
                })
            }
            Opcode::TextRequest => Request::Text(TextRequest {
                immediate: b.immediate(),
                final_: b.flags() & 0x80 != 0,
                continue_: b.flags() & 0x40 != 0,
                lun: b.lun_bytes(),
                itt: b.itt(),
                ttt: b.u32_at(20),
                cmdsn: b.u32_at(24),
                exp_statsn: b.u32_at(28),
                data: pdu.data,
            }),
            Opcode::DataOut => Request::DataOut(DataOut {
                final_: b.final_bit(),
                lun: b.lun_bytes(),
                itt: b.itt(),
                ttt: b.u32_at(20),
                exp_statsn: b.u32_at(28),
                datasn: b.u32_at(36),
                buffer_offset: b.u32_at(40),
                data: pdu.data,
            }),
            Opcode::LogoutRequest => Request::Logout(LogoutRequest {
                immediate: b.immediate(),
                reason: b.flags() & 0x7f,
                itt: b.itt(),
                cid: b.u16_at(20),
                cmdsn: b.u32_at(24),
                exp_statsn: b.u32_at(28),
            }),
            Opcode::SnackRequest => Request::Snack(SnackRequest {
                kind: b.flags() & 0x0f,
                itt: b.itt(),
            }),
            _ => return Err(PduError::UnsupportedOpcode(b.opcode_raw())),
        })
    }
}

fn parse_scsi_command(b: &Bhs, ahs: &[u8], data: Bytes) -> Result<ScsiCommand, PduError> {
    let flags = b.flags();
    let mut cdb = Cdb::from_slice(&b.0[32..48]);
    let mut bidi_read_len = None;
    let mut rest = ahs;
    while !rest.is_empty() {
        let [l0, l1, kind, ..] = *rest else {
            return Err(PduError::BadAhs);
        };
        let len = usize::from(u16::from_be_bytes([l0, l1]));
        // AHSLength counts the bytes after AHSType (the specific byte included).
        let body = rest.get(3..3 + len).ok_or(PduError::BadAhs)?;
        let entry = 3 + len + super::padding_for(3 + len);
        match kind {
            AHS_EXTENDED_CDB => {
                if len < 1 {
                    return Err(PduError::BadAhs);
                }
                cdb.extend_from_slice(&body[1..]);
            }
            AHS_BIDI_READ_LENGTH => {
                let [_, a, b2, c, d] = *body else {
                    return Err(PduError::BadAhs);
                };
                bidi_read_len = Some(u32::from_be_bytes([a, b2, c, d]));
            }
            _ => return Err(PduError::BadAhs),
        }
        rest = rest.get(entry..).unwrap_or(&[]);
    }
    Ok(ScsiCommand {
        immediate: b.immediate(),
        final_: flags & 0x80 != 0,
        read: flags & 0x40 != 0,
        write: flags & 0x20 != 0,
        attr: flags & 0x07,
        lun: b.lun_bytes(),
        itt: b.itt(),
        edtl: b.u32_at(20),
        cmdsn: b.u32_at(24),
        exp_statsn: b.u32_at(28),
        cdb,
        bidi_read_len,
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pdu(bhs: Bhs, ahs: Vec<u8>, data: &[u8]) -> Pdu {
        Pdu {
            bhs,
            ahs,
            data: Bytes::copy_from_slice(data),
        }
    }

    #[test]
    fn scsi_command_fields() {
        let mut b = Bhs::new(Opcode::ScsiCommand, 0x80 | 0x20 | 0x01);
        b.set_lun_bytes([0, 3, 0, 0, 0, 0, 0, 0]);
        b.set_itt(9);
        b.set_u32(20, 4096);
        b.set_u32(24, 100);
        b.set_u32(28, 7);
        b.0[32] = 0x2a;
        let received = pdu(b, vec![], b"abc");
        let (parsed, allocations) = crate::alloc_count::allocations(|| Request::parse(received));
        assert_eq!(allocations, 0, "a 16-byte CDB is held in place");
        let Request::ScsiCommand(c) = parsed.unwrap() else {
            panic!()
        };
        assert!(c.final_ && c.write && !c.read);
        assert_eq!(
            (c.attr, c.itt, c.edtl, c.cmdsn, c.exp_statsn),
            (1, 9, 4096, 100, 7)
        );
        assert_eq!(c.cdb.len(), 16);
        assert_eq!(c.cdb[0], 0x2a);
        assert_eq!(&c.data[..], b"abc");
    }

    #[test]
    fn extended_cdb_and_bidi_ahs() {
        let b = Bhs::new(Opcode::ScsiCommand, 0x80);
        // 32-byte CDB: 16 extra bytes, AHSLength = 17, an entry of 20 bytes.
        let mut ahs = vec![0, 17, 1, 0];
        ahs.extend(0x10..0x20u8);
        ahs.extend([0, 5, 2, 0, 0, 0, 2, 0]);
        let Request::ScsiCommand(c) = Request::parse(pdu(b, ahs, b"")).unwrap() else {
            panic!()
        };
        assert_eq!(c.cdb.len(), 32);
        assert_eq!(c.cdb[16], 0x10);
        assert_eq!(c.bidi_read_len, Some(512));
    }

    #[test]
    fn padded_ahs_entry() {
        // A 20-byte CDB: AHSLength 5 (reserved byte + 4 CDB bytes), padded to 8.
        let b = Bhs::new(Opcode::ScsiCommand, 0x80);
        let ahs = vec![0, 5, 1, 0, 0xa, 0xb, 0xc, 0xd];
        let Request::ScsiCommand(c) = Request::parse(pdu(b, ahs, b"")).unwrap() else {
            panic!()
        };
        assert_eq!(&c.cdb[16..], &[0xa, 0xb, 0xc, 0xd]);
        let ahs = vec![0, 6, 1, 0, 1, 2, 3, 4, 5, 0, 0, 0];
        let Request::ScsiCommand(c) = Request::parse(pdu(b, ahs, b"")).unwrap() else {
            panic!()
        };
        assert_eq!(c.cdb.len(), 21);
    }

    #[test]
    fn bad_ahs_is_an_error() {
        let b = Bhs::new(Opcode::ScsiCommand, 0x80);
        assert_eq!(
            Request::parse(pdu(b, vec![0, 40, 1, 0], b"")),
            Err(PduError::BadAhs)
        );
        assert_eq!(
            Request::parse(pdu(b, vec![0, 1, 9, 0], b"")),
            Err(PduError::BadAhs)
        );
    }

    #[test]
    fn login_fields() {
        let mut b = Bhs::new(Opcode::LoginRequest, 0x80 | 0x04 | 0x03);
        b.set_immediate(true);
        b.0[8..14].copy_from_slice(&[0x80, 1, 2, 3, 0, 0]);
        b.set_u16(14, 0);
        b.set_u16(20, 5);
        b.set_u32(24, 1000);
        let Request::Login(l) = Request::parse(pdu(b, vec![], b"A=B\0")).unwrap() else {
            panic!()
        };
        assert!(l.transit && !l.continue_);
        assert_eq!((l.csg, l.nsg, l.cid, l.cmdsn), (1, 3, 5, 1000));
        assert_eq!(l.isid, [0x80, 1, 2, 3, 0, 0]);
    }

    #[test]
    fn target_opcodes_are_unsupported() {
        let b = Bhs::new(Opcode::DataIn, 0);
        assert_eq!(
            Request::parse(pdu(b, vec![], b"")),
            Err(PduError::UnsupportedOpcode(0x25))
        );
        let mut b = Bhs::default();
        b.0[0] = 0x1c;
        assert_eq!(
            Request::parse(pdu(b, vec![], b"")),
            Err(PduError::UnsupportedOpcode(0x1c))
        );
    }

    #[test]
    fn data_out_and_tmf() {
        let mut b = Bhs::new(Opcode::DataOut, 0x80);
        b.set_u32(20, 77);
        b.set_u32(36, 2);
        b.set_u32(40, 8192);
        let Request::DataOut(d) = Request::parse(pdu(b, vec![], &[1; 8])).unwrap() else {
            panic!()
        };
        assert_eq!(
            (d.final_, d.ttt, d.datasn, d.buffer_offset, d.data.len()),
            (true, 77, 2, 8192, 8)
        );
        let mut b = Bhs::new(Opcode::TaskMgmtRequest, 0x80 | 0x05);
        b.set_u32(20, 0xffff_ffff);
        b.set_u32(32, 12);
        let Request::TaskMgmt(t) = Request::parse(pdu(b, vec![], b"")).unwrap() else {
            panic!()
        };
        assert_eq!(
            (t.function, t.referenced_tag, t.ref_cmdsn),
            (5, 0xffff_ffff, 12)
        );
    }
}
