//! Which cached line to evict: 2Q, or plain LRU to compare against.
//!
//! 2Q (Johnson and Shasha, 1994) keeps lines seen once in a FIFO (`a1in`,
//! a quarter of the cache) and lines seen again in an LRU (`am`). Lines
//! pushed out of `a1in` are remembered by number only (`a1out`, the ghosts,
//! half the cache's worth); a line that comes back while it is a ghost has
//! proved it is reused and goes straight to `am`. A scan or a backup reads
//! each line once, so it only ever churns `a1in` and the hot set in `am`
//! stays. Unlike ARC it has no adaptive target to tune, and each operation
//! is O(1), which matters under the state lock of every I/O.
//!
//! One departure from the paper: a line used again while on `a1in` moves
//! to `am` when the use is not part of the burst that brought it in (more
//! than [`CORRELATED`] policy events apart, fewer in a cache so small that
//! this is a large part of `a1in`). Sequential 4 KiB reads touch a
//! 64 KiB line sixteen times in a row, which must not count as reuse; a hot
//! line read again later must, or a warm-up that never fills the cache
//! would leave the whole hot set on `a1in`, at the mercy of the next scan.

use std::collections::{HashMap, VecDeque};

const NIL: u32 = u32::MAX;

/// Uses of a line closer together than this many policy events are one
/// burst (several streams interleaving over lines they each read through).
pub const CORRELATED: u64 = 64;

/// Which policy a cache runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PolicyKind {
    #[default]
    TwoQ,
    Lru,
}

/// Doubly linked lists over slot numbers, stored in arrays so that a move
/// allocates nothing.
struct Lists {
    prev: Vec<u32>,
    next: Vec<u32>,
    /// Which list a slot is on (0 = none).
    on: Vec<u8>,
    /// Head (newest) and tail (oldest) of each list, and its length.
    ends: [(u32, u32, usize); 3],
}

impl Lists {
    fn new(slots: u32) -> Lists {
        Lists {
            prev: vec![NIL; slots as usize],
            next: vec![NIL; slots as usize],
            on: vec![0; slots as usize],
            ends: [(NIL, NIL, 0); 3],
        }
    }

    fn push_head(&mut self, list: u8, slot: u32) {
        self.unlink(slot);
        let (head, tail, len) = &mut self.ends[list as usize];
        self.prev[slot as usize] = NIL;
        self.next[slot as usize] = *head;
        if *head != NIL {
            self.prev[*head as usize] = slot;
        } else {
            *tail = slot;
        }
        *head = slot;
        *len += 1;
        self.on[slot as usize] = list;
    }

    fn unlink(&mut self, slot: u32) {
        let list = self.on[slot as usize];
        if list == 0 {
            return;
        }
        let (p, n) = (self.prev[slot as usize], self.next[slot as usize]);
        let (head, tail, len) = &mut self.ends[list as usize];
        if p != NIL {
            self.next[p as usize] = n;
        } else {
            *head = n;
        }
        if n != NIL {
            self.prev[n as usize] = p;
        } else {
            *tail = p;
        }
        *len -= 1;
        self.on[slot as usize] = 0;
    }

    fn len(&self, list: u8) -> usize {
        self.ends[list as usize].2
    }

    /// Slots of `list` from the oldest.
    fn oldest(&self, list: u8) -> impl Iterator<Item = u32> + '_ {
        let mut cur = self.ends[list as usize].1;
        std::iter::from_fn(move || {
            (cur != NIL).then(|| {
                let s = cur;
                cur = self.prev[s as usize];
                s
            })
        })
    }
}

const A1IN: u8 = 1;
const AM: u8 = 2;

/// Line numbers recently pushed out of `a1in`, oldest first.
#[derive(Default)]
struct Ghosts {
    order: VecDeque<(u64, u64)>,
    /// Line → the stamp of its live entry in `order`.
    live: HashMap<u64, u64>,
    stamp: u64,
}

impl Ghosts {
    fn add(&mut self, line: u64, cap: usize) {
        self.stamp += 1;
        self.live.insert(line, self.stamp);
        self.order.push_back((line, self.stamp));
        while self.live.len() > cap {
            let Some((l, s)) = self.order.pop_front() else {
                break;
            };
            if self.live.get(&l) == Some(&s) {
                self.live.remove(&l);
            }
        }
        // Stale entries (lines that came back) are dropped when the queue
        // grows well past the live count.
        if self.order.len() > 2 * cap.max(16) {
            let live = &self.live;
            self.order.retain(|(l, s)| live.get(l) == Some(s));
        }
    }

    fn take(&mut self, line: u64) -> bool {
        self.live.remove(&line).is_some()
    }
}

pub struct Policy {
    kind: PolicyKind,
    lists: Lists,
    ghosts: Ghosts,
    /// Most slots on `a1in` before it gives up its oldest first.
    a1in_target: usize,
    ghost_cap: usize,
    /// Policy events so far, and each slot's last use by that count.
    clock: u64,
    last_use: Vec<u64>,
    correlated: u64,
}

impl Policy {
    pub fn new(kind: PolicyKind, slots: u32) -> Policy {
        Policy {
            kind,
            lists: Lists::new(slots),
            ghosts: Ghosts::default(),
            a1in_target: (slots as usize / 4).max(1),
            ghost_cap: (slots as usize / 2).max(1),
            clock: 0,
            last_use: vec![0; slots as usize],
            correlated: CORRELATED.min(slots as u64 / 8).max(1),
        }
    }

    /// A line was just put in `slot`.
    pub fn inserted(&mut self, slot: u32, line: u64) {
        self.clock += 1;
        self.last_use[slot as usize] = self.clock;
        match self.kind {
            PolicyKind::Lru => self.lists.push_head(AM, slot),
            PolicyKind::TwoQ if self.ghosts.take(line) => self.lists.push_head(AM, slot),
            PolicyKind::TwoQ => self.lists.push_head(A1IN, slot),
        }
    }

    /// The line in `slot` was used again.
    pub fn hit(&mut self, slot: u32) {
        self.clock += 1;
        let last = std::mem::replace(&mut self.last_use[slot as usize], self.clock);
        match self.lists.on[slot as usize] {
            AM => self.lists.push_head(AM, slot),
            // A burst of uses of a new line is still one use.
            A1IN if self.clock - last > self.correlated => self.lists.push_head(AM, slot),
            _ => {}
        }
    }

    /// The line in `slot` leaves the cache; `evicted` when pushed out for
    /// room rather than invalidated.
    pub fn removed(&mut self, slot: u32, line: u64, evicted: bool) {
        if evicted && self.lists.on[slot as usize] == A1IN {
            self.ghosts.add(line, self.ghost_cap);
        }
        self.lists.unlink(slot);
    }

    /// Slots in the order they should be evicted, up to `max`.
    pub fn victims(&self, max: usize) -> Vec<u32> {
        let (first, second) = if self.lists.len(A1IN) > self.a1in_target {
            (A1IN, AM)
        } else {
            (AM, A1IN)
        };
        self.lists
            .oldest(first)
            .chain(self.lists.oldest(second))
            .take(max)
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A cache of `slots` lines run by a policy alone, without I/O.
    pub struct Sim {
        policy: Policy,
        slot_of: HashMap<u64, u32>,
        line_in: Vec<Option<u64>>,
        pub hits: u64,
        pub misses: u64,
    }

    impl Sim {
        pub fn new(kind: PolicyKind, slots: u32) -> Sim {
            Sim {
                policy: Policy::new(kind, slots),
                slot_of: HashMap::new(),
                line_in: vec![None; slots as usize],
                hits: 0,
                misses: 0,
            }
        }

        pub fn access(&mut self, line: u64) {
            if let Some(&slot) = self.slot_of.get(&line) {
                self.hits += 1;
                self.policy.hit(slot);
                return;
            }
            self.misses += 1;
            let slot = match self.line_in.iter().position(Option::is_none) {
                Some(free) => free as u32,
                None => {
                    let victim = self.policy.victims(1)[0];
                    let old = self.line_in[victim as usize].take().unwrap();
                    self.slot_of.remove(&old);
                    self.policy.removed(victim, old, true);
                    victim
                }
            };
            self.line_in[slot as usize] = Some(line);
            self.slot_of.insert(line, slot);
            self.policy.inserted(slot, line);
        }

        pub fn reset_counts(&mut self) {
            self.hits = 0;
            self.misses = 0;
        }

        pub fn ratio(&self) -> f64 {
            self.hits as f64 / (self.hits + self.misses).max(1) as f64
        }
    }

    /// A reproducible, skewed choice of hot lines: xorshift, squared so
    /// that low line numbers are hotter.
    pub fn hot_line(state: &mut u64, hot: u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        let u = (*state >> 11) as f64 / (1u64 << 53) as f64;
        (u * u * hot as f64) as u64
    }

    /// Hit ratio of a hot set before a long scan and right after it.
    fn hit_ratio_around_a_scan(kind: PolicyKind) -> (f64, f64) {
        let slots = 1000;
        let hot = 600;
        let mut sim = Sim::new(kind, slots);
        let mut rng = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..50_000 {
            sim.access(hot_line(&mut rng, hot));
        }
        sim.reset_counts();
        for _ in 0..10_000 {
            sim.access(hot_line(&mut rng, hot));
        }
        let before = sim.ratio();
        // A scan of ten times the cache, none of it the hot set.
        for line in 1_000_000..1_010_000 {
            sim.access(line);
        }
        sim.reset_counts();
        for _ in 0..2_000 {
            sim.access(hot_line(&mut rng, hot));
        }
        (before, sim.ratio())
    }

    #[test]
    fn a_scan_does_not_flush_the_hot_set_under_2q_but_does_under_lru() {
        let (before, after) = hit_ratio_around_a_scan(PolicyKind::TwoQ);
        let (lru_before, lru_after) = hit_ratio_around_a_scan(PolicyKind::Lru);
        println!("2Q: {before:.3} -> {after:.3}; LRU: {lru_before:.3} -> {lru_after:.3}");
        assert!(before > 0.95, "the hot set fits: {before}");
        assert!(after >= 0.9 * before, "2Q kept the hot set: {after}");
        assert!(lru_before > 0.95);
        assert!(lru_after < 0.9 * lru_before, "LRU lost it: {lru_after}");
    }

    #[test]
    fn a_returning_ghost_goes_to_the_frequent_list() {
        let mut p = Policy::new(PolicyKind::TwoQ, 1000);
        p.inserted(0, 100);
        p.removed(0, 100, true);
        p.inserted(1, 100);
        assert_eq!(p.lists.on[1], AM);
        p.inserted(2, 200);
        assert_eq!(p.lists.on[2], A1IN);
        p.hit(2);
        assert_eq!(p.lists.on[2], A1IN, "a burst is one use");
        // a1in within its target: the frequent list's oldest goes first.
        assert_eq!(p.victims(8), vec![1, 2]);
        p.removed(2, 200, false);
        assert_eq!(p.victims(8), vec![1]);
        p.inserted(3, 300);
        for _ in 0..CORRELATED {
            p.hit(1);
        }
        p.hit(3);
        assert_eq!(p.lists.on[3], AM, "used again later");
    }
}
