//! Devices and helpers shared by the cache tests.
#![allow(dead_code)]

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[allow(unused_imports)] // each test crate uses a different part of this
pub use block::Torn;
use block::{BlockDevice, FaultyDevice, MemDevice, Wrapped, Wrapper};
use cache::{CacheDevice, CacheOptions, FormatPolicy, Mode};

/// Counts the writes and the bytes written through it.
#[derive(Default)]
pub struct Counting {
    pub writes: AtomicU64,
    pub bytes: AtomicU64,
    pub reads: AtomicU64,
}

impl Wrapper for Counting {
    fn describe(&self, child: &dyn BlockDevice) -> String {
        format!("counting({})", child.describe())
    }

    fn read_at(&self, child: &dyn BlockDevice, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        child.read_at(buf, offset)
    }

    fn write_at(&self, child: &dyn BlockDevice, buf: &[u8], o: u64, fua: bool) -> io::Result<()> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        child.write_at(buf, o, fua)
    }
}

/// A cache and a backing, each a faulty device (a volatile write cache
/// that a power cut empties) over memory.
pub struct Rig {
    pub cache: Arc<FaultyDevice>,
    pub backing: Arc<FaultyDevice>,
    pub backing_counts: Arc<Wrapped<Counting>>,
}

impl Rig {
    pub fn new(cache_size: u64, backing_size: u64) -> Rig {
        let counted = Arc::new(Wrapped::over(
            Arc::new(MemDevice::new(backing_size + cache::BACKING_RESERVE)),
            Counting::default(),
        ));
        Rig {
            cache: Arc::new(FaultyDevice::new(Arc::new(MemDevice::new(cache_size)))),
            backing: Arc::new(FaultyDevice::new(counted.clone())),
            backing_counts: counted,
        }
    }

    pub fn open(&self, options: CacheOptions) -> io::Result<CacheDevice> {
        CacheDevice::open(self.cache.clone(), self.backing.clone(), options)
    }

    /// Power loss on both devices.
    pub fn power_cut(&self) {
        self.cache.drop_unflushed();
        self.backing.drop_unflushed();
    }
}

/// Small lines, no thread, no cutoff: deterministic tests.
pub fn options(mode: Mode) -> CacheOptions {
    let mut o = CacheOptions::new("backing");
    o.mode = mode;
    o.line_size = 4096;
    o.sequential_cutoff = 0;
    o.background = false;
    o.format = FormatPolicy::IfBlank;
    o
}

pub fn read(dev: &dyn BlockDevice, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    dev.read_at(&mut buf, offset).unwrap();
    buf
}

/// Bytes that differ from write to write and from place to place.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (seed.wrapping_mul(0x9e37_79b9) ^ i.wrapping_mul(31)).wrapping_add(i >> 8) as u8)
        .collect()
}
