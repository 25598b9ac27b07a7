//! The metadata on the cache device: a superblock and the mapping table,
//! both kept in two copies so that a torn write never loses the last good
//! version.
//!
//! Each table block carries a checksum, the sequence number of the commit
//! that wrote it and the instance of the format it belongs to. A commit
//! writes each changed block over its older copy, so after a crash every
//! block reads as the version of some commit, the newest whose write
//! completed. Blocks of different commits can mix; see `state.rs` for why
//! that is safe.

use std::io;

use crate::geometry::{Geometry, BLOCK_HEADER, ENTRIES_PER_BLOCK, META_BLOCK};
use crate::mode::Mode;

const SUPER_MAGIC: &[u8; 8] = b"OACACHE1";
const BLOCK_MAGIC: u32 = 0x4f41_434d;
const MAX_ID: usize = 256;

/// What the superblock says about the cache device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub seq: u64,
    /// Random number chosen at format; table blocks of an earlier format
    /// are ignored by it.
    pub instance: u64,
    pub line: u64,
    pub slots: u32,
    pub backing_size: u64,
    /// The name the backing device was configured under.
    pub backing_id: String,
    /// Set by a clean close, cleared when the cache starts serving: a
    /// cache found unclean trusts no clean bit.
    pub clean: bool,
    /// The cache device failed while in use: the backing may have moved
    /// on from what the table says, so the table is not to be trusted.
    pub failed: bool,
    pub mode: Mode,
}

/// One slot of the table as stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    pub line: Option<u64>,
    pub valid: u64,
    pub dirty: u64,
}

fn mode_code(mode: Mode) -> u8 {
    Mode::ALL.iter().position(|m| *m == mode).unwrap() as u8
}

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; META_BLOCK as usize];
        b[..8].copy_from_slice(SUPER_MAGIC);
        let mut w = Writer {
            buf: &mut b,
            at: 12,
        };
        w.u64(self.seq);
        w.u64(self.instance);
        w.u64(self.line);
        w.u64(self.slots as u64);
        w.u64(self.backing_size);
        w.u64(self.clean as u64);
        w.u64(self.failed as u64);
        w.u64(mode_code(self.mode) as u64);
        let id = self.backing_id.as_bytes();
        let n = id.len().min(MAX_ID);
        w.u64(n as u64);
        w.bytes(&id[..n]);
        let crc = crc32c::crc32c(&b[12..]);
        b[8..12].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// `None` when the block is not an intact superblock.
    pub fn decode(b: &[u8]) -> Option<Superblock> {
        if &b[..8] != SUPER_MAGIC {
            return None;
        }
        let crc = u32::from_le_bytes(b[8..12].try_into().unwrap());
        if crc != crc32c::crc32c(&b[12..META_BLOCK as usize]) {
            return None;
        }
        let mut r = Reader { buf: b, at: 12 };
        let seq = r.u64();
        let instance = r.u64();
        let line = r.u64();
        let slots = r.u64() as u32;
        let backing_size = r.u64();
        let clean = r.u64() != 0;
        let failed = r.u64() != 0;
        let mode = *Mode::ALL.get(r.u64() as usize)?;
        let n = (r.u64() as usize).min(MAX_ID);
        let backing_id = String::from_utf8_lossy(r.bytes(n)).into_owned();
        Some(Superblock {
            seq,
            instance,
            line,
            slots,
            backing_size,
            backing_id,
            clean,
            failed,
            mode,
        })
    }
}

/// What the start of a cache device holds.
pub enum Found {
    Superblock {
        sb: Superblock,
        copy: usize,
    },
    /// Zeros: never used.
    Blank,
    /// Neither zeros nor a superblock.
    Garbage,
}

pub fn read_superblock(cache: &dyn block::BlockDevice) -> io::Result<Found> {
    let mut buf = vec![0u8; 2 * META_BLOCK as usize];
    cache.read_at(&mut buf, 0)?;
    let best = (0..2)
        .filter_map(|copy| {
            let at = copy * META_BLOCK as usize;
            Superblock::decode(&buf[at..at + META_BLOCK as usize]).map(|sb| (sb, copy))
        })
        .max_by_key(|(sb, _)| sb.seq);
    Ok(match best {
        Some((sb, copy)) => Found::Superblock { sb, copy },
        None if buf.iter().all(|&b| b == 0) => Found::Blank,
        None => Found::Garbage,
    })
}

pub fn encode_block(instance: u64, seq: u64, block: u32, entries: &[Entry]) -> Vec<u8> {
    let mut b = vec![0u8; META_BLOCK as usize];
    b[..4].copy_from_slice(&BLOCK_MAGIC.to_le_bytes());
    let mut w = Writer { buf: &mut b, at: 8 };
    w.u64(seq);
    w.u64(instance);
    w.u64(block as u64);
    debug_assert_eq!(w.at, BLOCK_HEADER);
    for e in entries {
        w.u64(e.line.map_or(0, |l| l + 1));
        w.u64(e.valid);
        w.u64(e.dirty);
    }
    let crc = crc32c::crc32c(&b[8..]);
    b[4..8].copy_from_slice(&crc.to_le_bytes());
    b
}

/// The sequence number and entries of an intact block of this instance
/// at this index.
pub fn decode_block(b: &[u8], instance: u64, block: u32) -> Option<(u64, Vec<Entry>)> {
    if u32::from_le_bytes(b[..4].try_into().unwrap()) != BLOCK_MAGIC {
        return None;
    }
    let crc = u32::from_le_bytes(b[4..8].try_into().unwrap());
    if crc != crc32c::crc32c(&b[8..META_BLOCK as usize]) {
        return None;
    }
    let mut r = Reader { buf: b, at: 8 };
    let seq = r.u64();
    if r.u64() != instance || r.u64() != block as u64 {
        return None;
    }
    let entries = (0..ENTRIES_PER_BLOCK)
        .map(|_| {
            let line = r.u64().checked_sub(1);
            Entry {
                line,
                valid: r.u64(),
                dirty: r.u64(),
            }
        })
        .collect();
    Some((seq, entries))
}

/// The table as last committed: each slot's entry, the sequence number of
/// the block version it came from, and which copy of each block is current.
pub struct LoadedTable {
    pub entries: Vec<(Entry, u64)>,
    pub current_copy: Vec<Option<usize>>,
    pub max_seq: u64,
}

pub fn load_table(
    cache: &dyn block::BlockDevice,
    geo: &Geometry,
    instance: u64,
) -> io::Result<LoadedTable> {
    let blocks = geo.table_blocks as usize;
    let mut copies = [Vec::new(), Vec::new()];
    for (copy, data) in copies.iter_mut().enumerate() {
        *data = vec![0u8; blocks * META_BLOCK as usize];
        // In pieces of a MiB: the table of a large cache is large.
        for (i, chunk) in data.chunks_mut(1 << 20).enumerate() {
            let at = geo.table_offset(0, copy) + (i << 20) as u64;
            cache.read_at(chunk, at)?;
        }
    }
    let mut entries = Vec::with_capacity(geo.slots as usize);
    let mut current_copy = Vec::with_capacity(blocks);
    let mut max_seq = 0;
    for block in 0..blocks {
        let range = block * META_BLOCK as usize..(block + 1) * META_BLOCK as usize;
        let best = (0..2)
            .filter_map(|c| {
                decode_block(&copies[c][range.clone()], instance, block as u32)
                    .map(|(seq, e)| (seq, e, c))
            })
            .max_by_key(|(seq, _, _)| *seq);
        let (seq, block_entries, copy) = match best {
            Some((seq, e, c)) => (seq, e, Some(c)),
            None => (0, vec![Entry::default(); ENTRIES_PER_BLOCK], None),
        };
        max_seq = max_seq.max(seq);
        current_copy.push(copy);
        entries.extend(block_entries.into_iter().map(|e| (e, seq)));
    }
    entries.truncate(geo.slots as usize);
    Ok(LoadedTable {
        entries,
        current_copy,
        max_seq,
    })
}

struct Writer<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn u64(&mut self, v: u64) {
        self.buf[self.at..self.at + 8].copy_from_slice(&v.to_le_bytes());
        self.at += 8;
    }
    fn bytes(&mut self, v: &[u8]) {
        self.buf[self.at..self.at + v.len()].copy_from_slice(v);
        self.at += v.len();
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn u64(&mut self) -> u64 {
        let v = u64::from_le_bytes(self.buf[self.at..self.at + 8].try_into().unwrap());
        self.at += 8;
        v
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let v = &self.buf[self.at..self.at + n];
        self.at += n;
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb() -> Superblock {
        Superblock {
            seq: 7,
            instance: 99,
            line: 65536,
            slots: 1000,
            backing_size: 1 << 30,
            backing_id: "hdd_r5".into(),
            clean: true,
            failed: false,
            mode: Mode::WriteBack,
        }
    }

    #[test]
    fn superblock_round_trips_and_detects_damage() {
        let mut b = sb().encode();
        assert_eq!(Superblock::decode(&b), Some(sb()));
        b[100] ^= 1;
        assert_eq!(Superblock::decode(&b), None);
    }

    #[test]
    fn block_round_trips_only_for_its_instance_and_index() {
        let mut entries = vec![Entry::default(); ENTRIES_PER_BLOCK];
        entries[3] = Entry {
            line: Some(0),
            valid: 5,
            dirty: 4,
        };
        let b = encode_block(1, 9, 2, &entries);
        assert_eq!(decode_block(&b, 1, 2), Some((9, entries)));
        assert_eq!(decode_block(&b, 2, 2), None);
        assert_eq!(decode_block(&b, 1, 3), None);
        let mut torn = b.clone();
        torn[2000..].fill(0xaa);
        assert_eq!(decode_block(&torn, 1, 2), None);
    }
}
