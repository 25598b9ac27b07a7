//! Where things are on the cache device, and how a backing offset maps to
//! cache lines and their sub-blocks.
//!
//! Layout: two superblock copies, then two copies of the mapping table
//! (one 4 KiB block per [`ENTRIES_PER_BLOCK`] slots), then the slots, each
//! one cache line, aligned to the line size.

use std::io;

/// Size of a superblock copy and of a table block.
pub const META_BLOCK: u64 = 4096;
/// Header of a table block: magic, crc, sequence, instance, block index.
pub const BLOCK_HEADER: usize = 32;
/// A table entry: backing line + 1 (0 = free), valid bits, dirty bits.
pub const ENTRY_BYTES: usize = 24;
pub const ENTRIES_PER_BLOCK: usize = (META_BLOCK as usize - BLOCK_HEADER) / ENTRY_BYTES;
/// Validity and dirtiness are tracked per sub-block, at most 64 a line,
/// so a 4 KiB write into a 64 KiB line never reads the rest of the line.
pub const MAX_SUBS: u64 = 64;
pub const MIN_SUB: u64 = 512;
pub const MIN_LINE: u64 = 4096;
pub const MAX_LINE: u64 = 4 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Cache line size in bytes.
    pub line: u64,
    /// Sub-block size in bytes.
    pub sub: u64,
    /// Number of cache lines the cache device holds.
    pub slots: u32,
    pub table_blocks: u32,
    pub data_start: u64,
    /// Size of the backing device (the size of the cache device as seen by
    /// its users).
    pub backing_size: u64,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl Geometry {
    pub fn new(cache_size: u64, backing_size: u64, line: u64) -> io::Result<Geometry> {
        if !line.is_power_of_two() || !(MIN_LINE..=MAX_LINE).contains(&line) {
            return Err(invalid(format!(
                "cache line {line} is not a power of two from {MIN_LINE} to {MAX_LINE}"
            )));
        }
        let sub = (line / MAX_SUBS).max(MIN_SUB);
        let mut slots = cache_size / line;
        let layout = |slots: u64| {
            let blocks = slots.div_ceil(ENTRIES_PER_BLOCK as u64);
            let meta = (2 + 2 * blocks) * META_BLOCK;
            (blocks, meta.div_ceil(line) * line)
        };
        while slots > 0 && layout(slots).1 + slots * line > cache_size {
            slots -= 1;
        }
        if slots < 2 || slots > u32::MAX as u64 / 2 {
            return Err(invalid(format!(
                "a cache device of {cache_size} bytes cannot hold a useful number of {line}-byte lines"
            )));
        }
        let (blocks, data_start) = layout(slots);
        Ok(Geometry {
            line,
            sub,
            slots: slots as u32,
            table_blocks: blocks as u32,
            data_start,
            backing_size,
        })
    }

    pub fn superblock_offset(copy: usize) -> u64 {
        copy as u64 * META_BLOCK
    }

    pub fn table_offset(&self, block: u32, copy: usize) -> u64 {
        (2 + copy as u64 * self.table_blocks as u64 + block as u64) * META_BLOCK
    }

    pub fn slot_offset(&self, slot: u32) -> u64 {
        self.data_start + slot as u64 * self.line
    }

    pub fn line_of(&self, offset: u64) -> u64 {
        offset / self.line
    }

    pub fn line_start(&self, line: u64) -> u64 {
        line * self.line
    }

    /// Bytes of `line` inside the backing (the last line may be short).
    pub fn line_len(&self, line: u64) -> u64 {
        (self.backing_size - self.line_start(line)).min(self.line)
    }

    pub fn sub_bits(&self) -> u32 {
        (self.line / self.sub) as u32
    }

    /// Sub-blocks touched by `[from, to)`, offsets inside a line.
    pub fn touched(&self, from: u64, to: u64) -> u64 {
        if from >= to {
            return 0;
        }
        mask(from / self.sub, (to - 1) / self.sub + 1)
    }

    /// Sub-blocks wholly inside `[from, to)`, offsets inside `line`; the
    /// short tail of the last line counts as whole when `to` reaches it.
    pub fn covered(&self, line: u64, from: u64, to: u64) -> u64 {
        let first = from.div_ceil(self.sub);
        let end = if to == self.line_len(line) {
            to.div_ceil(self.sub)
        } else {
            to / self.sub
        };
        if first >= end {
            0
        } else {
            mask(first, end)
        }
    }

    /// `[from, to)` widened to whole sub-blocks, within the line's length.
    pub fn widen(&self, line: u64, from: u64, to: u64) -> (u64, u64) {
        let start = from / self.sub * self.sub;
        let end = (to.div_ceil(self.sub) * self.sub).min(self.line_len(line));
        (start, end)
    }

    /// Byte range inside a line of the sub-blocks `first..end`.
    pub fn sub_range(&self, line: u64, first: u32, end: u32) -> (u64, u64) {
        let len = self.line_len(line);
        (
            (first as u64 * self.sub).min(len),
            (end as u64 * self.sub).min(len),
        )
    }
}

/// Bits `first..end` set.
pub fn mask(first: u64, end: u64) -> u64 {
    debug_assert!(first < end && end <= 64);
    let high = if end == 64 {
        u64::MAX
    } else {
        (1u64 << end) - 1
    };
    high & !((1u64 << first) - 1)
}

/// Maximal runs of set (`set = true`) or clear bits of `bits` within
/// `first..end`: `(start, end, set)`.
pub fn runs(bits: u64, first: u32, end: u32) -> Vec<(u32, u32, bool)> {
    let mut out: Vec<(u32, u32, bool)> = Vec::new();
    for i in first..end {
        let set = bits >> i & 1 == 1;
        match out.last_mut() {
            Some(last) if last.2 == set => last.1 = i + 1,
            _ => out.push((i, i + 1, set)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_fits_the_device() {
        let g = Geometry::new(64 << 20, 1 << 30, 64 << 10).unwrap();
        assert_eq!(g.sub, 1024);
        assert!(g.data_start + g.slots as u64 * g.line <= 64 << 20);
        assert!(g.table_blocks as usize * ENTRIES_PER_BLOCK >= g.slots as usize);
        assert_eq!(g.data_start % g.line, 0);
        assert!(g.table_offset(g.table_blocks - 1, 1) + META_BLOCK <= g.data_start);
        assert!(Geometry::new(64 << 20, 1 << 30, 3000).is_err());
        assert!(Geometry::new(8192, 1 << 30, 4096).is_err());
    }

    #[test]
    fn masks_and_ranges() {
        let g = Geometry::new(1 << 20, 10_000, 4096).unwrap();
        assert_eq!(g.sub, 512);
        assert_eq!(g.touched(0, 1), 1);
        assert_eq!(g.touched(511, 513), 0b11);
        assert_eq!(g.covered(0, 1, 1024), 0b10);
        // Line 2 is 1808 bytes long: its last sub-block is short.
        assert_eq!(g.line_len(2), 1808);
        assert_eq!(g.covered(2, 1536, 1808), 0b1000);
        assert_eq!(g.widen(2, 1000, 1700), (512, 1808));
        assert_eq!(mask(0, 64), u64::MAX);
        assert_eq!(
            runs(0b0110, 0, 4),
            vec![(0, 1, false), (1, 3, true), (3, 4, false)]
        );
    }
}
