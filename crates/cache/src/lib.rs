//! An SSD cache tier: a small fast block device in front of a large slow
//! one, as one more [`block::BlockDevice`].
//!
//! The backing is cut into cache lines; each line the cache holds lives in
//! a slot of the cache device, with validity and dirtiness tracked per
//! sub-block. Modes (write-through, write-back, write-around, none) switch
//! live. The mapping persists on the cache device in a checksummed,
//! double-buffered table, so the cache restarts warm and write-back data
//! survives power loss once flushed. docs/cache.md explains the design.
//!
//! ```
//! use std::sync::Arc;
//! use block::{BlockDevice, MemDevice};
//! use cache::{CacheDevice, CacheOptions, Mode};
//!
//! let ssd: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(16 << 20));
//! let hdd: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(256 << 20));
//! let mut options = CacheOptions::new("hdd");
//! options.mode = Mode::WriteBack;
//! let dev = Arc::new(CacheDevice::open(ssd, hdd.clone(), options)?);
//! dev.write_at(&[7; 4096], 0, false)?;
//! dev.flush()?; // durable on the cache device
//! assert_eq!(dev.status().dirty_bytes, 4096);
//! dev.set_mode(Mode::WriteThrough, &mut |p| println!("{} left", p.dirty_bytes_left))?;
//! let mut back = [0; 4096];
//! hdd.read_at(&mut back, 0)?;
//! assert_eq!(back, [7; 4096]);
//! Arc::into_inner(dev).unwrap().close()?; // a clean stop: warm and trusted next time
//! # Ok::<(), std::io::Error>(())
//! ```

mod atomic;
mod commit;
mod device;
mod fill;
mod geometry;
mod io;
mod label;
mod locks;
mod meta;
mod mode;
mod open;
mod policy;
mod state;
mod status;
mod stream;
mod writeback;

pub use device::{
    CacheDevice, CacheOptions, FormatPolicy, DEFAULT_LINE, DEFAULT_SEQUENTIAL_CUTOFF,
};
pub use geometry::{MAX_LINE, MIN_LINE};
pub use label::BACKING_RESERVE;
pub use mode::Mode;
pub use policy::PolicyKind;
pub use status::{CacheStatus, Health, HitRatio, WritebackStatus};
pub use writeback::{FlushProgress, WritebackSettings};
