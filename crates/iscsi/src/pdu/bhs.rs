//! The 48-byte Basic Header Segment and the opcodes it carries.
//!
//! Field offsets are fixed by RFC 7143 section 11; every accessor takes a
//! constant offset inside the array, so none of them can go out of bounds.

/// Length of the Basic Header Segment.
pub const BHS_LEN: usize = 48;

/// The "no tag" value for ITT and TTT fields.
pub const RESERVED_TAG: u32 = 0xffff_ffff;

/// Opcodes of RFC 7143 section 11.1.1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Opcode {
    NopOut,
    ScsiCommand,
    TaskMgmtRequest,
    LoginRequest,
    TextRequest,
    DataOut,
    LogoutRequest,
    SnackRequest,
    NopIn,
    ScsiResponse,
    TaskMgmtResponse,
    LoginResponse,
    TextResponse,
    DataIn,
    LogoutResponse,
    R2t,
    AsyncMessage,
    Reject,
}

impl Opcode {
    pub fn from_u8(raw: u8) -> Option<Opcode> {
        Some(match raw & 0x3f {
            0x00 => Opcode::NopOut,
            0x01 => Opcode::ScsiCommand,
            0x02 => Opcode::TaskMgmtRequest,
            0x03 => Opcode::LoginRequest,
            0x04 => Opcode::TextRequest,
            0x05 => Opcode::DataOut,
            0x06 => Opcode::LogoutRequest,
            0x10 => Opcode::SnackRequest,
            0x20 => Opcode::NopIn,
            0x21 => Opcode::ScsiResponse,
            0x22 => Opcode::TaskMgmtResponse,
            0x23 => Opcode::LoginResponse,
            0x24 => Opcode::TextResponse,
            0x25 => Opcode::DataIn,
            0x26 => Opcode::LogoutResponse,
            0x31 => Opcode::R2t,
            0x32 => Opcode::AsyncMessage,
            0x3f => Opcode::Reject,
            _ => return None,
        })
    }

    pub fn as_u8(self) -> u8 {
        match self {
            Opcode::NopOut => 0x00,
            Opcode::ScsiCommand => 0x01,
            Opcode::TaskMgmtRequest => 0x02,
            Opcode::LoginRequest => 0x03,
            Opcode::TextRequest => 0x04,
            Opcode::DataOut => 0x05,
            Opcode::LogoutRequest => 0x06,
            Opcode::SnackRequest => 0x10,
            Opcode::NopIn => 0x20,
            Opcode::ScsiResponse => 0x21,
            Opcode::TaskMgmtResponse => 0x22,
            Opcode::LoginResponse => 0x23,
            Opcode::TextResponse => 0x24,
            Opcode::DataIn => 0x25,
            Opcode::LogoutResponse => 0x26,
            Opcode::R2t => 0x31,
            Opcode::AsyncMessage => 0x32,
            Opcode::Reject => 0x3f,
        }
    }
}

/// A Basic Header Segment, kept as raw bytes with typed accessors.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Bhs(pub [u8; BHS_LEN]);

impl Default for Bhs {
    fn default() -> Self {
        Bhs([0; BHS_LEN])
    }
}

impl std::fmt::Debug for Bhs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Bhs(op={:#04x} flags={:#04x} itt={:#010x})",
            self.opcode_raw(),
            self.flags(),
            self.itt()
        )
    }
}

impl Bhs {
    /// A header with the opcode and flags byte set, everything else zero.
    pub fn new(opcode: Opcode, flags: u8) -> Bhs {
        let mut b = Bhs::default();
        b.0[0] = opcode.as_u8();
        b.0[1] = flags;
        b
    }

    pub fn opcode_raw(&self) -> u8 {
        self.0[0] & 0x3f
    }

    pub fn opcode(&self) -> Option<Opcode> {
        Opcode::from_u8(self.0[0])
    }

    /// The I bit: immediate delivery.
    pub fn immediate(&self) -> bool {
        self.0[0] & 0x40 != 0
    }

    pub fn set_immediate(&mut self, on: bool) {
        if on {
            self.0[0] |= 0x40;
        } else {
            self.0[0] &= !0x40;
        }
    }

    pub fn flags(&self) -> u8 {
        self.0[1]
    }

    /// The F (final) bit shared by most opcodes, or T (transit) for login.
    pub fn final_bit(&self) -> bool {
        self.0[1] & 0x80 != 0
    }

    /// TotalAHSLength in bytes (the wire field counts 4-byte words).
    pub fn total_ahs_len(&self) -> usize {
        usize::from(self.0[4]) * 4
    }

    pub fn set_total_ahs_len_bytes(&mut self, bytes: usize) {
        self.0[4] = (bytes / 4).min(255) as u8;
    }

    pub fn data_segment_len(&self) -> u32 {
        u32::from_be_bytes([0, self.0[5], self.0[6], self.0[7]])
    }

    pub fn set_data_segment_len(&mut self, len: u32) {
        let b = len.to_be_bytes();
        self.0[5] = b[1];
        self.0[6] = b[2];
        self.0[7] = b[3];
    }

    /// Bytes 8..16: LUN or opcode-specific.
    pub fn lun_bytes(&self) -> [u8; 8] {
        let mut l = [0u8; 8];
        l.copy_from_slice(&self.0[8..16]);
        l
    }

    pub fn set_lun_bytes(&mut self, lun: [u8; 8]) {
        self.0[8..16].copy_from_slice(&lun);
    }

    pub fn itt(&self) -> u32 {
        self.u32_at(16)
    }

    pub fn set_itt(&mut self, itt: u32) {
        self.set_u32(16, itt);
    }

    /// Big-endian u32 at a 4-byte aligned field offset below 48.
    pub fn u32_at(&self, off: usize) -> u32 {
        let mut b = [0u8; 4];
        if let Some(s) = self.0.get(off..off + 4) {
            b.copy_from_slice(s);
        }
        u32::from_be_bytes(b)
    }

    pub fn set_u32(&mut self, off: usize, v: u32) {
        if let Some(s) = self.0.get_mut(off..off + 4) {
            s.copy_from_slice(&v.to_be_bytes());
        }
    }

    pub fn u16_at(&self, off: usize) -> u16 {
        let mut b = [0u8; 2];
        if let Some(s) = self.0.get(off..off + 2) {
            b.copy_from_slice(s);
        }
        u16::from_be_bytes(b)
    }

    pub fn set_u16(&mut self, off: usize, v: u16) {
        if let Some(s) = self.0.get_mut(off..off + 2) {
            s.copy_from_slice(&v.to_be_bytes());
        }
    }

    pub fn byte(&self, off: usize) -> u8 {
        self.0.get(off).copied().unwrap_or(0)
    }

    pub fn set_byte(&mut self, off: usize, v: u8) {
        if let Some(b) = self.0.get_mut(off) {
            *b = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcode_round_trip() {
        for raw in 0u8..=0x3f {
            if let Some(op) = Opcode::from_u8(raw) {
                assert_eq!(op.as_u8(), raw);
            }
        }
        assert_eq!(
            Opcode::from_u8(0x41),
            Some(Opcode::ScsiCommand),
            "I bit is ignored"
        );
        assert_eq!(Opcode::from_u8(0x07), None);
    }

    #[test]
    fn data_segment_length_is_24_bits() {
        let mut b = Bhs::default();
        b.set_data_segment_len(0x00ab_cdef);
        assert_eq!(&b.0[5..8], &[0xab, 0xcd, 0xef]);
        assert_eq!(b.data_segment_len(), 0x00ab_cdef);
    }

    #[test]
    fn field_accessors() {
        let mut b = Bhs::new(Opcode::NopIn, 0x80);
        b.set_itt(0x1234_5678);
        b.set_u32(44, 7);
        b.set_u16(36, 0x0203);
        b.set_immediate(true);
        assert_eq!(b.0[0], 0x60);
        assert_eq!(b.opcode(), Some(Opcode::NopIn));
        assert!(b.immediate());
        assert_eq!(b.itt(), 0x1234_5678);
        assert_eq!(b.u32_at(44), 7);
        assert_eq!(b.u16_at(36), 0x0203);
        assert_eq!(b.u32_at(46), 0, "out of range reads are zero, not a panic");
        b.set_total_ahs_len_bytes(8);
        assert_eq!(b.total_ahs_len(), 8);
    }
}
