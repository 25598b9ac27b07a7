//! Asymmetric access: which target port groups may reach a device, and
//! how well.
//!
//! A device served by the two heads of an HA pair is one logical unit seen
//! through two target port groups, one per head. [`AccessStates`] holds
//! the state of each group as SPC-4's ALUA defines them (NVMe's ANA states
//! map onto the same set): the pair changes them, the transports report
//! them (REPORT TARGET PORT GROUPS, the ANA log page) and refuse media
//! access where the state says so. Every change is counted and passed to
//! the watchers, so each transport raises its own notice (a unit
//! attention, an asynchronous event).
//!
//! With no pair there is nothing to choose: every group is
//! active/optimized and explicit moves are not offered.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, RwLock};

/// A target port group's primary asymmetric access state (SPC-4 5.15.2.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessState {
    ActiveOptimized,
    ActiveNonOptimized,
    Standby,
    Unavailable,
    /// Between two of the others, while the pair moves the LU.
    Transitioning,
}

impl AccessState {
    pub const ALL: [AccessState; 5] = [
        AccessState::ActiveOptimized,
        AccessState::ActiveNonOptimized,
        AccessState::Standby,
        AccessState::Unavailable,
        AccessState::Transitioning,
    ];

    /// The ASYMMETRIC ACCESS STATE field value.
    pub const fn code(self) -> u8 {
        match self {
            AccessState::ActiveOptimized => 0x0,
            AccessState::ActiveNonOptimized => 0x1,
            AccessState::Standby => 0x2,
            AccessState::Unavailable => 0x3,
            AccessState::Transitioning => 0xF,
        }
    }

    pub fn from_code(code: u8) -> Option<AccessState> {
        AccessState::ALL.into_iter().find(|s| s.code() == code)
    }

    /// The state's bit in the supported states byte of a target port
    /// group descriptor (T_SUP ... AO_SUP).
    pub const fn support_bit(self) -> u8 {
        match self {
            AccessState::ActiveOptimized => 0x01,
            AccessState::ActiveNonOptimized => 0x02,
            AccessState::Standby => 0x04,
            AccessState::Unavailable => 0x08,
            AccessState::Transitioning => 0x80,
        }
    }

    /// Whether media access through a group in this state is served.
    pub const fn serves_io(self) -> bool {
        matches!(
            self,
            AccessState::ActiveOptimized | AccessState::ActiveNonOptimized
        )
    }

    pub const fn name(self) -> &'static str {
        match self {
            AccessState::ActiveOptimized => "active/optimized",
            AccessState::ActiveNonOptimized => "active/non-optimized",
            AccessState::Standby => "standby",
            AccessState::Unavailable => "unavailable",
            AccessState::Transitioning => "transitioning",
        }
    }
}

impl std::fmt::Display for AccessState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What last set a group's state: the STATUS CODE of its descriptor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Cause {
    #[default]
    None,
    /// An initiator's SET TARGET PORT GROUPS.
    Explicit,
    /// The target itself (the pair's failover, a planned move).
    Implicit,
}

impl Cause {
    pub const fn status_code(self) -> u8 {
        match self {
            Cause::None => 0,
            Cause::Explicit => 1,
            Cause::Implicit => 2,
        }
    }
}

/// One target port group as the model knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortGroup {
    pub id: u16,
    pub state: AccessState,
    /// Relative target port identifiers of the group's ports. A
    /// transport adds the local ports it sees sessions on; the peer's
    /// ports are known only from here.
    pub ports: Vec<u16>,
    /// The group is this node's.
    pub local: bool,
    /// Reported as the preferred group (PREF).
    pub preferred: bool,
    pub cause: Cause,
}

impl PortGroup {
    pub fn new(id: u16, state: AccessState, local: bool) -> PortGroup {
        PortGroup {
            id,
            state,
            ports: Vec::new(),
            local,
            preferred: false,
            cause: Cause::None,
        }
    }

    pub fn with_ports(mut self, ports: &[u16]) -> PortGroup {
        self.ports = ports.to_vec();
        self
    }

    pub fn preferred(mut self) -> PortGroup {
        self.preferred = true;
        self
    }
}

/// Why an explicit move was not made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MoveRefused {
    /// The combination of states asked for cannot be established; the
    /// index is that of the offending move.
    Invalid(usize),
    /// The move was tried and did not complete.
    Failed(String),
}

/// Makes the moves an initiator asks for with SET TARGET PORT GROUPS: the
/// pair implements it, since a move changes both heads.
pub trait ExplicitMoves: Send + Sync {
    /// Establishes `moves` (group, state), calling [`AccessStates::set`]
    /// for what changes, and returns once they hold or are refused.
    /// Groups and states are already checked against the model.
    fn request(
        &self,
        states: &AccessStates,
        moves: &[(u16, AccessState)],
    ) -> Result<(), MoveRefused>;
}

/// One change, as watchers are told of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessChange {
    /// The counter after the change.
    pub generation: u64,
    pub cause: Cause,
    /// The groups whose state changed, with their new state.
    pub groups: Vec<(u16, AccessState)>,
}

/// Told of every state change, outside the model's lock.
pub trait AccessWatcher: Send + Sync {
    fn access_changed(&self, change: &AccessChange);

    /// Explicit moves were offered (`true`) or withdrawn: SCSI's INQUIRY
    /// data says which.
    fn explicit_changed(&self, offered: bool) {
        let _ = offered;
    }
}

/// The asymmetric access states of one device's target port groups.
pub struct AccessStates {
    inner: RwLock<Inner>,
    generation: AtomicU64,
    /// Some group (or the default) refuses media access: the per-command
    /// check is skipped while this is false.
    restricted: AtomicBool,
    watchers: Mutex<Vec<Weak<dyn AccessWatcher>>>,
}

struct Inner {
    groups: Vec<PortGroup>,
    /// The state of a group the model does not name.
    others: AccessState,
    supported: u8,
    transition_secs: u8,
    explicit: Option<Arc<dyn ExplicitMoves>>,
}

impl Default for AccessStates {
    /// One node alone: every group active/optimized, no explicit moves.
    fn default() -> AccessStates {
        AccessStates {
            inner: RwLock::new(Inner {
                groups: Vec::new(),
                others: AccessState::ActiveOptimized,
                supported: AccessState::ActiveOptimized.support_bit(),
                transition_secs: 0,
                explicit: None,
            }),
            generation: AtomicU64::new(0),
            restricted: AtomicBool::new(false),
            watchers: Mutex::new(Vec::new()),
        }
    }
}

impl std::fmt::Debug for AccessStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.inner.read();
        f.debug_struct("AccessStates")
            .field("groups", &inner.groups)
            .field("others", &inner.others)
            .field("generation", &self.generation())
            .finish()
    }
}

/// The states a pair can put groups in: all five.
pub const PAIR_SUPPORTED: u8 = 0x01 | 0x02 | 0x04 | 0x08 | 0x80;

impl AccessStates {
    pub fn new() -> Arc<AccessStates> {
        Arc::new(AccessStates::default())
    }

    /// Replaces the groups, the state of groups not named, and the states
    /// reported as supported (a mask of [`AccessState::support_bit`]).
    /// A group whose state differs from before counts as changed, as
    /// implicit behaviour.
    pub fn configure(&self, groups: Vec<PortGroup>, others: AccessState, supported: u8) {
        let mut groups = groups;
        groups.sort_by_key(|g| g.id);
        groups.dedup_by_key(|g| g.id);
        let change = {
            let mut inner = self.inner.write();
            let before: Vec<(u16, AccessState)> = groups
                .iter()
                .map(|g| (g.id, inner.state_of(g.id)))
                .collect();
            let others_changed = inner.others != others;
            inner.groups = groups;
            inner.others = others;
            inner.supported = supported | AccessState::ActiveOptimized.support_bit();
            let changed: Vec<(u16, AccessState)> = inner
                .groups
                .iter()
                .zip(before)
                .filter(|(g, (_, was))| g.state != *was)
                .map(|(g, _)| (g.id, g.state))
                .collect();
            self.update_restricted(&inner);
            (others_changed || !changed.is_empty()).then_some(changed)
        };
        if let Some(groups) = change {
            self.announce(Cause::Implicit, groups);
        }
    }

    /// Sets the state of each named group; groups not in the model are
    /// added as remote groups. Only groups whose state changes count.
    pub fn set(&self, moves: &[(u16, AccessState)], cause: Cause) {
        let changed = {
            let mut inner = self.inner.write();
            let mut changed = Vec::new();
            for &(id, state) in moves {
                let others = inner.others;
                let group = match inner.groups.binary_search_by_key(&id, |g| g.id) {
                    Ok(i) => &mut inner.groups[i],
                    Err(i) => {
                        inner.groups.insert(i, PortGroup::new(id, others, false));
                        &mut inner.groups[i]
                    }
                };
                group.cause = cause;
                if group.state != state {
                    group.state = state;
                    changed.push((id, state));
                }
            }
            self.update_restricted(&inner);
            changed
        };
        if !changed.is_empty() {
            self.announce(cause, changed);
        }
    }

    /// Puts `groups` in the transitioning state: the first half of a move,
    /// which [`AccessStates::set`] ends.
    pub fn begin_transition(&self, groups: &[u16], cause: Cause) {
        let moves: Vec<_> = groups
            .iter()
            .map(|&g| (g, AccessState::Transitioning))
            .collect();
        self.set(&moves, cause);
    }

    /// The state of group `id`.
    pub fn state_of(&self, id: u16) -> AccessState {
        self.inner.read().state_of(id)
    }

    /// The state of `id` when some group may refuse media access, `None`
    /// (cheaply) when every group serves it.
    pub fn restriction(&self, id: u16) -> Option<AccessState> {
        if !self.restricted.load(Ordering::Acquire) {
            return None;
        }
        Some(self.state_of(id)).filter(|s| !s.serves_io())
    }

    /// The groups the model names, by id.
    pub fn groups(&self) -> Vec<PortGroup> {
        self.inner.read().groups.clone()
    }

    /// The state of a group the model does not name.
    pub fn others(&self) -> AccessState {
        self.inner.read().others
    }

    /// The id of this node's group, when the model names one.
    pub fn local_group(&self) -> Option<u16> {
        self.inner
            .read()
            .groups
            .iter()
            .find(|g| g.local)
            .map(|g| g.id)
    }

    /// The supported states byte of a target port group descriptor.
    pub fn supported(&self) -> u8 {
        self.inner.read().supported
    }

    /// Seconds an initiator should allow an implicit transition (the
    /// IMPLICIT TRANSITION TIME of REPORT TARGET PORT GROUPS); 0: unknown.
    pub fn transition_secs(&self) -> u8 {
        self.inner.read().transition_secs
    }

    pub fn set_transition_secs(&self, secs: u8) {
        self.inner.write().transition_secs = secs;
    }

    /// Offers explicit moves (SET TARGET PORT GROUPS) made by `hook`, or
    /// stops offering them.
    pub fn set_explicit(&self, hook: Option<Arc<dyn ExplicitMoves>>) {
        let offered = hook.is_some();
        let toggled = {
            let mut inner = self.inner.write();
            let was = inner.explicit.is_some();
            inner.explicit = hook;
            was != offered
        };
        if toggled {
            for w in self.live_watchers() {
                w.explicit_changed(offered);
            }
        }
    }

    /// The hook that makes explicit moves, when they are offered.
    pub fn explicit(&self) -> Option<Arc<dyn ExplicitMoves>> {
        self.inner.read().explicit.clone()
    }

    /// The states as status reports show them: each named group, the
    /// state of the others, whether explicit moves are offered, and the
    /// change counter.
    pub fn status(&self) -> serde_json::Value {
        let inner = self.inner.read();
        let groups: Vec<serde_json::Value> = inner
            .groups
            .iter()
            .map(|g| {
                serde_json::json!({
                    "id": g.id,
                    "state": g.state.name(),
                    "local": g.local,
                    "preferred": g.preferred,
                    "ports": g.ports,
                })
            })
            .collect();
        serde_json::json!({
            "groups": groups,
            "others": inner.others.name(),
            "explicit": inner.explicit.is_some(),
            "generation": self.generation(),
        })
    }

    /// How many changes there have been.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Tells `watcher` of every change from now on, for as long as it
    /// lives.
    pub fn watch(&self, watcher: Weak<dyn AccessWatcher>) {
        let mut watchers = self.watchers.lock();
        watchers.retain(|w| w.strong_count() > 0);
        watchers.push(watcher);
    }

    fn update_restricted(&self, inner: &Inner) {
        let restricted =
            !inner.others.serves_io() || inner.groups.iter().any(|g| !g.state.serves_io());
        self.restricted.store(restricted, Ordering::Release);
    }

    fn announce(&self, cause: Cause, groups: Vec<(u16, AccessState)>) {
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        let change = AccessChange {
            generation,
            cause,
            groups,
        };
        for w in self.live_watchers() {
            w.access_changed(&change);
        }
    }

    /// The watchers still alive, taken out of the lock so that they may
    /// call back.
    fn live_watchers(&self) -> Vec<Arc<dyn AccessWatcher>> {
        let mut watchers = self.watchers.lock();
        watchers.retain(|w| w.strong_count() > 0);
        watchers.iter().filter_map(Weak::upgrade).collect()
    }
}

impl Inner {
    fn state_of(&self, id: u16) -> AccessState {
        match self.groups.binary_search_by_key(&id, |g| g.id) {
            Ok(i) => self.groups[i].state,
            Err(_) => self.others,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Seen(Mutex<Vec<AccessChange>>);

    impl AccessWatcher for Seen {
        fn access_changed(&self, change: &AccessChange) {
            self.0.lock().push(change.clone());
        }
    }

    fn watched(states: &AccessStates) -> Arc<Seen> {
        let seen = Arc::new(Seen::default());
        let weak: Weak<Seen> = Arc::downgrade(&seen);
        states.watch(weak);
        seen
    }

    #[test]
    fn codes_round_trip_and_only_active_states_serve_io() {
        for s in AccessState::ALL {
            assert_eq!(AccessState::from_code(s.code()), Some(s));
        }
        assert_eq!(AccessState::from_code(0x4), None);
        assert_eq!(AccessState::from_code(0xE), None);
        let serving: Vec<_> = AccessState::ALL
            .into_iter()
            .filter(|s| s.serves_io())
            .collect();
        assert_eq!(
            serving,
            [
                AccessState::ActiveOptimized,
                AccessState::ActiveNonOptimized
            ]
        );
        let all = AccessState::ALL.iter().fold(0, |m, s| m | s.support_bit());
        assert_eq!(all, PAIR_SUPPORTED);
    }

    #[test]
    fn alone_every_group_is_active_optimized() {
        let s = AccessStates::new();
        for g in [0, 1, 7, u16::MAX] {
            assert_eq!(s.state_of(g), AccessState::ActiveOptimized);
            assert_eq!(s.restriction(g), None);
        }
        assert!(s.groups().is_empty());
        assert_eq!(s.supported(), 0x01);
        assert!(s.explicit().is_none());
        assert_eq!(s.generation(), 0);
        assert_eq!(s.local_group(), None);
    }

    #[test]
    fn a_pair_names_its_groups_and_each_change_is_announced_once() {
        let s = AccessStates::new();
        let seen = watched(&s);
        s.configure(
            vec![
                PortGroup::new(2, AccessState::Standby, false).with_ports(&[2]),
                PortGroup::new(1, AccessState::ActiveOptimized, true).preferred(),
            ],
            AccessState::Unavailable,
            PAIR_SUPPORTED,
        );
        assert_eq!(s.local_group(), Some(1));
        assert_eq!(s.groups().iter().map(|g| g.id).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(s.restriction(1), None);
        assert_eq!(s.restriction(2), Some(AccessState::Standby));
        assert_eq!(s.restriction(9), Some(AccessState::Unavailable));
        assert_eq!(s.generation(), 1);

        s.begin_transition(&[1, 2], Cause::Implicit);
        s.set(
            &[(1, AccessState::Standby), (2, AccessState::ActiveOptimized)],
            Cause::Implicit,
        );
        // Setting what already holds is no change.
        s.set(&[(1, AccessState::Standby)], Cause::Implicit);
        assert_eq!(s.generation(), 3);
        let seen = seen.0.lock();
        assert_eq!(seen.len(), 3);
        assert_eq!(
            seen[1].groups,
            [
                (1, AccessState::Transitioning),
                (2, AccessState::Transitioning)
            ]
        );
        assert_eq!(seen[2].generation, 3);
        assert_eq!(s.groups()[0].cause, Cause::Implicit);
        let status = s.status();
        assert_eq!(status["groups"][0]["state"], "standby");
        assert_eq!(status["groups"][1]["ports"], serde_json::json!([2]));
        assert_eq!(status["others"], "unavailable");
        assert_eq!(status["explicit"], false);
        assert_eq!(status["generation"], 3);
    }

    #[test]
    fn a_dropped_watcher_is_forgotten() {
        let s = AccessStates::new();
        let seen = watched(&s);
        drop(seen);
        s.set(&[(1, AccessState::Standby)], Cause::Implicit);
        assert!(s.watchers.lock().is_empty());
        // An unnamed group set becomes a remote group of the model.
        assert!(!s.groups()[0].local);
        assert_eq!(s.state_of(2), AccessState::ActiveOptimized);
    }

    struct Refuse;

    impl ExplicitMoves for Refuse {
        fn request(&self, _: &AccessStates, _: &[(u16, AccessState)]) -> Result<(), MoveRefused> {
            Err(MoveRefused::Failed("no".into()))
        }
    }

    #[derive(Default)]
    struct Offers(Mutex<Vec<bool>>);

    impl AccessWatcher for Offers {
        fn access_changed(&self, _: &AccessChange) {}
        fn explicit_changed(&self, offered: bool) {
            self.0.lock().push(offered);
        }
    }

    #[test]
    fn offering_explicit_moves_is_told_when_it_changes() {
        let s = AccessStates::new();
        let offers = Arc::new(Offers::default());
        let weak: Weak<Offers> = Arc::downgrade(&offers);
        s.watch(weak);
        s.set_explicit(Some(Arc::new(Refuse)));
        s.set_explicit(Some(Arc::new(Refuse)));
        s.set_explicit(None);
        s.set_explicit(None);
        assert_eq!(*offers.0.lock(), [true, false]);
        assert_eq!(s.generation(), 0, "no access state changed");
    }

    #[test]
    fn back_to_all_active_lifts_the_restriction() {
        let s = AccessStates::new();
        s.set(&[(1, AccessState::Unavailable)], Cause::Implicit);
        assert_eq!(s.restriction(1), Some(AccessState::Unavailable));
        s.set(&[(1, AccessState::ActiveNonOptimized)], Cause::Explicit);
        assert_eq!(s.restriction(1), None);
        assert_eq!(s.groups()[0].cause.status_code(), 1);
    }
}
