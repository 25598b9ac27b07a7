//! Atomic writes through the cache, all or nothing across a crash, by
//! redirect-on-write: every line the write touches is written whole (the
//! old slot's valid blocks with the write laid over) into a fresh slot,
//! never over the slot that holds the line now, and the fresh slots all
//! lie in ONE table block. The write of that one checksummed block is the
//! atomic point: a torn block reads as its older copy (`meta.rs`), so a
//! crash leaves either none of the new mappings or all of them.
//!
//! The old slots must not be recorded free before the new mappings are
//! durable, nor rewritten still naming their lines in the same commit (a
//! line named by two slots goes to the newer block, and a tie would be
//! settled by slot order). So their blocks are held back from the switch's
//! commit, which runs under the metadata lock, and the old slots are freed
//! after it, for a later commit to record. In write-back mode the new lines
//! stay dirty; in the other modes they are written back at once (a crash
//! first leaves them dirty, and the restart writes them back).

use std::collections::{BTreeSet, HashMap};
use std::io;

use block::AtomicWrites;

use crate::device::Inner;
use crate::geometry::{runs, ENTRIES_PER_BLOCK};
use crate::io::{on_backing, on_cache, stranded, Fault, Res};
use crate::locks::Held;
use crate::mode::Mode;
use crate::state::{Slot, State};

/// The longest atomic write, in lines: it touches one line more at most,
/// and all of them need fresh slots in one table block (169 slots), found
/// by evicting clean lines if need be. 64 lines of 16 KiB take the 256
/// blocks of 512 bytes initiators commonly try.
const MAX_LINES: u64 = 64;

/// One line of an atomic write: the slot holding it now, the fresh slot
/// that takes its new image, and what of that image is valid and dirty.
struct Redirect {
    line: u64,
    old: Option<u32>,
    fresh: u32,
    valid: u64,
    dirty: u64,
    image: Vec<u8>,
}

fn block_of(slot: u32) -> u32 {
    slot / ENTRIES_PER_BLOCK as u32
}

/// No table block has the fresh slots a write needs, and no clean line
/// can give them up: every line is dirty. Write-back frees some in time,
/// so the error says to retry (a timeout, which initiators retry).
fn no_room() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "no room in the cache for an atomic write now: too many lines are dirty",
    )
}

impl State {
    /// `n` free slots of one table block, taken out of the free list.
    fn take_in_one_block(&mut self, n: usize) -> Option<Vec<u32>> {
        let mut count: HashMap<u32, usize> = HashMap::new();
        let block = self.free.iter().rev().map(|&s| block_of(s)).find(|&b| {
            let c = count.entry(b).or_default();
            *c += 1;
            *c >= n
        })?;
        let mut taken = Vec::with_capacity(n);
        self.free.retain(|&s| {
            let take = taken.len() < n && block_of(s) == block;
            if take {
                taken.push(s);
            }
            !take
        });
        Some(taken)
    }

    /// A staged slot becomes the line's slot in the map.
    fn adopt(&mut self, slot: u32, line: u64) {
        self.map.insert(line, slot);
        self.policy.inserted(slot, line);
        let dirty = self.slots[slot as usize].dirty;
        if dirty != 0 {
            self.dirty_lines.insert(line, slot);
            self.dirty_subs += dirty.count_ones() as u64;
        }
    }
}

impl Inner {
    /// The atomic writes the cache takes now: its own while it serves,
    /// the backing's when detached or failed.
    pub fn atomic_limits(&self) -> Option<AtomicWrites> {
        if self.is_detached() || self.is_failed() {
            return self.backing.atomic_writes();
        }
        let per_block = (self.geo.slots as u64).min(ENTRIES_PER_BLOCK as u64);
        // Room for the fresh slots of a write and as many again.
        let lines = MAX_LINES.min((per_block / 2).saturating_sub(1));
        (lines > 0).then(|| AtomicWrites::up_to(lines * self.geo.line))
    }

    /// `buf` at `offset`, all or nothing across a crash (module comment).
    pub fn write_atomic(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        let len = buf.len() as u64;
        self.check(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        self.touch();
        let mode_held = self.mode.read();
        let mode = *mode_held;
        self.open_check()?;
        if self.is_detached() {
            return self.backing.write_atomic(buf, offset, fua);
        }
        // Written back at once outside write-back: no pass may write an
        // older copy of these lines after that (passes write after letting
        // the line locks go), so the pass lock comes first, as in passes.
        let _pass = (mode != Mode::WriteBack).then(|| self.writeback_pass.lock());
        let held = self.lock_lines(offset, len);
        if self.is_failed() {
            if self.has_dirty(offset, len) {
                return Err(stranded());
            }
            self.invalidate_clean(offset, len);
            return self.backing.write_atomic(buf, offset, fua);
        }
        let limits = self.atomic_limits().ok_or_else(block::atomic_unsupported)?;
        if !limits.allows(offset, len) {
            return Err(limits.refusal(offset, len));
        }
        match self.write_redirected(buf, offset, mode, &held) {
            Ok(()) => Ok(()),
            Err(Fault::Backing(e)) => Err(e),
            Err(Fault::Cache(e)) => {
                self.fail("atomic write", &e);
                Err(e)
            }
        }
    }

    fn write_redirected(&self, buf: &[u8], offset: u64, mode: Mode, held: &Held) -> Res<()> {
        // The new lines are dirty from the switch on.
        let _mark = on_backing(self.dirty_mark())?;
        let segments: Vec<(u64, u64, u64)> = self.segments(offset, buf.len() as u64).collect();
        let fresh = self.reserve_fresh(segments.len(), held)?;
        let staged = segments
            .iter()
            .zip(&fresh)
            .map(|(&(line, from, to), &slot)| {
                let at = (self.geo.line_start(line) + from - offset) as usize;
                let data = &buf[at..at + (to - from) as usize];
                let r = self.image(line, from, to, data, slot)?;
                on_cache(
                    self.cache
                        .write_at(&r.image, self.geo.slot_offset(slot), false),
                )?;
                Ok(r)
            })
            .collect::<Res<Vec<Redirect>>>();
        let redirects = match staged {
            Ok(r) => r,
            Err(e) => {
                // Never named by the table: free as they were.
                self.state.lock().free.extend(fresh);
                return Err(e);
            }
        };
        self.switch(&redirects)?;
        if mode != Mode::WriteBack {
            self.write_back_now(&redirects, mode)?;
        }
        Ok(())
    }

    /// `n` free slots in one table block, evicting clean lines (and
    /// committing, so that they are free) if need be.
    fn reserve_fresh(&self, n: usize, held: &Held) -> Res<Vec<u32>> {
        for _ in 0..4 {
            {
                let mut st = self.state.lock();
                if let Some(slots) = st.take_in_one_block(n) {
                    return Ok(slots);
                }
                let mut room: HashMap<u32, usize> = HashMap::new();
                for &s in st.free.iter().chain(&st.quarantine) {
                    *room.entry(block_of(s)).or_default() += 1;
                }
                let mut evicted = 0;
                for victim in st.policy.victims(self.geo.slots as usize) {
                    if room.values().any(|&r| r >= n) {
                        break;
                    }
                    if !self.evict_clean(&mut st, victim, held) {
                        continue;
                    }
                    *room.entry(block_of(victim)).or_default() += 1;
                    evicted += 1;
                }
                self.counters
                    .evictions
                    .fetch_add(evicted, std::sync::atomic::Ordering::Relaxed);
                if st.quarantine.is_empty() {
                    break;
                }
            }
            on_cache(self.commit())?;
        }
        // Not the cache device's fault: returned as it is.
        Err(Fault::Backing(no_room()))
    }

    /// The line's new image for slot `fresh`: what its slot holds now,
    /// completed at the written sub-blocks' edges from the backing, with
    /// `data` laid over `[from, to)`.
    fn image(&self, line: u64, from: u64, to: u64, data: &[u8], fresh: u32) -> Res<Redirect> {
        let (old, valid, dirty) = {
            let st = self.state.lock();
            match st.lookup(line) {
                Some(s) => (
                    Some(s),
                    st.slots[s as usize].valid,
                    st.slots[s as usize].dirty,
                ),
                None => (None, 0, 0),
            }
        };
        let mut image = vec![0u8; self.geo.line_len(line) as usize];
        if let Some(slot) = old {
            for (r0, r1, set) in runs(valid, 0, self.geo.sub_bits()) {
                let (x, y) = self.geo.sub_range(line, r0, r1);
                if set && x < y {
                    let out = &mut image[x as usize..y as usize];
                    self.read_from_cache_device(out, self.geo.slot_offset(slot) + x)?;
                }
            }
        }
        let (wfrom, wto) = self.geo.widen(line, from, to);
        for (x, y) in [(wfrom, from), (to, wto)] {
            if x < y && valid >> (x / self.geo.sub) & 1 == 0 {
                let out = &mut image[x as usize..y as usize];
                on_backing(self.backing.read_at(out, self.geo.line_start(line) + x))?;
            }
        }
        image[from as usize..to as usize].copy_from_slice(data);
        let touched = self.geo.touched(from, to);
        Ok(Redirect {
            line,
            old,
            fresh,
            valid: valid | touched,
            dirty: dirty | touched,
            image,
        })
    }

    /// Switches every line of the write to its fresh slot in one commit
    /// (module comment), with no other commit in between.
    fn switch(&self, redirects: &[Redirect]) -> Res<()> {
        let mut meta = self.meta.lock();
        let fresh_block = block_of(redirects[0].fresh);
        let mut held_back = BTreeSet::new();
        {
            let mut st = self.state.lock();
            for r in redirects {
                let gen = st.slots[r.fresh as usize].gen + 1;
                st.slots[r.fresh as usize] = Slot {
                    line: Some(r.line),
                    valid: r.valid,
                    dirty: r.dirty,
                    gen,
                };
                st.mark(r.fresh);
                match r.old {
                    // Freed in the very block that switches.
                    Some(old) if block_of(old) == fresh_block => st.release(old, false),
                    Some(old) => {
                        held_back.insert(block_of(old));
                    }
                    None => {}
                }
            }
        }
        let committed = self.commit_locked(&mut meta, &held_back);
        {
            // Whatever the commit did, memory follows the new mapping: on
            // a failure the cache is failed, and its table no longer
            // trusted.
            let mut st = self.state.lock();
            for r in redirects {
                if let Some(old) = r.old.filter(|&o| block_of(o) != fresh_block) {
                    st.release(old, false);
                }
                st.adopt(r.fresh, r.line);
            }
        }
        drop(meta);
        committed.map_err(Fault::Cache)
    }

    /// Outside write-back mode: the switched lines go to the backing now
    /// and are clean after it (in mode `none`, dropped from the cache).
    fn write_back_now(&self, redirects: &[Redirect], mode: Mode) -> Res<()> {
        let gens: Vec<u64> = {
            let st = self.state.lock();
            redirects
                .iter()
                .map(|r| st.slots[r.fresh as usize].gen)
                .collect()
        };
        for r in redirects {
            for (r0, r1, set) in runs(r.dirty, 0, self.geo.sub_bits()) {
                let (x, y) = self.geo.sub_range(r.line, r0, r1);
                if set && x < y {
                    let at = self.geo.line_start(r.line) + x;
                    let data = &r.image[x as usize..y as usize];
                    on_backing(self.backing.write_at(data, at, false))?;
                }
            }
        }
        on_backing(self.backing.flush())?;
        let mut st = self.state.lock();
        for (r, gen) in redirects.iter().zip(gens) {
            st.cleaned(r.fresh, r.line, gen, r.dirty);
            if mode == Mode::None {
                st.invalidate(r.fresh, r.valid);
            }
        }
        Ok(())
    }
}
