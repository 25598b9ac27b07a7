//! The thin provisioning soft threshold of a pool-backed LU (SBC-3
//! 4.7.3.7): its size in the Logical Block Provisioning VPD page (THRESHOLD
//! EXPONENT), its descriptor in the Logical Block Provisioning mode page
//! (1Ch/02h), and THIN PROVISIONING SOFT THRESHOLD REACHED for every I_T
//! nexus when the pool's space in use rises to it.

use std::sync::atomic::Ordering;

use block::SpaceThreshold;

use crate::cdb::{put16, put32};
use crate::lu::LogicalUnit;
use crate::mode::PageControl;
use crate::sense::asc;

pub const PAGE_PROVISIONING: u8 = 0x1C;
pub const SUBPAGE_PROVISIONING: u8 = 0x02;
/// Page header and the 12 bytes before the first threshold descriptor.
const DESCRIPTORS_AT: usize = 16;
const DESCRIPTOR_LEN: usize = 8;
/// THRESHOLD TYPE 000b (soft), THRESHOLD ARMING 001b (increasing).
const SOFT_ARMING_INCREASING: u8 = 0x01;
/// THRESHOLD RESOURCE: used LBA mapping resources.
const USED_LBA_MAPPING_RESOURCES: u8 = 0x02;

/// THRESHOLD EXPONENT: a threshold set is the pool's unit in logical
/// blocks (at least two blocks, as 0 means "no thresholds"), larger where
/// the pool's capacity in sets would not fit THRESHOLD COUNT's 32 bits.
pub fn threshold_exponent(t: &SpaceThreshold, block_size: u32) -> u8 {
    let bs = u64::from(block_size);
    let per_unit = (t.granularity() / bs).max(1);
    let mut e = per_unit.ilog2().max(1);
    let blocks = t.capacity() / bs;
    while e < 63 && blocks >> e > u64::from(u32::MAX) {
        e += 1;
    }
    e as u8
}

/// The Logical Block Provisioning mode page: one soft threshold on the
/// used LBA mapping resources of the pool, armed on increasing, enabled
/// when a threshold is set. Nothing is changeable; SITUA is 0, so every
/// I_T nexus is told.
pub fn provisioning_page(t: &SpaceThreshold, block_size: u32, pc: PageControl) -> Vec<u8> {
    let mut pg = vec![0u8; DESCRIPTORS_AT + DESCRIPTOR_LEN];
    pg[0] = 0x40 | PAGE_PROVISIONING;
    pg[1] = SUBPAGE_PROVISIONING;
    let len = (pg.len() - 4) as u16;
    put16(&mut pg, 2, len);
    if pc == PageControl::Changeable {
        return pg;
    }
    let d = &mut pg[DESCRIPTORS_AT..];
    d[0] = SOFT_ARMING_INCREASING;
    d[1] = USED_LBA_MAPPING_RESOURCES;
    if let Some(bytes) = t.bytes() {
        d[0] |= 0x80;
        let set = u64::from(block_size) << threshold_exponent(t, block_size);
        let count = bytes.div_ceil(set);
        put32(d, 4, u32::try_from(count).unwrap_or(u32::MAX));
    }
    pg
}

impl LogicalUnit {
    /// THRESHOLD EXPONENT for the VPD page: 0 (no thresholds) unless the
    /// device allocates from a pool.
    pub(crate) fn threshold_exponent(&self) -> u8 {
        match &self.space_threshold {
            Some(t) if self.thin() => threshold_exponent(t, self.block_size),
            _ => 0,
        }
    }

    /// The current mode page, for an LU that reports thresholds.
    pub(crate) fn provisioning_page(&self, pc: PageControl) -> Option<Vec<u8>> {
        let t = self.space_threshold.as_ref().filter(|_| self.thin())?;
        Some(provisioning_page(t, self.block_size, pc))
    }

    /// Establishes THIN PROVISIONING SOFT THRESHOLD REACHED for every
    /// nexus when the pool reached its threshold since the last command:
    /// one load and compare per command otherwise.
    pub(crate) fn notice_threshold(&self) {
        let Some(t) = &self.space_threshold else {
            return;
        };
        let now = t.reached();
        if self.threshold_seen.load(Ordering::Relaxed) == now {
            return;
        }
        if self.threshold_seen.swap(now, Ordering::Relaxed) != now {
            self.state
                .lock()
                .notify_all(asc::SOFT_THRESHOLD_REACHED, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdb::be32;

    #[test]
    fn the_exponent_is_the_unit_in_blocks_and_fits_the_pool_in_32_bits() {
        // 1 GiB pool of 64 KiB units, 512-byte blocks: 128 blocks a unit.
        let t = SpaceThreshold::new(1 << 30, 64 << 10);
        assert_eq!(threshold_exponent(&t, 512), 7);
        assert_eq!(threshold_exponent(&t, 4096), 4);
        // A unit of one block still gives a nonzero exponent.
        let t = SpaceThreshold::new(1 << 30, 4096);
        assert_eq!(threshold_exponent(&t, 4096), 1);
        // 4 PiB of 4 KiB units in 512-byte blocks: 2^43 blocks, so sets
        // of 2^12 blocks (2^31 sets; 2^11 would make 2^32).
        let t = SpaceThreshold::new(4 << 50, 4096);
        assert_eq!(threshold_exponent(&t, 512), 12);
    }

    #[test]
    fn the_mode_page_holds_one_soft_threshold_descriptor() {
        let t = SpaceThreshold::new(1 << 30, 64 << 10);
        let off = provisioning_page(&t, 512, PageControl::Current);
        assert_eq!(off.len(), 24);
        assert_eq!(&off[..4], &[0x5C, 0x02, 0, 20]);
        assert_eq!(off[4], 0, "SITUA 0: every nexus is told");
        // Not enabled without a threshold; type soft, arming increasing,
        // resource: used LBA mapping resources.
        assert_eq!(&off[16..24], &[0x01, 0x02, 0, 0, 0, 0, 0, 0]);

        // 80% of the pool: 819.2 MiB rounded up to units, in sets of 2^7
        // 512-byte blocks (one 64 KiB unit each).
        let bytes = 13108 * (64 << 10);
        t.set_bytes(Some(bytes));
        let on = provisioning_page(&t, 512, PageControl::Current);
        assert_eq!(on[16], 0x81);
        assert_eq!(be32(&on, 20), 13108);
        let on4k = provisioning_page(&t, 4096, PageControl::Current);
        assert_eq!(be32(&on4k, 20), 13108, "sets of 2^4 4 KiB blocks");

        let changeable = provisioning_page(&t, 512, PageControl::Changeable);
        assert_eq!(&changeable[..4], &[0x5C, 0x02, 0, 20]);
        assert!(changeable[4..].iter().all(|&b| b == 0));
    }

    mod on_a_pool {
        use std::sync::Arc;

        use block::{BlockDevice, MemDevice};
        use pool::{MetadataLocation, Pool, SoftThreshold};
        use scsi_api::status;

        use crate::cdb::be32;
        use crate::config::LuConfig;
        use crate::lu::test_support::*;
        use crate::lu::LogicalUnit;
        use crate::sense::key;

        const UNIT: u64 = 4096;

        /// A pool of ten 4 KiB units with two volumes, each an LU.
        fn pool_and_lus() -> (Arc<Pool>, Arc<LogicalUnit>, Arc<LogicalUnit>) {
            let data: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(11 * UNIT));
            let meta = MetadataLocation::Device(Arc::new(MemDevice::new(8 << 20)));
            let pool = Pool::create("p", vec![data], &meta, UNIT).unwrap();
            let mut lus = Vec::new();
            for name in ["a", "b"] {
                pool.create_volume(name, 1 << 20).unwrap();
                let dev = Arc::new(pool.volume(name).unwrap());
                lus.push(LogicalUnit::new(dev, LuConfig::default()).unwrap());
            }
            let b = lus.pop().unwrap();
            (pool, lus.pop().unwrap(), b)
        }

        fn write_unit(lu: &LogicalUnit, n: &scsi_api::Nexus, unit: u32) -> scsi_api::ScsiResponse {
            let cdb = rw10(0x2A, 0, unit * 8, 8);
            run(lu, n, &cdb, &[0x5A; UNIT as usize])
        }

        #[test]
        fn reaching_the_threshold_tells_every_nexus_of_every_volume_once() {
            let (pool, a, b) = pool_and_lus();
            pool.set_soft_threshold(Some(SoftThreshold::Percent(50)));
            let (x, y) = (nexus("x"), nexus("y"));
            for (lu, n) in [(&a, &x), (&a, &y), (&b, &x)] {
                ready(lu, n);
            }
            let vpd = run(&a, &x, &[0x12, 1, 0xB2, 0, 64, 0], &[]).data_in;
            assert_eq!(vpd[4], 3, "one 4 KiB unit is 2^3 blocks");
            let page = run(&a, &x, &[0x1A, 0x08, 0x1C, 0x02, 255, 0], &[]).data_in;
            assert_eq!(page[4..6], [0x5C, 0x02]);
            assert_eq!(page[4 + 16], 0x81);
            assert_eq!(be32(&page, 4 + 20), 5, "50% of 10 units");

            for unit in 0..4 {
                assert_eq!(write_unit(&a, &x, unit).status, status::GOOD);
            }
            // The fifth unit reaches the threshold; the write itself is GOOD.
            assert_eq!(write_unit(&a, &x, 4).status, status::GOOD);
            let reached = (key::UNIT_ATTENTION, 0x38, 0x07);
            for (lu, n) in [(&a, &x), (&a, &y), (&b, &x)] {
                assert_eq!(sense_of(&run(lu, n, &[0; 6], &[])), reached);
                assert_eq!(run(lu, n, &[0; 6], &[]).status, status::GOOD);
            }
            // Further allocation above the threshold says nothing more.
            assert_eq!(write_unit(&b, &x, 0).status, status::GOOD);
            assert_eq!(run(&a, &x, &[0; 6], &[]).status, status::GOOD);

            // Below it again (the unmapped units freed by a commit), then
            // up to it: told again.
            let unmap = {
                let mut p = vec![0, 22, 0, 16];
                p.extend_from_slice(&[0; 4]);
                p.extend_from_slice(&0u64.to_be_bytes());
                p.extend_from_slice(&16u32.to_be_bytes());
                p.extend_from_slice(&[0; 4]);
                p
            };
            let cdb = [0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0];
            assert_eq!(run(&a, &x, &cdb, &unmap).status, status::GOOD);
            pool.flush().unwrap();
            assert_eq!(pool.space().used_units, 4);
            assert_eq!(write_unit(&a, &x, 0).status, status::GOOD);
            assert_eq!(sense_of(&run(&b, &x, &[0; 6], &[])), reached);
        }

        #[test]
        fn without_a_threshold_nothing_is_told_and_the_descriptor_is_off() {
            let (pool, a, _) = pool_and_lus();
            let x = nexus("x");
            ready(&a, &x);
            for unit in 0..8 {
                assert_eq!(write_unit(&a, &x, unit).status, status::GOOD);
            }
            assert_eq!(pool.space().used_units, 8);
            assert_eq!(run(&a, &x, &[0; 6], &[]).status, status::GOOD);
            let page = run(&a, &x, &[0x1A, 0x08, 0x1C, 0x02, 255, 0], &[]).data_in;
            assert_eq!(page[4 + 16], 0x01, "not enabled");
        }

        #[test]
        fn a_device_outside_a_pool_reports_no_thresholds() {
            let lu = lu();
            let x = nexus("x");
            ready(&lu, &x);
            let vpd = run(&lu, &x, &[0x12, 1, 0xB2, 0, 64, 0], &[]).data_in;
            assert_eq!(vpd[4], 0);
            let r = run(&lu, &x, &[0x1A, 0x08, 0x1C, 0x02, 255, 0], &[]);
            assert_eq!(sense_of(&r), (key::ILLEGAL_REQUEST, 0x24, 0));
            // Every subpage of 1Ch: the informational exceptions page only.
            let d = run(&lu, &x, &[0x1A, 0x08, 0x1C, 0xFF, 255, 0], &[]).data_in;
            assert_eq!(d.len(), 4 + 12);
        }

        #[test]
        fn mode_select_takes_the_page_back_unchanged_only() {
            let (pool, a, _) = pool_and_lus();
            pool.set_soft_threshold(Some(SoftThreshold::Percent(50)));
            let x = nexus("x");
            ready(&a, &x);
            let sensed = run(&a, &x, &[0x1A, 0x08, 0x3F, 0xFF, 255, 0], &[]).data_in;
            // Header (mode data length 0), then every page as sensed.
            let mut param = vec![0, 0, 0, 0];
            param.extend_from_slice(&sensed[4..]);
            let cdb = [0x15, 0x10, 0, 0, param.len() as u8, 0];
            assert_eq!(run(&a, &x, &cdb, &param).status, status::GOOD);
            let at = param.len() - 4;
            param[at] ^= 0x01;
            let r = run(&a, &x, &cdb, &param);
            assert_eq!(sense_of(&r), (key::ILLEGAL_REQUEST, 0x26, 0));
        }
    }
}
