//! Failover with a witness, a node's side (docs/ha.md, "Failover with a
//! witness").
//!
//! - A primary holds each mirror's lease from the witness and renews it
//!   on every tick. Writing without the peer needs the lease, with the
//!   generation it writes recorded by the witness before the first such
//!   write starts: a node that went on alone and then died has told the
//!   witness, which then refuses the other node as behind.
//! - The lease counts on this node's monotonic clock from when the claim
//!   was sent, less a margin, so it runs out here before it does at the
//!   witness. A lone write is acknowledged only while it holds; a
//!   primary with neither peer nor lease is demoted (its paths go
//!   standby). While the peer takes the writes, the peer is the second
//!   vote: losing the witness alone changes nothing.
//! - A secondary that lost its primary peer while in sync with it (or while
//!   primary) asks for the grant on every tick and, once granted (the
//!   holder's lease ran out, and this replica is as new as the last
//!   holder's), promotes itself.

use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use block::{DeviceError, ErrorClass};
use parking_lot::Mutex;
use serde::Serialize;

use crate::mirror::generations::Generations;
use crate::mirror::{Inner, Role};
use crate::witness::{Answer, BlockingClient, Request, Verdict, WitnessClient};

/// What this node's mirrors ask the witness for.
#[derive(Clone, Debug)]
pub struct FailoverSettings {
    pub witness: WitnessClient,
    pub peer: String,
    pub lease: Duration,
}

/// A lease this node holds, as it counts it.
#[derive(Clone, Copy, Debug)]
struct Held {
    /// When this node stops counting on it: sent + lease − margin.
    until: Instant,
    /// What the witness recorded with the grant.
    generations: Generations,
}

/// The witness's side of one mirror, for `ha status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WitnessStatus {
    pub address: String,
    pub lease_ms: u64,
    /// How long this node still counts on its lease.
    pub lease_left_ms: Option<u64>,
    /// Promoted with `--force`: writing alone without the witness.
    pub forced: bool,
    /// The witness's last answer, or why it gave none.
    pub last: Option<String>,
}

pub struct Failover {
    settings: FailoverSettings,
    client: BlockingClient,
    held: Mutex<HashMap<String, Held>>,
    forced: Mutex<HashSet<String>>,
    last: Mutex<HashMap<String, String>>,
    mirrors: Mutex<Vec<(String, Weak<Inner>)>>,
}

impl std::fmt::Debug for Failover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Failover")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

fn fenced(why: String) -> io::Error {
    DeviceError::new(ErrorClass::Fenced, why).into()
}

/// How much sooner than the witness this node stops counting on a lease:
/// room for the claim's time in flight and for clocks that drift.
pub fn margin(lease: Duration) -> Duration {
    lease / 4
}

fn describe(a: &io::Result<Answer>) -> String {
    match a {
        Ok(Answer::Verdict(Verdict::Granted { .. })) => "granted".into(),
        // Not how long: the text is logged each time it changes.
        Ok(Answer::Verdict(Verdict::Held { holder, .. })) => format!("held by {holder}"),
        Ok(Answer::Verdict(Verdict::Behind {
            holder,
            generations,
        })) => format!(
            "refused: this replica is behind what {holder} wrote (generation {:016x})",
            generations.current
        ),
        Ok(Answer::Verdict(Verdict::Released)) => "released".into(),
        Ok(Answer::Verdict(Verdict::Full)) => "refused: the witness keeps no more leases".into(),
        Ok(Answer::Refused(why)) => format!("refused: {why}"),
        Err(e) => format!("unreachable: {e}"),
    }
}

impl Failover {
    /// Starts the witness client and the thread that tends the mirrors.
    pub fn start(settings: FailoverSettings) -> io::Result<Arc<Failover>> {
        let client = BlockingClient::new(settings.witness.clone())?;
        let f = Arc::new(Failover {
            settings,
            client,
            held: Mutex::default(),
            forced: Mutex::default(),
            last: Mutex::default(),
            mirrors: Mutex::default(),
        });
        let weak = Arc::downgrade(&f);
        let tick = (f.settings.lease / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
        std::thread::Builder::new()
            .name("ha-failover".into())
            .spawn(move || {
                while let Some(f) = weak.upgrade() {
                    f.tend_all();
                    drop(f);
                    std::thread::sleep(tick);
                }
            })?;
        Ok(f)
    }

    pub fn settings(&self) -> &FailoverSettings {
        &self.settings
    }

    pub(crate) fn register(&self, name: &str, inner: Weak<Inner>) {
        let mut m = self.mirrors.lock();
        m.retain(|(n, w)| n != name && w.strong_count() > 0);
        m.push((name.to_string(), inner));
    }

    /// Asks for (or renews) `mirror`'s lease with `generations`; keeps
    /// what the witness granted.
    fn claim(&self, mirror: &str, generations: Generations) -> io::Result<Answer> {
        let sent = Instant::now();
        let answer = self.client.ask(Request::Claim {
            peer: self.settings.peer.clone(),
            mirror: mirror.to_string(),
            generations,
            lease: self.settings.lease,
        });
        if let Ok(Answer::Verdict(Verdict::Granted { lease, generations })) = &answer {
            let until = sent + lease.saturating_sub(margin(*lease));
            let held = Held {
                until,
                generations: *generations,
            };
            self.held.lock().insert(mirror.to_string(), held);
        }
        self.note(mirror, describe(&answer));
        answer
    }

    /// Keeps the witness's last answer, logging it when it changes.
    fn note(&self, mirror: &str, text: String) {
        let mut last = self.last.lock();
        if last.get(mirror) != Some(&text) {
            tracing::info!(mirror, "witness: {text}");
            last.insert(mirror.to_string(), text);
        }
    }

    fn holds(&self, mirror: &str, now: Instant) -> Option<Held> {
        self.held
            .lock()
            .get(mirror)
            .copied()
            .filter(|h| now < h.until)
    }

    /// Before the primary of `mirror` writes without its peer with
    /// `generations`: Ok only while this node holds the lease with
    /// those generations recorded by the witness (asked for now if
    /// needed; this blocks for at most the witness's timeout).
    pub fn alone(&self, mirror: &str, generations: &Generations) -> io::Result<()> {
        if self.forced.lock().contains(mirror) {
            return Ok(());
        }
        let recorded =
            |h: Option<Held>| h.is_some_and(|h| h.generations.current == generations.current);
        if recorded(self.holds(mirror, Instant::now())) {
            return Ok(());
        }
        let answer = self.claim(mirror, *generations);
        if recorded(self.holds(mirror, Instant::now())) {
            return Ok(());
        }
        Err(fenced(format!(
            "{mirror}: no write without the peer unless the witness grants it ({})",
            describe(&answer)
        )))
    }

    /// Whether a write `mirror` took alone may still be acknowledged.
    pub fn still_granted(&self, mirror: &str) -> bool {
        self.forced.lock().contains(mirror) || self.holds(mirror, Instant::now()).is_some()
    }

    /// The mirror was demoted: its lease is given up, a forced promotion
    /// ends.
    pub fn demoted(&self, mirror: &str) {
        self.forced.lock().remove(mirror);
        if self.held.lock().remove(mirror).is_some() {
            self.client.send(Request::Release {
                peer: self.settings.peer.clone(),
                mirror: mirror.to_string(),
            });
        }
    }

    /// The operator's override: `mirror` writes alone without the
    /// witness until it is demoted.
    pub fn force(&self, mirror: &str) {
        tracing::warn!(mirror, "forced: writing without the witness's grant");
        self.forced.lock().insert(mirror.to_string());
    }

    pub fn status(&self, mirror: &str) -> WitnessStatus {
        let now = Instant::now();
        WitnessStatus {
            address: self.settings.witness.address.clone(),
            lease_ms: self.settings.lease.as_millis() as u64,
            lease_left_ms: self
                .holds(mirror, now)
                .map(|h| (h.until - now).as_millis() as u64),
            forced: self.forced.lock().contains(mirror),
            last: self.last.lock().get(mirror).cloned(),
        }
    }

    fn tend_all(&self) {
        let mirrors: Vec<_> = self.mirrors.lock().clone();
        for (name, inner) in mirrors {
            if let Some(inner) = inner.upgrade() {
                self.tend(&name, &inner);
            }
        }
    }

    /// One tick for one mirror: renew, fence, or take over.
    fn tend(&self, name: &str, inner: &Inner) {
        let s = inner.standing();
        if s.closed {
            return;
        }
        match s.role {
            Role::Primary => {
                if self.forced.lock().contains(name) {
                    return;
                }
                let answer = self.claim(name, s.generations);
                if s.replicating {
                    return; // the peer's vote
                }
                let why = match answer {
                    Ok(Answer::Verdict(
                        Verdict::Held { holder, .. } | Verdict::Behind { holder, .. },
                    )) => {
                        format!("the witness gave the lease to {holder}")
                    }
                    _ if self.holds(name, Instant::now()).is_none() => {
                        "lost both the peer and the witness's lease".to_string()
                    }
                    _ => return,
                };
                tracing::warn!(mirror = name, "stepping down: {why}");
                if let Err(e) = inner.demote() {
                    tracing::error!(mirror = name, "stepping down failed: {e}");
                }
            }
            Role::Secondary => {
                if s.connected || !s.current_at_loss || s.inconsistent {
                    return;
                }
                if let Ok(Answer::Verdict(Verdict::Granted { .. })) =
                    self.claim(name, s.generations)
                {
                    match inner.promote() {
                        Ok(()) => tracing::warn!(
                            mirror = name,
                            "took over from {}: its lease ran out and the witness granted this node",
                            self.settings.peer
                        ),
                        Err(e) => {
                            tracing::error!(mirror = name, "taking over failed: {e}");
                            self.demoted(name);
                        }
                    }
                }
            }
        }
    }
}
