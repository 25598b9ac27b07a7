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
    pub const AER_LIMIT: Status = status(SPECIFIC, 0x05, false);
    pub const INVALID_LOG_PAGE: Status = status(SPECIFIC, 0x09, false);
    pub const NOT_SAVEABLE: Status = status(SPECIFIC, 0x0D, false);
    pub const CONNECT_INCOMPATIBLE: Status = status(SPECIFIC, 0x80, false);
    pub const CONNECT_BUSY: Status = status(SPECIFIC, 0x81, true);
    pub const CONNECT_INVALID_PARAMETERS: Status = status(SPECIFIC, 0x82, false);
    pub const CONNECT_INVALID_HOST: Status = status(SPECIFIC, 0x84, false);
    /// Authentication Required (Fabrics 2.0, figure 38).
    pub const AUTH_REQUIRED: Status = status(SPECIFIC, 0x91, false);
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

    /// Every status this target sends, where it sits in the completion
    /// entry, and the section of the specification that defines it.
    #[test]
    fn statuses_are_the_ones_the_specifications_define() {
        let table = [
            (
                Status::INVALID_OPCODE,
                0,
                0x01,
                "Base 2.0 4.6.1.2.1: Invalid Command Opcode (an unknown opcode)",
            ),
            (
                Status::INVALID_FIELD,
                0,
                0x02,
                "Base 2.0 4.6.1.2.1: Invalid Field in Command (a transfer over MDTS, a bad CNS)",
            ),
            (
                Status::CID_CONFLICT,
                0,
                0x03,
                "Base 2.0 4.6.1.2.1: Command ID Conflict",
            ),
            (
                Status::INTERNAL_ERROR,
                0,
                0x06,
                "Base 2.0 4.6.1.2.1: Internal Error",
            ),
            (
                Status::ABORT_REQUESTED,
                0,
                0x07,
                "Base 2.0 4.6.1.2.1: Command Abort Requested (an aborted event request)",
            ),
            (
                Status::FUSED_FAILED,
                0,
                0x09,
                "Base 2.0 4.6.1.2.1: Command Aborted due to Failed Fused Command",
            ),
            (
                Status::FUSED_MISSING,
                0,
                0x0A,
                "Base 2.0 4.6.1.2.1: Command Aborted due to Missing Fused Command",
            ),
            (
                Status::INVALID_NAMESPACE,
                0,
                0x0B,
                "Base 2.0 4.6.1.2.1: Invalid Namespace or Format",
            ),
            (
                Status::COMMAND_SEQUENCE,
                0,
                0x0C,
                "Base 2.0 4.6.1.2.1: Command Sequence Error (before Connect, before CC.EN)",
            ),
            (
                Status::SGL_LENGTH_INVALID,
                0,
                0x0F,
                "Base 2.0 4.6.1.2.1: Data SGL Length Invalid",
            ),
            (
                Status::SGL_INVALID_TYPE,
                0,
                0x11,
                "Base 2.0 4.6.1.2.1: SGL Descriptor Type Invalid",
            ),
            (
                Status::WRITE_PROTECTED,
                0,
                0x20,
                "Base 2.0 4.6.1.2.1: Namespace is Write Protected",
            ),
            (
                Status::INTERRUPTED,
                0,
                0x21,
                "Base 2.0 4.6.1.2.1: Command Interrupted",
            ),
            (
                Status::TRANSIENT_TRANSPORT,
                0,
                0x22,
                "Base 2.0 4.6.1.2.1: Transient Transport Error (a bad data digest)",
            ),
            (
                Status::LBA_OUT_OF_RANGE,
                0,
                0x80,
                "Base 2.0 4.6.1.2.1: LBA Out of Range",
            ),
            (
                Status::CAPACITY_EXCEEDED,
                0,
                0x81,
                "Base 2.0 4.6.1.2.1: Capacity Exceeded",
            ),
            (
                Status::NAMESPACE_NOT_READY,
                0,
                0x82,
                "Base 2.0 4.6.1.2.1: Namespace Not Ready",
            ),
            (
                Status::AER_LIMIT,
                1,
                0x05,
                "Base 2.0 5.2: Asynchronous Event Request Limit Exceeded",
            ),
            (
                Status::INVALID_LOG_PAGE,
                1,
                0x09,
                "Base 2.0 5.16: Invalid Log Page",
            ),
            (
                Status::NOT_SAVEABLE,
                1,
                0x0D,
                "Base 2.0 5.27: Feature Identifier Not Saveable",
            ),
            (
                Status::CONNECT_INCOMPATIBLE,
                1,
                0x80,
                "Fabrics 2.0 6.3: Connect Incompatible Format",
            ),
            (
                Status::CONNECT_BUSY,
                1,
                0x81,
                "Fabrics 2.0 6.3: Connect Controller Busy",
            ),
            (
                Status::CONNECT_INVALID_PARAMETERS,
                1,
                0x82,
                "Fabrics 2.0 6.3: Connect Invalid Parameters",
            ),
            (
                Status::CONNECT_INVALID_HOST,
                1,
                0x84,
                "Fabrics 2.0 6.3: Connect Invalid Host (not in allow_hosts)",
            ),
            (
                Status::WRITE_FAULT,
                2,
                0x80,
                "Base 2.0 4.6.1.2.4: Write Fault",
            ),
            (
                Status::UNRECOVERED_READ,
                2,
                0x81,
                "Base 2.0 4.6.1.2.4: Unrecovered Read Error",
            ),
            (
                Status::COMPARE_FAILURE,
                2,
                0x85,
                "Base 2.0 4.6.1.2.4: Compare Failure",
            ),
            (
                Status::ACCESS_DENIED,
                2,
                0x86,
                "Base 2.0 4.6.1.2.4: Access Denied (a host no longer admitted)",
            ),
            (
                Status::ANA_INACCESSIBLE,
                3,
                0x02,
                "Base 2.0 4.6.1.2.5: Asymmetric Access Inaccessible",
            ),
        ];
        for (status, sct, sc, section) in table {
            assert_eq!((status.code_type(), status.code()), (sct, sc), "{section}");
            // Retrying these can succeed; nothing else is worth it.
            let retry = [
                Status::INTERRUPTED,
                Status::TRANSIENT_TRANSPORT,
                Status::NAMESPACE_NOT_READY,
                Status::CONNECT_BUSY,
            ];
            assert_eq!(status.do_not_retry(), !retry.contains(&status), "{section}");
        }
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
