//! Which replica is current: generation ids, as DRBD's data generation
//! UUIDs.
//!
//! Each replica carries the id of the generation its data belongs to
//! (`current`), the generation its bitmap counts changes from
//! (`bitmap`, 0 when it tracks none) and the two generations before
//! (`history`). A primary that writes while its peer is away starts a
//! new generation, keeping the old one as its bitmap's base; a resync
//! ends with the target adopting the source's ids. Comparing two
//! replicas' ids on reconnect then says, without looking at data, which
//! one is newer and whether its bitmap alone covers the difference, or
//! that both moved on from the same point: split brain.

use rand::RngCore;
use serde::Serialize;

/// The `current` of a replica no primary has written through yet.
pub const JUST_CREATED: u64 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Generations {
    pub current: u64,
    pub bitmap: u64,
    pub history: [u64; 2],
}

/// How two replicas stand to each other, seen from one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relation {
    /// Same generation: at most the regions in either bitmap (writes in
    /// flight at a crash) may differ.
    Same,
    /// This replica is newer: the peer needs the regions of this one's
    /// bitmap, or everything when `full`.
    Newer { full: bool },
    /// The peer is newer.
    Older { full: bool },
    /// Both wrote since they parted: neither may overwrite the other
    /// without an operator's word.
    SplitBrain,
    /// No shared history at all: different data sets.
    Unrelated,
}

/// A fresh generation id: random, never 0 nor [`JUST_CREATED`].
pub fn new_id() -> u64 {
    loop {
        let id = rand::rngs::OsRng.next_u64();
        if id != 0 && id != JUST_CREATED {
            return id;
        }
    }
}

impl Generations {
    pub fn fresh() -> Generations {
        Generations {
            current: JUST_CREATED,
            bitmap: 0,
            history: [0; 2],
        }
    }

    /// Starts a new generation for writes the peer will miss; false when
    /// the bitmap already counts from an older one (it goes on counting).
    pub fn start_tracking(&mut self) -> bool {
        if self.bitmap != 0 {
            return false;
        }
        self.bitmap = self.current;
        self.current = new_id();
        true
    }

    /// The first promotion of a new replica: its data becomes a
    /// generation of its own, which a new peer must copy whole.
    pub fn first_promotion(&mut self) -> bool {
        if self.current != JUST_CREATED {
            return false;
        }
        self.current = new_id();
        true
    }

    /// A resync from this replica ended: its bitmap's base is history.
    pub fn synced_as_source(&mut self) {
        if self.bitmap != 0 {
            self.history = [self.bitmap, self.history[0]];
            self.bitmap = 0;
        }
    }

    /// A resync to this replica ended: it now holds `source`'s data.
    pub fn adopt(&mut self, source: &Generations) {
        *self = Generations {
            current: source.current,
            bitmap: 0,
            history: source.history,
        };
    }
}

/// How `me` stands to `peer`.
pub fn compare(me: &Generations, peer: &Generations) -> Relation {
    if me.current == peer.current {
        return Relation::Same;
    }
    if peer.current == JUST_CREATED {
        return Relation::Newer { full: true };
    }
    if me.current == JUST_CREATED {
        return Relation::Older { full: true };
    }
    if me.bitmap != 0 && me.bitmap == peer.current {
        return Relation::Newer { full: false };
    }
    if peer.bitmap != 0 && peer.bitmap == me.current {
        return Relation::Older { full: false };
    }
    // The peer's generation is one this replica left behind, further
    // back than its bitmap reaches.
    if me.history.contains(&peer.current) {
        return Relation::Newer { full: true };
    }
    if peer.history.contains(&me.current) {
        return Relation::Older { full: true };
    }
    // Both moved on from one generation, or one from a generation the
    // other has since left: each wrote what the other lacks.
    let moved_on = |a: &Generations, b: &Generations| {
        a.bitmap != 0 && (a.bitmap == b.bitmap || b.history.contains(&a.bitmap))
    };
    if moved_on(me, peer) || moved_on(peer, me) {
        return Relation::SplitBrain;
    }
    Relation::Unrelated
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(current: u64, bitmap: u64, history: [u64; 2]) -> Generations {
        Generations {
            current,
            bitmap,
            history,
        }
    }

    fn both_ways(a: &Generations, b: &Generations) -> (Relation, Relation) {
        (compare(a, b), compare(b, a))
    }

    #[test]
    fn a_primary_that_wrote_alone_is_newer_by_its_bitmap() {
        let mut a = g(10, 0, [0, 0]);
        let b = a;
        assert!(a.start_tracking());
        assert!(!a.start_tracking(), "a second outage counts on");
        assert_eq!(
            both_ways(&a, &b),
            (
                Relation::Newer { full: false },
                Relation::Older { full: false }
            )
        );
        // After the resync both are the same generation again: the
        // source makes its bitmap's base history, the target adopts.
        let mut b = b;
        a.synced_as_source();
        b.adopt(&a);
        assert_eq!(a, b);
        assert_eq!(a.history[0], 10);
        assert_eq!(compare(&a, &b), Relation::Same);
    }

    #[test]
    fn both_writing_apart_is_split_brain() {
        let (mut a, mut b) = (g(10, 0, [7, 0]), g(10, 0, [7, 0]));
        a.start_tracking();
        b.start_tracking();
        assert_eq!(
            both_ways(&a, &b),
            (Relation::SplitBrain, Relation::SplitBrain)
        );
        // The peer moved on from a generation this one already left.
        let mut c = g(10, 0, [7, 0]);
        c.start_tracking();
        c.synced_as_source(); // c: current new, history [10, 7]
        let mut d = g(10, 0, [7, 0]);
        d.start_tracking();
        assert_eq!(compare(&c, &d), Relation::SplitBrain);
    }

    #[test]
    fn a_peer_older_than_the_bitmap_needs_everything() {
        let mut a = g(10, 0, [0, 0]);
        let old = a;
        a.start_tracking();
        a.synced_as_source(); // the bitmap from 10 is gone
        a.start_tracking();
        assert_eq!(
            both_ways(&a, &old),
            (
                Relation::Newer { full: true },
                Relation::Older { full: true }
            )
        );
    }

    #[test]
    fn new_replicas() {
        let (mut a, b) = (Generations::fresh(), Generations::fresh());
        assert_eq!(compare(&a, &b), Relation::Same);
        assert!(a.first_promotion());
        assert!(!a.first_promotion());
        assert_eq!(
            both_ways(&a, &b),
            (
                Relation::Newer { full: true },
                Relation::Older { full: true }
            )
        );
        assert_eq!(
            compare(&g(5, 0, [0, 0]), &g(6, 0, [0, 0])),
            Relation::Unrelated
        );
    }

    /// A model of two replicas: each writes alone or they resync (fully,
    /// or with the target never hearing that it ended). Whatever the
    /// order, the comparison names the side that wrote, and split brain
    /// exactly when both did; only once three resyncs in a row went
    /// unheard may the history, two generations deep, no longer reach
    /// back, and the replicas compare as unrelated (refused, not guessed).
    #[derive(Clone, Copy, Debug)]
    enum Event {
        WriteA,
        WriteB,
        Resync,
        ResyncUnheard,
    }

    fn event() -> impl proptest::strategy::Strategy<Value = Event> {
        proptest::prop_oneof![
            proptest::strategy::Just(Event::WriteA),
            proptest::strategy::Just(Event::WriteB),
            proptest::strategy::Just(Event::Resync),
            proptest::strategy::Just(Event::ResyncUnheard),
        ]
    }

    proptest::proptest! {
        #[test]
        fn the_comparison_follows_who_wrote(events in proptest::collection::vec(event(), 1..40)) {
            let mut a = g(100, 0, [0, 0]);
            let mut b = a;
            // Whether each side holds writes the other lacks.
            let (mut a_wrote, mut b_wrote) = (false, false);
            let mut unheard = 0;
            for e in events {
                let relation = compare(&a, &b);
                let expected = match (a_wrote, b_wrote) {
                    (false, false) => "same",
                    (true, false) => "newer",
                    (false, true) => "older",
                    (true, true) => "split",
                };
                let seen = match relation {
                    Relation::Same => "same",
                    Relation::Newer { .. } => "newer",
                    Relation::Older { .. } => "older",
                    Relation::SplitBrain => "split",
                    Relation::Unrelated => "unrelated",
                };
                if !(seen == "unrelated" && unheard >= 3) {
                    proptest::prop_assert_eq!(seen, expected, "{:?} {:?}", a, b);
                }
                let mirrored = match compare(&b, &a) {
                    Relation::Newer { full } => Relation::Older { full },
                    Relation::Older { full } => Relation::Newer { full },
                    r => r,
                };
                proptest::prop_assert_eq!(mirrored, relation);
                match e {
                    Event::WriteA => {
                        a.start_tracking();
                        a_wrote = true;
                    }
                    Event::WriteB => {
                        b.start_tracking();
                        b_wrote = true;
                    }
                    Event::Resync | Event::ResyncUnheard => {
                        let (source, target) = match relation {
                            Relation::Newer { .. } => (&mut a, &mut b),
                            Relation::Older { .. } => (&mut b, &mut a),
                            _ => continue,
                        };
                        source.synced_as_source();
                        if matches!(e, Event::Resync) {
                            target.adopt(source);
                            (a_wrote, b_wrote) = (false, false);
                            unheard = 0;
                        } else {
                            unheard += 1;
                        }
                    }
                }
            }
        }
    }
}
