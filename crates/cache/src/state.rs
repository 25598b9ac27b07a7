//! The mapping in memory: which backing line each slot holds, which of its
//! sub-blocks are valid and dirty, and which slots are free.
//!
//! Crash safety rests on three rules kept here and in `commit.rs`:
//! - the table on disk only ever names data that was on the cache device
//!   before the table was written (a commit flushes the cache first);
//! - a slot the committed table says holds a line is not given to another
//!   line until a commit has recorded it free (freed slots wait in
//!   `quarantine`), so the committed table never points at another
//!   line's bytes;
//! - after an unclean stop every cached sub-block is taken as dirty (the
//!   cache is the authority), since writes after the last commit may have
//!   changed a line the table calls clean.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::geometry::ENTRIES_PER_BLOCK;
use crate::meta::Entry;
use crate::policy::{Policy, PolicyKind};

#[derive(Clone, Copy, Debug, Default)]
pub struct Slot {
    pub line: Option<u64>,
    pub valid: u64,
    pub dirty: u64,
    /// Bumped by every write to the slot and every change of tenant, so
    /// write-back can tell whether the bytes it copied are still the
    /// newest.
    pub gen: u64,
}

pub struct State {
    pub slots: Vec<Slot>,
    pub map: HashMap<u64, u32>,
    pub free: Vec<u32>,
    /// Freed since the last commit began: reusable once it completes.
    pub quarantine: Vec<u32>,
    /// Lines with dirty sub-blocks, in backing order, and their slots.
    pub dirty_lines: BTreeMap<u64, u32>,
    pub dirty_subs: u64,
    /// Table blocks changed since the last commit began.
    pub changed: BTreeSet<u32>,
    pub policy: Policy,
}

impl State {
    pub fn empty(slots: u32, kind: PolicyKind) -> State {
        State {
            slots: vec![Slot::default(); slots as usize],
            map: HashMap::new(),
            free: (0..slots).rev().collect(),
            quarantine: Vec::new(),
            dirty_lines: BTreeMap::new(),
            dirty_subs: 0,
            changed: BTreeSet::new(),
            policy: Policy::new(kind, slots),
        }
    }

    /// The state a loaded table describes. Of two slots naming the same
    /// line (a commit torn between their blocks), the one from the newer
    /// block wins. With `unclean`, every valid sub-block is dirty.
    pub fn from_table(entries: &[(Entry, u64)], kind: PolicyKind, unclean: bool) -> State {
        let mut st = State::empty(entries.len() as u32, kind);
        st.free.clear();
        let mut newest: HashMap<u64, (u32, u64)> = HashMap::new();
        for (slot, (e, seq)) in entries.iter().enumerate() {
            let Some(line) = e.line else { continue };
            if newest.get(&line).is_none_or(|&(_, s)| *seq > s) {
                newest.insert(line, (slot as u32, *seq));
            }
        }
        for (slot, (e, _)) in entries.iter().enumerate() {
            let slot = slot as u32;
            let owner = e.line.filter(|l| newest[l].0 == slot);
            match owner {
                Some(line) if e.valid != 0 => {
                    let dirty = if unclean { e.valid } else { e.dirty & e.valid };
                    st.slots[slot as usize] = Slot {
                        line: Some(line),
                        valid: e.valid,
                        dirty,
                        gen: 0,
                    };
                    st.map.insert(line, slot);
                    st.policy.inserted(slot, line);
                    if dirty != 0 {
                        st.dirty_lines.insert(line, slot);
                        st.dirty_subs += dirty.count_ones() as u64;
                    }
                    if unclean && dirty != e.dirty {
                        st.mark(slot);
                    }
                }
                _ => {
                    if e.line.is_some() {
                        // A stale duplicate or an empty line: free on disk
                        // at the next commit.
                        st.mark(slot);
                        st.quarantine.push(slot);
                    } else {
                        st.free.push(slot);
                    }
                }
            }
        }
        st.free.reverse();
        st
    }

    pub fn entry(&self, slot: u32) -> Entry {
        let s = &self.slots[slot as usize];
        Entry {
            line: s.line,
            valid: s.valid,
            dirty: s.dirty,
        }
    }

    /// Notes that `slot`'s entry must be written at the next commit.
    pub fn mark(&mut self, slot: u32) {
        self.changed.insert(slot / ENTRIES_PER_BLOCK as u32);
    }

    pub fn lookup(&self, line: u64) -> Option<u32> {
        self.map.get(&line).copied()
    }

    /// Gives a free slot to `line`.
    pub fn take_free(&mut self, line: u64) -> Option<u32> {
        let slot = self.free.pop()?;
        let gen = self.slots[slot as usize].gen + 1;
        self.slots[slot as usize] = Slot {
            line: Some(line),
            gen,
            ..Slot::default()
        };
        self.map.insert(line, slot);
        self.policy.inserted(slot, line);
        self.mark(slot);
        Some(slot)
    }

    /// The slot's data was written: `valid` sub-blocks now hold the line's
    /// bytes, `dirty` of them newer than the backing's.
    pub fn written(&mut self, slot: u32, valid: u64, dirty: u64) {
        let s = &mut self.slots[slot as usize];
        let before = (s.valid, s.dirty);
        s.valid |= valid | dirty;
        s.dirty |= dirty;
        s.gen += 1;
        let line = s.line.expect("written slot holds a line");
        let added = (s.dirty & !before.1).count_ones() as u64;
        if (s.valid, s.dirty) != before {
            if before.1 == 0 && s.dirty != 0 {
                self.dirty_lines.insert(line, slot);
            }
            self.dirty_subs += added;
            self.mark(slot);
        }
    }

    /// Sub-blocks `bits` of the slot no longer hold the line (they are
    /// stale, or discarded). A slot left with nothing is freed.
    pub fn invalidate(&mut self, slot: u32, bits: u64) {
        let s = &mut self.slots[slot as usize];
        if s.valid & bits == 0 && s.dirty & bits == 0 {
            return;
        }
        let dropped_dirty = (s.dirty & bits).count_ones() as u64;
        s.valid &= !bits;
        s.dirty &= !bits;
        s.gen += 1;
        let (line, now_dirty, now_valid) = (s.line.unwrap(), s.dirty, s.valid);
        self.dirty_subs -= dropped_dirty;
        if dropped_dirty > 0 && now_dirty == 0 {
            self.dirty_lines.remove(&line);
        }
        self.mark(slot);
        if now_valid == 0 {
            self.release(slot, false);
        }
    }

    /// Write-back copied `bits` of the slot as they were at `gen`: they are
    /// clean unless written since.
    pub fn cleaned(&mut self, slot: u32, line: u64, gen: u64, bits: u64) -> bool {
        let s = &mut self.slots[slot as usize];
        if s.line != Some(line) || s.gen != gen {
            return false;
        }
        let cleared = (s.dirty & bits).count_ones() as u64;
        s.dirty &= !bits;
        let now_dirty = s.dirty;
        self.dirty_subs -= cleared;
        if cleared > 0 {
            if now_dirty == 0 {
                self.dirty_lines.remove(&line);
            }
            self.mark(slot);
        }
        true
    }

    /// Takes the line out of `slot`; the slot waits in quarantine for the
    /// next commit.
    pub fn release(&mut self, slot: u32, evicted: bool) {
        // The generation goes on counting, so that a write-back copy of an
        // earlier tenant never passes for a copy of a later one.
        let gen = self.slots[slot as usize].gen + 1;
        let s = std::mem::replace(
            &mut self.slots[slot as usize],
            Slot {
                gen,
                ..Slot::default()
            },
        );
        let line = s.line.expect("released slot holds a line");
        self.map.remove(&line);
        if s.dirty != 0 {
            self.dirty_lines.remove(&line);
            self.dirty_subs -= s.dirty.count_ones() as u64;
        }
        self.policy.removed(slot, line, evicted);
        self.quarantine.push(slot);
        self.mark(slot);
    }

    pub fn occupied(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(line: u64, valid: u64, dirty: u64) -> Entry {
        Entry {
            line: Some(line),
            valid,
            dirty,
        }
    }

    #[test]
    fn the_newer_of_two_slots_for_a_line_wins_and_unclean_makes_all_dirty() {
        let table = vec![
            (entry(7, 0b11, 0), 3),
            (entry(7, 0b01, 0b01), 5),
            (Entry::default(), 5),
            (entry(9, 0b110, 0b010), 1),
        ];
        let st = State::from_table(&table, PolicyKind::TwoQ, false);
        assert_eq!(st.lookup(7), Some(1));
        assert_eq!(st.lookup(9), Some(3));
        assert_eq!(st.free, vec![2]);
        assert_eq!(
            st.quarantine,
            vec![0],
            "the stale slot is freed on disk first"
        );
        assert_eq!(st.dirty_subs, 2);
        let st = State::from_table(&table, PolicyKind::TwoQ, true);
        assert_eq!(st.slots[3].dirty, 0b110);
        assert_eq!(st.dirty_subs, 3);
    }

    #[test]
    fn dirty_accounting_follows_writes_cleaning_and_invalidation() {
        let mut st = State::empty(4, PolicyKind::TwoQ);
        let s = st.take_free(10).unwrap();
        st.written(s, 0b1111, 0b0110);
        assert_eq!(st.dirty_subs, 2);
        assert!(st.dirty_lines.contains_key(&10));
        let gen = st.slots[s as usize].gen;
        st.written(s, 0, 0b1000);
        assert!(!st.cleaned(s, 10, gen, 0b0110), "written since the copy");
        let gen = st.slots[s as usize].gen;
        assert!(st.cleaned(s, 10, gen, 0b1110));
        assert_eq!(st.dirty_subs, 0);
        assert!(st.dirty_lines.is_empty());
        st.invalidate(s, 0b1111);
        assert_eq!(st.lookup(10), None);
        assert_eq!(st.quarantine, vec![s]);
        // The same slot back for the same line, written as often: a copy
        // taken before still does not count.
        let stale_gen = st.slots[s as usize].gen;
        st.free = std::mem::take(&mut st.quarantine);
        let again = st.take_free(10).unwrap();
        assert_eq!(again, s);
        st.written(s, 0b1, 0b1);
        assert!(st.slots[s as usize].gen > stale_gen);
    }
}
