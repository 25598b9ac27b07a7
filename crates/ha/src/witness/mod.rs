//! The witness: a third vote for a pair, so that two nodes never both
//! own a mirror after a partition (docs/ha.md, "Failover with a
//! witness"). It grants each mirror's ownership lease to one node at a
//! time ([`lease`]), remembers the newest generation a holder told it of
//! so that a node that missed writes never gets the grant, and keeps
//! those records on disk ([`store`]). Nodes authenticate with the pair's
//! secret over the link's handshake ([`server`], [`client`]); the
//! messages are [`wire`]'s.

pub mod client;
pub mod lease;
pub mod server;
pub mod store;
pub mod wire;

pub use client::{BlockingClient, WitnessClient};
pub use lease::{Key, Leases, Record, Verdict};
pub use server::{Witness, WitnessSettings};
pub use wire::{Answer, Request};
