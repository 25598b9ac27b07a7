//! The witness's rules: who holds each mirror's ownership lease, until
//! when (on the witness's clock), and the newest generation any holder
//! told it of.
//!
//! - A claim with no record is granted.
//! - The holder renews while its lease runs; its record only moves
//!   forward (a renewal read before a newer generation began never
//!   lowers it).
//! - Anyone else is granted only once the holder's lease ran out (or
//!   was released), and only with generations equal to or newer than
//!   the record: a node that missed writes never gets the grant.
//! - Records read back after a restart count as held for one whole
//!   lease from the restart: the holder may still be counting on it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::mirror::generations::{compare, Generations, Relation};

/// The shortest and the longest lease a node may ask for.
pub const MIN_LEASE: Duration = Duration::from_millis(500);
pub const MAX_LEASE: Duration = Duration::from_secs(120);
/// Records one witness keeps at most: every pair's every mirror.
pub const MAX_RECORDS: usize = 4096;

/// Which lease: a pair (its two nodes' names, in order) and a mirror.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    pub pair: (String, String),
    pub mirror: String,
}

impl Key {
    pub fn new(node: &str, peer: &str, mirror: &str) -> Key {
        let pair = if node <= peer {
            (node.to_string(), peer.to_string())
        } else {
            (peer.to_string(), node.to_string())
        };
        Key {
            pair,
            mirror: mirror.to_string(),
        }
    }
}

/// What the witness keeps of one lease (all of it on disk but `until`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub holder: String,
    pub generations: Generations,
    pub lease: Duration,
    /// When the lease runs out; `None` once released.
    pub until: Option<Instant>,
}

/// The witness's answer to a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The claimant holds the lease for `lease` from when it sent the
    /// claim; `generations` is the record now.
    Granted {
        lease: Duration,
        generations: Generations,
    },
    /// Another node holds a lease that has `left` to run.
    Held { holder: String, left: Duration },
    /// The claimant's data is older than what the last holder wrote.
    Behind {
        holder: String,
        generations: Generations,
    },
    /// The lease was given up (or was not the claimant's to give up).
    Released,
    /// The witness keeps no more records.
    Full,
}

#[derive(Default)]
pub struct Leases {
    records: BTreeMap<Key, Record>,
}

fn up_to_date(claim: &Generations, record: &Generations) -> bool {
    matches!(
        compare(claim, record),
        Relation::Same | Relation::Newer { .. }
    )
}

impl Leases {
    /// Records read back from disk at `now`: each held for its lease.
    pub fn restored(records: Vec<(Key, Record)>, now: Instant) -> Leases {
        let records = records
            .into_iter()
            .map(|(k, r)| {
                let until = Some(now + r.lease);
                (k, Record { until, ..r })
            })
            .collect();
        Leases { records }
    }

    pub fn get(&self, key: &Key) -> Option<&Record> {
        self.records.get(key)
    }

    pub fn records(&self) -> impl Iterator<Item = (&Key, &Record)> {
        self.records.iter()
    }

    /// `node` asks for (or renews) the lease of `key` for `lease`,
    /// holding `generations`.
    pub fn claim(
        &mut self,
        now: Instant,
        key: &Key,
        node: &str,
        generations: Generations,
        lease: Duration,
    ) -> Verdict {
        let lease = lease.clamp(MIN_LEASE, MAX_LEASE);
        let Some(rec) = self.records.get_mut(key) else {
            if self.records.len() >= MAX_RECORDS {
                return Verdict::Full;
            }
            let rec = Record {
                holder: node.to_string(),
                generations,
                lease,
                until: Some(now + lease),
            };
            self.records.insert(key.clone(), rec);
            return Verdict::Granted { lease, generations };
        };
        let running = rec.until.is_some_and(|t| now < t);
        if rec.holder == node && running {
            if up_to_date(&generations, &rec.generations) {
                rec.generations = generations;
            }
        } else if running {
            return Verdict::Held {
                holder: rec.holder.clone(),
                left: rec.until.map_or(Duration::ZERO, |t| t - now),
            };
        } else if !up_to_date(&generations, &rec.generations) {
            return Verdict::Behind {
                holder: rec.holder.clone(),
                generations: rec.generations,
            };
        } else {
            rec.holder = node.to_string();
            rec.generations = generations;
        }
        rec.lease = lease;
        rec.until = Some(now + lease);
        Verdict::Granted {
            lease,
            generations: rec.generations,
        }
    }

    /// Restores `key`'s record as it was before a change that could not
    /// be written to disk.
    pub fn put_back(&mut self, key: &Key, before: Option<Record>) {
        match before {
            Some(r) => self.records.insert(key.clone(), r),
            None => self.records.remove(key),
        };
    }

    /// The holder gives its lease up (a planned demotion); the record of
    /// its generations stays.
    pub fn release(&mut self, key: &Key, node: &str) -> Verdict {
        if let Some(rec) = self.records.get_mut(key) {
            if rec.holder == node {
                rec.until = None;
            }
        }
        Verdict::Released
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(current: u64, bitmap: u64) -> Generations {
        Generations {
            current,
            bitmap,
            history: [0; 2],
        }
    }

    const LEASE: Duration = Duration::from_secs(3);

    fn granted(v: &Verdict) -> bool {
        matches!(v, Verdict::Granted { .. })
    }

    #[test]
    fn one_holder_at_a_time_and_the_other_only_after_expiry() {
        let t0 = Instant::now();
        let key = Key::new("b", "a", "vm");
        assert_eq!(key, Key::new("a", "b", "vm"));
        let mut l = Leases::default();
        assert!(granted(&l.claim(t0, &key, "a", g(10, 0), LEASE)));
        let v = l.claim(t0 + Duration::from_secs(1), &key, "b", g(10, 0), LEASE);
        assert_eq!(
            v,
            Verdict::Held {
                holder: "a".into(),
                left: Duration::from_secs(2)
            }
        );
        // The holder renews: its lease runs from the renewal.
        let t2 = t0 + Duration::from_secs(2);
        assert!(granted(&l.claim(t2, &key, "a", g(10, 0), LEASE)));
        let almost = t2 + LEASE - Duration::from_millis(1);
        assert!(matches!(
            l.claim(almost, &key, "b", g(10, 0), LEASE),
            Verdict::Held { .. }
        ));
        // Expired: the other, as up to date, takes it; then a is refused.
        assert!(granted(&l.claim(t2 + LEASE, &key, "b", g(10, 0), LEASE)));
        assert!(matches!(
            l.claim(t2 + LEASE, &key, "a", g(10, 0), LEASE),
            Verdict::Held { holder, .. } if holder == "b"
        ));
        // Other mirrors and pairs have leases of their own.
        assert!(granted(&l.claim(
            t2,
            &Key::new("a", "b", "vm2"),
            "a",
            g(1, 0),
            LEASE
        )));
        assert!(granted(&l.claim(
            t2,
            &Key::new("a", "c", "vm"),
            "a",
            g(1, 0),
            LEASE
        )));
    }

    #[test]
    fn a_node_behind_the_last_holder_never_gets_the_grant() {
        let t0 = Instant::now();
        let key = Key::new("a", "b", "vm");
        let mut l = Leases::default();
        assert!(granted(&l.claim(t0, &key, "a", g(10, 0), LEASE)));
        // a wrote alone: a new generation counting from 10.
        assert!(granted(&l.claim(t0, &key, "a", g(11, 10), LEASE)));
        let late = t0 + 10 * LEASE;
        assert_eq!(
            l.claim(late, &key, "b", g(10, 0), LEASE),
            Verdict::Behind {
                holder: "a".into(),
                generations: g(11, 10)
            }
        );
        // A renewal read before the new generation began does not lower
        // the record.
        let mut l = Leases::default();
        l.claim(t0, &key, "a", g(11, 10), LEASE);
        let v = l.claim(t0, &key, "a", g(10, 0), LEASE);
        assert_eq!(
            v,
            Verdict::Granted {
                lease: LEASE,
                generations: g(11, 10)
            }
        );
        assert!(!granted(&l.claim(late, &key, "b", g(10, 0), LEASE)));
        // The up-to-date node (after a resync it holds 11) is granted.
        assert!(granted(&l.claim(late, &key, "b", g(11, 0), LEASE)));
    }

    #[test]
    fn a_release_frees_the_lease_but_keeps_the_record() {
        let t0 = Instant::now();
        let key = Key::new("a", "b", "vm");
        let mut l = Leases::default();
        l.claim(t0, &key, "a", g(11, 10), LEASE);
        // Only the holder can release.
        l.release(&key, "b");
        assert!(!granted(&l.claim(t0, &key, "b", g(11, 0), LEASE)));
        l.release(&key, "a");
        assert!(!granted(&l.claim(t0, &key, "b", g(10, 0), LEASE)));
        assert!(granted(&l.claim(t0, &key, "b", g(11, 0), LEASE)));
        // A holder whose lease ran out is as anyone else.
        let late = t0 + 10 * LEASE;
        assert!(!granted(&l.claim(late, &key, "a", g(10, 0), LEASE)));
    }

    #[test]
    fn records_read_back_are_held_for_a_lease_and_leases_are_bounded() {
        let t0 = Instant::now();
        let key = Key::new("a", "b", "vm");
        let rec = Record {
            holder: "a".into(),
            generations: g(11, 10),
            lease: LEASE,
            until: None,
        };
        let mut l = Leases::restored(vec![(key.clone(), rec)], t0);
        assert!(!granted(&l.claim(t0, &key, "b", g(11, 0), LEASE)));
        assert!(granted(&l.claim(t0 + LEASE, &key, "b", g(11, 0), LEASE)));
        let v = l.claim(t0, &Key::new("a", "b", "x"), "a", g(1, 0), Duration::ZERO);
        assert!(matches!(v, Verdict::Granted { lease, .. } if lease == MIN_LEASE));
        let v = l.claim(t0, &Key::new("a", "b", "y"), "a", g(1, 0), Duration::MAX);
        assert!(matches!(v, Verdict::Granted { lease, .. } if lease == MAX_LEASE));
    }
}
