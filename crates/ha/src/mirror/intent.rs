//! The mirror's bitmap: which regions may differ between the replicas.
//!
//! Two sets make it. `out_of_sync` holds regions the peer is known to
//! miss (written while it was away, or copied to it by no resync yet);
//! only a resync clears them. `active` holds regions with writes that
//! both replicas take now, as DRBD's activity log does: a crash of the
//! primary mid-write leaves them possibly different, so they are on disk
//! before the write starts and cleared lazily, once a flush of both
//! replicas made them stable with no write begun since. The image on
//! disk is the union; after a crash all of it reads as out of sync.

use std::collections::HashMap;
use std::ops::RangeInclusive;

use regions::{bitmap_bytes, RegionSet};

pub struct Intent {
    regions: u64,
    out_of_sync: RegionSet,
    active: RegionSet,
    in_flight: HashMap<u64, u32>,
    /// Regions a write began in since the current flush started.
    retouched: RegionSet,
}

impl Intent {
    /// The bitmap as read from disk: every bit out of sync.
    pub fn new(regions: u64, on_disk: RegionSet) -> Intent {
        Intent {
            regions,
            out_of_sync: on_disk,
            active: RegionSet::new(regions),
            in_flight: HashMap::new(),
            retouched: RegionSet::new(regions),
        }
    }

    fn on_disk(&self, r: u64) -> bool {
        self.out_of_sync.get(r) || self.active.get(r)
    }

    /// The image to write: the union of both sets.
    pub fn image(&self) -> Vec<u8> {
        let mut all = self.out_of_sync.clone();
        all.union(&self.active);
        all.to_bytes(bitmap_bytes(self.regions))
    }

    /// Marks regions as written by both replicas; true when the image
    /// gained a bit (it must reach the disk before the write does).
    pub fn begin_active(&mut self, rs: RangeInclusive<u64>) -> bool {
        let mut newly = false;
        for r in rs {
            *self.in_flight.entry(r).or_insert(0) += 1;
            self.retouched.set(r, true);
            newly |= !self.on_disk(r);
            self.active.set(r, true);
        }
        newly
    }

    /// A write ended; a flush already under way may not cover it on the
    /// peer, so the region counts as touched since that flush started.
    pub fn end_active(&mut self, rs: RangeInclusive<u64>) {
        for r in rs {
            self.retouched.set(r, true);
            if let Some(n) = self.in_flight.get_mut(&r) {
                *n -= 1;
                if *n == 0 {
                    self.in_flight.remove(&r);
                }
            }
        }
    }

    /// Marks regions the peer misses; true when the image gained a bit.
    pub fn mark_out_of_sync(&mut self, rs: impl Iterator<Item = u64>) -> bool {
        let mut newly = false;
        for r in rs {
            newly |= !self.on_disk(r);
            self.out_of_sync.set(r, true);
        }
        newly
    }

    /// The peer failed: whatever it took without a flush since may be
    /// lost, so every active region is out of sync now.
    pub fn active_to_out_of_sync(&mut self) {
        self.out_of_sync.union(&self.active);
    }

    pub fn flush_started(&mut self) {
        self.retouched = RegionSet::new(self.regions);
    }

    /// Both replicas flushed: active regions with no write in flight and
    /// none begun since the flush started are the same on both. True
    /// when the image lost a bit.
    pub fn flush_done(&mut self) -> bool {
        let mut changed = false;
        let active: Vec<u64> = self.active.iter().collect();
        for r in active {
            if !self.in_flight.contains_key(&r) && !self.retouched.get(r) {
                self.active.set(r, false);
                changed |= !self.out_of_sync.get(r);
            }
        }
        changed
    }

    /// A resync copied `synced` to the peer and the peer flushed it.
    pub fn clear_synced(&mut self, synced: &RegionSet) {
        self.out_of_sync.subtract(synced);
    }

    pub fn out_of_sync(&self) -> &RegionSet {
        &self.out_of_sync
    }

    /// Everything that may differ: out of sync or active.
    pub fn differing(&self) -> RegionSet {
        let mut all = self.out_of_sync.clone();
        all.union(&self.active);
        all
    }

    /// A resync to this replica ended: nothing differs any more.
    pub fn clear_all(&mut self) {
        self.out_of_sync = RegionSet::new(self.regions);
        let active: Vec<u64> = self.active.iter().collect();
        for r in active {
            if !self.in_flight.contains_key(&r) {
                self.active.set(r, false);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn active_bits_go_after_a_flush_of_both_and_out_of_sync_ones_stay() {
        let mut i = Intent::new(8, RegionSet::new(8));
        assert!(i.begin_active(0..=2));
        assert!(!i.begin_active(1..=1), "already on disk");
        i.end_active(0..=2);
        i.flush_started();
        assert!(!i.begin_active(0..=0), "written again during the flush");
        i.end_active(1..=1); // ended during the flush: maybe not covered
        assert!(i.flush_done());
        assert_eq!(i.differing().iter().collect::<Vec<_>>(), [0, 1]);
        i.flush_started();
        assert!(i.flush_done(), "region 1: nothing since this flush began");
        assert_eq!(i.differing().iter().collect::<Vec<_>>(), [0]);
        assert!(i.mark_out_of_sync([5].into_iter()));
        i.end_active(0..=0);
        i.flush_started();
        i.flush_done();
        assert_eq!(i.differing().iter().collect::<Vec<_>>(), [5]);
        assert_eq!(i.image()[0], 1 << 5);
    }

    #[test]
    fn a_failed_peer_makes_active_regions_out_of_sync() {
        let mut i = Intent::new(8, RegionSet::new(8));
        i.begin_active(2..=3);
        i.end_active(2..=3);
        i.active_to_out_of_sync();
        i.flush_started();
        i.flush_done();
        assert_eq!(i.out_of_sync().iter().collect::<Vec<_>>(), [2, 3]);
        let mut synced = RegionSet::new(8);
        synced.set(2, true);
        i.clear_synced(&synced);
        assert_eq!(i.out_of_sync().iter().collect::<Vec<_>>(), [3]);
    }
}
