//! The HA pair: two nodes that serve the same volumes, each volume's data
//! held by both (docs/ha.md).
//!
//! What is here:
//!
//! - [`link`]: the replication link. Each node listens; the node whose
//!   name sorts first dials. Both prove knowledge of a shared secret
//!   ([`secret`], a file of mode 0600) by an HMAC-SHA256 over both nonces
//!   and both names ([`link::handshake`]) before anything else is read or
//!   sent. Unauthenticated connections live under `peer-limits`' pre-login
//!   budget, wrong secrets under its back-off and rate-limited log. After
//!   that, frames ([`wire`]: kind, length, CRC32C) are bounded in size,
//!   outgoing bytes are bounded with a write deadline, incoming requests
//!   are bounded in bytes being served, heartbeats declare a silent peer
//!   gone, and the dialer reconnects with back-off.
//! - [`mirror`]: [`Mirror`], a `block::BlockDevice` over a local device,
//!   paired with the peer's mirror of the same name: writes complete when
//!   both replicas hold them as durably as asked (DRBD's protocol C);
//!   generation ids say which replica is current; a write-intent bitmap
//!   (the `regions` crate's sets, shared with RAID) says what differs;
//!   resync copies only that, throttled, while I/O goes on; split brain
//!   is detected and left to an operator.
//! - [`config`]: the `[ha]` section's types and checks.
//! - [`pair`]: the node's one link, for the device kind to open over.
//!
//! - [`witness`]: the third vote, granting each mirror's ownership lease
//!   to one node at a time; [`failover`]: a node's side of it (renewing,
//!   stepping down without peer nor lease, taking over a lost owner).
//!
//! Not here yet: PR replication.

pub mod config;
pub mod failover;
pub mod link;
pub mod mirror;
pub mod pair;
pub mod secret;
pub mod wire;
pub mod witness;

pub use mirror::{Connection, Mirror, MirrorOptions, MirrorStatus, Role};
