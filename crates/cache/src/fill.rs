//! Reads that admit what they miss: the whole cache line is filled.
//!
//! A read miss reads every sub-block of the line the cache does not hold
//! yet, not only the bytes asked for, and caches them all, as dm-cache
//! promotes whole blocks. On a spinning disk a 64 KiB read costs about
//! what a 4 KiB one does (the seek dominates), so a hot set of N lines
//! is resident after at most N backing reads instead of one per 4 KiB
//! block: with 64 KiB lines a random-read working set warms 16x sooner.
//! Sub-blocks the cache already holds (perhaps dirty, newer than the
//! backing) are never read from the backing nor overwritten.

use smallvec::SmallVec;

use crate::device::Inner;
use crate::geometry::runs;
use crate::io::{on_backing, Res};
use crate::locks::Held;

/// One line of a read: the bytes `[from, to)` of `line` wanted, at `at`
/// in the caller's buffer; its slot and which sub-blocks it holds.
struct LinePlan {
    line: u64,
    from: u64,
    to: u64,
    at: usize,
    slot: Option<u32>,
    valid: u64,
    /// Fill the line's missing sub-blocks into `slot`.
    fill: bool,
}

/// A backing read covering whole missing parts of one or more lines.
struct BackingRead {
    offset: u64,
    data: Vec<u8>,
}

impl Inner {
    pub(crate) fn read_filling(&self, buf: &mut [u8], offset: u64, held: &Held) -> Res<()> {
        if let Some(at) = self.whole_hit(offset, buf.len() as u64) {
            self.read_from_cache_device(buf, at)?;
            self.counters.read(buf.len() as u64, 0);
            return Ok(());
        }
        let mut plans: SmallVec<[LinePlan; 4]> = SmallVec::new();
        {
            let mut st = self.state.lock();
            for (line, from, to) in self.segments(offset, buf.len() as u64) {
                let slot = st.lookup(line);
                let valid = slot.map_or(0, |s| st.slots[s as usize].valid);
                if let Some(s) = slot {
                    st.policy.hit(s);
                }
                let wanted = self.geo.touched(from, to);
                plans.push(LinePlan {
                    line,
                    from,
                    to,
                    at: (self.geo.line_start(line) + from - offset) as usize,
                    slot,
                    valid,
                    fill: wanted & !valid != 0,
                });
            }
        }
        // Slots for the lines to fill (evicting if need be); a line with
        // no room is read as asked and not cached.
        for p in plans.iter_mut().filter(|p| p.fill) {
            match self.slot_for(p.line, held)? {
                Some(slot) => {
                    p.slot = Some(slot);
                    p.valid = self.state.lock().slots[slot as usize].valid;
                }
                None => {
                    p.fill = false;
                    p.slot = None;
                    p.valid = 0;
                }
            }
        }
        // What comes from the backing, neighbouring parts merged into one
        // read: the missing sub-blocks of whole lines to fill, the missing
        // bytes asked for of the others.
        let mut ranges: SmallVec<[(u64, u64); 4]> = SmallVec::new();
        for p in &plans {
            let base = self.geo.line_start(p.line);
            let (first, end) = if p.fill {
                (0, self.subs_in(p.line))
            } else {
                (
                    (p.from / self.geo.sub) as u32,
                    ((p.to - 1) / self.geo.sub + 1) as u32,
                )
            };
            for (r0, r1, set) in runs(p.valid, first, end) {
                if set {
                    continue;
                }
                let (mut x, mut y) = self.geo.sub_range(p.line, r0, r1);
                if !p.fill {
                    (x, y) = (x.max(p.from), y.min(p.to));
                }
                if x >= y {
                    continue;
                }
                match ranges.last_mut() {
                    Some(last) if last.1 == base + x => last.1 = base + y,
                    _ => ranges.push((base + x, base + y)),
                }
            }
        }
        let mut reads: SmallVec<[BackingRead; 2]> = SmallVec::new();
        for (x, y) in ranges {
            let mut data = vec![0u8; (y - x) as usize];
            on_backing(self.backing.read_at(&mut data, x))?;
            reads.push(BackingRead { offset: x, data });
        }
        let (mut hit, mut miss) = (0, 0);
        for p in &plans {
            let base = self.geo.line_start(p.line);
            let first = (p.from / self.geo.sub) as u32;
            let end = ((p.to - 1) / self.geo.sub + 1) as u32;
            for (r0, r1, set) in runs(p.valid, first, end) {
                let (x, y) = self.geo.sub_range(p.line, r0, r1);
                let (x, y) = (x.max(p.from), y.min(p.to));
                let out = &mut buf[p.at + (x - p.from) as usize..p.at + (y - p.from) as usize];
                if set {
                    let slot = p.slot.expect("valid sub-blocks have a slot");
                    self.read_from_cache_device(out, self.geo.slot_offset(slot) + x)?;
                    hit += y - x;
                } else {
                    out.copy_from_slice(from_backing(&reads, base + x, out.len()));
                    miss += y - x;
                }
            }
        }
        self.counters.read(hit, miss);
        for p in plans.iter().filter(|p| p.fill) {
            if let Err(e) = self.fill_line(p, &reads) {
                // The data read is good; only caching it failed.
                self.fail("fill", &e);
                break;
            }
        }
        Ok(())
    }

    /// Where on the cache device a read inside one line lies, when the
    /// cache holds all of it: the common hit, without planning.
    fn whole_hit(&self, offset: u64, len: u64) -> Option<u64> {
        let line = self.geo.line_of(offset);
        let from = offset - self.geo.line_start(line);
        if from + len > self.geo.line {
            return None;
        }
        let mut st = self.state.lock();
        let slot = st.lookup(line)?;
        let wanted = self.geo.touched(from, from + len);
        if st.slots[slot as usize].valid & wanted != wanted {
            return None;
        }
        st.policy.hit(slot);
        Some(self.geo.slot_offset(slot) + from)
    }

    /// How many sub-blocks `line` has (the last line may be short).
    fn subs_in(&self, line: u64) -> u32 {
        self.geo.line_len(line).div_ceil(self.geo.sub) as u32
    }

    /// Writes the line's missing sub-blocks, just read from the backing,
    /// into its slot.
    fn fill_line(&self, p: &LinePlan, reads: &[BackingRead]) -> std::io::Result<()> {
        let slot = p.slot.expect("a line to fill has a slot");
        let base = self.geo.line_start(p.line);
        let mut filled = 0;
        for (r0, r1, set) in runs(p.valid, 0, self.subs_in(p.line)) {
            if set {
                continue;
            }
            let (x, y) = self.geo.sub_range(p.line, r0, r1);
            let data = from_backing(reads, base + x, (y - x) as usize);
            self.cache
                .write_at(data, self.geo.slot_offset(slot) + x, false)?;
            filled |= crate::geometry::mask(r0 as u64, r1 as u64);
        }
        if filled != 0 {
            self.state.lock().written(slot, filled, 0);
        }
        Ok(())
    }
}

/// The bytes `[dev, dev + len)` of the backing, from the reads made.
fn from_backing(reads: &[BackingRead], dev: u64, len: usize) -> &[u8] {
    let r = reads
        .iter()
        .find(|r| r.offset <= dev && dev + len as u64 <= r.offset + r.data.len() as u64)
        .expect("a backing read covers every missing part");
    let at = (dev - r.offset) as usize;
    &r.data[at..at + len]
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use block::{BlockDevice, MemDevice};

    use crate::{CacheDevice, CacheOptions, Mode};

    #[test]
    fn a_read_miss_fills_the_whole_line_and_keeps_newer_sub_blocks() {
        let ssd: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(4 << 20));
        let hdd: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(64 << 20));
        let pattern: Vec<u8> = (0..128 << 10).map(|i| (i % 251) as u8).collect();
        hdd.write_at(&pattern, 0, false).unwrap();
        let mut options = CacheOptions::new("hdd");
        options.mode = Mode::WriteBack;
        options.background = false;
        let dev = CacheDevice::open(ssd, hdd.clone(), options).unwrap();
        // A dirty sub-block in the middle of line 0, newer than the backing.
        dev.write_at(&[9; 1024], 8192, false).unwrap();
        let mut buf = vec![0; 4096];
        dev.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, pattern[..4096]);
        // The rest of the line came in with it: only hits from here on.
        let missed = dev.status().reads.miss_bytes;
        let mut line = vec![0; 64 << 10];
        dev.read_at(&mut line, 0).unwrap();
        assert_eq!(dev.status().reads.miss_bytes, missed);
        let mut want = pattern[..64 << 10].to_vec();
        want[8192..9216].fill(9);
        assert_eq!(line, want, "the fill kept the newer sub-block");
        // The next line is not cached yet: a read straddling both fills it.
        dev.read_at(&mut buf, (64 << 10) - 2048).unwrap();
        assert_eq!(buf, pattern[(64 << 10) - 2048..(64 << 10) + 2048]);
        let missed = dev.status().reads.miss_bytes;
        dev.read_at(&mut line, 64 << 10).unwrap();
        assert_eq!(line, pattern[64 << 10..]);
        assert_eq!(dev.status().reads.miss_bytes, missed);
    }
}
