//! WRITE ATOMIC(16) and what the Block Limits page says of it, both from
//! the device's own promise ([`block::BlockDevice::atomic_writes`]): a
//! logical unit offers atomic writes only where the device keeps them all
//! or nothing across a crash. Against concurrent commands the unit's
//! exclusive range lock keeps every other access to the blocks out.

use block::AtomicWrites;
use scsi_api::ScsiResponse;

use crate::cdb::put32;
use crate::lu::{Ctx, LogicalUnit, Outcome};
use crate::rw::extent;
use crate::sense::{asc, io_sense, Sense};

/// The device's atomic write limits in logical blocks, as the Block
/// Limits page reports them (0: no alignment or granularity asked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AtomicBlocks {
    pub max: u64,
    pub alignment: u64,
    pub granularity: u64,
}

impl AtomicBlocks {
    /// `limits` for blocks of `block_size` bytes, with at most
    /// `max_transfer` blocks; `None` when not even one block fits.
    fn of(limits: AtomicWrites, block_size: u64, max_transfer: u64) -> Option<AtomicBlocks> {
        let alignment = in_blocks(limits.alignment, block_size);
        let granularity = in_blocks(limits.granularity, block_size);
        let max = (limits.max_bytes / block_size).min(max_transfer);
        // The longest length that is a multiple of the granularity.
        let max = match granularity {
            0 => max,
            g => max - max % g,
        };
        (max > 0).then_some(AtomicBlocks {
            max,
            alignment,
            granularity,
        })
    }

    /// Whether `blocks` at `lba` are an atomic write these limits allow;
    /// the CDB byte to point at when not.
    fn check(&self, lba: u64, blocks: u64) -> Result<(), usize> {
        if blocks > self.max || (self.granularity > 1 && !blocks.is_multiple_of(self.granularity)) {
            return Err(12);
        }
        if self.alignment > 1 && !lba.is_multiple_of(self.alignment) {
            return Err(2);
        }
        Ok(())
    }
}

/// A byte multiple as a block multiple: the least number of blocks whose
/// bytes are a multiple of `bytes` (0 stays 0, no constraint).
fn in_blocks(bytes: u64, block_size: u64) -> u64 {
    if bytes == 0 {
        return 0;
    }
    let lcm = bytes / gcd(bytes, block_size) * block_size;
    match lcm / block_size {
        1 => 0,
        n => n,
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl LogicalUnit {
    /// WRITE ATOMIC's limits here, or `None` where it is not offered.
    pub(crate) fn atomic_limits(&self) -> Option<AtomicBlocks> {
        let limits = self.device.atomic_writes()?;
        AtomicBlocks::of(
            limits,
            u64::from(self.block_size),
            self.max_transfer_blocks(),
        )
    }

    /// The atomic fields of the Block Limits page `d` (64 bytes).
    pub(crate) fn put_atomic_limits(&self, d: &mut [u8]) {
        let Some(limits) = self.atomic_limits() else {
            return;
        };
        let field = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        put32(d, 44, field(limits.max));
        put32(d, 48, field(limits.alignment));
        put32(d, 52, field(limits.granularity));
        // No atomic boundary: the CDB's ATOMIC BOUNDARY must be zero.
    }

    pub(crate) fn write_atomic(&self, ctx: &Ctx<'_>) -> Outcome {
        let cdb = ctx.cdb();
        let e = extent(cdb);
        self.check_transfer(&e)?;
        self.check_writable(ctx)?;
        if e.blocks == 0 {
            return Ok(ScsiResponse::good());
        }
        let limits = self
            .atomic_limits()
            .ok_or_else(|| Sense::invalid_cdb(0, None))?;
        limits
            .check(e.lba, e.blocks)
            .map_err(|byte| Sense::invalid_cdb(byte, None))?;
        let len = (e.blocks * u64::from(self.block_size)) as usize;
        // All or nothing: a short transfer cannot be written atomically.
        let Some(data) = ctx.cmd.data_out.get(..len) else {
            return Err(Sense::illegal(asc::INVALID_FIELD_IN_INFORMATION_UNIT).into());
        };
        let _guard = self.locks.lock(e.lba, e.blocks, true);
        let fua = self.force_unit_access(crate::rw::fua_of(cdb));
        self.device
            .write_atomic(data, self.offset(e.lba), fua)
            .map_err(|err| io_sense(&err, true))?;
        Ok(ScsiResponse::good())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdb::be32;
    use crate::inquiry::VPD_BLOCK_LIMITS;
    use crate::lu::test_support::*;
    use crate::sense::key;
    use block::{BlockDevice, MemDevice, Wrapped, Wrapper};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// A RAM disk whose atomic writes have the limits given, counted.
    struct Limited(AtomicWrites, AtomicU64);

    impl Wrapper for Limited {
        fn describe(&self, _: &dyn BlockDevice) -> String {
            "limited".into()
        }
        fn atomic_writes(&self, _: &dyn BlockDevice) -> Option<AtomicWrites> {
            Some(self.0)
        }
        fn write_atomic(
            &self,
            child: &dyn BlockDevice,
            buf: &[u8],
            offset: u64,
            fua: bool,
        ) -> std::io::Result<()> {
            self.1.fetch_add(1, Ordering::Relaxed);
            child.write_atomic(buf, offset, fua)
        }
    }

    /// A RAM disk that keeps its atomic writes to itself.
    struct Plain;

    impl Wrapper for Plain {
        fn describe(&self, _: &dyn BlockDevice) -> String {
            "plain".into()
        }
    }

    fn unit_over(device: Arc<dyn BlockDevice>) -> Arc<LogicalUnit> {
        LogicalUnit::new(device, crate::LuConfig::default()).unwrap()
    }

    fn write_atomic_16(lba: u64, blocks: u16) -> Vec<u8> {
        let mut c = vec![crate::commands::op::WRITE_ATOMIC_16, 0];
        c.extend_from_slice(&lba.to_be_bytes());
        c.extend_from_slice(&[0, 0]);
        c.extend_from_slice(&blocks.to_be_bytes());
        c.extend_from_slice(&[0, 0]);
        c
    }

    fn block_limits(lu: &LogicalUnit) -> Vec<u8> {
        let n = nexus("a");
        run(lu, &n, &[0x12, 1, VPD_BLOCK_LIMITS, 0, 255, 0], &[]).data_in
    }

    #[test]
    fn the_device_limits_are_advertised_and_enforced() {
        let limits = AtomicWrites {
            max_bytes: 64 * 512,
            alignment: 4096,
            granularity: 1024,
        };
        let mem = Arc::new(MemDevice::new(1 << 20));
        let dev = Arc::new(Wrapped::over(
            mem.clone(),
            Limited(limits, AtomicU64::new(0)),
        ));
        let lu = unit_over(dev.clone());
        let bl = block_limits(&lu);
        assert_eq!((be32(&bl, 44), be32(&bl, 48), be32(&bl, 52)), (64, 8, 2));
        let n = nexus("a");
        ready(&lu, &n);
        let data = vec![0x5A; 16 * 512];
        let r = run(&lu, &n, &write_atomic_16(8, 16), &data);
        assert_eq!(r.status, scsi_api::status::GOOD);
        assert_eq!(dev.1.load(Ordering::Relaxed), 1, "through write_atomic");
        let mut back = vec![0; 16 * 512];
        mem.read_at(&mut back, 8 * 512).unwrap();
        assert_eq!(back, data);
        for (lba, blocks) in [(4, 16), (8, 15), (0, 66)] {
            let r = run(&lu, &n, &write_atomic_16(lba, blocks), &data);
            assert_eq!(sense_of(&r).0, key::ILLEGAL_REQUEST, "{lba}+{blocks}");
            assert_eq!((sense_of(&r).1, sense_of(&r).2), (0x24, 0));
        }
        assert_eq!(
            dev.1.load(Ordering::Relaxed),
            1,
            "refused before the device"
        );
    }

    #[test]
    fn a_device_without_atomic_writes_offers_none() {
        let lu = unit_over(Arc::new(Wrapped::over(
            Arc::new(MemDevice::new(1 << 20)),
            Plain,
        )));
        let bl = block_limits(&lu);
        assert_eq!((be32(&bl, 44), be32(&bl, 48), be32(&bl, 52)), (0, 0, 0));
        let n = nexus("a");
        ready(&lu, &n);
        let r = run(&lu, &n, &write_atomic_16(0, 1), &[0; 512]);
        assert_eq!(
            (sense_of(&r).0, sense_of(&r).1),
            (key::ILLEGAL_REQUEST, 0x20),
            "invalid opcode"
        );
        // A RAM disk keeps them, as before.
        let bl = block_limits(&lu_with(1 << 20, crate::LuConfig::default()));
        assert_eq!(be32(&bl, 44), 65536);
    }

    #[test]
    fn byte_limits_become_block_limits() {
        let any = AtomicBlocks::of(AtomicWrites::up_to(u64::MAX), 512, 65536).unwrap();
        assert_eq!((any.max, any.alignment, any.granularity), (65536, 0, 0));
        let strict = AtomicWrites {
            max_bytes: 1 << 20,
            alignment: 8192,
            granularity: 1024,
        };
        let b = AtomicBlocks::of(strict, 4096, 65536).unwrap();
        assert_eq!((b.max, b.alignment, b.granularity), (256, 2, 0));
        assert_eq!(b.check(2, 5), Ok(()));
        assert_eq!(b.check(1, 5), Err(2));
        assert_eq!(b.check(0, 257), Err(12));
        let g = AtomicBlocks::of(
            AtomicWrites {
                granularity: 3 * 512,
                ..strict
            },
            512,
            65536,
        )
        .unwrap();
        assert_eq!((g.max, g.granularity), (2046, 3));
        assert_eq!(g.check(0, 4), Err(12));
        assert!(AtomicBlocks::of(AtomicWrites::up_to(511), 512, 100).is_none());
    }
}
