//! A volume's map of virtual units to physical units. Every READ and WRITE
//! looks its unit up here. Mapped units cluster, so the map is a table of
//! pages of [`PAGE`] consecutive virtual units, a page allocated when a
//! unit in it is first mapped and dropped when its last one is unmapped.
//! The pages are found through a hash map of their own, small enough to
//! stay in the cache (one entry per 512 units, and a huge sparse volume
//! written at its far end costs one entry, not a table up to there). A
//! mapped unit costs 8 bytes, where a hash map of units took about 34 at
//! its usual fill (docs/bench/techniques.md section 39).

use std::collections::HashMap;

/// Entries per page: one 4 KiB page of physical unit numbers.
const PAGE: usize = 512;

/// The entry of a virtual unit that is not mapped.
const UNMAPPED: u64 = u64::MAX;

struct Page {
    units: [u64; PAGE],
    mapped: u32,
}

#[derive(Default)]
pub(crate) struct UnitMap {
    pages: HashMap<u64, Box<Page>, foldhash::fast::RandomState>,
    len: usize,
}

/// Page number and slot in it of a virtual unit.
fn split(vunit: u64) -> (u64, usize) {
    (vunit / PAGE as u64, (vunit % PAGE as u64) as usize)
}

impl UnitMap {
    pub fn get(&self, vunit: &u64) -> Option<&u64> {
        let (page, slot) = split(*vunit);
        let unit = &self.pages.get(&page)?.units[slot];
        (*unit != UNMAPPED).then_some(unit)
    }

    pub fn contains_key(&self, vunit: &u64) -> bool {
        self.get(vunit).is_some()
    }

    /// Maps `vunit` to `unit`; the unit it mapped to before, if any.
    pub fn insert(&mut self, vunit: u64, unit: u64) -> Option<u64> {
        debug_assert_ne!(unit, UNMAPPED);
        let (page, slot) = split(vunit);
        let page = self.pages.entry(page).or_insert_with(|| {
            Box::new(Page {
                units: [UNMAPPED; PAGE],
                mapped: 0,
            })
        });
        let old = std::mem::replace(&mut page.units[slot], unit);
        if old == UNMAPPED {
            page.mapped += 1;
            self.len += 1;
            None
        } else {
            Some(old)
        }
    }

    /// Unmaps `vunit`; the unit it mapped to, if any.
    pub fn remove(&mut self, vunit: &u64) -> Option<u64> {
        let (index, slot) = split(*vunit);
        let page = self.pages.get_mut(&index)?;
        let old = std::mem::replace(&mut page.units[slot], UNMAPPED);
        if old == UNMAPPED {
            return None;
        }
        page.mapped -= 1;
        self.len -= 1;
        if page.mapped == 0 {
            self.pages.remove(&index);
        }
        Some(old)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// (virtual unit, physical unit) of every mapped unit, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let mut order: Vec<u64> = self.pages.keys().copied().collect();
        order.sort_unstable();
        order.into_iter().flat_map(move |index| {
            let page = &self.pages[&index];
            page.units
                .iter()
                .enumerate()
                .filter_map(move |(slot, &unit)| {
                    (unit != UNMAPPED).then_some((index * PAGE as u64 + slot as u64, unit))
                })
        })
    }

    /// The mapped virtual units, in order.
    pub fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.iter().map(|(vunit, _)| vunit)
    }

    /// The physical units mapped, in virtual unit order.
    pub fn values(&self) -> impl Iterator<Item = u64> + '_ {
        self.iter().map(|(_, unit)| unit)
    }
}

impl FromIterator<(u64, u64)> for UnitMap {
    fn from_iter<I: IntoIterator<Item = (u64, u64)>>(iter: I) -> UnitMap {
        let mut map = UnitMap::default();
        for (vunit, unit) in iter {
            map.insert(vunit, unit);
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn behaves_as_an_ordered_map_and_frees_empty_pages() {
        let mut map = UnitMap::default();
        let mut model = BTreeMap::new();
        // Across page boundaries, with gaps, replaced and removed entries.
        let keys = [0, 1, 511, 512, 513, 5000, 100_000, 3];
        for (i, &k) in keys.iter().enumerate() {
            assert_eq!(map.insert(k, i as u64 * 10), model.insert(k, i as u64 * 10));
        }
        assert_eq!(map.insert(512, 7), model.insert(512, 7));
        assert_eq!(map.remove(&1), model.remove(&1));
        assert_eq!(map.remove(&1), None);
        assert_eq!(map.remove(&4), None);
        assert_eq!(map.remove(&9_999_999), None);
        assert_eq!(map.len(), model.len());
        for k in 0..101_000 {
            assert_eq!(map.get(&k), model.get(&k), "{k}");
        }
        let all: Vec<(u64, u64)> = model.iter().map(|(&k, &v)| (k, v)).collect();
        assert_eq!(map.iter().collect::<Vec<_>>(), all);
        assert_eq!(
            map.keys().collect::<Vec<_>>(),
            model.keys().copied().collect::<Vec<_>>()
        );

        // A page goes with its last entry.
        assert_eq!(map.pages.len(), 4);
        assert_eq!(map.remove(&100_000), Some(60));
        assert_eq!(map.remove(&5000), Some(50));
        assert_eq!(map.pages.len(), 2);
        // A unit far out costs one page.
        assert_eq!(map.insert(u64::MAX / 2, 1), None);
        assert_eq!(map.get(&(u64::MAX / 2)), Some(&1));
        assert_eq!(map.pages.len(), 3);
        assert_eq!(map.remove(&(u64::MAX / 2)), Some(1));
        for k in [0, 511, 512, 513, 3] {
            map.remove(&k);
        }
        assert_eq!(map.len(), 0);
        assert!(map.pages.is_empty());
    }
}
