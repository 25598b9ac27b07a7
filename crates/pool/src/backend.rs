//! Metadata kept on a block device instead of a file: a redb storage
//! backend over any [`BlockDevice`], so the metadata can sit on its own
//! device (and, in tests, on a device that loses unflushed writes).

use std::fmt;
use std::io;
use std::sync::Arc;

use block::BlockDevice;
use parking_lot::Mutex;

const MAGIC: &[u8; 8] = b"OAPMETA1";
/// The first 4 KiB hold the magic and the store's length.
const HEADER: u64 = 4096;

/// A redb [`redb::StorageBackend`] over a block device. The store's length
/// is kept in a header block and written along with the data, so it
/// becomes durable with the same flush.
pub struct DeviceBackend {
    device: Arc<dyn BlockDevice>,
    len: Mutex<u64>,
}

impl fmt::Debug for DeviceBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceBackend({})", self.device.describe())
    }
}

impl DeviceBackend {
    /// Opens the metadata area of `device`; a device without the header is
    /// formatted as empty.
    pub fn new(device: Arc<dyn BlockDevice>) -> io::Result<DeviceBackend> {
        if device.size() < HEADER * 2 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "metadata device is too small",
            ));
        }
        let mut head = [0u8; 16];
        device.read_at(&mut head, 0)?;
        let len = if &head[0..8] == MAGIC {
            u64::from_le_bytes(head[8..16].try_into().unwrap_or([0; 8]))
        } else {
            let backend = DeviceBackend {
                device: device.clone(),
                len: Mutex::new(0),
            };
            backend.write_header(0)?;
            device.flush()?;
            0
        };
        Ok(DeviceBackend {
            device,
            len: Mutex::new(len),
        })
    }

    fn write_header(&self, len: u64) -> io::Result<()> {
        let mut head = [0u8; 16];
        head[0..8].copy_from_slice(MAGIC);
        head[8..16].copy_from_slice(&len.to_le_bytes());
        self.device.write_at(&head, 0, false)
    }

    fn check(&self, offset: u64, len: usize) -> io::Result<u64> {
        let end = offset
            .checked_add(len as u64)
            .filter(|&e| e <= *self.len.lock())
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::UnexpectedEof, "beyond the metadata store")
            })?;
        let _ = end;
        Ok(HEADER + offset)
    }
}

impl redb::StorageBackend for DeviceBackend {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(*self.len.lock())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let at = self.check(offset, out.len())?;
        self.device.read_at(out, at)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let mut cur = self.len.lock();
        if len
            .checked_add(HEADER)
            .is_none_or(|e| e > self.device.size())
        {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "metadata device is full",
            ));
        }
        if len > *cur {
            self.device.write_zeroes(HEADER + *cur, len - *cur)?;
        }
        self.write_header(len)?;
        *cur = len;
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.device.flush()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let at = self.check(offset, data.len())?;
        self.device.write_at(data, at, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use block::MemDevice;
    use redb::StorageBackend;

    #[test]
    fn length_survives_reopen_and_growth_reads_zeros() {
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(1 << 20));
        let b = DeviceBackend::new(dev.clone()).unwrap();
        assert_eq!(b.len().unwrap(), 0);
        b.set_len(8192).unwrap();
        b.write(100, b"meta").unwrap();
        let b = DeviceBackend::new(dev).unwrap();
        assert_eq!(b.len().unwrap(), 8192);
        let mut got = [0u8; 6];
        b.read(100, &mut got).unwrap();
        assert_eq!(&got, b"meta\0\0");
        assert!(b.read(8190, &mut got).is_err());
        assert!(b.set_len(1 << 21).is_err());
    }
}
