//! Reference counts of physical units and the choice of free ones.

use std::collections::{HashMap, HashSet};
use std::io;

/// Per-unit reference counts, both as they are now and as the metadata
/// store last committed them.
pub struct Space {
    /// Mappings that refer to each unit now.
    refs: Vec<u32>,
    /// Reference counts as last committed.
    committed: Vec<u32>,
    /// Units whose count dropped to zero since their last commit: not
    /// reusable until a commit records them free, because the committed
    /// state may still map them.
    held: HashSet<u64>,
    /// Units being filled by a write that will map them once its data is
    /// written; nobody else may take them meanwhile.
    reserved: HashSet<u64>,
    /// Shared units being copied by copy-on-writes outside the pool's
    /// lock, with how many copies are under way: not written in place
    /// until the copies end, even if they become exclusive meanwhile.
    copying: HashMap<u64, u32>,
    used: u64,
    /// Where the search for a free unit resumes.
    cursor: u64,
}

impl Space {
    pub fn new(total_units: u64, refs: impl IntoIterator<Item = (u64, u32)>) -> io::Result<Space> {
        let mut counts = vec![0u32; total_units as usize];
        let mut used = 0;
        for (unit, count) in refs {
            let slot = counts.get_mut(unit as usize).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("reference count for unit {unit} beyond the pool"),
                )
            })?;
            if count > 0 && *slot == 0 {
                used += 1;
            }
            *slot = count;
        }
        Ok(Space {
            committed: counts.clone(),
            refs: counts,
            held: HashSet::new(),
            reserved: HashSet::new(),
            copying: HashMap::new(),
            used,
            cursor: 0,
        })
    }

    pub fn total(&self) -> u64 {
        self.refs.len() as u64
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn held(&self) -> u64 {
        self.held.len() as u64
    }

    pub fn free(&self) -> u64 {
        self.total() - self.used - self.held() - self.reserved.len() as u64
    }

    pub fn count(&self, unit: u64) -> u32 {
        self.refs.get(unit as usize).copied().unwrap_or(0)
    }

    pub fn is_held(&self, unit: u64) -> bool {
        self.held.contains(&unit)
    }

    /// Whether the unit may be written in place: one mapping refers to it,
    /// the committed state has no other (it may still share a unit that
    /// a not yet committed copy-on-write or discard stopped sharing), and
    /// no copy-on-write is copying it.
    pub fn exclusive(&self, unit: u64) -> bool {
        let i = unit as usize;
        self.refs.get(i) == Some(&1)
            && self.committed.get(i).is_some_and(|&c| c <= 1)
            && !self.copying.contains_key(&unit)
    }

    /// A copy-on-write starts copying `unit`: until [`Space::end_copy`],
    /// nothing writes it in place and it is not reused if freed.
    pub fn start_copy(&mut self, unit: u64) {
        *self.copying.entry(unit).or_insert(0) += 1;
    }

    pub fn end_copy(&mut self, unit: u64) {
        if let Some(n) = self.copying.get_mut(&unit) {
            *n -= 1;
            if *n == 0 {
                self.copying.remove(&unit);
            }
        }
    }

    /// Whether the committed state maps the unit at all.
    pub fn is_committed(&self, unit: u64) -> bool {
        self.committed.get(unit as usize).is_some_and(|&c| c > 0)
    }

    /// A unit that nothing refers to and that is not held.
    pub fn find_free(&mut self) -> io::Result<u64> {
        let total = self.total();
        if self.free() == 0 {
            return Err(io::Error::new(io::ErrorKind::StorageFull, "pool is full"));
        }
        for step in 0..total {
            let unit = (self.cursor + step) % total;
            if self.refs[unit as usize] == 0
                && !self.held.contains(&unit)
                && !self.reserved.contains(&unit)
                && !self.copying.contains_key(&unit)
            {
                self.cursor = (unit + 1) % total;
                return Ok(unit);
            }
        }
        Err(io::Error::new(io::ErrorKind::StorageFull, "pool is full"))
    }

    /// Takes a free unit for a write that fills it before mapping it.
    pub fn reserve(&mut self) -> io::Result<u64> {
        let unit = self.find_free()?;
        self.reserved.insert(unit);
        Ok(unit)
    }

    /// Ends a reservation; the caller maps the unit or lets it go.
    pub fn unreserve(&mut self, unit: u64) {
        self.reserved.remove(&unit);
    }

    /// Adds one reference; returns true when the unit came into use.
    pub fn increment(&mut self, unit: u64) -> bool {
        let c = &mut self.refs[unit as usize];
        *c += 1;
        if *c == 1 {
            self.used += 1;
        }
        *c == 1
    }

    /// Drops one reference; returns true when the unit became unreferenced
    /// (it is then held until the next commit).
    pub fn decrement(&mut self, unit: u64) -> bool {
        let c = &mut self.refs[unit as usize];
        *c = c.saturating_sub(1);
        if *c == 0 {
            self.used -= 1;
            self.held.insert(unit);
            true
        } else {
            false
        }
    }

    /// Records a commit: its counts are now durable, and the units it freed
    /// may be reused.
    pub fn committed(&mut self, refs: &std::collections::BTreeMap<u64, u32>, freed: &[u64]) {
        for (&unit, &count) in refs {
            if let Some(c) = self.committed.get_mut(unit as usize) {
                *c = count;
            }
        }
        for unit in freed {
            self.held.remove(unit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn freed_units_wait_for_their_commit() {
        let mut s = Space::new(2, []).unwrap();
        let a = s.find_free().unwrap();
        s.increment(a);
        let b = s.find_free().unwrap();
        assert_ne!(a, b);
        s.increment(b);
        assert!(s.find_free().is_err());
        assert!(s.decrement(a));
        assert!(s.find_free().is_err(), "a is held until committed");
        s.committed(&BTreeMap::from([(a, 0), (b, 1)]), &[a]);
        assert_eq!(s.find_free().unwrap(), a);
    }

    #[test]
    fn a_unit_shared_in_the_committed_state_is_not_exclusive() {
        let mut s = Space::new(4, [(1, 2)]).unwrap();
        assert_eq!(s.used(), 1);
        assert!(!s.exclusive(1));
        assert!(!s.decrement(1));
        assert!(!s.exclusive(1), "still shared by the committed state");
        s.committed(&BTreeMap::from([(1, 1)]), &[]);
        assert!(s.exclusive(1));
        assert!(Space::new(1, [(5, 1)]).is_err());
    }

    #[test]
    fn a_unit_being_copied_is_neither_written_in_place_nor_reused() {
        let mut s = Space::new(2, [(0, 1)]).unwrap();
        assert!(s.exclusive(0));
        s.start_copy(0);
        s.start_copy(0);
        assert!(!s.exclusive(0));
        s.end_copy(0);
        assert!(!s.exclusive(0), "one copy still under way");
        s.end_copy(0);
        assert!(s.exclusive(0));

        // Freed and committed while copied: not handed out again.
        s.start_copy(0);
        assert!(s.decrement(0));
        s.committed(&BTreeMap::from([(0, 0)]), &[0]);
        assert_eq!(s.find_free().unwrap(), 1);
        s.increment(1);
        assert!(s.find_free().is_err());
        s.end_copy(0);
        assert_eq!(s.find_free().unwrap(), 0);
    }
}
