//! The write-intent bitmap: one bit per region of member rows, set on
//! every member (with FUA) before the first write into the region, and
//! cleared lazily once a flush has made that region's writes stable.
//!
//! After an unclean stop only the regions whose bit is set can have
//! members that disagree, so resync walks only those. While the array is
//! degraded bits are never cleared: a member that comes back then needs
//! only the regions written while it was away.

use std::io;
use std::sync::Arc;

use block::BlockDevice;
use parking_lot::Mutex;

use crate::superblock::BITMAP_OFFSET;

pub use regions::{bitmap_bytes, RegionSet};

pub fn read_bitmap(dev: &dyn BlockDevice, regions: u64) -> io::Result<RegionSet> {
    let mut b = vec![0u8; bitmap_bytes(regions)];
    dev.read_at(&mut b, BITMAP_OFFSET)?;
    Ok(RegionSet::from_bytes(&b, regions))
}

struct State {
    /// The bits as last written (or being written) to the members.
    on_disk: RegionSet,
    /// Writes in flight per region.
    in_flight: Vec<u32>,
    /// Regions a write began in since the current flush started.
    retouched: RegionSet,
    /// Set while some member misses writes: no bit may be cleared.
    keep: bool,
}

pub struct Bitmap {
    pub region_rows: u64,
    pub regions: u64,
    state: Mutex<State>,
}

/// Writes a bitmap image to the members, with or without FUA.
pub type BitmapWriter<'a> = &'a dyn Fn(&[u8], bool) -> io::Result<()>;

impl Bitmap {
    pub fn new(region_rows: u64, rows: u64, initial: RegionSet) -> Bitmap {
        let regions = rows.div_ceil(region_rows).max(1);
        Bitmap {
            region_rows,
            regions,
            state: Mutex::new(State {
                on_disk: initial,
                in_flight: vec![0; regions as usize],
                retouched: RegionSet::new(regions),
                keep: false,
            }),
        }
    }

    pub fn region_of_row(&self, row: u64) -> u64 {
        row / self.region_rows
    }

    pub fn dirty(&self) -> RegionSet {
        self.state.lock().on_disk.clone()
    }

    pub fn keeping(&self) -> bool {
        self.state.lock().keep
    }

    pub fn set_keep(&self, keep: bool) {
        self.state.lock().keep = keep;
    }

    /// Marks the regions of member rows `rows` as being written; returns
    /// once every newly set bit is stable on the members.
    pub fn begin_write(&self, rows: std::ops::Range<u64>, write: BitmapWriter) -> io::Result<()> {
        let (first, last) = (
            self.region_of_row(rows.start),
            self.region_of_row(rows.end - 1),
        );
        let mut st = self.state.lock();
        let mut newly = false;
        for r in first..=last {
            st.in_flight[r as usize] += 1;
            st.retouched.set(r, true);
            if !st.on_disk.get(r) {
                st.on_disk.set(r, true);
                newly = true;
            }
        }
        if newly {
            // Under the lock: images reach the members in the order made.
            let image = st.on_disk.to_bytes(bitmap_bytes(self.regions));
            if let Err(e) = write(&image, true) {
                for r in first..=last {
                    st.in_flight[r as usize] -= 1;
                }
                return Err(e);
            }
        }
        Ok(())
    }

    pub fn end_write(&self, rows: std::ops::Range<u64>) {
        let (first, last) = (
            self.region_of_row(rows.start),
            self.region_of_row(rows.end - 1),
        );
        let mut st = self.state.lock();
        for r in first..=last {
            st.in_flight[r as usize] -= 1;
        }
    }

    /// Called as a flush of the members starts: from now on, which
    /// regions get written again.
    pub fn flush_started(&self) {
        let mut st = self.state.lock();
        st.retouched = RegionSet::new(self.regions);
    }

    /// Called once the members' flush succeeded: regions with no write in
    /// flight and none begun since the flush started are clean.
    pub fn flush_done(&self, write: BitmapWriter) -> io::Result<()> {
        let mut st = self.state.lock();
        if st.keep {
            return Ok(());
        }
        let mut changed = false;
        let dirty: Vec<u64> = st.on_disk.iter().collect();
        for r in dirty {
            if st.in_flight[r as usize] == 0 && !st.retouched.get(r) {
                st.on_disk.set(r, false);
                changed = true;
            }
        }
        if changed {
            // FUA, so a flush leaves no member cache holding anything.
            let image = st.on_disk.to_bytes(bitmap_bytes(self.regions));
            write(&image, true)?;
        }
        Ok(())
    }

    /// Clears regions once a resync made them consistent.
    pub fn clear_synced(&self, synced: &RegionSet, write: BitmapWriter) -> io::Result<()> {
        let mut st = self.state.lock();
        if st.keep {
            return Ok(());
        }
        for r in synced.iter() {
            if st.in_flight[r as usize] == 0 {
                st.on_disk.set(r, false);
            }
        }
        let image = st.on_disk.to_bytes(bitmap_bytes(self.regions));
        write(&image, true)
    }

    /// The image of the current bits, for a member joining the array.
    pub fn image(&self) -> Vec<u8> {
        self.state
            .lock()
            .on_disk
            .to_bytes(bitmap_bytes(self.regions))
    }
}

/// Writes a bitmap image to every device in `devs`.
pub fn write_image_to(devs: &[Arc<dyn BlockDevice>], image: &[u8], fua: bool) -> io::Result<()> {
    for d in devs {
        d.write_at(image, BITMAP_OFFSET, fua)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn bits_are_written_before_data_and_cleared_after_a_flush() {
        let bm = Bitmap::new(4, 40, RegionSet::new(10));
        let writes = RefCell::new(Vec::new());
        let w = |img: &[u8], fua: bool| {
            writes.borrow_mut().push((img[0], fua));
            Ok(())
        };
        bm.begin_write(0..5, &w).unwrap(); // regions 0 and 1
        assert_eq!(writes.borrow().as_slice(), [(0b11, true)]);
        bm.begin_write(1..2, &w).unwrap(); // already set: no write
        assert_eq!(writes.borrow().len(), 1);
        bm.flush_started();
        bm.end_write(0..5);
        bm.begin_write(2..3, &w).unwrap(); // region 0 again, during the flush
        bm.flush_done(&w).unwrap();
        // Region 1 is clean now; region 0 has writes in flight, one of
        // them begun after the flush started.
        assert_eq!(writes.borrow().last(), Some(&(0b01, true)));
        bm.end_write(1..2);
        bm.end_write(2..3);
        bm.flush_started();
        bm.flush_done(&w).unwrap();
        assert_eq!(writes.borrow().last(), Some(&(0, true)));
        assert_eq!(bm.dirty().count(), 0);
    }

    #[test]
    fn a_degraded_array_keeps_its_bits() {
        let bm = Bitmap::new(1, 8, RegionSet::new(8));
        let w = |_: &[u8], _: bool| Ok(());
        bm.set_keep(true);
        bm.begin_write(3..4, &w).unwrap();
        bm.end_write(3..4);
        bm.flush_started();
        bm.flush_done(&w).unwrap();
        assert_eq!(bm.dirty().iter().collect::<Vec<_>>(), [3]);
    }
}
