//! A set of pending changes over a device: non-overlapping extents, each
//! holding data, zeros or a discard, keyed by start offset. A later change
//! replaces whatever earlier changes it overlaps.

use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pending {
    Data(Vec<u8>),
    Zeroes(u64),
    Discard(u64),
}

impl Pending {
    pub fn len(&self) -> u64 {
        match self {
            Pending::Data(v) => v.len() as u64,
            Pending::Zeroes(n) | Pending::Discard(n) => *n,
        }
    }

    /// Keeps `[0, at)` in `self` and returns `[at, len)`.
    fn split_off(&mut self, at: u64) -> Pending {
        match self {
            Pending::Data(v) => Pending::Data(v.split_off(at as usize)),
            Pending::Zeroes(n) => {
                let rest = *n - at;
                *n = at;
                Pending::Zeroes(rest)
            }
            Pending::Discard(n) => {
                let rest = *n - at;
                *n = at;
                Pending::Discard(rest)
            }
        }
    }
}

#[derive(Default)]
pub struct Overlay {
    extents: BTreeMap<u64, Pending>,
}

impl Overlay {
    /// Bytes of data held (zero and discard extents cost nothing).
    pub fn data_bytes(&self) -> u64 {
        self.extents
            .values()
            .filter(|p| matches!(p, Pending::Data(_)))
            .map(Pending::len)
            .sum()
    }

    /// Start offsets of the extents overlapping `[start, end)`.
    fn overlapping(&self, start: u64, end: u64) -> Vec<u64> {
        let mut keys = Vec::new();
        if let Some((&k, p)) = self.extents.range(..start).next_back() {
            if k + p.len() > start {
                keys.push(k);
            }
        }
        keys.extend(self.extents.range(start..end).map(|(&k, _)| k));
        keys
    }

    /// Forgets pending changes inside `[start, end)`, trimming extents that
    /// stick out of it.
    pub fn punch(&mut self, start: u64, end: u64) {
        for k in self.overlapping(start, end) {
            let Some(mut ext) = self.extents.remove(&k) else {
                continue;
            };
            let ext_end = k + ext.len();
            if ext_end > end {
                let right = ext.split_off(end - k);
                self.extents.insert(end, right);
            }
            if k < start {
                ext.split_off(start - k);
                self.extents.insert(k, ext);
            }
        }
    }

    pub fn insert(&mut self, start: u64, change: Pending) {
        let len = change.len();
        if len == 0 {
            return;
        }
        self.punch(start, start + len);
        self.extents.insert(start, change);
    }

    /// Lays the pending changes over `buf`, which holds the device content
    /// at `offset`. Discarded ranges read as zeros.
    pub fn patch(&self, buf: &mut [u8], offset: u64) {
        let end = offset + buf.len() as u64;
        for k in self.overlapping(offset, end) {
            let Some(ext) = self.extents.get(&k) else {
                continue;
            };
            let from = k.max(offset);
            let to = (k + ext.len()).min(end);
            let dst = &mut buf[(from - offset) as usize..(to - offset) as usize];
            match ext {
                Pending::Data(v) => dst.copy_from_slice(&v[(from - k) as usize..(to - k) as usize]),
                Pending::Zeroes(_) | Pending::Discard(_) => dst.fill(0),
            }
        }
    }

    /// The extent containing `offset`, if any, and the start of the next
    /// extent after `offset`.
    pub fn at(&self, offset: u64) -> (Option<(u64, &Pending)>, Option<u64>) {
        let containing = self
            .extents
            .range(..=offset)
            .next_back()
            .filter(|(&k, p)| k + p.len() > offset)
            .map(|(&k, p)| (k, p));
        let next = self.extents.range(offset + 1..).next().map(|(&k, _)| k);
        (containing, next)
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, &Pending)> {
        self.extents.iter().map(|(&k, p)| (k, p))
    }

    pub fn clear(&mut self) {
        self.extents.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(o: &Overlay, len: usize) -> Vec<u8> {
        let mut buf = vec![0xeeu8; len];
        o.patch(&mut buf, 0);
        buf
    }

    #[test]
    fn later_writes_replace_earlier_ones() {
        let mut o = Overlay::default();
        o.insert(10, Pending::Data(vec![1; 10]));
        o.insert(15, Pending::Data(vec![2; 2]));
        o.insert(0, Pending::Zeroes(12));
        let v = view(&o, 24);
        assert_eq!(&v[..12], &[0; 12]);
        assert_eq!(&v[12..15], &[1; 3]);
        assert_eq!(&v[15..17], &[2; 2]);
        assert_eq!(&v[17..20], &[1; 3]);
        assert_eq!(&v[20..], &[0xee; 4]);
        assert_eq!(o.data_bytes(), 8);
        // Extents stay disjoint and ordered.
        let mut end = 0;
        for (k, p) in o.iter() {
            assert!(k >= end);
            end = k + p.len();
        }
    }

    #[test]
    fn punch_inside_one_extent_splits_it() {
        let mut o = Overlay::default();
        o.insert(0, Pending::Data((0..20).collect()));
        o.punch(5, 8);
        let v = view(&o, 20);
        assert_eq!(&v[..5], &[0, 1, 2, 3, 4]);
        assert_eq!(&v[5..8], &[0xee; 3]);
        assert_eq!(v[8], 8);
        assert_eq!(o.at(6), (None, Some(8)));
        assert_eq!(o.at(3).0.map(|(k, _)| k), Some(0));
    }
}
