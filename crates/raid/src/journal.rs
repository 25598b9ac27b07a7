//! The atomic write journal: how a write of up to [`MAX_ATOMIC_BYTES`]
//! is made all or nothing across a crash on every level.
//!
//! A whole atomic write (target offset, length, data, sequence number,
//! checksum) is first written with FUA as a *record* to one journal slot
//! on every live member; only then does the data go through the normal
//! write path (with FUA, so RAID5/6 keep their write hole closed through
//! the partial parity log), and only once that is durable is the slot
//! overwritten with a *retired* marker of the same sequence number.
//! Assembly replays every slot whose newest copy is a valid record, so a
//! cut leaves either no durable record (the array was not yet touched:
//! all old) or one (replayed: all new). The record is on every member,
//! so it survives the loss of any member the level tolerates.
//!
//! Retiring before the write returns means no acknowledged write ever
//! lies over a live record, so a replay can never undo a later write.
//!
//! A member that missed a retirement (it was failed, then came back)
//! keeps a stale record; the superblock's journal floor (the oldest
//! sequence number still in flight when it was written) voids it.

use std::collections::BTreeSet;

use parking_lot::{Condvar, Mutex};

/// The longest atomic write: 256 blocks of 512 bytes, what initiators
/// commonly try.
pub const MAX_ATOMIC_BYTES: u64 = 128 << 10;
/// Slots of a new array's journal: atomic writes in flight at once.
pub const JOURNAL_SLOTS: u32 = 4;
/// A slot's header block, before its data.
pub const HEAD: u64 = 4096;
const MAGIC: &[u8; 8] = b"OAATOMJ1";
const FIELDS: usize = 48;

/// Bytes of one journal slot on a member for writes of up to `max`.
pub fn slot_bytes(max: u64) -> u64 {
    HEAD + max.next_multiple_of(4096)
}

/// What a slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A write whose in-place copy may be incomplete: replay it.
    Record = 1,
    /// The write of this sequence number is durable in place.
    Retired = 2,
}

/// A slot's header: `len` bytes for `offset` follow it (a record), or
/// none (a retired marker).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    pub seq: u64,
    pub kind: Kind,
    pub offset: u64,
    pub len: u32,
    crc: u32,
}

impl Head {
    /// Whether this copy is newer than `other`: a higher sequence number,
    /// or the same one retired.
    pub fn newer_than(&self, other: &Head) -> bool {
        (self.seq, self.kind) > (other.seq, other.kind)
    }

    /// Whether `data` (the `len` bytes after the header) is what was
    /// written with it: a torn record fails this.
    pub fn verify(&self, header: &[u8], data: &[u8]) -> bool {
        data.len() == self.len as usize
            && crc32c::crc32c_append(crc32c::crc32c(&header[..FIELDS]), data) == self.crc
    }
}

/// The bytes of a record of `data` for `offset` (padded to whole 4 KiB),
/// or of a retired marker when `data` is `None`.
pub fn encode(array_id: u128, seq: u64, offset: u64, data: Option<&[u8]>) -> Vec<u8> {
    let len = data.map_or(0, |d| d.len());
    let mut b = Vec::with_capacity(HEAD as usize + len.next_multiple_of(4096));
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&array_id.to_le_bytes());
    b.extend_from_slice(&seq.to_le_bytes());
    let kind = if data.is_some() {
        Kind::Record
    } else {
        Kind::Retired
    };
    b.extend_from_slice(&(kind as u32).to_le_bytes());
    b.extend_from_slice(&offset.to_le_bytes());
    b.extend_from_slice(&(len as u32).to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&b), data.unwrap_or(&[]));
    b.extend_from_slice(&crc.to_le_bytes());
    b.resize(HEAD as usize, 0);
    if let Some(d) = data {
        b.extend_from_slice(d);
        b.resize(HEAD as usize + len.next_multiple_of(4096), 0);
    }
    b
}

/// The header in a slot's first block; `None` for anything but one of
/// this array's (a blank or foreign slot). A record's data must still be
/// checked with [`Head::verify`].
pub fn decode_head(block: &[u8], array_id: u128) -> Option<Head> {
    if block.len() < FIELDS + 4 || &block[..8] != MAGIC {
        return None;
    }
    let u64_at = |at: usize| u64::from_le_bytes(block[at..at + 8].try_into().unwrap());
    let u32_at = |at: usize| u32::from_le_bytes(block[at..at + 4].try_into().unwrap());
    if u128::from_le_bytes(block[8..24].try_into().unwrap()) != array_id {
        return None;
    }
    let kind = match u32_at(32) {
        1 => Kind::Record,
        2 => Kind::Retired,
        _ => return None,
    };
    let head = Head {
        seq: u64_at(24),
        kind,
        offset: u64_at(36),
        len: u32_at(44),
        crc: u32_at(48),
    };
    if kind == Kind::Retired && !head.verify(block, &[]) {
        return None;
    }
    Some(head)
}

struct State {
    free: Vec<u32>,
    next_seq: u64,
    /// Sequence numbers whose record may be live on the members.
    inflight: BTreeSet<u64>,
}

/// The running array's journal: which slots are free, and sequence
/// numbers.
pub struct Journal {
    pub slots: u32,
    pub max_bytes: u64,
    state: Mutex<State>,
    freed: Condvar,
}

impl Journal {
    pub fn new(slots: u32, max_bytes: u64, next_seq: u64) -> Journal {
        Journal {
            slots,
            max_bytes,
            state: Mutex::new(State {
                free: (0..slots).rev().collect(),
                next_seq,
                inflight: BTreeSet::new(),
            }),
            freed: Condvar::new(),
        }
    }

    /// A free slot and a fresh sequence number for a record; waits while
    /// every slot holds a write in flight.
    pub fn take(&self) -> (u32, u64) {
        let mut st = self.state.lock();
        loop {
            if let Some(slot) = st.free.pop() {
                let seq = st.next_seq;
                st.next_seq += 1;
                st.inflight.insert(seq);
                return (slot, seq);
            }
            self.freed.wait(&mut st);
        }
    }

    /// The write of `seq` is retired (or never wrote a record): `slot` is
    /// free again.
    pub fn give_back(&self, slot: u32, seq: u64) {
        let mut st = self.state.lock();
        st.inflight.remove(&seq);
        st.free.push(slot);
        self.freed.notify_one();
    }

    /// A record found live at assembly keeps the floor at or below `seq`
    /// until [`Journal::release`]: a superblock written meanwhile must
    /// not void it before its replay is durable.
    pub fn hold(&self, seq: u64) {
        self.state.lock().inflight.insert(seq);
    }

    pub fn release(&self, seq: u64) {
        self.state.lock().inflight.remove(&seq);
    }

    /// The oldest sequence number whose record may still be live: records
    /// below it are void. Recorded in every superblock written.
    pub fn floor(&self) -> u64 {
        let st = self.state.lock();
        st.inflight.first().copied().unwrap_or(st.next_seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_torn_ones_fail_their_checksum() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
        let b = encode(9, 41, 123_456, Some(&data));
        assert_eq!(b.len(), 4096 + 8192, "padded to whole blocks");
        let head = decode_head(&b, 9).expect("a record");
        assert_eq!(
            (head.seq, head.kind, head.offset, head.len),
            (41, Kind::Record, 123_456, 5000)
        );
        assert!(head.verify(&b, &b[4096..4096 + 5000]));
        assert_eq!(decode_head(&b, 10), None, "another array's");
        let mut torn = b.clone();
        torn[4096 + 4999] ^= 1;
        assert!(!head.verify(&torn, &torn[4096..4096 + 5000]));
        let mut bad_head = b.clone();
        bad_head[40] ^= 1; // the offset
        let h = decode_head(&bad_head, 9).unwrap();
        assert!(!h.verify(&bad_head, &bad_head[4096..4096 + 5000]));
        assert_eq!(decode_head(&[0u8; 4096], 9), None, "a blank slot");
    }

    #[test]
    fn a_retired_marker_outranks_its_record_and_older_ones() {
        let rec = decode_head(&encode(1, 7, 0, Some(&[1; 512])), 1).unwrap();
        let retired = decode_head(&encode(1, 7, 0, None), 1).unwrap();
        assert_eq!(retired.kind, Kind::Retired);
        assert!(retired.newer_than(&rec) && !rec.newer_than(&retired));
        let later = decode_head(&encode(1, 8, 0, Some(&[1; 512])), 1).unwrap();
        assert!(later.newer_than(&retired));
        let mut torn = encode(1, 7, 0, None);
        torn[30] ^= 1;
        assert_eq!(decode_head(&torn, 1), None, "a torn marker is no marker");
    }

    #[test]
    fn slots_wait_and_the_floor_is_the_oldest_in_flight() {
        let j = Journal::new(2, MAX_ATOMIC_BYTES, 10);
        assert_eq!(j.floor(), 10);
        let (a, sa) = j.take();
        let (b, sb) = j.take();
        assert_ne!(a, b);
        assert_eq!((sa, sb), (10, 11));
        assert_eq!(j.floor(), 10);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| j.take());
            std::thread::sleep(std::time::Duration::from_millis(20));
            j.give_back(a, sa);
            let (c, sc) = waiter.join().unwrap();
            assert_eq!((c, sc), (a, 12));
        });
        assert_eq!(j.floor(), 11);
        j.give_back(b, sb);
        assert_eq!(j.floor(), 12);
        j.hold(5);
        assert_eq!(j.floor(), 5, "a record being replayed");
        j.release(5);
        assert_eq!(j.floor(), 12);
    }
}
