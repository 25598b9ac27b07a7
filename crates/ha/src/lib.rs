//! The HA pair (see docs/ha.md).
pub mod link;
pub mod secret;
pub mod wire;
