//! A RAM disk with a volatile cache that a power cut tears, for crash
//! tests of the layers above (the cache tier, RAID): built only with the
//! `testing` feature.

use std::io;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use crate::{BlockDevice, MemDevice};

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
    power: Arc<AtomicI64>,
}

fn power_lost() -> io::Error {
    io::Error::other("power lost")
}

impl Torn {
    pub fn new(size: u64, power: Arc<AtomicI64>) -> Torn {
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

    fn capabilities(&self) -> crate::Capabilities {
        crate::Capabilities {
            volatile_cache: true,
            ..self.child.capabilities()
        }
    }

    fn describe(&self) -> String {
        "torn".into()
    }
}
