//! Devices and helpers shared by the cache tests.
#![allow(dead_code)]

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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

/// A disk whose volatile cache, at a power cut, keeps a random subset of
/// the writes since the last flush, some of them torn at a 512-byte
/// boundary: harsher than `FaultyDevice`, which loses them all.
///
/// Devices sharing a `power` budget lose power together, in the middle of
/// whatever they are doing, once it has counted down their writes and
/// flushes to zero (negative: never); every call fails from then on.
pub struct Torn {
    child: Arc<dyn BlockDevice>,
    pending: parking_lot::Mutex<Vec<(u64, Vec<u8>)>>,
    power: Arc<std::sync::atomic::AtomicI64>,
}

fn power_lost() -> io::Error {
    io::Error::other("power lost")
}

impl Torn {
    pub fn new(size: u64, power: Arc<std::sync::atomic::AtomicI64>) -> Torn {
        Torn {
            child: Arc::new(MemDevice::new(size)),
            pending: parking_lot::Mutex::new(Vec::new()),
            power,
        }
    }

    /// Counts one write or flush against the budget.
    fn spend(&self) -> io::Result<()> {
        let left = self.power.load(Ordering::SeqCst);
        if left == 0 {
            return Err(power_lost());
        }
        if left > 0 {
            self.power.fetch_sub(1, Ordering::SeqCst);
        }
        Ok(())
    }

    fn apply_all(&self, pending: &mut Vec<(u64, Vec<u8>)>) -> io::Result<()> {
        for (offset, data) in pending.drain(..) {
            self.child.write_at(&data, offset, false)?;
        }
        Ok(())
    }

    /// Power loss: each unflushed write survives whole, torn or not at
    /// all, as `seed` decides, in the order they were made.
    pub fn power_cut(&self, seed: &mut u64) {
        let mut pending = self.pending.lock();
        for (offset, data) in pending.drain(..) {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let keep = match (*seed >> 33) % 8 {
                0..=3 => data.len(),
                4 => ((*seed >> 40) as usize % data.len().div_ceil(512)) * 512,
                _ => 0,
            };
            if keep > 0 {
                self.child
                    .write_at(&data[..keep.min(data.len())], offset, false)
                    .unwrap();
            }
        }
    }
}

impl BlockDevice for Torn {
    fn size(&self) -> u64 {
        self.child.size()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.power.load(Ordering::SeqCst) == 0 {
            return Err(power_lost());
        }
        let pending = self.pending.lock();
        self.child.read_at(buf, offset)?;
        let end = offset + buf.len() as u64;
        for (o, data) in pending.iter() {
            let (from, to) = ((*o).max(offset), (o + data.len() as u64).min(end));
            if from < to {
                buf[(from - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&data[(from - o) as usize..(to - o) as usize]);
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.spend()?;
        let mut pending = self.pending.lock();
        if fua {
            // Earlier writes may reach the media at any time; here, first.
            self.apply_all(&mut pending)?;
            return self.child.write_at(buf, offset, true);
        }
        pending.push((offset, buf.to_vec()));
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.spend()?;
        let mut pending = self.pending.lock();
        self.apply_all(&mut pending)?;
        self.child.flush()
    }

    fn capabilities(&self) -> block::Capabilities {
        block::Capabilities {
            volatile_cache: true,
            ..self.child.capabilities()
        }
    }

    fn describe(&self) -> String {
        "torn".into()
    }
}
