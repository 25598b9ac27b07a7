//! Model-based test of every level: random writes, flushes, member
//! failures, re-adds, rebuilds onto new members and power cuts, checked
//! against an in-memory model of what the array must return.
//!
//! The model holds, per byte, the last value written and whether a flush
//! (or FUA) has made it stable. Without a power cut every read must
//! return the last values exactly; after one, every stable byte must, and
//! the rest may hold any value (the model then adopts what the array
//! returns, which must stay put from then on).
//!
//! A power cut lets a random subset of the members' caches reach their
//! media first, so the data and parity of a row can be cut apart; on a
//! degraded RAID5/6 that is the write hole, which the partial parity log
//! closes (see `docs/raid.md`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use block::{BlockDevice, FaultyDevice};
use common::*;
use proptest::prelude::*;
use raid::{Level, RaidArray};

const ROWS: u64 = 12;

#[derive(Clone, Debug)]
enum Op {
    Write {
        at: u64,
        len: u64,
        seed: u64,
        fua: bool,
    },
    Read {
        at: u64,
        len: u64,
    },
    Flush,
    /// A discard (or with `zeroes`, a zeroing) of a range: zeros after.
    Discard {
        at: u64,
        len: u64,
        zeroes: bool,
    },
    /// The member in this slot starts failing all I/O.
    Fail(usize),
    /// A failed member is healed and re-added (bitmap catch-up).
    ReAdd(usize),
    /// A new device replaces the first failed member (full rebuild).
    Rebuild,
    /// A device a rebuild superseded comes back healed: re-adding it is
    /// refused, whatever its events; added, it is a spare that fills the
    /// first failed slot with a full rebuild.
    ReturnSuperseded(usize),
    /// Power cut: some members' caches reach their media (by the seed's
    /// bits), the others lose their unflushed writes; the array is
    /// reassembled from its live members in a shuffled order.
    Crash(u64),
}

fn op() -> impl Strategy<Value = Op> {
    // Positions and lengths are fractions of the array, scaled later.
    prop_oneof![
        6 => (0..10_000u64, 1..3000u64, any::<u64>(), prop::bool::weighted(0.2))
            .prop_map(|(at, len, seed, fua)| Op::Write { at, len, seed, fua }),
        2 => (0..10_000u64, 1..5000u64).prop_map(|(at, len)| Op::Read { at, len }),
        2 => Just(Op::Flush),
        1 => (0..10_000u64, 1..6000u64, any::<bool>())
            .prop_map(|(at, len, zeroes)| Op::Discard { at, len, zeroes }),
        1 => (0..8usize).prop_map(Op::Fail),
        1 => (0..8usize).prop_map(Op::ReAdd),
        1 => Just(Op::Rebuild),
        1 => (0..8usize).prop_map(Op::ReturnSuperseded),
        1 => any::<u64>().prop_map(Op::Crash),
    ]
}

struct Model {
    value: Vec<u8>,
    stable: Vec<bool>,
}

struct Harness {
    level: Level,
    array: Option<RaidArray>,
    /// The device in each slot, and whether the harness made it fail.
    slots: Vec<(Arc<FaultyDevice>, bool)>,
    /// Devices a rebuild superseded, with what they held then.
    superseded: Vec<Arc<FaultyDevice>>,
    model: Model,
    size: u64,
}

fn geometry_survives(level: Level, failed: &[bool]) -> bool {
    raid::Geometry {
        level,
        members: failed.len(),
        chunk: CHUNK,
        rows: ROWS,
    }
    .survives(failed)
}

impl Harness {
    fn new(level: Level) -> Harness {
        let (array, members, _) = array(level, members_for(level), 0, ROWS);
        let size = array.size();
        Harness {
            level,
            array: Some(array),
            slots: members.into_iter().map(|m| (m, false)).collect(),
            superseded: Vec::new(),
            model: Model {
                value: vec![0; size as usize],
                stable: vec![true; size as usize],
            },
            size,
        }
    }

    fn array(&self) -> &RaidArray {
        self.array.as_ref().unwrap()
    }

    fn failed(&self) -> Vec<bool> {
        self.slots.iter().map(|s| s.1).collect()
    }

    /// Tells the array about every failure the harness injected that its
    /// I/O has not met yet.
    fn sync_failures(&self) {
        let status = self.array().status();
        for (slot, s) in self.slots.iter().enumerate() {
            if s.1 && status.members[slot].state != raid::MemberState::Missing {
                self.array().fail(slot).unwrap();
            }
        }
    }

    fn settle(&self) {
        assert!(
            self.array().wait_idle(Duration::from_secs(30)),
            "sync did not end"
        );
    }

    fn check(&self, at: u64, len: u64) {
        let mut got = vec![0u8; len as usize];
        self.array().read_at(&mut got, at).unwrap();
        let want = &self.model.value[at as usize..(at + len) as usize];
        if got != want {
            let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
            panic!(
                "{:?}: byte {} reads {} instead of {}",
                self.level,
                at + first as u64,
                got[first],
                want[first]
            );
        }
    }

    fn apply(&mut self, op: Op) {
        if std::env::var("RAID_TRACE").is_ok() {
            let st = self.array().status();
            let states: Vec<String> = st
                .members
                .iter()
                .map(|m| format!("{:?}", m.state))
                .collect();
            TRACE.with(|t| {
                t.borrow_mut().push(format!(
                    "{:?} {:?} harness {:?} -> {op:?}",
                    st.state,
                    states,
                    self.failed()
                ))
            });
        }
        let size = self.size;
        match op {
            Op::Write { at, len, seed, fua } => {
                // Whole sectors, as a LUN writes them.
                let at = at * size / 10_000 / 512 * 512;
                let len = (len / 512 + 1) * 512;
                let len = len.min(size - at);
                if len == 0 {
                    return;
                }
                let data = pattern(len as usize, seed);
                self.array().write_at(&data, at, fua).unwrap();
                let r = at as usize..(at + len) as usize;
                self.model.value[r.clone()].copy_from_slice(&data);
                self.model.stable[r].fill(fua);
            }
            Op::Read { at, len } => {
                let at = at * size / 10_000;
                self.check(at, len.min(size - at));
            }
            Op::Discard { at, len, zeroes } => {
                let at = at * size / 10_000 / 512 * 512;
                let len = ((len * size / 10_000) / 512 * 512).min(size - at);
                if zeroes {
                    self.array().write_zeroes(at, len).unwrap();
                } else {
                    self.array().discard(at, len).unwrap();
                }
                let r = at as usize..(at + len) as usize;
                self.model.value[r.clone()].fill(0);
                self.model.stable[r].fill(false);
            }
            Op::Flush => {
                self.array().flush().unwrap();
                self.model.stable.fill(true);
            }
            Op::Fail(slot) => {
                let slot = slot % self.slots.len();
                let mut failed = self.failed();
                failed[slot] = true;
                if self.slots[slot].1 || !geometry_survives(self.level, &failed) {
                    return;
                }
                self.slots[slot].0.set_fail_reads(true);
                self.slots[slot].0.set_fail_writes(true);
                self.slots[slot].1 = true;
            }
            Op::ReAdd(slot) => {
                let slot = slot % self.slots.len();
                if !self.slots[slot].1 {
                    return;
                }
                self.sync_failures();
                let dev = self.slots[slot].0.clone();
                dev.heal();
                self.array().re_add(dev).unwrap();
                self.slots[slot].1 = false;
                self.settle();
            }
            Op::Rebuild => {
                let Some(slot) = self.slots.iter().position(|s| s.1) else {
                    return;
                };
                self.sync_failures();
                let dev = faulty(member_size(ROWS));
                self.array().add(dev.clone()).unwrap();
                let old = std::mem::replace(&mut self.slots[slot], (dev, false));
                self.superseded.push(old.0);
                self.settle();
            }
            Op::ReturnSuperseded(i) => {
                if self.superseded.is_empty() {
                    return;
                }
                self.sync_failures();
                let dev = self.superseded.remove(i % self.superseded.len());
                dev.heal();
                let err = self.array().re_add(dev.clone()).err();
                assert!(
                    matches!(err, Some(raid::AssembleError::Superseded(..))),
                    "{:?}: a superseded device re-added: {err:?}",
                    self.level
                );
                if self.level == Level::Raid0 {
                    return;
                }
                if let Some(slot) = self.slots.iter().position(|s| s.1) {
                    self.array().add(dev.clone()).unwrap();
                    self.slots[slot] = (dev, false);
                    self.settle();
                }
            }
            Op::Crash(seed) => {
                self.sync_failures();
                self.array = None;
                for (i, (dev, failed)) in self.slots.iter().enumerate() {
                    if !failed && seed >> (32 + i) & 1 == 1 {
                        dev.flush().unwrap();
                    }
                    dev.drop_unflushed();
                }
                let mut live: Vec<Arc<dyn BlockDevice>> = self
                    .slots
                    .iter()
                    .filter(|s| !s.1)
                    .map(|s| s.0.clone() as Arc<dyn BlockDevice>)
                    .collect();
                let n = live.len();
                for i in (1..n).rev() {
                    live.swap(i, (seed as usize ^ (i * 7919)) % (i + 1));
                }
                self.array = Some(RaidArray::assemble(live, options()).unwrap());
                self.settle();
                let mut got = vec![0u8; size as usize];
                self.array().read_at(&mut got, 0).unwrap();
                for (i, (g, want)) in got.iter().zip(&self.model.value).enumerate() {
                    if self.model.stable[i] && g != want {
                        panic!(
                            "{:?}: after a power cut byte {i} reads {g} instead of {want}",
                            self.level
                        );
                    }
                }
                self.model.value = got;
                self.model.stable.fill(true);
            }
        }
    }
}

thread_local! {
    static TRACE: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

struct DumpOnPanic;

impl Drop for DumpOnPanic {
    fn drop(&mut self) {
        let t = TRACE.with(|t| std::mem::take(&mut *t.borrow_mut()));
        if std::thread::panicking() && !t.is_empty() && std::env::var("RAID_TRACE_OUT").is_ok() {
            let path = std::env::var("RAID_TRACE_OUT").unwrap();
            if !std::path::Path::new(&path).exists() {
                std::fs::write(path, t.join("\n")).unwrap();
            }
        }
    }
}

fn run(level: Level, ops: Vec<Op>) {
    let _dump = DumpOnPanic;
    let mut h = Harness::new(level);
    for op in ops {
        h.apply(op);
    }
    // Whatever happened, the whole array reads as the model says, now and
    // after any member that can still go goes.
    h.check(0, h.size);
    for slot in 0..h.slots.len() {
        let mut failed = h.failed();
        failed[slot] = true;
        if !h.slots[slot].1 && geometry_survives(level, &failed) {
            h.slots[slot].0.set_fail_reads(true);
            h.check(0, h.size);
            h.slots[slot].0.set_fail_reads(false);
            break;
        }
    }
}

/// 48 cases unless `PROPTEST_CASES` asks for more.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48)
}

macro_rules! model_test {
    ($name:ident, $level:expr) => {
        proptest! {
            #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]
            #[test]
            fn $name(ops in prop::collection::vec(op(), 1..40)) {
                run($level, ops);
            }
        }
    };
}

model_test!(raid0_matches_the_model, Level::Raid0);
model_test!(raid1_matches_the_model, Level::Raid1);
model_test!(raid10_matches_the_model, Level::Raid10);
model_test!(raid5_matches_the_model, Level::Raid5);
model_test!(raid6_matches_the_model, Level::Raid6);

#[test]
fn a_cut_on_a_degraded_raid5_keeps_the_unwritten_sectors() {
    run(
        Level::Raid5,
        vec![
            Op::Write {
                at: 3425,
                len: 2746,
                seed: 0,
                fua: false,
            },
            Op::Write {
                at: 3435,
                len: 700,
                seed: 1,
                fua: false,
            },
            Op::Fail(4),
            Op::Crash(3389684629198864384),
        ],
    );
}

#[test]
fn raid5_cut_after_writes_while_the_parity_member_was_missing() {
    run(
        Level::Raid5,
        vec![
            Op::Read {
                at: 8600,
                len: 3485,
            },
            Op::Read {
                at: 3176,
                len: 4152,
            },
            Op::Fail(4),
            Op::Write {
                at: 4747,
                len: 1327,
                seed: 11219768684775699265,
                fua: false,
            },
            Op::Write {
                at: 1526,
                len: 1854,
                seed: 10375704198925366593,
                fua: false,
            },
            Op::Flush,
            Op::Flush,
            Op::Read { at: 1083, len: 934 },
            Op::Write {
                at: 6578,
                len: 101,
                seed: 14206568067322546323,
                fua: false,
            },
            Op::Write {
                at: 7335,
                len: 1650,
                seed: 9079492396290021377,
                fua: false,
            },
            Op::Rebuild,
            Op::Rebuild,
            Op::Write {
                at: 2971,
                len: 1826,
                seed: 13984536193396054907,
                fua: false,
            },
            Op::Write {
                at: 6404,
                len: 951,
                seed: 10620565273543478685,
                fua: false,
            },
            Op::Fail(2),
            Op::Write {
                at: 6365,
                len: 1328,
                seed: 1851680792136786124,
                fua: false,
            },
            Op::Read { at: 9278, len: 591 },
            Op::Write {
                at: 7077,
                len: 2262,
                seed: 6673956001519272588,
                fua: false,
            },
            Op::Read {
                at: 9108,
                len: 1509,
            },
            Op::Read {
                at: 4946,
                len: 4468,
            },
            Op::Write {
                at: 2705,
                len: 2328,
                seed: 1632371651399406665,
                fua: false,
            },
            Op::Write {
                at: 5464,
                len: 707,
                seed: 17983113135523979346,
                fua: false,
            },
            Op::Fail(5),
            Op::Fail(7),
            Op::Crash(646941387391162376),
        ],
    );
}

#[test]
fn raid6_cut_after_fua_writes_while_degraded() {
    run(
        Level::Raid6,
        vec![
            Op::Read {
                at: 7892,
                len: 1294,
            },
            Op::Write {
                at: 7991,
                len: 1322,
                seed: 13821911766755444949,
                fua: true,
            },
            Op::Write {
                at: 6543,
                len: 814,
                seed: 11024407548191742973,
                fua: false,
            },
            Op::Rebuild,
            Op::Fail(4),
            Op::Write {
                at: 7867,
                len: 605,
                seed: 11844484970036122496,
                fua: true,
            },
            Op::Write {
                at: 6862,
                len: 2111,
                seed: 8141885400747727984,
                fua: false,
            },
            Op::Read {
                at: 5073,
                len: 4896,
            },
            Op::Fail(0),
            Op::Write {
                at: 4638,
                len: 1622,
                seed: 9964665727175789540,
                fua: false,
            },
            Op::Read {
                at: 7358,
                len: 1774,
            },
            Op::ReAdd(6),
            Op::Crash(5958013084712676570),
        ],
    );
}
