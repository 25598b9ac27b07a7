//! A device that stores nothing: reads return zeros, writes vanish.
//! Useful to measure the transport and command set without storage cost.

use std::io;

use crate::{check_range, AtomicWrites, BlockDevice, Capabilities};

pub struct NullDevice {
    size: u64,
}

impl NullDevice {
    pub fn new(size: u64) -> NullDevice {
        NullDevice { size }
    }
}

impl BlockDevice for NullDevice {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        buf.fill(0);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, offset, len)
    }

    /// It keeps nothing, so no crash can tear what it keeps.
    fn atomic_writes(&self) -> Option<AtomicWrites> {
        Some(AtomicWrites::up_to(u64::MAX))
    }

    fn write_atomic(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.write_at(buf, offset, fua)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            thin: false,
            volatile_cache: false,
            may_block: false,
            // Everything reads as zeros, discarded ranges included.
            discard_zeroes: true,
            discard: true,
            read_only: false,
        }
    }

    fn describe(&self) -> String {
        format!("null:{}", self.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_zeros_after_writes() {
        let dev = NullDevice::new(8192);
        dev.write_at(&[0xaa; 4096], 0, true).unwrap();
        let mut buf = [0x55u8; 4096];
        dev.read_at(&mut buf, 0).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        assert_eq!(dev.size(), 8192);
    }

    #[test]
    fn rejects_out_of_range() {
        let dev = NullDevice::new(512);
        assert!(dev.read_at(&mut [0; 2], 511).is_err());
        assert!(dev.write_at(&[0; 1], 512, false).is_err());
    }
}
