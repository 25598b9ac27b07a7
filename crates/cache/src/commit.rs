//! Writing the mapping table and the superblock.
//!
//! A commit copies the changed table blocks out of memory, flushes the
//! cache device (so every slot the blocks name holds its data on stable
//! storage), writes each block over its older copy, and flushes again.
//! Only then do the slots freed before the copy become reusable.

use std::collections::BTreeSet;
use std::io;

use crate::device::Inner;
use crate::geometry::{Geometry, ENTRIES_PER_BLOCK};
use crate::meta::{encode_block, Entry, Superblock};

/// What the writer of the metadata knows about the copies on disk.
pub struct MetaWriter {
    pub sb: Superblock,
    /// Which superblock copy holds `sb`.
    pub sb_copy: usize,
    /// Sequence number of the last commit.
    pub seq: u64,
    /// Which copy of each table block is current (`None`: never written).
    pub current_copy: Vec<Option<usize>>,
}

impl Inner {
    /// Makes the table on the cache device say what memory says, and every
    /// completed write to the cache device stable.
    pub fn commit(&self) -> io::Result<()> {
        let result = self.commit_locked(&mut self.meta.lock(), &BTreeSet::new());
        if let Err(e) = &result {
            // With the metadata lock released: failing writes a superblock.
            self.fail("metadata commit", e);
        }
        result
    }

    /// Commits all but the table blocks in `held_back`, which stay
    /// changed (and the slots freed in them quarantined) for a later
    /// commit.
    pub(crate) fn commit_locked(
        &self,
        meta: &mut MetaWriter,
        held_back: &BTreeSet<u32>,
    ) -> io::Result<()> {
        let (blocks, released) = {
            let mut st = self.state.lock();
            let mut changed = std::mem::take(&mut st.changed);
            let mut released = std::mem::take(&mut st.quarantine);
            for b in held_back {
                if changed.remove(b) {
                    st.changed.insert(*b);
                }
            }
            released.retain(|&slot| {
                let kept = held_back.contains(&(slot / ENTRIES_PER_BLOCK as u32));
                if kept {
                    st.quarantine.push(slot);
                }
                !kept
            });
            let blocks: Vec<(u32, Vec<Entry>)> = changed
                .into_iter()
                .map(|b| {
                    let first = b * ENTRIES_PER_BLOCK as u32;
                    let end = (first + ENTRIES_PER_BLOCK as u32).min(self.geo.slots);
                    let mut entries: Vec<Entry> = (first..end).map(|s| st.entry(s)).collect();
                    entries.resize(ENTRIES_PER_BLOCK, Entry::default());
                    (b, entries)
                })
                .collect();
            (blocks, released)
        };
        match self.write_table(meta, &blocks) {
            Ok(()) => {
                self.state.lock().free.extend(released);
                Ok(())
            }
            Err(e) => {
                // Kept for a commit after the device comes back.
                let mut st = self.state.lock();
                st.changed.extend(blocks.iter().map(|(b, _)| *b));
                st.quarantine.extend(released);
                Err(e)
            }
        }
    }

    fn write_table(&self, meta: &mut MetaWriter, blocks: &[(u32, Vec<Entry>)]) -> io::Result<()> {
        self.cache.flush()?;
        if blocks.is_empty() {
            return Ok(());
        }
        let seq = meta.seq + 1;
        let mut copies = Vec::with_capacity(blocks.len());
        for (b, entries) in blocks {
            let copy = meta.current_copy[*b as usize].map_or(0, |c| 1 - c);
            let data = encode_block(meta.sb.instance, seq, *b, entries);
            self.cache
                .write_at(&data, self.geo.table_offset(*b, copy), false)?;
            copies.push((*b, copy));
        }
        self.cache.flush()?;
        meta.seq = seq;
        for (b, copy) in copies {
            meta.current_copy[b as usize] = Some(copy);
        }
        Ok(())
    }

    /// Writes the superblock over its older copy, stable before returning.
    pub fn write_superblock(&self, meta: &mut MetaWriter, clean: bool) -> io::Result<()> {
        meta.sb.seq += 1;
        meta.sb.clean = clean;
        meta.sb.failed = self.is_failed();
        // Recursive: the caller may be an I/O holding the mode shared.
        meta.sb.mode = *self.mode.read_recursive();
        let copy = 1 - meta.sb_copy;
        self.cache
            .write_at(&meta.sb.encode(), Geometry::superblock_offset(copy), false)?;
        self.cache.flush()?;
        meta.sb_copy = copy;
        Ok(())
    }
}

/// Writes a new superblock into both copies, so that no copy of an
/// earlier format outranks it.
pub fn format(cache: &dyn block::BlockDevice, sb: &Superblock) -> io::Result<MetaWriter> {
    let mut sb = sb.clone();
    for copy in 0..2 {
        sb.seq = copy as u64 + 1;
        cache.write_at(&sb.encode(), Geometry::superblock_offset(copy), false)?;
    }
    cache.flush()?;
    Ok(MetaWriter {
        sb,
        sb_copy: 1,
        seq: 0,
        current_copy: Vec::new(),
    })
}
