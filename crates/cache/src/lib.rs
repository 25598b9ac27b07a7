//! An SSD cache tier: a small fast block device in front of a large slow
//! one, as one more [`block::BlockDevice`].
//!
//! The backing is cut into cache lines; each line the cache holds lives in
//! a slot of the cache device, with validity and dirtiness tracked per
//! sub-block. Modes (write-through, write-back, write-around, none) switch
//! live. The mapping persists on the cache device in a checksummed,
//! double-buffered table, so the cache restarts warm and write-back data
//! survives power loss once flushed. docs/cache.md explains the design.

mod commit;
mod device;
mod geometry;
mod io;
mod locks;
mod meta;
mod mode;
mod policy;
mod state;
mod status;
mod stream;
mod writeback;

pub use device::{
    CacheDevice, CacheOptions, FormatPolicy, DEFAULT_LINE, DEFAULT_SEQUENTIAL_CUTOFF,
};
pub use mode::Mode;
pub use policy::PolicyKind;
pub use status::{CacheStatus, Health, HitRatio, WritebackStatus};
pub use writeback::{FlushProgress, WritebackSettings};
