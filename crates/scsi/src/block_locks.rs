//! A logical unit's view of its device's range locks: in logical blocks
//! here, in bytes on the shared [`Backing`], so that units of other block
//! sizes and other transports lock the same bytes.
//!
//! Every medium access holds its LBA range for the duration of the device
//! call. Plain reads and writes hold it shared, so they never wait for one
//! another; COMPARE AND WRITE, ORWRITE, WRITE ATOMIC and SANITIZE hold it
//! exclusive, so no other access to those LBAs (from any nexus, any target,
//! EXTENDED COPY or NBD) can interleave with them. VMware ATS relies on
//! this.

use std::sync::Arc;

use export::{Backing, RangeGuard};

pub(crate) struct BlockLocks {
    backing: Arc<Backing>,
    /// log2 of the block size.
    shift: u32,
}

impl BlockLocks {
    pub fn new(backing: Arc<Backing>, block_size: u32) -> BlockLocks {
        BlockLocks {
            backing,
            shift: block_size.trailing_zeros(),
        }
    }

    fn bytes(&self, lba: u64, blocks: u64) -> (u64, u64) {
        (
            lba.saturating_mul(1 << self.shift),
            blocks.saturating_mul(1 << self.shift),
        )
    }

    pub fn lock(&self, lba: u64, blocks: u64, exclusive: bool) -> RangeGuard<'_> {
        let (start, len) = self.bytes(lba, blocks);
        self.backing.locks.lock(start, len, exclusive)
    }

    /// [`BlockLocks::lock`] without waiting: `None` while another holder
    /// conflicts.
    pub fn try_lock(&self, lba: u64, blocks: u64, exclusive: bool) -> Option<RangeGuard<'_>> {
        let (start, len) = self.bytes(lba, blocks);
        self.backing.locks.try_lock(start, len, exclusive)
    }

    pub fn release(&self, id: u64) {
        self.backing.locks.release(id);
    }
}
