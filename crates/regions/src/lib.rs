//! Sets of regions, one bit each, and the image they are stored as.
//!
//! A write-intent bitmap answers "which parts of this copy may differ
//! from the other copies": RAID's members (`raid::bitmap`) and the HA
//! mirror's replicas (`ha`) both keep one, with their own rules for when
//! a bit is set and cleared. What they share is the set itself and its
//! on-disk image: little-endian 64-bit words, region 0 in bit 0 of the
//! first word, padded with zeros to whole 4 KiB blocks.

/// A set of regions, one bit each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegionSet {
    words: Vec<u64>,
}

impl RegionSet {
    pub fn new(regions: u64) -> RegionSet {
        RegionSet {
            words: vec![0; regions.div_ceil(64) as usize],
        }
    }

    /// A set of `regions` regions, all of them in it.
    pub fn full(regions: u64) -> RegionSet {
        let mut s = RegionSet {
            words: vec![u64::MAX; regions.div_ceil(64) as usize],
        };
        s.trim(regions);
        s
    }

    pub fn get(&self, r: u64) -> bool {
        self.words
            .get((r / 64) as usize)
            .is_some_and(|w| w & (1 << (r % 64)) != 0)
    }

    pub fn set(&mut self, r: u64, on: bool) {
        let w = &mut self.words[(r / 64) as usize];
        if on {
            *w |= 1 << (r % 64);
        } else {
            *w &= !(1 << (r % 64));
        }
    }

    pub fn count(&self) -> u64 {
        self.words.iter().map(|w| w.count_ones() as u64).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    pub fn union(&mut self, other: &RegionSet) {
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a |= b;
        }
    }

    /// Takes the regions of `other` out of this set.
    pub fn subtract(&mut self, other: &RegionSet) {
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a &= !b;
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.words.iter().enumerate().flat_map(|(i, w)| {
            (0..64)
                .filter(move |b| w & (1 << b) != 0)
                .map(move |b| i as u64 * 64 + b)
        })
    }

    /// The image of the set, `len` bytes (zeros past its last word).
    pub fn to_bytes(&self, len: usize) -> Vec<u8> {
        let mut b: Vec<u8> = self.words.iter().flat_map(|w| w.to_le_bytes()).collect();
        b.resize(len, 0);
        b
    }

    /// The set of `regions` regions an image holds; bytes it lacks read as
    /// zeros, bits past the last region are ignored.
    pub fn from_bytes(b: &[u8], regions: u64) -> RegionSet {
        let mut s = RegionSet::new(regions);
        for (i, w) in s.words.iter_mut().enumerate() {
            let mut word = [0u8; 8];
            let from = (i * 8).min(b.len());
            let to = (i * 8 + 8).min(b.len());
            word[..to - from].copy_from_slice(&b[from..to]);
            *w = u64::from_le_bytes(word);
        }
        s.trim(regions);
        s
    }

    /// Bits past the last region are not ours.
    fn trim(&mut self, regions: u64) {
        if !regions.is_multiple_of(64) {
            if let Some(last) = self.words.last_mut() {
                *last &= (1u64 << (regions % 64)) - 1;
            }
        }
    }
}

/// Bytes of the image of `regions` regions, in whole 4 KiB.
pub fn bitmap_bytes(regions: u64) -> usize {
    (regions.div_ceil(8) as usize).div_ceil(4096) * 4096
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_bytes() {
        let mut s = RegionSet::new(100);
        for r in [0, 5, 63, 64, 99] {
            s.set(r, true);
        }
        let b = s.to_bytes(bitmap_bytes(100));
        assert_eq!(b.len(), 4096);
        let back = RegionSet::from_bytes(&b, 100);
        assert_eq!(back, s);
        assert_eq!(back.iter().collect::<Vec<_>>(), [0, 5, 63, 64, 99]);
        assert_eq!(back.count(), 5);
    }

    #[test]
    fn a_full_set_holds_exactly_its_regions() {
        let s = RegionSet::full(70);
        assert_eq!(s.count(), 70);
        assert!(!s.get(70));
        let image = RegionSet::from_bytes(&[0xff; 16], 70);
        assert_eq!(image, s, "bits past the last region are ignored");
    }

    #[test]
    fn union_and_subtract() {
        let mut a = RegionSet::new(10);
        a.set(1, true);
        let mut b = RegionSet::new(10);
        b.set(2, true);
        a.union(&b);
        assert_eq!(a.iter().collect::<Vec<_>>(), [1, 2]);
        a.subtract(&b);
        assert_eq!(a.iter().collect::<Vec<_>>(), [1]);
        assert!(!a.is_empty());
        assert!(RegionSet::new(10).is_empty());
        assert!(!a.get(1000), "a region past the end is in no set");
    }
}
