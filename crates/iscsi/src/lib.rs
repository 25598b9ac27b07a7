//! iSCSI target transport (RFC 7143).
//!
//! Layers, bottom up:
//! - [`pdu`]: framing (BHS, AHS, padding, CRC32C digests) and typed PDUs;
//! - [`text`], [`negotiation`], [`login`], [`auth`], [`auth_chap`]: the login
//!   phase as pure functions and state machines (fuzzed from `fuzz/`);
//! - [`access`]: initiator groups, their LUN views and CHAP credentials;
//! - [`cmdsn`], [`datain`], [`dataout`], [`discovery`], [`lun`]: the
//!   arithmetic of the full feature phase;
//! - the connection loop and session table (private), driven by [`Server`].
//!
//! # Design notes
//!
//! - **One connection per session, ErrorRecoveryLevel 0.** MaxConnections
//!   is negotiated down to 1, so session state lives with its connection.
//!   A lost connection ends the session; reinstatement (same initiator,
//!   ISID and target) closes the old session and calls `nexus_lost` for it
//!   before `nexus_added` for the new one.
//! - **Tasks per connection.** A reader task frames PDUs, a writer task
//!   stamps StatSN/ExpCmdSN/MaxCmdSN as PDUs leave and gathers them into
//!   vectored writes, and one loop owns all other state. Commands whose LUN
//!   may block run on the blocking pool and queue their own response;
//!   others run inline in the loop.
//! - **CmdSN window.** MaxCmdSN = ExpCmdSN + window - 1 - (commands not yet
//!   answered), so the window both orders and bounds concurrent commands.
//!   Commands outside it are dropped silently; commands ahead of a gap wait.
//! - **Data-Out errors.** A DataSN, offset or length error fails the
//!   command with CHECK CONDITION (ABORTED COMMAND, PROTOCOL SERVICE CRC
//!   ERROR) once its open sequences have ended, and the connection stays
//!   up (RFC 3720 6.7). Framing errors (header digest, oversized segment)
//!   end the connection: the stream cannot be trusted any more.
//! - **Bounded memory.** Data segments above the declared
//!   MaxRecvDataSegmentLength (8 KiB during login) are refused before they
//!   are read; login and Text requests are capped at 64 KiB; R2Ts are only
//!   issued within a per-connection write buffer budget.
//! - **Aborts.** A running command cannot be stopped; an abort marks it,
//!   suppresses its response and waits for it to finish before the TMF
//!   response goes out, so the initiator never sees both.

pub mod access;
#[cfg(test)]
mod access_property;
#[cfg(test)]
mod alloc_count;
pub mod auth;
pub mod auth_chap;
pub mod cmdsn;
mod connection;
pub mod datain;
pub mod dataout;
pub mod discovery;
#[cfg(feature = "fault-injection")]
pub mod faults;
mod frontend;
pub mod login;
mod login_outcome;
pub mod lun;
pub mod negotiation;
mod options;
pub mod pdu;
mod server;
mod session;
mod session_info;
mod session_json;
mod shards;
pub mod text;

pub use frontend::targets_of;
pub use login_outcome::{LoginCounters, Refusal};
pub use negotiation::Digest;
pub use options::ServerOptions;
/// The CHAP back-off lives with the other peer limits.
pub use peer_limits::AuthThrottle;
pub use server::{Server, SessionCounts, Target};
pub use session_info::{ConnectionInfo, SessionInfo};
pub use session_json::session_json;
