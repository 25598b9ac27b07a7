//! The HA pair (see docs/ha.md).
pub mod config;
pub mod link;
pub mod secret;
pub mod wire;
