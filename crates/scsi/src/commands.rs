//! The table of supported commands.
//!
//! One entry per operation code (and service action) holds everything that
//! is uniform across commands: the CDB usage mask (which doubles as the
//! reserved-field check and as REPORT SUPPORTED OPERATION CODES data), how
//! reservations restrict it, whether a pending unit attention or a running
//! sanitize blocks it, and which device capability it needs.

use crate::sense::Sense;

pub mod op {
    pub const TEST_UNIT_READY: u8 = 0x00;
    pub const REQUEST_SENSE: u8 = 0x03;
    pub const READ_6: u8 = 0x08;
    pub const WRITE_6: u8 = 0x0A;
    pub const INQUIRY: u8 = 0x12;
    pub const MODE_SELECT_6: u8 = 0x15;
    pub const RESERVE_6: u8 = 0x16;
    pub const RELEASE_6: u8 = 0x17;
    pub const MODE_SENSE_6: u8 = 0x1A;
    pub const START_STOP_UNIT: u8 = 0x1B;
    pub const PREVENT_ALLOW: u8 = 0x1E;
    pub const READ_CAPACITY_10: u8 = 0x25;
    pub const READ_10: u8 = 0x28;
    pub const WRITE_10: u8 = 0x2A;
    pub const WRITE_VERIFY_10: u8 = 0x2E;
    pub const VERIFY_10: u8 = 0x2F;
    pub const PRE_FETCH_10: u8 = 0x34;
    pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    pub const READ_DEFECT_DATA_10: u8 = 0x37;
    pub const WRITE_SAME_10: u8 = 0x41;
    pub const UNMAP: u8 = 0x42;
    pub const SANITIZE: u8 = 0x48;
    pub const MODE_SELECT_10: u8 = 0x55;
    pub const RESERVE_10: u8 = 0x56;
    pub const RELEASE_10: u8 = 0x57;
    pub const MODE_SENSE_10: u8 = 0x5A;
    pub const PERSISTENT_RESERVE_IN: u8 = 0x5E;
    pub const PERSISTENT_RESERVE_OUT: u8 = 0x5F;
    pub const EXTENDED_COPY: u8 = 0x83;
    pub const RECEIVE_COPY_RESULTS: u8 = 0x84;
    pub const READ_16: u8 = 0x88;
    pub const COMPARE_AND_WRITE: u8 = 0x89;
    pub const WRITE_16: u8 = 0x8A;
    pub const ORWRITE_16: u8 = 0x8B;
    pub const WRITE_VERIFY_16: u8 = 0x8E;
    pub const VERIFY_16: u8 = 0x8F;
    pub const PRE_FETCH_16: u8 = 0x90;
    pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    pub const WRITE_SAME_16: u8 = 0x93;
    pub const WRITE_ATOMIC_16: u8 = 0x9C;
    pub const SERVICE_ACTION_IN_16: u8 = 0x9E;
    pub const REPORT_LUNS: u8 = 0xA0;
    pub const MAINTENANCE_IN: u8 = 0xA3;
    pub const MAINTENANCE_OUT: u8 = 0xA4;
    pub const READ_12: u8 = 0xA8;
    pub const WRITE_12: u8 = 0xAA;
    pub const WRITE_VERIFY_12: u8 = 0xAE;
    pub const VERIFY_12: u8 = 0xAF;
    pub const READ_DEFECT_DATA_12: u8 = 0xB7;
}

/// Service actions of the commands that have them.
pub mod sa {
    pub const READ_CAPACITY_16: u8 = 0x10;
    pub const GET_LBA_STATUS: u8 = 0x12;
    pub const REPORT_TARGET_PORT_GROUPS: u8 = 0x0A;
    pub const REPORT_SUPPORTED_OPCODES: u8 = 0x0C;
    pub const REPORT_SUPPORTED_TMFS: u8 = 0x0D;
    pub const SET_TARGET_PORT_GROUPS: u8 = 0x0A;
    pub const EXTENDED_COPY_LID1: u8 = 0x00;
    pub const COPY_STATUS: u8 = 0x00;
    pub const COPY_OPERATING_PARAMETERS: u8 = 0x03;
    pub const SANITIZE_OVERWRITE: u8 = 0x01;
    pub const SANITIZE_BLOCK_ERASE: u8 = 0x02;
    pub const SANITIZE_EXIT_FAILURE_MODE: u8 = 0x1F;
    pub const PRIN_READ_KEYS: u8 = 0x00;
    pub const PRIN_READ_RESERVATION: u8 = 0x01;
    pub const PRIN_REPORT_CAPABILITIES: u8 = 0x02;
    pub const PRIN_READ_FULL_STATUS: u8 = 0x03;
    pub const PROUT_REGISTER: u8 = 0x00;
    pub const PROUT_RESERVE: u8 = 0x01;
    pub const PROUT_RELEASE: u8 = 0x02;
    pub const PROUT_CLEAR: u8 = 0x03;
    pub const PROUT_PREEMPT: u8 = 0x04;
    pub const PROUT_PREEMPT_AND_ABORT: u8 = 0x05;
    pub const PROUT_REGISTER_AND_IGNORE: u8 = 0x06;
    pub const PROUT_REGISTER_AND_MOVE: u8 = 0x07;
}

/// How reservations held by another I_T nexus restrict a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Never conflicts (INQUIRY, REPORT LUNS, READ CAPACITY, ...).
    Always,
    /// Conflicts under SPC-2 reservations only (TEST UNIT READY).
    Status,
    /// Reads the medium: shared under Write Exclusive types.
    Read,
    /// Changes the medium or LU state.
    Write,
    /// The command applies its own reservation rules.
    Own,
}

/// A device capability a command depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    Nothing,
    /// Logical block provisioning (LBPME): UNMAP.
    Provisioning,
    /// Atomic writes.
    Atomic,
    SanitizeOverwrite,
    SanitizeBlockErase,
    /// Any sanitize operation at all.
    Sanitize,
    /// Someone makes explicit ALUA moves: SET TARGET PORT GROUPS.
    ExplicitAlua,
}

pub struct Command {
    pub opcode: u8,
    /// Service action (CDB byte 1 bits 4:0) for commands that have one.
    pub service_action: Option<u8>,
    pub name: &'static str,
    /// CDB usage data as REPORT SUPPORTED OPERATION CODES returns it: the
    /// opcode, the service action in its field, and every other bit the
    /// device server evaluates. Bits outside it must be zero.
    pub usage: &'static [u8],
    pub access: Access,
    /// Reported and executed while a unit attention is pending
    /// (SAM-5 5.14: INQUIRY, REPORT LUNS, REQUEST SENSE).
    pub ignores_unit_attention: bool,
    /// Allowed while a sanitize operation runs (SBC-4 4.33).
    pub during_sanitize: bool,
    pub needs: Needs,
    /// Recommended command timeout in seconds (RCTD).
    pub timeout: u32,
}

/// The control byte bit we evaluate: NACA (which we do not support).
const C: u8 = 0x04;

macro_rules! cmd {
    ($op:expr, $sa:expr, $name:expr, $usage:expr, $access:expr) => {
        cmd!($op, $sa, $name, $usage, $access, Needs::Nothing)
    };
    ($op:expr, $sa:expr, $name:expr, $usage:expr, $access:expr, $needs:expr) => {
        Command {
            opcode: $op,
            service_action: $sa,
            name: $name,
            usage: $usage,
            access: $access,
            ignores_unit_attention: false,
            during_sanitize: false,
            needs: $needs,
            timeout: 30,
        }
    };
}

use op::*;
use Access::*;

#[rustfmt::skip]
pub static COMMANDS: &[Command] = &[
    cmd!(TEST_UNIT_READY, None, "TEST UNIT READY", &[TEST_UNIT_READY, 0, 0, 0, 0, C], Status),
    Command {
        ignores_unit_attention: true,
        during_sanitize: true,
        ..cmd!(REQUEST_SENSE, None, "REQUEST SENSE", &[REQUEST_SENSE, 0x01, 0, 0, 0xFF, C], Always)
    },
    cmd!(READ_6, None, "READ(6)", &[READ_6, 0x1F, 0xFF, 0xFF, 0xFF, C], Read),
    cmd!(WRITE_6, None, "WRITE(6)", &[WRITE_6, 0x1F, 0xFF, 0xFF, 0xFF, C], Write),
    Command {
        ignores_unit_attention: true,
        during_sanitize: true,
        ..cmd!(INQUIRY, None, "INQUIRY", &[INQUIRY, 0x01, 0xFF, 0xFF, 0xFF, C], Always)
    },
    cmd!(MODE_SELECT_6, None, "MODE SELECT(6)", &[MODE_SELECT_6, 0x11, 0, 0, 0xFF, C], Write),
    cmd!(RESERVE_6, None, "RESERVE(6)", &[RESERVE_6, 0, 0, 0, 0, C], Own),
    cmd!(RELEASE_6, None, "RELEASE(6)", &[RELEASE_6, 0, 0, 0, 0, C], Own),
    cmd!(MODE_SENSE_6, None, "MODE SENSE(6)", &[MODE_SENSE_6, 0x08, 0xFF, 0xFF, 0xFF, C], Read),
    cmd!(START_STOP_UNIT, None, "START STOP UNIT", &[START_STOP_UNIT, 0x01, 0, 0x0F, 0xF7, C], Write),
    cmd!(PREVENT_ALLOW, None, "PREVENT ALLOW MEDIUM REMOVAL", &[PREVENT_ALLOW, 0, 0, 0, 0x03, C], Write),
    cmd!(READ_CAPACITY_10, None, "READ CAPACITY(10)", &[READ_CAPACITY_10, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0x01, C], Always),
    cmd!(READ_10, None, "READ(10)", &[READ_10, 0x1A, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, C], Read),
    cmd!(WRITE_10, None, "WRITE(10)", &[WRITE_10, 0x1A, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, C], Write),
    cmd!(WRITE_VERIFY_10, None, "WRITE AND VERIFY(10)", &[WRITE_VERIFY_10, 0x16, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, C], Write),
    cmd!(VERIFY_10, None, "VERIFY(10)", &[VERIFY_10, 0x16, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, C], Read),
    cmd!(PRE_FETCH_10, None, "PRE-FETCH(10)", &[PRE_FETCH_10, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, C], Read),
    cmd!(SYNCHRONIZE_CACHE_10, None, "SYNCHRONIZE CACHE(10)", &[SYNCHRONIZE_CACHE_10, 0x06, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, C], Write),
    cmd!(READ_DEFECT_DATA_10, None, "READ DEFECT DATA(10)", &[READ_DEFECT_DATA_10, 0, 0x1F, 0, 0, 0, 0, 0xFF, 0xFF, C], Write),
    cmd!(WRITE_SAME_10, None, "WRITE SAME(10)", &[WRITE_SAME_10, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, C], Write),
    cmd!(UNMAP, None, "UNMAP", &[UNMAP, 0x01, 0, 0, 0, 0, 0x1F, 0xFF, 0xFF, C], Write, Needs::Provisioning),
    cmd!(SANITIZE, Some(sa::SANITIZE_OVERWRITE), "SANITIZE (OVERWRITE)", &[SANITIZE, 0xA0 | sa::SANITIZE_OVERWRITE, 0, 0, 0, 0, 0, 0xFF, 0xFF, C ], Write, Needs::SanitizeOverwrite),
    cmd!(SANITIZE, Some(sa::SANITIZE_BLOCK_ERASE), "SANITIZE (BLOCK ERASE)", &[SANITIZE, 0xA0 | sa::SANITIZE_BLOCK_ERASE, 0, 0, 0, 0, 0, 0xFF, 0xFF, C ], Write, Needs::SanitizeBlockErase),
    cmd!(SANITIZE, Some(sa::SANITIZE_EXIT_FAILURE_MODE), "SANITIZE (EXIT FAILURE MODE)", &[SANITIZE, 0xA0 | sa::SANITIZE_EXIT_FAILURE_MODE, 0, 0, 0, 0, 0, 0xFF, 0xFF, C ], Write, Needs::Sanitize),
    cmd!(MODE_SELECT_10, None, "MODE SELECT(10)", &[MODE_SELECT_10, 0x11, 0, 0, 0, 0, 0, 0xFF, 0xFF, C], Write),
    cmd!(RESERVE_10, None, "RESERVE(10)", &[RESERVE_10, 0, 0, 0, 0, 0, 0, 0, 0, C], Own),
    cmd!(RELEASE_10, None, "RELEASE(10)", &[RELEASE_10, 0, 0, 0, 0, 0, 0, 0, 0, C], Own),
    cmd!(MODE_SENSE_10, None, "MODE SENSE(10)", &[MODE_SENSE_10, 0x18, 0xFF, 0xFF, 0, 0, 0, 0xFF, 0xFF, C], Read),
    cmd!(PERSISTENT_RESERVE_IN, Some(sa::PRIN_READ_KEYS), "PERSISTENT RESERVE IN (READ KEYS)", &[PERSISTENT_RESERVE_IN, sa::PRIN_READ_KEYS, 0, 0, 0, 0, 0, 0xFF, 0xFF, C], Own),
    cmd!(PERSISTENT_RESERVE_IN, Some(sa::PRIN_READ_RESERVATION), "PERSISTENT RESERVE IN (READ RESERVATION)", &[PERSISTENT_RESERVE_IN, sa::PRIN_READ_RESERVATION, 0, 0, 0, 0, 0, 0xFF, 0xFF, C], Own),
    cmd!(PERSISTENT_RESERVE_IN, Some(sa::PRIN_REPORT_CAPABILITIES), "PERSISTENT RESERVE IN (REPORT CAPABILITIES)", &[PERSISTENT_RESERVE_IN, sa::PRIN_REPORT_CAPABILITIES, 0, 0, 0, 0, 0, 0xFF, 0xFF, C], Own),
    cmd!(PERSISTENT_RESERVE_IN, Some(sa::PRIN_READ_FULL_STATUS), "PERSISTENT RESERVE IN (READ FULL STATUS)", &[PERSISTENT_RESERVE_IN, sa::PRIN_READ_FULL_STATUS, 0, 0, 0, 0, 0, 0xFF, 0xFF, C], Own),
    prout(
        sa::PROUT_REGISTER,
        "PERSISTENT RESERVE OUT (REGISTER)",
        &PROUT_USAGE[0],
    ),
    prout(
        sa::PROUT_RESERVE,
        "PERSISTENT RESERVE OUT (RESERVE)",
        &PROUT_USAGE[1],
    ),
    prout(
        sa::PROUT_RELEASE,
        "PERSISTENT RESERVE OUT (RELEASE)",
        &PROUT_USAGE[2],
    ),
    prout(
        sa::PROUT_CLEAR,
        "PERSISTENT RESERVE OUT (CLEAR)",
        &PROUT_USAGE[3],
    ),
    prout(
        sa::PROUT_PREEMPT,
        "PERSISTENT RESERVE OUT (PREEMPT)",
        &PROUT_USAGE[4],
    ),
    prout(
        sa::PROUT_PREEMPT_AND_ABORT,
        "PERSISTENT RESERVE OUT (PREEMPT AND ABORT)",
        &PROUT_USAGE[5],
    ),
    prout(
        sa::PROUT_REGISTER_AND_IGNORE,
        "PERSISTENT RESERVE OUT (REGISTER AND IGNORE)",
        &PROUT_USAGE[6],
    ),
    prout(
        sa::PROUT_REGISTER_AND_MOVE,
        "PERSISTENT RESERVE OUT (REGISTER AND MOVE)",
        &PROUT_USAGE[7],
    ),
    cmd!(EXTENDED_COPY, Some(sa::EXTENDED_COPY_LID1), "EXTENDED COPY(LID1)", &[EXTENDED_COPY, sa::EXTENDED_COPY_LID1, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, C], Write),
    cmd!(RECEIVE_COPY_RESULTS, Some(sa::COPY_STATUS), "RECEIVE COPY RESULTS (COPY STATUS)", &[RECEIVE_COPY_RESULTS, sa::COPY_STATUS, 0xFF, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, C], Read),
    cmd!(RECEIVE_COPY_RESULTS, Some(sa::COPY_OPERATING_PARAMETERS), "RECEIVE COPY RESULTS (OPERATING PARAMETERS)", &[RECEIVE_COPY_RESULTS, sa::COPY_OPERATING_PARAMETERS, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, C], Always),
    cmd!(READ_16, None, "READ(16)", &RW16_USAGE[0], Read),
    cmd!(COMPARE_AND_WRITE, None, "COMPARE AND WRITE", &[COMPARE_AND_WRITE, 0x1A, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0xFF, 0x1F, C], Write),
    cmd!(WRITE_16, None, "WRITE(16)", &RW16_USAGE[1], Write),
    cmd!(ORWRITE_16, None, "ORWRITE(16)", &RW16_USAGE[2], Write),
    cmd!(WRITE_VERIFY_16, None, "WRITE AND VERIFY(16)", &RW16_USAGE[3], Write),
    cmd!(VERIFY_16, None, "VERIFY(16)", &RW16_USAGE[4], Read),
    cmd!(PRE_FETCH_16, None, "PRE-FETCH(16)", &[PRE_FETCH_16, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, C], Read),
    cmd!(SYNCHRONIZE_CACHE_16, None, "SYNCHRONIZE CACHE(16)", &RW16_USAGE[5], Write),
    cmd!(WRITE_SAME_16, None, "WRITE SAME(16)", &RW16_USAGE[6], Write),
    cmd!(WRITE_ATOMIC_16, None, "WRITE ATOMIC(16)", &[WRITE_ATOMIC_16, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0xFF, 0xFF, 0x1F, C], Write, Needs::Atomic),
    cmd!(SERVICE_ACTION_IN_16, Some(sa::READ_CAPACITY_16), "READ CAPACITY(16)", &[SERVICE_ACTION_IN_16, sa::READ_CAPACITY_16, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0x01, C], Always),
    cmd!(SERVICE_ACTION_IN_16, Some(sa::GET_LBA_STATUS), "GET LBA STATUS", &[SERVICE_ACTION_IN_16, sa::GET_LBA_STATUS, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, C], Read),
    Command {
        ignores_unit_attention: true,
        during_sanitize: true,
        ..cmd!(REPORT_LUNS, None, "REPORT LUNS", &[REPORT_LUNS, 0, 0xFF, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, C], Always)
    },
    cmd!(MAINTENANCE_IN, Some(sa::REPORT_TARGET_PORT_GROUPS), "REPORT TARGET PORT GROUPS", &[MAINTENANCE_IN, 0xE0 | sa::REPORT_TARGET_PORT_GROUPS, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, C ], Always),
    cmd!(MAINTENANCE_IN, Some(sa::REPORT_SUPPORTED_OPCODES), "REPORT SUPPORTED OPERATION CODES", &[MAINTENANCE_IN, sa::REPORT_SUPPORTED_OPCODES, 0x87, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, C], Always),
    cmd!(MAINTENANCE_IN, Some(sa::REPORT_SUPPORTED_TMFS), "REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS", &[MAINTENANCE_IN, sa::REPORT_SUPPORTED_TMFS, 0x80, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, C], Always),
    cmd!(MAINTENANCE_OUT, Some(sa::SET_TARGET_PORT_GROUPS), "SET TARGET PORT GROUPS", &[MAINTENANCE_OUT, sa::SET_TARGET_PORT_GROUPS, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, C], Write, Needs::ExplicitAlua),
    cmd!(READ_12, None, "READ(12)", &RW12_USAGE[0], Read),
    cmd!(WRITE_12, None, "WRITE(12)", &RW12_USAGE[1], Write),
    cmd!(WRITE_VERIFY_12, None, "WRITE AND VERIFY(12)", &RW12_USAGE[2], Write),
    cmd!(VERIFY_12, None, "VERIFY(12)", &RW12_USAGE[3], Read),
    cmd!(READ_DEFECT_DATA_12, None, "READ DEFECT DATA(12)", &[READ_DEFECT_DATA_12, 0x1F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, C], Write),
];

const fn rw12(opcode: u8, flags: u8) -> [u8; 12] {
    [
        opcode, flags, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, C,
    ]
}

const fn rw16(opcode: u8, flags: u8) -> [u8; 16] {
    [
        opcode, flags, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
        0x1F, C,
    ]
}

static RW12_USAGE: [[u8; 12]; 4] = [
    rw12(READ_12, 0x1A),
    rw12(WRITE_12, 0x1A),
    rw12(WRITE_VERIFY_12, 0x16),
    rw12(VERIFY_12, 0x16),
];

static RW16_USAGE: [[u8; 16]; 7] = [
    rw16(READ_16, 0x1A),
    rw16(WRITE_16, 0x1A),
    rw16(ORWRITE_16, 0x1A),
    rw16(WRITE_VERIFY_16, 0x16),
    rw16(VERIFY_16, 0x16),
    rw16(SYNCHRONIZE_CACHE_16, 0x06),
    rw16(WRITE_SAME_16, 0x19),
];

const fn prout_usage(sa: u8) -> [u8; 10] {
    [
        PERSISTENT_RESERVE_OUT,
        sa,
        0xFF,
        0,
        0,
        0xFF,
        0xFF,
        0xFF,
        0xFF,
        C,
    ]
}

static PROUT_USAGE: [[u8; 10]; 8] = [
    prout_usage(0),
    prout_usage(1),
    prout_usage(2),
    prout_usage(3),
    prout_usage(4),
    prout_usage(5),
    prout_usage(6),
    prout_usage(7),
];

const fn prout(sa: u8, name: &'static str, usage: &'static [u8]) -> Command {
    Command {
        opcode: PERSISTENT_RESERVE_OUT,
        service_action: Some(sa),
        name,
        usage,
        access: Own,
        ignores_unit_attention: false,
        during_sanitize: false,
        needs: Needs::Nothing,
        timeout: 30,
    }
}

/// Whether an opcode carries a service action in CDB byte 1.
/// Whether commands with `opcode` run despite a pending unit attention.
pub fn ignores_unit_attention(opcode: u8) -> bool {
    by_opcode(opcode).iter().any(|c| c.ignores_unit_attention)
}

pub fn has_service_actions(opcode: u8) -> bool {
    by_opcode(opcode).iter().any(|c| c.service_action.is_some())
}

/// The table entries of `opcode`, found through an index built once: the
/// lookup runs for every command.
fn by_opcode(opcode: u8) -> &'static [Command] {
    static INDEX: std::sync::OnceLock<[(u16, u16); 256]> = std::sync::OnceLock::new();
    let index = INDEX.get_or_init(|| {
        // Entries of one opcode are adjacent in the table.
        let mut index = [(0u16, 0u16); 256];
        for (i, c) in COMMANDS.iter().enumerate() {
            let slot = &mut index[usize::from(c.opcode)];
            if slot.1 == 0 {
                *slot = (i as u16, 1);
            } else {
                slot.1 += 1;
            }
        }
        index
    });
    let (start, len) = index[usize::from(opcode)];
    &COMMANDS[usize::from(start)..usize::from(start + len)]
}

/// The service action of `cdb` if its opcode has service actions.
pub fn service_action_of(cdb: &[u8]) -> Option<u8> {
    let opcode = *cdb.first()?;
    has_service_actions(opcode).then(|| cdb.get(1).map_or(0, |b| b & 0x1F))
}

/// Why a CDB does not name a supported command.
#[derive(Debug, PartialEq)]
pub enum Lookup<'a> {
    Found(&'a Command),
    /// Unknown operation code.
    UnknownOpcode,
    /// Known operation code, unknown service action.
    UnknownServiceAction,
}

/// Finds the command for `cdb` among those `supported` accepts.
pub fn lookup(cdb: &[u8], supported: impl Fn(&Command) -> bool) -> Lookup<'static> {
    let Some(&opcode) = cdb.first() else {
        return Lookup::UnknownOpcode;
    };
    let sa = service_action_of(cdb);
    let mut opcode_known = false;
    for c in by_opcode(opcode).iter().filter(|c| supported(c)) {
        opcode_known = true;
        if c.service_action == sa {
            return Lookup::Found(c);
        }
    }
    if opcode_known {
        Lookup::UnknownServiceAction
    } else {
        Lookup::UnknownOpcode
    }
}

impl PartialEq for Command {
    fn eq(&self, other: &Command) -> bool {
        self.opcode == other.opcode && self.service_action == other.service_action
    }
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl Command {
    /// Checks that `cdb` is long enough and sets no bit outside the usage
    /// data (reserved fields must be zero, SPC-4 4.2.5.1). The control
    /// byte's vendor-specific bits are ignored; NACA is rejected because
    /// we do not support ACA.
    pub fn check_cdb(&self, cdb: &[u8]) -> Result<(), Sense> {
        let len = self.usage.len();
        if cdb.len() < len {
            return Err(Sense::invalid_cdb(cdb.len(), None));
        }
        for (i, (&b, &mask)) in cdb[..len - 1].iter().zip(self.usage).enumerate() {
            let mut allowed = mask;
            if i == 1 && self.service_action.is_some() {
                allowed |= 0x1F;
            }
            let stray = b & !allowed;
            if i > 0 && stray != 0 {
                let bit = 7 - stray.leading_zeros() as u8;
                return Err(Sense::invalid_cdb(i, Some(bit)));
            }
        }
        if cdb[len - 1] & 0x04 != 0 {
            return Err(Sense::invalid_cdb(len - 1, Some(2)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CDB length of each opcode group (SAM-5 table 6).
    fn cdb_length(opcode: u8) -> usize {
        match opcode >> 5 {
            0 => 6,
            1 | 2 => 10,
            4 => 16,
            5 => 12,
            _ => 16,
        }
    }

    #[test]
    fn every_usage_starts_with_its_opcode_and_has_its_group_length() {
        for c in COMMANDS {
            assert_eq!(c.usage[0], c.opcode, "{}", c.name);
            assert_eq!(c.usage.len(), cdb_length(c.opcode), "{}", c.name);
            if let Some(sa) = c.service_action {
                assert_eq!(c.usage[1] & 0x1F, sa, "{}", c.name);
            }
        }
    }

    #[test]
    fn opcodes_and_service_actions_are_unique() {
        for (i, a) in COMMANDS.iter().enumerate() {
            for b in &COMMANDS[i + 1..] {
                assert!(a != b, "{} duplicates {}", a.name, b.name);
            }
            if a.service_action.is_none() {
                assert!(!COMMANDS
                    .iter()
                    .any(|b| b.opcode == a.opcode && b.service_action.is_some()));
            }
        }
    }

    #[test]
    fn entries_of_one_opcode_are_adjacent() {
        for (i, c) in COMMANDS.iter().enumerate() {
            let last = COMMANDS.iter().rposition(|d| d.opcode == c.opcode).unwrap();
            assert!(
                COMMANDS[i..=last].iter().all(|d| d.opcode == c.opcode),
                "{}",
                c.name
            );
            assert_eq!(
                by_opcode(c.opcode).len(),
                COMMANDS.iter().filter(|d| d.opcode == c.opcode).count()
            );
        }
        assert!(by_opcode(0xFF).is_empty());
    }

    #[test]
    fn lookup_distinguishes_unknown_opcode_and_service_action() {
        let all = |_: &Command| true;
        assert!(matches!(lookup(&[0x28; 10], all), Lookup::Found(c) if c.name == "READ(10)"));
        assert_eq!(lookup(&[0xFF; 16], all), Lookup::UnknownOpcode);
        assert_eq!(
            lookup(&[0x9E, 0x05, 0, 0], all),
            Lookup::UnknownServiceAction
        );
        assert_eq!(
            lookup(&[0x42; 10], |c| c.opcode != UNMAP),
            Lookup::UnknownOpcode
        );
    }

    #[test]
    fn reserved_bits_are_rejected_with_a_field_pointer() {
        let read10 = COMMANDS.iter().find(|c| c.opcode == READ_10).unwrap();
        let mut cdb = [0u8; 10];
        cdb[0] = READ_10;
        assert!(read10.check_cdb(&cdb).is_ok());
        cdb[1] = 0x20; // RDPROTECT
        let s = read10.check_cdb(&cdb).unwrap_err();
        assert_eq!(s.specific, Some([0xC8 | 5, 0, 1]));
        cdb[1] = 0x18; // DPO + FUA are fine
        assert!(read10.check_cdb(&cdb).is_ok());
        cdb[9] = 0x04; // NACA
        assert!(read10.check_cdb(&cdb).is_err());
        cdb[9] = 0xC0; // vendor bits are ignored
        assert!(read10.check_cdb(&cdb).is_ok());
        assert!(read10.check_cdb(&cdb[..9]).is_err());
    }
}
