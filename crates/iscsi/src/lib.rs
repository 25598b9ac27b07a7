//! iSCSI target transport (RFC 7143).
//!
//! Layers, bottom up:
//! - [`pdu`]: framing (BHS, AHS, padding, CRC32C digests) and typed PDUs;
//! - [`text`], [`negotiation`], [`login`], [`auth`]: the login phase as pure
//!   functions and state machines;
//! - [`cmdsn`], [`datain`], [`dataout`], [`discovery`], [`lun`]: the
//!   arithmetic of the full feature phase;
//! - the connection loop and session table (private), driven by [`Server`].

pub mod auth;
pub mod cmdsn;
mod connection;
pub mod datain;
pub mod dataout;
pub mod discovery;
pub mod login;
pub mod lun;
pub mod negotiation;
mod options;
pub mod pdu;
mod server;
mod session;
pub mod text;

pub use negotiation::Digest;
pub use options::ServerOptions;
pub use server::{Server, Target};
