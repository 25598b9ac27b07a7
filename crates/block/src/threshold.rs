//! A thin device's soft threshold on the space of the store it allocates
//! from (a pool), shared by every device of that store so that the SCSI
//! layer can report it (SBC-3 thresholds) and notice when it is reached.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug)]
pub struct SpaceThreshold {
    capacity: u64,
    granularity: u64,
    /// Bytes in use at which the threshold is reached; 0 when none is set.
    bytes: AtomicU64,
    /// How many times the space in use rose to the threshold: a device
    /// compares it with the count it last saw, one atomic load.
    reached: AtomicU64,
}

impl SpaceThreshold {
    /// For a store of `capacity` bytes allocated in `granularity`-byte
    /// units.
    pub fn new(capacity: u64, granularity: u64) -> SpaceThreshold {
        SpaceThreshold {
            capacity,
            granularity,
            bytes: AtomicU64::new(0),
            reached: AtomicU64::new(0),
        }
    }

    /// Bytes the store can hold.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The store's allocation unit in bytes.
    pub fn granularity(&self) -> u64 {
        self.granularity
    }

    /// The threshold in bytes in use, if one is set.
    pub fn bytes(&self) -> Option<u64> {
        Some(self.bytes.load(Ordering::Relaxed)).filter(|&b| b > 0)
    }

    pub fn set_bytes(&self, bytes: Option<u64>) {
        self.bytes.store(bytes.unwrap_or(0), Ordering::Relaxed);
    }

    /// Times the threshold was reached since the store opened.
    pub fn reached(&self) -> u64 {
        self.reached.load(Ordering::Relaxed)
    }

    /// The space in use rose to the threshold.
    pub fn note_reached(&self) {
        self.reached.fetch_add(1, Ordering::Relaxed);
    }
}
