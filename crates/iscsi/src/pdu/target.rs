//! Builders for the PDUs a target sends (RFC 7143 section 11).
//!
//! The builders fill every field except StatSN, ExpCmdSN and MaxCmdSN,
//! which the connection writer stamps when the PDU actually leaves (see
//! [`stamp_sequence_numbers`]).

use super::{Bhs, Opcode, RESERVED_TAG};

/// Offset of StatSN in every target PDU.
pub const STATSN_OFFSET: usize = 24;
/// Offset of ExpCmdSN in every target PDU.
pub const EXPCMDSN_OFFSET: usize = 28;
/// Offset of MaxCmdSN in every target PDU.
pub const MAXCMDSN_OFFSET: usize = 32;

/// Residual of a data transfer against the expected length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Residual {
    #[default]
    None,
    /// The command wanted more than the initiator expected.
    Overflow(u32),
    /// The command used less than the initiator expected.
    Underflow(u32),
}

impl Residual {
    /// Compare what a command transferred (or wanted to) with the
    /// initiator's expectation.
    pub fn between(expected: u32, actual: u64) -> Residual {
        let expected = u64::from(expected);
        if actual > expected {
            Residual::Overflow((actual - expected).min(u64::from(u32::MAX)) as u32)
        } else if actual < expected {
            Residual::Underflow((expected - actual) as u32)
        } else {
            Residual::None
        }
    }

    /// The O/U flag bits as they sit in byte 1.
    pub fn flag_bits(self) -> u8 {
        match self {
            Residual::None => 0,
            Residual::Overflow(_) => 0x04,
            Residual::Underflow(_) => 0x02,
        }
    }

    pub fn count(self) -> u32 {
        match self {
            Residual::None => 0,
            Residual::Overflow(n) | Residual::Underflow(n) => n,
        }
    }
}

/// Fill StatSN (when the PDU carries one), ExpCmdSN and MaxCmdSN.
pub fn stamp_sequence_numbers(bhs: &mut Bhs, statsn: Option<u32>, exp_cmdsn: u32, max_cmdsn: u32) {
    if let Some(sn) = statsn {
        bhs.set_u32(STATSN_OFFSET, sn);
    }
    bhs.set_u32(EXPCMDSN_OFFSET, exp_cmdsn);
    bhs.set_u32(MAXCMDSN_OFFSET, max_cmdsn);
}

pub fn nop_in(lun: [u8; 8], itt: u32, ttt: u32) -> Bhs {
    let mut b = Bhs::new(Opcode::NopIn, 0x80);
    b.set_lun_bytes(lun);
    b.set_itt(itt);
    b.set_u32(20, ttt);
    b
}

/// SCSI Response (11.4). `response` 0 = command completed at target.
pub fn scsi_response(
    itt: u32,
    response: u8,
    status: u8,
    residual: Residual,
    exp_datasn: u32,
) -> Bhs {
    let mut b = Bhs::new(Opcode::ScsiResponse, 0x80 | residual.flag_bits());
    b.set_byte(2, response);
    b.set_byte(3, status);
    b.set_itt(itt);
    b.set_u32(20, 0); // SNACK Tag
    b.set_u32(36, exp_datasn);
    b.set_u32(44, residual.count());
    b
}

/// Status fields of the last Data-In of a command, when status is
/// phase-collapsed into it (S bit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataInStatus {
    pub status: u8,
    pub residual: Residual,
}

/// SCSI Data-In (11.7).
pub fn data_in(
    itt: u32,
    datasn: u32,
    offset: u32,
    final_: bool,
    status: Option<DataInStatus>,
) -> Bhs {
    let mut flags = if final_ { 0x80 } else { 0 };
    if let Some(st) = status {
        flags |= 0x01 | st.residual.flag_bits();
    }
    let mut b = Bhs::new(Opcode::DataIn, flags);
    if let Some(st) = status {
        b.set_byte(3, st.status);
        b.set_u32(44, st.residual.count());
    }
    b.set_itt(itt);
    b.set_u32(20, RESERVED_TAG);
    b.set_u32(36, datasn);
    b.set_u32(40, offset);
    b
}

/// Ready To Transfer (11.8).
pub fn r2t(lun: [u8; 8], itt: u32, ttt: u32, r2tsn: u32, offset: u32, len: u32) -> Bhs {
    let mut b = Bhs::new(Opcode::R2t, 0x80);
    b.set_lun_bytes(lun);
    b.set_itt(itt);
    b.set_u32(20, ttt);
    b.set_u32(36, r2tsn);
    b.set_u32(40, offset);
    b.set_u32(44, len);
    b
}

/// Task Management Function Response (11.6).
pub fn task_mgmt_response(itt: u32, response: u8) -> Bhs {
    let mut b = Bhs::new(Opcode::TaskMgmtResponse, 0x80);
    b.set_byte(2, response);
    b.set_itt(itt);
    b
}

/// Login Response (11.13). Unlike the other builders this one carries the
/// sequence numbers itself: login runs before the writer exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LoginResponse {
    pub transit: bool,
    pub continue_: bool,
    pub csg: u8,
    pub nsg: u8,
    pub version_max: u8,
    pub version_active: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: u32,
    pub statsn: u32,
    pub exp_cmdsn: u32,
    pub max_cmdsn: u32,
    pub status_class: u8,
    pub status_detail: u8,
}

impl LoginResponse {
    pub fn to_bhs(&self) -> Bhs {
        let mut flags = ((self.csg & 3) << 2) | (self.nsg & 3);
        if self.transit {
            flags |= 0x80;
        }
        if self.continue_ {
            flags |= 0x40;
        }
        let mut b = Bhs::new(Opcode::LoginResponse, flags);
        b.set_byte(2, self.version_max);
        b.set_byte(3, self.version_active);
        b.0[8..14].copy_from_slice(&self.isid);
        b.set_u16(14, self.tsih);
        b.set_itt(self.itt);
        stamp_sequence_numbers(&mut b, Some(self.statsn), self.exp_cmdsn, self.max_cmdsn);
        b.set_byte(36, self.status_class);
        b.set_byte(37, self.status_detail);
        b
    }
}

/// Text Response (11.11).
pub fn text_response(lun: [u8; 8], itt: u32, ttt: u32, final_: bool, continue_: bool) -> Bhs {
    let mut flags = 0;
    if final_ {
        flags |= 0x80;
    }
    if continue_ {
        flags |= 0x40;
    }
    let mut b = Bhs::new(Opcode::TextResponse, flags);
    b.set_lun_bytes(lun);
    b.set_itt(itt);
    b.set_u32(20, ttt);
    b
}

/// Logout Response (11.15).
pub fn logout_response(itt: u32, response: u8, time2wait: u16, time2retain: u16) -> Bhs {
    let mut b = Bhs::new(Opcode::LogoutResponse, 0x80);
    b.set_byte(2, response);
    b.set_itt(itt);
    b.set_u16(40, time2wait);
    b.set_u16(42, time2retain);
    b
}

/// Asynchronous Message event codes (11.9.1).
pub mod async_event {
    pub const SCSI_EVENT: u8 = 0;
    pub const LOGOUT_REQUEST: u8 = 1;
    pub const CONNECTION_DROP: u8 = 2;
    pub const SESSION_DROP: u8 = 3;
    pub const NEGOTIATION_REQUEST: u8 = 4;
}

/// Asynchronous Message (11.9).
pub fn async_message(lun: [u8; 8], event: u8, parameters: [u16; 3]) -> Bhs {
    let mut b = Bhs::new(Opcode::AsyncMessage, 0x80);
    b.set_lun_bytes(lun);
    b.set_itt(RESERVED_TAG);
    b.set_byte(36, event);
    b.set_u16(38, parameters[0]);
    b.set_u16(40, parameters[1]);
    b.set_u16(42, parameters[2]);
    b
}

/// Reject reason codes (11.17.1).
pub mod reject_reason {
    pub const DATA_DIGEST_ERROR: u8 = 0x02;
    pub const SNACK_REJECT: u8 = 0x03;
    pub const PROTOCOL_ERROR: u8 = 0x04;
    pub const COMMAND_NOT_SUPPORTED: u8 = 0x05;
    pub const IMMEDIATE_COMMAND_REJECT: u8 = 0x06;
    pub const TASK_IN_PROGRESS: u8 = 0x07;
    pub const INVALID_DATA_ACK: u8 = 0x08;
    pub const INVALID_PDU_FIELD: u8 = 0x09;
    pub const OUT_OF_RESOURCES: u8 = 0x0a;
    pub const NEGOTIATION_RESET: u8 = 0x0b;
    pub const WAITING_FOR_LOGOUT: u8 = 0x0c;
}

/// Reject (11.17); the rejected PDU's header goes in the data segment.
pub fn reject(reason: u8) -> Bhs {
    let mut b = Bhs::new(Opcode::Reject, 0x80);
    b.set_byte(2, reason);
    b.set_itt(RESERVED_TAG);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residual_between() {
        assert_eq!(Residual::between(512, 512), Residual::None);
        assert_eq!(Residual::between(0, 512), Residual::Overflow(512));
        assert_eq!(Residual::between(10000, 512), Residual::Underflow(9488));
        assert_eq!(Residual::between(0, u64::MAX), Residual::Overflow(u32::MAX));
    }

    #[test]
    fn data_in_with_status() {
        let b = data_in(
            5,
            3,
            8192,
            true,
            Some(DataInStatus {
                status: 0,
                residual: Residual::Underflow(100),
            }),
        );
        assert_eq!(b.0[0], 0x25);
        assert_eq!(b.flags(), 0x80 | 0x02 | 0x01);
        assert_eq!(b.u32_at(20), RESERVED_TAG);
        assert_eq!((b.u32_at(36), b.u32_at(40), b.u32_at(44)), (3, 8192, 100));
        let b = data_in(5, 0, 0, false, None);
        assert_eq!(b.flags(), 0);
    }

    #[test]
    fn scsi_response_layout() {
        let b = scsi_response(7, 0, 2, Residual::Overflow(512), 0);
        assert_eq!(b.0[0], 0x21);
        assert_eq!(b.flags(), 0x84);
        assert_eq!(
            (b.byte(2), b.byte(3), b.itt(), b.u32_at(44)),
            (0, 2, 7, 512)
        );
    }

    #[test]
    fn login_response_layout() {
        let r = LoginResponse {
            transit: true,
            csg: 1,
            nsg: 3,
            isid: [1, 2, 3, 4, 5, 6],
            tsih: 9,
            itt: 0x10,
            statsn: 0x20,
            exp_cmdsn: 0x30,
            max_cmdsn: 0x40,
            status_class: 2,
            status_detail: 3,
            ..Default::default()
        };
        let b = r.to_bhs();
        assert_eq!(b.0[0], 0x23);
        assert_eq!(b.flags(), 0x87);
        assert_eq!(&b.0[8..14], &[1, 2, 3, 4, 5, 6]);
        assert_eq!(
            (
                b.u16_at(14),
                b.itt(),
                b.u32_at(24),
                b.u32_at(28),
                b.u32_at(32)
            ),
            (9, 0x10, 0x20, 0x30, 0x40)
        );
        assert_eq!((b.byte(36), b.byte(37)), (2, 3));
    }

    #[test]
    fn stamp_leaves_statsn_when_absent() {
        let mut b = r2t([0; 8], 1, 2, 3, 4, 5);
        b.set_u32(24, 0xdead);
        stamp_sequence_numbers(&mut b, None, 10, 20);
        assert_eq!((b.u32_at(24), b.u32_at(28), b.u32_at(32)), (0xdead, 10, 20));
        assert_eq!((b.u32_at(36), b.u32_at(40), b.u32_at(44)), (3, 4, 5));
    }
}
