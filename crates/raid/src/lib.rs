//! RAID 0, 1, 10, 5 and 6 over member block devices, as one
//! [`block::BlockDevice`].
//!
//! - Geometry ([`geometry`]): md's layouts (RAID5 left-symmetric, RAID6
//!   P then Q, RAID10 "near 2").
//! - Each member starts with a [`superblock`] (array id, geometry, slot,
//!   event counter) and a write-intent [`bitmap`]; data follows at
//!   [`superblock::data_offset`]. [`RaidArray::assemble`] takes members in
//!   any order and refuses foreign or stale ones.
//! - A member whose I/O fails is marked failed and the array goes on
//!   degraded; a hot spare takes its slot and is rebuilt by a background
//!   thread, throttled between a minimum and a maximum speed.
//! - After an unclean stop only regions dirty in the bitmap are resynced;
//!   a member re-added after an absence catches up only regions written
//!   meanwhile.
//!
//! - Scrub checks mirrors and parity; each member keeps latency and
//!   throughput figures, and a markedly slower one is named.
//! - On RAID5/6 a partial parity [`log`] closes the write hole: a power
//!   cut between a partial write's data and parity, followed by the loss
//!   of a member, does not corrupt the columns nobody was writing.
//! - On every level an atomic write [`journal`] makes writes of up to
//!   [`journal::MAX_ATOMIC_BYTES`] all or nothing across a crash.
//! - [`RaidArray::assemble_forced`] ([`force`]) brings back an array whose
//!   members went stale one after another, from the freshest of them.

mod admin;
mod array;
mod assemble;
pub mod bitmap;
mod core;
pub mod force;
pub mod geometry;
pub mod gf;
mod io_atomic;
mod io_copies;
mod io_log;
mod io_parity;
mod io_stripes;
pub mod journal;
mod locks;
pub mod log;
mod member;
mod pipeline;
mod provision;
mod rebuild;
mod recent;
mod replace;
mod scrub;
mod spread;
mod status;
pub mod superblock;
mod weakest;
mod worker;

pub use array::{AssembleError, RaidArray};
pub use core::RaidOptions;
pub use force::{Forced, ForcedMember};
pub use geometry::{Geometry, Level};
pub use recent::{INTERVAL as WEAKEST_INTERVAL, WINDOW as WEAKEST_WINDOW};
pub use scrub::ScrubReport;
pub use status::{
    ArrayState, BitmapStatus, MemberIo, MemberState, MemberStatus, RaidStatus, SyncProgress,
};
pub use weakest::WeakLink;
