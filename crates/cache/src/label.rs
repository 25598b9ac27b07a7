//! The mark a write-back cache leaves on its backing: the last
//! [`LABEL_BYTES`] of the backing (in a reserve the cache does not
//! expose) say
//! whether writes not yet written back live on a cache device, and on
//! which one (its format's random instance number).
//!
//! The mark survives the loss of the cache device, which the cache's own
//! metadata cannot: a restart that finds the backing marked but not that
//! cache device (missing, blank, replaced, failed) refuses to serve the
//! backing, whose blocks may be older than what was acknowledged, instead
//! of serving them as if nothing happened. bcache keeps the same fact in
//! the backing's superblock.
//!
//! It also records that the cache device failed while in use (the backing
//! is alive then): writes went to the backing alone from that moment, so
//! the cached copies are stale should that device come back after a
//! restart. With nothing left to write back it is then formatted anew;
//! with writes stranded on it, it is refused like a lost one.
//!
//! The mark is set, on stable storage, before the first write lands dirty
//! on the cache, and cleared once everything is written back (a full
//! flush, leaving write-back, detach, or a clean stop with nothing dirty).

use std::io;

use block::BlockDevice;

/// Bytes at the end of the backing that hold the mark.
pub const LABEL_BYTES: u64 = 4096;
/// Bytes at the end of the backing the cache does not expose, the mark in
/// their last 4 KiB: a whole allocation unit of most backings (a RAM
/// device's 64 KiB chunks, a file's blocks), so that writing the mark never
/// makes the exposed blocks beside it read as allocated. A backing with a
/// larger allocation unit reserves one unit.
pub const BACKING_RESERVE: u64 = 1 << 20;
const MAGIC: &[u8; 8] = b"OACDIRTY";
const MAX_NAME: usize = 512;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    /// Writes not yet written back live on the cache device `instance`.
    pub dirty: bool,
    /// The cache device `instance` failed while in use: the backing has
    /// moved on without it, so its table is not to be trusted again.
    pub failed: bool,
    /// The format instance of the cache device that holds them.
    pub instance: u64,
    /// That cache device, as it described itself, for messages.
    pub cache: String,
}

impl Label {
    fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; LABEL_BYTES as usize];
        b[..8].copy_from_slice(MAGIC);
        let name = &self.cache.as_bytes()[..self.cache.len().min(MAX_NAME)];
        b[12..20].copy_from_slice(&(self.dirty as u64).to_le_bytes());
        b[20..28].copy_from_slice(&self.instance.to_le_bytes());
        b[28..36].copy_from_slice(&(self.failed as u64).to_le_bytes());
        b[36..44].copy_from_slice(&(name.len() as u64).to_le_bytes());
        b[44..44 + name.len()].copy_from_slice(name);
        let crc = crc32c::crc32c(&b[12..]);
        b[8..12].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// `None` unless `b` is an intact label.
    fn decode(b: &[u8]) -> Option<Label> {
        if b.len() < LABEL_BYTES as usize || &b[..8] != MAGIC {
            return None;
        }
        let crc = u32::from_le_bytes(b[8..12].try_into().ok()?);
        if crc != crc32c::crc32c(&b[12..LABEL_BYTES as usize]) {
            return None;
        }
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        let len = (u64_at(36) as usize).min(MAX_NAME);
        Some(Label {
            dirty: u64_at(12) != 0,
            failed: u64_at(28) != 0,
            instance: u64_at(20),
            cache: String::from_utf8_lossy(&b[44..44 + len]).into_owned(),
        })
    }
}

/// The bytes of the backing the cache exposes: all but the reserve.
pub fn exposed_size(backing: &dyn BlockDevice) -> io::Result<u64> {
    backing
        .size()
        .checked_sub(BACKING_RESERVE.max(backing.granularity()))
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is too small to be a backing", backing.describe()),
            )
        })
}

fn label_offset(backing: &dyn BlockDevice) -> io::Result<u64> {
    exposed_size(backing)?;
    Ok(backing.size() - LABEL_BYTES)
}

/// The backing's label; `None` when it has none (never cached in
/// write-back, or formatted before the label existed).
pub fn read(backing: &dyn BlockDevice) -> io::Result<Option<Label>> {
    let mut b = vec![0u8; LABEL_BYTES as usize];
    backing.read_at(&mut b, label_offset(backing)?)?;
    Ok(Label::decode(&b))
}

/// Writes the label, stable before returning.
pub fn write(backing: &dyn BlockDevice, label: &Label) -> io::Result<()> {
    backing.write_at(&label.encode(), label_offset(backing)?, false)?;
    backing.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use block::MemDevice;

    #[test]
    fn a_label_reads_back_and_anything_else_is_none() {
        let dev = MemDevice::new(2 << 20);
        assert_eq!(read(&dev).unwrap(), None);
        let label = Label {
            dirty: true,
            failed: false,
            instance: 42,
            cache: "file(/ssd)".into(),
        };
        write(&dev, &label).unwrap();
        assert_eq!(read(&dev).unwrap(), Some(label));
        let mut torn = vec![0u8; 1];
        dev.read_at(&mut torn, (2 << 20) - 100).unwrap();
        dev.write_at(&[torn[0] ^ 1], (2 << 20) - 100, false)
            .unwrap();
        assert_eq!(read(&dev).unwrap(), None, "a damaged label is no label");
        assert_eq!(exposed_size(&dev).unwrap(), 1 << 20);
        assert_eq!(
            dev.allocation(0, 1 << 20).unwrap(),
            (block::Allocation::Deallocated, 1 << 20),
            "the mark leaves the exposed blocks unallocated"
        );
        assert!(exposed_size(&MemDevice::new(1 << 20)).is_err());
    }
}
