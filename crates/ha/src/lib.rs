//! The HA pair (see docs/ha.md).
pub mod config;
pub mod link;
pub mod mirror;
pub mod pair;
pub mod secret;
pub mod wire;

pub use mirror::{Connection, Mirror, MirrorOptions, MirrorStatus, Role};
