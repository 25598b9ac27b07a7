//! The partial parity log that closes the RAID5/6 write hole.
//!
//! A partial-row write changes some data columns and the parity. If the
//! power goes between those writes and a member is then lost, rebuilding
//! the lost member from parity that does not match the data returns
//! wrong bytes, also for columns nobody was writing. So before such a
//! write, an entry goes (with FUA) to the row's parity members holding,
//! per 512-byte sector of the write's window, the set `U` of columns written
//! since the last flush and the *partial parity* of the other columns:
//! `PP = XOR of columns not in U` (and `PQ`, their Q, on RAID6). Those
//! columns do not change until the next flush, so whatever state the cut
//! leaves the written columns and the parity in, the untouched columns
//! can be rebuilt from `PP`/`PQ` alone; assembly replays the entries: it
//! rebuilds any missing untouched column that way and rewrites the
//! parity to match the data.
//!
//! Entries live until a flush: entries are stamped with an epoch; a flush
//! waits for writes of the current epoch, flushes the members, records
//! the epoch as retired in the log header (so replay skips older
//! entries), and only then frees their slots. A newer entry for a page
//! supersedes older ones of its sectors (its `U` includes theirs). A writer that finds
//! no free slot flushes the array itself.
//!
//! This is md's PPL idea, extended to a sector's whole history since the
//! last flush (md logs one write at a time) and to Q for RAID6.

use std::collections::{BTreeMap, HashMap};

use parking_lot::{Condvar, Mutex};

/// The unit entries track: a 512-byte sector, the smallest logical
/// block a LUN has. Bytes of a partly written sector count as written.
pub const SECTOR: u64 = 512;
const MAGIC: &[u8; 8] = b"OAPPL001";
const HEADER_MAGIC: &[u8; 8] = b"OAPPLHDR";

/// Bytes of an entry's header (fields, masks and checksum) for `sectors`
/// sectors, in whole 4 KiB.
pub fn header_bytes(sectors: usize) -> usize {
    (FIELDS + sectors * 8 + 4).next_multiple_of(4096)
}

const FIELDS: usize = 57;

/// One log entry: the partial parity of `masks.len()` sectors of `row`
/// from `first_sector` (in-chunk sector index).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub seq: u64,
    pub epoch: u64,
    pub row: u64,
    pub first_sector: u32,
    /// Per sector, the columns written since the last flush.
    pub masks: Vec<u64>,
    pub pp: Vec<u8>,
    pub pq: Option<Vec<u8>>,
}

impl Entry {
    pub fn encode(&self, array_id: u128) -> Vec<u8> {
        let hl = header_bytes(self.masks.len());
        let mut b = Vec::with_capacity(hl + self.pp.len() * 2);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&array_id.to_le_bytes());
        for v in [self.seq, self.epoch, self.row] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&self.first_sector.to_le_bytes());
        b.extend_from_slice(&(self.masks.len() as u32).to_le_bytes());
        b.push(self.pq.is_some() as u8);
        for m in &self.masks {
            b.extend_from_slice(&m.to_le_bytes());
        }
        b.resize(hl, 0);
        b.extend_from_slice(&self.pp);
        if let Some(pq) = &self.pq {
            b.extend_from_slice(pq);
        }
        let crc = crc32c::crc32c_append(crc32c::crc32c(&b[..hl - 4]), &b[hl..]);
        b[hl - 4..hl].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// `None` for anything but a whole entry of this array.
    pub fn decode(slot: &[u8], array_id: u128) -> Option<Entry> {
        if slot.len() < FIELDS || &slot[..8] != MAGIC {
            return None;
        }
        let u64_at = |at: usize| u64::from_le_bytes(slot[at..at + 8].try_into().unwrap());
        let u32_at = |at: usize| u32::from_le_bytes(slot[at..at + 4].try_into().unwrap());
        if u128::from_le_bytes(slot[8..24].try_into().unwrap()) != array_id {
            return None;
        }
        let (seq, epoch, row) = (u64_at(24), u64_at(32), u64_at(40));
        let (first_sector, sectors) = (u32_at(48), u32_at(52) as usize);
        let has_q = slot[56] != 0;
        let hl = header_bytes(sectors);
        let plen = sectors * SECTOR as usize;
        let payload = plen * if has_q { 2 } else { 1 };
        if slot.len() < hl + payload {
            return None;
        }
        let crc = crc32c::crc32c_append(crc32c::crc32c(&slot[..hl - 4]), &slot[hl..hl + payload]);
        if crc != u32_at(hl - 4) {
            return None;
        }
        let masks = (0..sectors).map(|i| u64_at(FIELDS + i * 8)).collect();
        Some(Entry {
            seq,
            epoch,
            row,
            first_sector,
            masks,
            pp: slot[hl..hl + plen].to_vec(),
            pq: has_q.then(|| slot[hl + plen..hl + 2 * plen].to_vec()),
        })
    }
}

/// The log header: entries of epochs up to `retired` are void. Kept
/// twice in its block, written one copy after the other, so a torn write
/// leaves the other.
pub fn encode_header(array_id: u128, retired: u64) -> Vec<u8> {
    let mut copy = Vec::with_capacity(2048);
    copy.extend_from_slice(HEADER_MAGIC);
    copy.extend_from_slice(&array_id.to_le_bytes());
    copy.extend_from_slice(&retired.to_le_bytes());
    let crc = crc32c::crc32c(&copy);
    copy.extend_from_slice(&crc.to_le_bytes());
    copy.resize(2048, 0);
    copy
}

pub fn decode_header(block: &[u8], array_id: u128) -> Option<u64> {
    block
        .chunks(2048)
        .filter_map(|c| {
            if c.len() < 36 || &c[..8] != HEADER_MAGIC {
                return None;
            }
            let crc = u32::from_le_bytes(c[32..36].try_into().unwrap());
            let id = u128::from_le_bytes(c[8..24].try_into().unwrap());
            (crc == crc32c::crc32c(&c[..32]) && id == array_id)
                .then(|| u64::from_le_bytes(c[24..32].try_into().unwrap()))
        })
        .max()
}

/// The newest write of a sector since the last flush: the columns
/// written, and the slot of its entry unless it needed none.
#[derive(Clone, Copy)]
struct Live {
    mask: u64,
    slot: Option<u32>,
    epoch: u64,
    seq: u64,
}

struct State {
    epoch: u64,
    seq: u64,
    inflight: BTreeMap<u64, usize>,
    free: Vec<u32>,
    /// Live sectors per slot.
    refs: Vec<u32>,
    live: HashMap<(u64, u32), Live>,
}

/// A write's place in the log: its epoch, and a slot for its entry
/// unless it needs none.
pub struct Reservation {
    pub slot: Option<u32>,
    pub epoch: u64,
    pub seq: u64,
}

pub struct Log {
    pub slots: u32,
    state: Mutex<State>,
    drained: Condvar,
    /// One flush at a time walks the epochs.
    pub flush_lock: Mutex<()>,
}

impl Log {
    /// A log whose entries up to epoch `retired` are void.
    pub fn new(slots: u32, retired: u64, seq: u64) -> Log {
        Log {
            slots,
            state: Mutex::new(State {
                epoch: retired + 1,
                seq,
                inflight: BTreeMap::new(),
                free: (0..slots).rev().collect(),
                refs: vec![0; slots as usize],
                live: HashMap::new(),
            }),
            drained: Condvar::new(),
            flush_lock: Mutex::new(()),
        }
    }

    /// Columns written since the last flush, per sector.
    pub fn live_masks(&self, row: u64, first_sector: u32, sectors: u32) -> Vec<u64> {
        let st = self.state.lock();
        (first_sector..first_sector + sectors)
            .map(|p| st.live.get(&(row, p)).map_or(0, |l| l.mask))
            .collect()
    }

    /// Whether a sector of the window has an entry on the members that
    /// no flush has retired, even one a FUA write has since made stable:
    /// replay would take it for the sector's newest, so a later write of
    /// the sector must log an entry of its own to supersede it.
    pub fn has_entry(&self, row: u64, first_sector: u32, sectors: u32) -> bool {
        let st = self.state.lock();
        (first_sector..first_sector + sectors)
            .any(|p| st.live.get(&(row, p)).is_some_and(|l| l.slot.is_some()))
    }

    pub fn has_live(&self, row: u64, first_page: u32, pages: u32) -> bool {
        self.live_masks(row, first_page, pages)
            .iter()
            .any(|m| *m != 0)
    }

    /// A place in the current epoch, with a slot if `entry`; `None` when
    /// no slot is free: flush first.
    pub fn reserve(&self, entry: bool) -> Option<Reservation> {
        let mut st = self.state.lock();
        let slot = if entry { Some(st.free.pop()?) } else { None };
        st.seq += 1;
        let epoch = st.epoch;
        *st.inflight.entry(epoch).or_default() += 1;
        Some(Reservation {
            slot,
            epoch,
            seq: st.seq,
        })
    }

    /// The entry is stable (or the write needs none): it supersedes
    /// older ones of its sectors.
    pub fn committed(&self, r: &Reservation, row: u64, first_sector: u32, masks: &[u64]) {
        let mut st = self.state.lock();
        for (i, mask) in masks.iter().enumerate() {
            let key = (row, first_sector + i as u32);
            let live = Live {
                mask: *mask,
                slot: r.slot,
                epoch: r.epoch,
                seq: r.seq,
            };
            if let Some(old) = st.live.insert(key, live) {
                Self::unref(&mut st, old.slot);
            }
            if let Some(slot) = r.slot {
                st.refs[slot as usize] += 1;
            }
        }
    }

    fn unref(st: &mut State, slot: Option<u32>) {
        let Some(slot) = slot else { return };
        let refs = &mut st.refs[slot as usize];
        *refs -= 1;
        if *refs == 0 {
            st.free.push(slot);
        }
    }

    /// A FUA write has ended: its sectors are stable, and no longer count
    /// as written for later entries (unless a later write took them).
    /// Its entry keeps its slot until a flush retires it or a newer one
    /// supersedes it: were the slot reused, replay would take an older
    /// entry of these sectors for the newest.
    pub fn forget(&self, r: &Reservation, row: u64, first_sector: u32, sectors: u32) {
        let mut st = self.state.lock();
        for s in first_sector..first_sector + sectors {
            if let Some(l) = st.live.get_mut(&(row, s)).filter(|l| l.seq == r.seq) {
                l.mask = 0;
            }
        }
    }

    /// The write the reservation was for has ended (or never started:
    /// `used` false frees the slot at once).
    pub fn finished(&self, r: &Reservation, used: bool) {
        let mut st = self.state.lock();
        if let (false, Some(slot)) = (used, r.slot) {
            if st.refs[slot as usize] == 0 {
                st.free.push(slot);
            }
        }
        let n = st.inflight.get_mut(&r.epoch).expect("reserved");
        *n -= 1;
        if *n == 0 {
            st.inflight.remove(&r.epoch);
            self.drained.notify_all();
        }
    }

    /// Starts a flush: later entries get a new epoch; returns the old one
    /// once no write of it (or before) is still in flight.
    pub fn begin_flush(&self) -> u64 {
        let mut st = self.state.lock();
        let old = st.epoch;
        st.epoch += 1;
        while st.inflight.range(..=old).next().is_some() {
            self.drained.wait(&mut st);
        }
        old
    }

    /// Whether any entry of epoch `upto` or before is live.
    pub fn any_live_through(&self, upto: u64) -> bool {
        let st = self.state.lock();
        st.live.values().any(|l| l.epoch <= upto)
    }

    /// After the header retiring `upto` is stable: their slots are free.
    pub fn retire(&self, upto: u64) {
        let mut st = self.state.lock();
        let gone: Vec<(u64, u32)> = st
            .live
            .iter()
            .filter(|(_, l)| l.epoch <= upto)
            .map(|(k, _)| *k)
            .collect();
        for k in gone {
            let l = st.live.remove(&k).expect("listed");
            Self::unref(&mut st, l.slot);
        }
    }

    pub fn live_sectors(&self) -> usize {
        self.state.lock().live.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_torn_ones_are_void() {
        let e = Entry {
            seq: 9,
            epoch: 3,
            row: 77,
            first_sector: 2,
            masks: vec![0b101, 0b1],
            pp: vec![7; 1024],
            pq: Some(vec![9; 1024]),
        };
        let mut b = e.encode(5);
        assert_eq!(Entry::decode(&b, 5), Some(e.clone()));
        assert_eq!(Entry::decode(&b, 6), None);
        b[4096 + 1024 + 100] ^= 1; // a torn payload
        assert_eq!(Entry::decode(&b, 5), None);
    }

    #[test]
    fn header_survives_one_torn_copy() {
        let mut h = encode_header(1, 41);
        h.extend(encode_header(1, 42));
        assert_eq!(decode_header(&h, 1), Some(42));
        h[2048 + 30] ^= 1;
        assert_eq!(decode_header(&h, 1), Some(41));
        assert_eq!(decode_header(&h, 2), None);
    }

    #[test]
    fn slots_come_back_when_superseded_or_retired() {
        let log = Log::new(2, 0, 0);
        let a = log.reserve(true).unwrap();
        log.committed(&a, 5, 0, &[1, 1]);
        log.finished(&a, true);
        let b = log.reserve(true).unwrap();
        assert!(log.reserve(true).is_none(), "two slots only");
        let unlogged = log.reserve(false).unwrap();
        log.committed(&unlogged, 6, 0, &[7]);
        log.finished(&unlogged, true);
        // b covers both sectors of a: a's slot is free again.
        log.committed(&b, 5, 0, &[3, 3]);
        log.finished(&b, true);
        assert_eq!(log.live_masks(5, 0, 3), [3, 3, 0]);
        let c = log.reserve(true).unwrap();
        assert_eq!(c.slot, a.slot);
        log.finished(&c, false);
        let old = log.begin_flush();
        assert!(log.any_live_through(old));
        log.retire(old);
        assert_eq!(log.live_sectors(), 0);
        assert!(log.reserve(true).is_some() && log.reserve(true).is_some());
    }
}
