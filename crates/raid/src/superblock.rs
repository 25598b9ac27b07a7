//! The member superblock: the first 4 KiB of every member (and spare).
//!
//! It says which array the member belongs to (a random id), the geometry,
//! the member's slot, and an event counter bumped on every change of the
//! membership, so that assembly can put members in order whatever order
//! they are given in, and refuse one that belongs elsewhere or missed
//! events (it was failed or absent while the others went on).
//!
//! Member layout: superblock at 0, write-intent bitmap from 4 KiB, the
//! partial parity log (parity levels) from [`LOG_OFFSET`], the atomic
//! write journal after it, data from [`data_offset`].
//!
//! Version 2 added the journal (its slots, their size, and the floor of
//! live sequence numbers). A version 1 superblock reads as an array with
//! no journal (same layout as before, no atomic writes).
//! Version 3 added the time the last scrub ended; an array never scrubbed
//! does not need it. Version 4 added the member's own id and the roster:
//! the id of the device that owns each slot. A device whose id no longer
//! owns its slot was superseded (a spare was rebuilt into it) and holds
//! nothing the array can trust, whatever its events say. Every array
//! writes version 4 from its first change on.

use std::io;

use block::BlockDevice;

use crate::geometry::{Geometry, Level};
use crate::journal::{slot_bytes, JOURNAL_SLOTS, MAX_ATOMIC_BYTES};

pub const SUPERBLOCK_SIZE: usize = 4096;
pub const BITMAP_OFFSET: u64 = 4096;
/// Room for the superblock and a bitmap of up to ~8 million regions.
pub const LOG_OFFSET: u64 = 1 << 20;

/// Bytes of one partial parity log slot: a header for a chunk's sectors,
/// then partial P and partial Q for up to a chunk.
pub fn log_slot_bytes(chunk: u64) -> u64 {
    crate::log::header_bytes((chunk / crate::log::SECTOR) as usize) as u64 + 2 * chunk
}

/// Where member data starts on a new array (it has the journal).
pub fn data_offset(chunk: u64, log_slots: u32) -> u64 {
    layout(chunk, log_slots, JOURNAL_SLOTS, MAX_ATOMIC_BYTES).1
}

/// Where the atomic write journal starts and where member data starts:
/// after the log's header block and slots, then the journal's slots,
/// rounded up to a MiB.
pub fn layout(chunk: u64, log_slots: u32, journal_slots: u32, journal_max: u64) -> (u64, u64) {
    let journal = if log_slots == 0 {
        LOG_OFFSET
    } else {
        LOG_OFFSET + 4096 + log_slots as u64 * log_slot_bytes(chunk)
    };
    let end = journal + journal_slots as u64 * slot_bytes(journal_max);
    let data = if end == LOG_OFFSET {
        LOG_OFFSET
    } else {
        end.next_multiple_of(1 << 20)
    };
    (journal, data)
}
const MAGIC: &[u8; 8] = b"OARAID01";
/// Version 2 added the journal; version 3 the last scrub's time; version
/// 4 the member ids and the roster.
const VERSION: u32 = 4;
/// The most members whose roster fits the superblock's 4 KiB.
pub const MAX_MEMBERS: usize = 200;

/// Bits of the flags word after `recovering` (bit 0).
const FLAG_REPLACEMENT: u32 = 1;
const FLAG_RELEASED: u32 = 2;

/// The slot of a hot spare.
pub const SPARE_SLOT: u32 = u32::MAX;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub array_id: u128,
    pub level: Level,
    pub members: u32,
    pub chunk: u64,
    pub rows: u64,
    /// Chunk rows per write-intent bitmap bit.
    pub region_rows: u64,
    /// Which member this is, or [`SPARE_SLOT`].
    pub slot: u32,
    /// Set while the member is being rebuilt: its data is not yet whole.
    pub recovering: bool,
    /// A member being copied beside the in-sync member of `slot`, to take
    /// its place when complete (`raid replace`); recovering too.
    pub replacement: bool,
    /// A member that a completed replacement took the place of: never
    /// assembled again.
    pub released: bool,
    pub events: u64,
    /// The events value when the bitmap last began keeping its bits for
    /// an absent member: a member last in sync at or after it can catch
    /// up from the bitmap alone.
    pub keep_since: u64,
    /// Slots of the partial parity log (0: none).
    pub log_slots: u32,
    /// Slots of the atomic write journal (0: none, a version 1 array).
    pub journal_slots: u32,
    /// Bytes of the longest atomic write a journal slot holds.
    pub journal_max: u64,
    /// Journal records with a lower sequence number are void.
    pub journal_floor: u64,
    /// When the last scrub ended, milliseconds since the Unix epoch (0:
    /// none recorded), so that `scrub_every` counts across restarts.
    pub last_scrub: u64,
    /// This device's id in the array (0: a superblock from before ids).
    pub member_id: u128,
    /// The id of the device owning each slot when this was written (0:
    /// none known); empty in a superblock from before ids.
    pub roster: Vec<u128>,
}

impl Superblock {
    pub fn geometry(&self) -> Geometry {
        Geometry {
            level: self.level,
            members: self.members as usize,
            chunk: self.chunk,
            rows: self.rows,
        }
    }

    pub fn data_offset(&self) -> u64 {
        self.layout().1
    }

    /// Where the journal and the data start on this array's members.
    pub fn layout(&self) -> (u64, u64) {
        layout(
            self.chunk,
            self.log_slots,
            self.journal_slots,
            self.journal_max,
        )
    }

    pub fn is_spare(&self) -> bool {
        self.slot == SPARE_SLOT
    }

    /// Whether this member's device still owns its slot by `roster` (the
    /// newest one the array has). Unknown ids (superblocks from before
    /// them) own their slot.
    pub fn owns_slot(&self, roster: &[u128]) -> bool {
        match roster.get(self.slot as usize) {
            Some(&owner) if owner != 0 && self.member_id != 0 => owner == self.member_id,
            _ => true,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(SUPERBLOCK_SIZE);
        let version: u32 = if self.member_id != 0 {
            VERSION
        } else if self.last_scrub > 0 {
            3
        } else if self.journal_slots > 0 {
            2
        } else {
            1
        };
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&version.to_le_bytes());
        b.extend_from_slice(&self.array_id.to_le_bytes());
        b.extend_from_slice(&self.level.number().to_le_bytes());
        b.extend_from_slice(&self.members.to_le_bytes());
        b.extend_from_slice(&self.chunk.to_le_bytes());
        b.extend_from_slice(&self.rows.to_le_bytes());
        b.extend_from_slice(&self.region_rows.to_le_bytes());
        b.extend_from_slice(&self.slot.to_le_bytes());
        let flags = self.recovering as u32
            | (self.replacement as u32) << FLAG_REPLACEMENT
            | (self.released as u32) << FLAG_RELEASED;
        b.extend_from_slice(&flags.to_le_bytes());
        b.extend_from_slice(&self.events.to_le_bytes());
        b.extend_from_slice(&self.keep_since.to_le_bytes());
        b.extend_from_slice(&self.log_slots.to_le_bytes());
        if version >= 2 {
            b.extend_from_slice(&self.journal_slots.to_le_bytes());
            b.extend_from_slice(&self.journal_max.to_le_bytes());
            b.extend_from_slice(&self.journal_floor.to_le_bytes());
        }
        if version >= 3 {
            b.extend_from_slice(&self.last_scrub.to_le_bytes());
        }
        if version >= 4 {
            b.extend_from_slice(&self.member_id.to_le_bytes());
            for slot in 0..self.members as usize {
                let id = self.roster.get(slot).copied().unwrap_or(0);
                b.extend_from_slice(&id.to_le_bytes());
            }
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b.resize(SUPERBLOCK_SIZE, 0);
        b
    }

    /// `None` when the block holds no superblock of ours at all.
    pub fn decode(b: &[u8]) -> Result<Option<Superblock>, String> {
        if b.len() < 128 || &b[..8] != MAGIC {
            return Ok(None);
        }
        let mut at = 8;
        let mut take = |n: usize| {
            let s = &b[at..at + n];
            at += n;
            s
        };
        let u32_of = |s: &[u8]| u32::from_le_bytes(s.try_into().unwrap());
        let u64_of = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap());
        let version = u32_of(take(4));
        let array_id = u128::from_le_bytes(take(16).try_into().unwrap());
        let level = u32_of(take(4));
        let members = u32_of(take(4));
        let chunk = u64_of(take(8));
        let rows = u64_of(take(8));
        let region_rows = u64_of(take(8));
        let slot = u32_of(take(4));
        let flags = u32_of(take(4));
        let events = u64_of(take(8));
        let keep_since = u64_of(take(8));
        let log_slots = u32_of(take(4));
        if version == 0 || version > VERSION {
            return Err(format!(
                "superblock version {version} is not supported (this build reads 1 to {VERSION})"
            ));
        }
        let (journal_slots, journal_max, journal_floor) = if version >= 2 {
            (u32_of(take(4)), u64_of(take(8)), u64_of(take(8)))
        } else {
            (0, 0, 0)
        };
        let last_scrub = if version >= 3 { u64_of(take(8)) } else { 0 };
        let (member_id, roster) = if version >= 4 {
            if members as usize > MAX_MEMBERS {
                return Err(format!(
                    "superblock names {members} members (at most {MAX_MEMBERS})"
                ));
            }
            if b.len() < 136 + 16 * members as usize {
                return Err("superblock is cut short".into());
            }
            let id = u128::from_le_bytes(take(16).try_into().unwrap());
            let roster = (0..members)
                .map(|_| u128::from_le_bytes(take(16).try_into().unwrap()))
                .collect();
            (id, roster)
        } else {
            (0, Vec::new())
        };
        let end = at;
        let crc = u32_of(&b[end..end + 4]);
        if crc != crc32c::crc32c(&b[..end]) {
            return Err("superblock checksum mismatch".into());
        }
        if journal_slots > 0 && (journal_max == 0 || journal_max > 1 << 30) {
            return Err(format!(
                "superblock names an atomic journal of {journal_max}-byte slots"
            ));
        }
        let level = Level::from_number(level).ok_or(format!("unknown RAID level {level}"))?;
        if chunk == 0 || region_rows == 0 || members == 0 {
            return Err("superblock has a zero chunk, region or member count".into());
        }
        Ok(Some(Superblock {
            array_id,
            level,
            members,
            chunk,
            rows,
            region_rows,
            slot,
            recovering: flags & 1 != 0,
            replacement: flags & (1 << FLAG_REPLACEMENT) != 0,
            released: flags & (1 << FLAG_RELEASED) != 0,
            events,
            keep_since,
            log_slots,
            journal_slots,
            journal_max,
            journal_floor,
            last_scrub,
            member_id,
            roster,
        }))
    }

    pub fn read_from(dev: &dyn BlockDevice) -> io::Result<Result<Option<Superblock>, String>> {
        if dev.size() < LOG_OFFSET {
            return Ok(Err("device is smaller than the RAID metadata area".into()));
        }
        let mut b = vec![0u8; SUPERBLOCK_SIZE];
        dev.read_at(&mut b, 0)?;
        Ok(Superblock::decode(&b))
    }

    /// Written with FUA: membership changes must be stable before the
    /// I/O that depends on them.
    pub fn write_to(&self, dev: &dyn BlockDevice) -> io::Result<()> {
        dev.write_at(&self.encode(), 0, true)
    }
}

#[cfg(test)]
impl Superblock {
    /// A member's superblock in tests: an in-sync member of array 1 (4 KiB
    /// chunks, 16 rows, one row a region), no log, journal or scrub yet.
    pub(crate) fn plain(level: Level, members: u32, slot: u32, events: u64) -> Superblock {
        Superblock {
            array_id: 1,
            level,
            members,
            chunk: 4096,
            rows: 16,
            region_rows: 1,
            slot,
            recovering: false,
            replacement: false,
            released: false,
            events,
            keep_since: 0,
            log_slots: 0,
            journal_slots: 0,
            journal_max: 0,
            journal_floor: 0,
            last_scrub: 0,
            member_id: 0,
            roster: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_detects_damage() {
        let sb = Superblock {
            array_id: 0x1234_5678_9abc_def0_1122_3344_5566_7788,
            level: Level::Raid6,
            members: 5,
            chunk: 65536,
            rows: 1000,
            region_rows: 16,
            slot: 3,
            recovering: true,
            replacement: true,
            released: false,
            events: 42,
            keep_since: 40,
            log_slots: 64,
            journal_slots: 4,
            journal_max: 128 << 10,
            journal_floor: 17,
            last_scrub: 1_795_000_000_000,
            member_id: 0xfeed,
            roster: vec![1, 2, 0, 0xfeed, 5],
        };
        let mut b = sb.encode();
        assert_eq!(b.len(), SUPERBLOCK_SIZE);
        assert_eq!(Superblock::decode(&b), Ok(Some(sb.clone())));
        let released = Superblock {
            recovering: false,
            replacement: false,
            released: true,
            ..sb.clone()
        };
        assert_eq!(
            Superblock::decode(&released.encode()),
            Ok(Some(released.clone()))
        );
        // A version 1 superblock, as written before the journal and the
        // last scrub time: the same fields up to the log slots, the CRC.
        let mut v1 = released.encode()[..88].to_vec();
        v1[8..12].copy_from_slice(&1u32.to_le_bytes());
        let crc = crc32c::crc32c(&v1);
        v1.extend_from_slice(&crc.to_le_bytes());
        v1.resize(SUPERBLOCK_SIZE, 0);
        let old = Superblock {
            last_scrub: 0,
            journal_slots: 0,
            journal_max: 0,
            journal_floor: 0,
            member_id: 0,
            roster: Vec::new(),
            ..released
        };
        assert_eq!(Superblock::decode(&v1), Ok(Some(old)));
        // Never scrubbed and no journal: still version 1.
        let plain = Superblock {
            last_scrub: 0,
            journal_slots: 0,
            member_id: 0,
            ..sb.clone()
        };
        assert_eq!(
            u32::from_le_bytes(plain.encode()[8..12].try_into().unwrap()),
            1
        );
        b[20] ^= 1;
        assert!(Superblock::decode(&b).is_err());
        assert_eq!(Superblock::decode(&[0u8; 4096]), Ok(None));
    }

    #[test]
    fn a_member_owns_its_slot_only_while_the_roster_names_it() {
        let sb = Superblock {
            member_id: 7,
            ..Superblock::plain(Level::Raid1, 2, 0, 3)
        };
        assert!(sb.owns_slot(&[7, 9]));
        assert!(!sb.owns_slot(&[8, 9]), "a spare was rebuilt into slot 0");
        assert!(sb.owns_slot(&[]), "a roster from before ids");
        assert!(sb.owns_slot(&[0, 9]), "no owner known");
        let old = Superblock {
            member_id: 0,
            ..sb.clone()
        };
        assert!(old.owns_slot(&[8, 9]), "an id from before ids");
        // A roster longer than the 4 KiB block can hold is refused, not
        // read past the end.
        let mut big = Superblock {
            members: 2,
            roster: vec![1, 2],
            ..sb
        }
        .encode();
        big[32..36].copy_from_slice(&300u32.to_le_bytes());
        assert!(Superblock::decode(&big)
            .unwrap_err()
            .contains("300 members"));
        let mut short = big.clone();
        short[32..36].copy_from_slice(&200u32.to_le_bytes());
        assert!(Superblock::decode(&short[..1000])
            .unwrap_err()
            .contains("cut short"));
    }

    #[test]
    fn a_version_1_superblock_reads_as_an_array_without_a_journal() {
        let old = Superblock {
            array_id: 7,
            chunk: 65536,
            rows: 100,
            region_rows: 4,
            ..Superblock::plain(Level::Raid1, 2, 1, 3)
        };
        let b = old.encode();
        assert_eq!(u32::from_le_bytes(b[8..12].try_into().unwrap()), 1);
        let back = Superblock::decode(&b).unwrap().unwrap();
        assert_eq!(back, old);
        assert_eq!(back.data_offset(), LOG_OFFSET, "the layout of before");
        let mut future = b.clone();
        future[8] = 9;
        let e = Superblock::decode(&future).unwrap_err();
        assert!(e.contains("version 9 is not supported"), "{e}");
    }

    #[test]
    fn the_journal_lies_between_the_log_and_the_data() {
        let (j, d) = layout(4096, 0, 4, 128 << 10);
        assert_eq!(j, LOG_OFFSET);
        assert_eq!(d, 2 << 20);
        let (j, d) = layout(65536, 64, 4, 128 << 10);
        assert_eq!(j, LOG_OFFSET + 4096 + 64 * log_slot_bytes(65536));
        assert!(d >= j + 4 * slot_bytes(128 << 10) && d.is_multiple_of(1 << 20));
        assert_eq!(
            layout(65536, 64, 0, 0).1,
            (LOG_OFFSET + 4096 + 64 * log_slot_bytes(65536)).next_multiple_of(1 << 20)
        );
    }
}
