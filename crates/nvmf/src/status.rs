//! Completion status (NVMe Base 2.0, 4.6.1.2): the status code type and
//! code a command ends with, and the one translation of a device error
//! class into it.

use block::ErrorClass;

/// A status field without its phase bit: code in bits 7:0, type in
/// 10:8, Do Not Retry in bit 14.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Status(pub u16);

const GENERIC: u16 = 0;
const SPECIFIC: u16 = 1;
const MEDIA: u16 = 2;
const PATH: u16 = 3;
const DNR: u16 = 1 << 14;

const fn status(sct: u16, sc: u16, retry: bool) -> Status {
    Status(sct << 8 | sc | if retry { 0 } else { DNR })
}

impl Status {
    pub const SUCCESS: Status = Status(0);
    // Generic command status (figure 100).
    pub const INVALID_OPCODE: Status = status(GENERIC, 0x01, false);
    pub const INVALID_FIELD: Status = status(GENERIC, 0x02, false);
    pub const CID_CONFLICT: Status = status(GENERIC, 0x03, false);
    pub const DATA_TRANSFER_ERROR: Status = status(GENERIC, 0x04, false);
    pub const INTERNAL_ERROR: Status = status(GENERIC, 0x06, false);
    pub const ABORT_REQUESTED: Status = status(GENERIC, 0x07, false);
    pub const FUSED_FAILED: Status = status(GENERIC, 0x09, false);
    pub const FUSED_MISSING: Status = status(GENERIC, 0x0A, false);
    pub const INVALID_NAMESPACE: Status = status(GENERIC, 0x0B, false);
    pub const COMMAND_SEQUENCE: Status = status(GENERIC, 0x0C, false);
    pub const SGL_INVALID_TYPE: Status = status(GENERIC, 0x11, false);
    pub const SGL_LENGTH_INVALID: Status = status(GENERIC, 0x0F, false);
    pub const WRITE_PROTECTED: Status = status(GENERIC, 0x20, false);
    pub const INTERRUPTED: Status = status(GENERIC, 0x21, true);
    pub const TRANSIENT_TRANSPORT: Status = status(GENERIC, 0x22, true);
    pub const LBA_OUT_OF_RANGE: Status = status(GENERIC, 0x80, false);
    pub const CAPACITY_EXCEEDED: Status = status(GENERIC, 0x81, false);
    pub const NAMESPACE_NOT_READY: Status = status(GENERIC, 0x82, true);
    // Command specific status (figure 101, and Fabrics 2.0 figure 38).
    pub const INVALID_QUEUE_ID: Status = status(SPECIFIC, 0x01, false);
    pub const AER_LIMIT: Status = status(SPECIFIC, 0x05, false);
    pub const INVALID_LOG_PAGE: Status = status(SPECIFIC, 0x09, false);
    pub const NOT_SAVEABLE: Status = status(SPECIFIC, 0x0D, false);
    pub const CONNECT_INCOMPATIBLE: Status = status(SPECIFIC, 0x80, false);
    pub const CONNECT_BUSY: Status = status(SPECIFIC, 0x81, true);
    pub const CONNECT_INVALID_PARAMETERS: Status = status(SPECIFIC, 0x82, false);
    pub const CONNECT_INVALID_HOST: Status = status(SPECIFIC, 0x84, false);
    // Media and data integrity errors (figure 102).
    pub const WRITE_FAULT: Status = status(MEDIA, 0x80, false);
    pub const UNRECOVERED_READ: Status = status(MEDIA, 0x81, false);
    pub const COMPARE_FAILURE: Status = status(MEDIA, 0x85, false);
    pub const ACCESS_DENIED: Status = status(MEDIA, 0x86, false);
    // Path related status (figure 103).
    pub const ANA_INACCESSIBLE: Status = status(PATH, 0x02, false);

    pub fn is_success(self) -> bool {
        self.0 & 0x7FF == 0
    }

    pub fn code(self) -> u8 {
        self.0 as u8
    }

    pub fn code_type(self) -> u8 {
        (self.0 >> 8 & 7) as u8
    }

    pub fn do_not_retry(self) -> bool {
        self.0 & DNR != 0
    }
}

/// What a failed device call ends the command with. A medium error is a
/// write fault on a write and an unrecovered read otherwise.
pub fn class_status(class: ErrorClass, writing: bool) -> Status {
    match class {
        ErrorClass::Medium if writing => Status::WRITE_FAULT,
        ErrorClass::Medium => Status::UNRECOVERED_READ,
        ErrorClass::SpaceExhausted => Status::CAPACITY_EXCEEDED,
        ErrorClass::ReadOnly => Status::WRITE_PROTECTED,
        // The host may reach the device through the node that serves it now.
        ErrorClass::Fenced => Status::ANA_INACCESSIBLE,
        ErrorClass::NotReady => Status::NAMESPACE_NOT_READY,
        ErrorClass::TimedOut => Status::INTERRUPTED,
        ErrorClass::OutOfRange => Status::LBA_OUT_OF_RANGE,
        // The command was checked already: the fault is the target's.
        ErrorClass::Invalid => Status::INTERNAL_ERROR,
        ErrorClass::Unsupported => Status::INVALID_OPCODE,
    }
}

/// [`class_status`] of an error a device returned.
pub fn device_status(e: &std::io::Error, writing: bool) -> Status {
    class_status(block::classify(e), writing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_sit_where_the_completion_entry_has_them() {
        let s = Status::COMPARE_FAILURE;
        assert_eq!((s.code_type(), s.code()), (2, 0x85));
        assert!(s.do_not_retry() && !s.is_success());
        assert!(!Status::INTERRUPTED.do_not_retry());
        assert!(Status::SUCCESS.is_success());
    }

    /// Each device error class, the status it ends a command with, and
    /// the section of NVMe Base 2.0 that defines that status.
    #[test]
    fn device_error_classes_map_once() {
        let table = [
            (
                ErrorClass::Medium,
                true,
                Status::WRITE_FAULT,
                "4.6.1.2.4 Write Fault",
            ),
            (
                ErrorClass::Medium,
                false,
                Status::UNRECOVERED_READ,
                "4.6.1.2.4 Unrecovered Read Error",
            ),
            (
                ErrorClass::SpaceExhausted,
                true,
                Status::CAPACITY_EXCEEDED,
                "4.6.1.2.1 Capacity Exceeded",
            ),
            (
                ErrorClass::ReadOnly,
                true,
                Status::WRITE_PROTECTED,
                "4.6.1.2.1 Namespace is Write Protected",
            ),
            (
                ErrorClass::Fenced,
                false,
                Status::ANA_INACCESSIBLE,
                "4.6.1.2.5 Asymmetric Access Inaccessible",
            ),
            (
                ErrorClass::NotReady,
                false,
                Status::NAMESPACE_NOT_READY,
                "4.6.1.2.1 Namespace Not Ready",
            ),
            (
                ErrorClass::TimedOut,
                false,
                Status::INTERRUPTED,
                "4.6.1.2.1 Command Interrupted",
            ),
            (
                ErrorClass::OutOfRange,
                false,
                Status::LBA_OUT_OF_RANGE,
                "4.6.1.2.1 LBA Out of Range",
            ),
            (
                ErrorClass::Invalid,
                false,
                Status::INTERNAL_ERROR,
                "4.6.1.2.1 Internal Error",
            ),
            (
                ErrorClass::Unsupported,
                false,
                Status::INVALID_OPCODE,
                "4.6.1.2.1 Invalid Command Opcode",
            ),
        ];
        for class in ErrorClass::ALL {
            assert!(table.iter().any(|t| t.0 == class), "{class:?} has a status");
        }
        for (class, writing, want, section) in table {
            assert_eq!(class_status(class, writing), want, "{class:?}: {section}");
            let raised: std::io::Error = block::DeviceError::new(class, "from a device").into();
            assert_eq!(device_status(&raised, writing), want, "{section}");
        }
        let enospc = std::io::Error::from_raw_os_error(28);
        assert_eq!(device_status(&enospc, true), Status::CAPACITY_EXCEEDED);
    }
}
