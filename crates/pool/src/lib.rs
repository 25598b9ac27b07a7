//! Storage pools and thin volumes.
//!
//! A [`Pool`] spreads allocation units (64 KiB by default, chosen at
//! creation) over one or more data devices. Each volume maps virtual units
//! to physical units; units carry reference counts so snapshots and clones
//! share them, and the first write to a shared unit copies it. Every volume
//! is served as a [`block::BlockDevice`] ([`VolumeDevice`]).
//!
//! Mappings live in memory and are committed to a crash-safe metadata store
//! (redb) on flush: the data devices are flushed first, then the metadata
//! transaction commits, so a mapping is never durable before its data.
//! Units freed since the last commit are not reused until that commit is
//! durable, and a unit the committed state still shares is never written in
//! place, so after a crash every committed volume reads what it held.

mod atomic;
mod backend;
mod check;
mod layout;
mod pool;
mod record;
mod sending;
mod space;
mod steps;
mod store;
mod unit_map;
mod usage;
mod volume;

#[cfg(test)]
mod atomic_tests;
#[cfg(test)]
mod tests;

pub use atomic::MAX_ATOMIC_BYTES;
pub use backend::DeviceBackend;
pub use check::CheckReport;
pub use pool::{MetadataLocation, Pool, PoolSpace, DEFAULT_UNIT_SIZE};
pub use record::{VolumeInfo, VolumeKind};
pub use steps::Progress;
pub use usage::{PoolUsage, SoftThreshold, VolumeUsage};
pub use volume::VolumeDevice;
