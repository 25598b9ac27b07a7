//! Sense data: every CHECK CONDITION the command set reports is built here.
//!
//! A [`Sense`] holds the meaning (key, additional sense code, information,
//! sense-key specific bytes); [`Sense::encode`] renders it in fixed format
//! (SPC-4 4.5.3) or descriptor format (SPC-4 4.5.2), chosen by the D_SENSE
//! bit of the control mode page.
//!
//! A failed device call is answered by the class of its error
//! ([`block::classify`]), one sense per class ([`class_sense`]).

use std::io;

use block::ErrorClass;

/// Sense keys (SPC-4 table 27).
pub mod key {
    pub const NO_SENSE: u8 = 0x0;
    pub const NOT_READY: u8 = 0x2;
    pub const MEDIUM_ERROR: u8 = 0x3;
    pub const HARDWARE_ERROR: u8 = 0x4;
    pub const ILLEGAL_REQUEST: u8 = 0x5;
    pub const UNIT_ATTENTION: u8 = 0x6;
    pub const DATA_PROTECT: u8 = 0x7;
    pub const COPY_ABORTED: u8 = 0xA;
    pub const MISCOMPARE: u8 = 0xE;
}

/// Additional sense code and qualifier pairs used by this crate.
pub mod asc {
    pub const NO_ADDITIONAL: (u8, u8) = (0x00, 0x00);
    pub const NOT_READY_OPERATION_IN_PROGRESS: (u8, u8) = (0x04, 0x07);
    pub const NOT_READY_MANUAL_INTERVENTION: (u8, u8) = (0x04, 0x03);
    pub const NOT_READY_SANITIZE_IN_PROGRESS: (u8, u8) = (0x04, 0x1B);
    pub const NOT_ACCESSIBLE_TRANSITIONING: (u8, u8) = (0x04, 0x0A);
    pub const NOT_ACCESSIBLE_TARGET_PORT_STANDBY: (u8, u8) = (0x04, 0x0B);
    pub const NOT_ACCESSIBLE_TARGET_PORT_UNAVAILABLE: (u8, u8) = (0x04, 0x0C);
    pub const WRITE_ERROR: (u8, u8) = (0x0C, 0x00);
    pub const COPY_TARGET_NOT_REACHABLE: (u8, u8) = (0x0D, 0x02);
    pub const INVALID_FIELD_IN_INFORMATION_UNIT: (u8, u8) = (0x0E, 0x03);
    pub const UNRECOVERED_READ_ERROR: (u8, u8) = (0x11, 0x00);
    pub const PARAMETER_LIST_LENGTH_ERROR: (u8, u8) = (0x1A, 0x00);
    pub const MISCOMPARE_DURING_VERIFY: (u8, u8) = (0x1D, 0x00);
    pub const INVALID_OPCODE: (u8, u8) = (0x20, 0x00);
    pub const LBA_OUT_OF_RANGE: (u8, u8) = (0x21, 0x00);
    pub const INVALID_FIELD_IN_CDB: (u8, u8) = (0x24, 0x00);
    pub const LU_NOT_SUPPORTED: (u8, u8) = (0x25, 0x00);
    pub const INVALID_FIELD_IN_PARAMETER_LIST: (u8, u8) = (0x26, 0x00);
    pub const INVALID_RELEASE_OF_PERSISTENT_RESERVATION: (u8, u8) = (0x26, 0x04);
    pub const TOO_MANY_TARGET_DESCRIPTORS: (u8, u8) = (0x26, 0x06);
    pub const UNSUPPORTED_TARGET_DESCRIPTOR_TYPE: (u8, u8) = (0x26, 0x07);
    pub const TOO_MANY_SEGMENT_DESCRIPTORS: (u8, u8) = (0x26, 0x08);
    pub const UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE: (u8, u8) = (0x26, 0x09);
    pub const WRITE_PROTECTED: (u8, u8) = (0x27, 0x00);
    pub const SOFTWARE_WRITE_PROTECTED: (u8, u8) = (0x27, 0x02);
    pub const SPACE_ALLOCATION_FAILED_WRITE_PROTECT: (u8, u8) = (0x27, 0x07);
    pub const POWER_ON_RESET: (u8, u8) = (0x29, 0x00);
    pub const MODE_PARAMETERS_CHANGED: (u8, u8) = (0x2A, 0x01);
    pub const RESERVATIONS_PREEMPTED: (u8, u8) = (0x2A, 0x03);
    pub const RESERVATIONS_RELEASED: (u8, u8) = (0x2A, 0x04);
    pub const REGISTRATIONS_PREEMPTED: (u8, u8) = (0x2A, 0x05);
    pub const ASYMMETRIC_ACCESS_STATE_CHANGED: (u8, u8) = (0x2A, 0x06);
    pub const CAPACITY_DATA_CHANGED: (u8, u8) = (0x2A, 0x09);
    pub const SANITIZE_FAILED: (u8, u8) = (0x31, 0x03);
    pub const SOFT_THRESHOLD_REACHED: (u8, u8) = (0x38, 0x07);
    pub const SAVING_PARAMETERS_NOT_SUPPORTED: (u8, u8) = (0x39, 0x00);
    pub const INQUIRY_DATA_CHANGED: (u8, u8) = (0x3F, 0x03);
    pub const REPORTED_LUNS_CHANGED: (u8, u8) = (0x3F, 0x0E);
    pub const INTERNAL_TARGET_FAILURE: (u8, u8) = (0x44, 0x00);
    pub const SET_TARGET_PORT_GROUPS_FAILED: (u8, u8) = (0x67, 0x0A);
}

/// The meaning of one sense report, independent of its wire format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sense {
    pub key: u8,
    pub asc: u8,
    pub ascq: u8,
    /// INFORMATION field (e.g. the offset of a miscompare).
    pub information: Option<u64>,
    /// Sense-key specific bytes, SKSV already set in the first byte.
    pub specific: Option<[u8; 3]>,
}

impl Sense {
    pub fn new(key: u8, code: (u8, u8)) -> Sense {
        Sense {
            key,
            asc: code.0,
            ascq: code.1,
            information: None,
            specific: None,
        }
    }

    pub fn illegal(code: (u8, u8)) -> Sense {
        Sense::new(key::ILLEGAL_REQUEST, code)
    }

    /// INVALID FIELD IN CDB pointing at `byte` (and `bit` when given).
    pub fn invalid_cdb(byte: usize, bit: Option<u8>) -> Sense {
        Sense::illegal(asc::INVALID_FIELD_IN_CDB).with_field(true, byte, bit)
    }

    /// INVALID FIELD IN PARAMETER LIST pointing at `byte` of the data.
    pub fn invalid_param(byte: usize, bit: Option<u8>) -> Sense {
        Sense::illegal(asc::INVALID_FIELD_IN_PARAMETER_LIST).with_field(false, byte, bit)
    }

    pub fn invalid_opcode() -> Sense {
        Sense::illegal(asc::INVALID_OPCODE).with_field(true, 0, None)
    }

    pub fn lba_out_of_range() -> Sense {
        Sense::illegal(asc::LBA_OUT_OF_RANGE)
    }

    pub fn param_list_length() -> Sense {
        Sense::illegal(asc::PARAMETER_LIST_LENGTH_ERROR)
    }

    pub fn write_protected() -> Sense {
        Sense::new(key::DATA_PROTECT, asc::WRITE_PROTECTED)
    }

    pub fn lu_not_supported() -> Sense {
        Sense::illegal(asc::LU_NOT_SUPPORTED)
    }

    pub fn unit_attention(code: (u8, u8)) -> Sense {
        Sense::new(key::UNIT_ATTENTION, code)
    }

    /// MISCOMPARE DURING VERIFY OPERATION at byte `offset` of the compared data.
    pub fn miscompare(offset: u64) -> Sense {
        Sense::new(key::MISCOMPARE, asc::MISCOMPARE_DURING_VERIFY).with_information(offset)
    }

    pub fn read_error() -> Sense {
        Sense::new(key::MEDIUM_ERROR, asc::UNRECOVERED_READ_ERROR)
    }

    pub fn write_error() -> Sense {
        Sense::new(key::MEDIUM_ERROR, asc::WRITE_ERROR)
    }

    pub fn internal_failure() -> Sense {
        Sense::new(key::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE)
    }

    /// NOT READY, SANITIZE IN PROGRESS with the progress indication
    /// (`progress` in 1/65536 units).
    pub fn sanitize_in_progress(progress: u16) -> Sense {
        let p = progress.to_be_bytes();
        Sense {
            specific: Some([0x80, p[0], p[1]]),
            ..Sense::new(key::NOT_READY, asc::NOT_READY_SANITIZE_IN_PROGRESS)
        }
    }

    pub fn with_information(mut self, info: u64) -> Sense {
        self.information = Some(info);
        self
    }

    /// Adds a field pointer (SPC-4 4.5.2.4.2): `in_cdb` is the C/D bit.
    pub fn with_field(mut self, in_cdb: bool, byte: usize, bit: Option<u8>) -> Sense {
        let mut b0 = 0x80;
        if in_cdb {
            b0 |= 0x40;
        }
        if let Some(bit) = bit {
            b0 |= 0x08 | (bit & 0x07);
        }
        let field = u16::try_from(byte).unwrap_or(u16::MAX).to_be_bytes();
        self.specific = Some([b0, field[0], field[1]]);
        self
    }

    /// Renders the sense data; `descriptor` selects descriptor format.
    pub fn encode(&self, descriptor: bool) -> Vec<u8> {
        if descriptor {
            self.encode_descriptor()
        } else {
            self.encode_fixed()
        }
    }

    fn encode_fixed(&self) -> Vec<u8> {
        let mut s = vec![0u8; 18];
        s[0] = 0x70;
        s[2] = self.key & 0x0F;
        if let Some(info) = self.information {
            // The fixed format only has room for 32 bits; VALID says
            // whether the value fits.
            if let Ok(v) = u32::try_from(info) {
                s[0] |= 0x80;
                s[3..7].copy_from_slice(&v.to_be_bytes());
            }
        }
        s[7] = 10;
        s[12] = self.asc;
        s[13] = self.ascq;
        if let Some(sks) = self.specific {
            s[15..18].copy_from_slice(&sks);
        }
        s
    }

    fn encode_descriptor(&self) -> Vec<u8> {
        let mut s = vec![0u8; 8];
        s[0] = 0x72;
        s[1] = self.key & 0x0F;
        s[2] = self.asc;
        s[3] = self.ascq;
        if let Some(info) = self.information {
            s.extend_from_slice(&[0x00, 0x0A, 0x80, 0x00]);
            s.extend_from_slice(&info.to_be_bytes());
        }
        if let Some(sks) = self.specific {
            s.extend_from_slice(&[0x02, 0x06, 0x00, 0x00]);
            s.extend_from_slice(&sks);
            s.push(0);
        }
        s[7] = (s.len() - 8) as u8;
        s
    }
}

/// Sense for a failed device call; `writing` when it changed the medium.
pub(crate) fn io_sense(e: &io::Error, writing: bool) -> Sense {
    class_sense(block::classify(e), writing)
}

/// The sense of each class of device error.
pub(crate) fn class_sense(class: ErrorClass, writing: bool) -> Sense {
    match class {
        ErrorClass::Medium => medium_error(writing),
        // SBC's answer for a write that needs space a thin LU cannot
        // allocate: initiators report a full pool, not a failing disk. A
        // read allocates nothing, so it failed for some other reason.
        ErrorClass::SpaceExhausted if writing => Sense::new(
            key::DATA_PROTECT,
            asc::SPACE_ALLOCATION_FAILED_WRITE_PROTECT,
        ),
        ErrorClass::SpaceExhausted => medium_error(false),
        ErrorClass::ReadOnly => Sense::write_protected(),
        // Another node serves the LU now: as the ALUA unavailable state
        // says, so multipath moves to a path through that node.
        ErrorClass::Fenced => {
            Sense::new(key::NOT_READY, asc::NOT_ACCESSIBLE_TARGET_PORT_UNAVAILABLE)
        }
        ErrorClass::NotReady => Sense::new(key::NOT_READY, asc::NOT_READY_MANUAL_INTERVENTION),
        // Nothing says the medium is bad, and the request may still
        // complete: initiators retry after a pause (and multipath may send
        // to another path).
        ErrorClass::TimedOut => Sense::new(key::NOT_READY, asc::NOT_READY_OPERATION_IN_PROGRESS),
        ErrorClass::OutOfRange => Sense::lba_out_of_range(),
        // The CDB was checked before the device saw it, so a device that
        // refuses the arguments is this target's own failure.
        ErrorClass::Invalid => Sense::internal_failure(),
        // Initiators stop sending a command answered so (Linux turns
        // UNMAP and WRITE SAME off for the disk).
        ErrorClass::Unsupported => Sense::illegal(asc::INVALID_OPCODE),
    }
}

fn medium_error(writing: bool) -> Sense {
    if writing {
        Sense::write_error()
    } else {
        Sense::read_error()
    }
}

/// Why a command did not complete with GOOD.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    Check(Sense),
    /// A status without sense data, e.g. RESERVATION CONFLICT.
    Status(u8),
}

impl From<Sense> for Failure {
    fn from(s: Sense) -> Failure {
        Failure::Check(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_format_layout() {
        let s = Sense::invalid_cdb(2, Some(5)).encode(false);
        assert_eq!(s.len(), 18);
        assert_eq!(s[0], 0x70);
        assert_eq!(s[2], key::ILLEGAL_REQUEST);
        assert_eq!(s[7], 10);
        assert_eq!((s[12], s[13]), asc::INVALID_FIELD_IN_CDB);
        assert_eq!(s[15], 0x80 | 0x40 | 0x08 | 5);
        assert_eq!(&s[16..18], &[0, 2]);
    }

    #[test]
    fn fixed_format_information_valid_only_when_it_fits() {
        let s = Sense::miscompare(0x1234).encode(false);
        assert_eq!(s[0], 0xF0);
        assert_eq!(&s[3..7], &[0, 0, 0x12, 0x34]);
        let s = Sense::miscompare(1 << 40).encode(false);
        assert_eq!(s[0], 0x70);
    }

    #[test]
    fn descriptor_format_layout() {
        let s = Sense::miscompare(7).with_field(false, 3, None).encode(true);
        assert_eq!(s[0], 0x72);
        assert_eq!(s[1], key::MISCOMPARE);
        assert_eq!((s[2], s[3]), asc::MISCOMPARE_DURING_VERIFY);
        assert_eq!(s[7] as usize, s.len() - 8);
        // Information descriptor first, then sense-key specific.
        assert_eq!(&s[8..12], &[0x00, 0x0A, 0x80, 0x00]);
        assert_eq!(&s[12..20], &7u64.to_be_bytes());
        assert_eq!(&s[20..24], &[0x02, 0x06, 0x00, 0x00]);
        assert_eq!(&s[24..27], &[0x80, 0x00, 0x03]);
    }

    fn errno(n: i32) -> io::Error {
        io::Error::from_raw_os_error(n)
    }

    fn kind(k: io::ErrorKind) -> io::Error {
        io::Error::new(k, "from a device")
    }

    /// The (key, ASC, ASCQ) of `class` raised outright and of each of
    /// `errors`, on a write and on a read.
    fn assert_answers(class: ErrorClass, errors: Vec<io::Error>, write: Answer, read: Answer) {
        let raised = block::DeviceError::new(class, "from a device").into();
        for e in std::iter::once(raised).chain(errors) {
            for (writing, want) in [(true, write), (false, read)] {
                let s = io_sense(&e, writing);
                assert_eq!((s.key, s.asc, s.ascq), want, "{e:?}, writing: {writing}");
            }
        }
    }

    type Answer = (u8, u8, u8);
    const WRITE_ERROR: Answer = (key::MEDIUM_ERROR, 0x0C, 0x00);
    const READ_ERROR: Answer = (key::MEDIUM_ERROR, 0x11, 0x00);
    const SPACE_ALLOCATION_FAILED: Answer = (key::DATA_PROTECT, 0x27, 0x07);
    const WRITE_PROTECTED: Answer = (key::DATA_PROTECT, 0x27, 0x00);
    const PORT_UNAVAILABLE: Answer = (key::NOT_READY, 0x04, 0x0C);
    const MANUAL_INTERVENTION: Answer = (key::NOT_READY, 0x04, 0x03);
    const IN_PROGRESS: Answer = (key::NOT_READY, 0x04, 0x07);
    const LBA_OUT_OF_RANGE: Answer = (key::ILLEGAL_REQUEST, 0x21, 0x00);
    const INTERNAL_FAILURE: Answer = (key::HARDWARE_ERROR, 0x44, 0x00);
    const INVALID_OPCODE: Answer = (key::ILLEGAL_REQUEST, 0x20, 0x00);

    /// A test for each class: its sense on a write and on a read, for the
    /// class raised outright and for the errors devices raise that mean it.
    macro_rules! class_tests {
        ($($test:ident: $class:ident => $write:expr, $read:expr, [$($e:expr),*];)*) => {$(
            #[test]
            fn $test() {
                assert_answers(ErrorClass::$class, vec![$($e),*], $write, $read);
            }
        )*};
    }

    class_tests! {
        // What nothing better is known of is a medium error too.
        a_medium_error_is_a_write_or_read_error: Medium => WRITE_ERROR, READ_ERROR,
            [errno(libc::EIO), errno(libc::ENOMEM), kind(io::ErrorKind::InvalidData)];
        // The pool's own error and the file system's; a read allocates
        // nothing, so one that meets a full pool is a read error.
        a_write_out_of_space_is_a_space_allocation_failure:
            SpaceExhausted => SPACE_ALLOCATION_FAILED, READ_ERROR,
            [kind(io::ErrorKind::StorageFull), errno(libc::ENOSPC), errno(libc::EDQUOT)];
        a_read_only_device_is_write_protected: ReadOnly => WRITE_PROTECTED, WRITE_PROTECTED,
            [errno(libc::EROFS), errno(libc::EACCES)];
        a_fenced_node_is_an_unavailable_port: Fenced => PORT_UNAVAILABLE, PORT_UNAVAILABLE,
            [errno(libc::ESHUTDOWN)];
        a_device_not_ready_needs_manual_intervention:
            NotReady => MANUAL_INTERVENTION, MANUAL_INTERVENTION, [errno(libc::ENXIO)];
        a_timeout_is_retryable: TimedOut => IN_PROGRESS, IN_PROGRESS,
            [errno(libc::ETIMEDOUT), kind(io::ErrorKind::TimedOut)];
        past_the_devices_end_is_an_lba_out_of_range:
            OutOfRange => LBA_OUT_OF_RANGE, LBA_OUT_OF_RANGE, [];
        refused_arguments_are_an_internal_target_failure:
            Invalid => INTERNAL_FAILURE, INTERNAL_FAILURE, [errno(libc::EINVAL)];
        an_unsupported_operation_is_an_invalid_opcode:
            Unsupported => INVALID_OPCODE, INVALID_OPCODE,
            [kind(io::ErrorKind::Unsupported), errno(libc::EOPNOTSUPP)];
    }

    #[test]
    fn sanitize_progress_is_in_sense_key_specific_bytes() {
        let s = Sense::sanitize_in_progress(0x8000).encode(false);
        assert_eq!(s[2], key::NOT_READY);
        assert_eq!(&s[15..18], &[0x80, 0x80, 0x00]);
    }
}
