//! Runs the running configuration's `[[schedule]]`s: once a second each
//! schedule's plan (crates/schedule) is carried out on its pool, and
//! clones named in `refresh` are re-pointed at the newest snapshot once no
//! session uses them. `GET /v1/schedules` reports what each did last.
//!
//! Runs are on the blocking pool, one at a time: a snapshot is a metadata
//! commit of the pool, and schedules are minutes or days apart.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pool::{Pool, VolumeInfo, VolumeKind};
use serde_json::{json, Value};

use crate::admin::Admin;

/// What one schedule did, for the API and `status`.
#[derive(Clone, Debug, Default)]
struct Outcome {
    last_run: Option<i64>,
    newest: Option<String>,
    taken: u64,
    pruned: u64,
    /// Snapshots past `keep` that a clone still depends on.
    held: Vec<String>,
    /// Clones waiting for their sessions to end before a refresh.
    waiting: Vec<String>,
    error: Option<String>,
}

#[derive(Default)]
pub struct Scheduler {
    /// By (pool, volume).
    outcomes: Mutex<BTreeMap<(String, String), Outcome>>,
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// What a schedule needs of the daemon, read under its lock at once.
struct Job {
    schedule: control::Schedule,
    pool: std::io::Result<Arc<Pool>>,
    /// Of each clone to refresh: whether a logged-in session may use it.
    in_use: BTreeMap<String, bool>,
}

impl Scheduler {
    /// Run every schedule once a second until the process ends.
    pub async fn run(self: Arc<Self>, admin: Arc<Admin>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            let (me, admin) = (self.clone(), admin.clone());
            let _ = tokio::task::spawn_blocking(move || me.run_due(&admin)).await;
        }
    }

    fn jobs(admin: &Admin) -> Vec<Job> {
        let current = admin.current.lock().unwrap_or_else(|p| p.into_inner());
        let serving = |pool: &str, clone: &str| {
            current
                .runtime
                .exporter_of(pool, clone)
                .map(|device| current.config.targets_serving(device))
                .unwrap_or_default()
                .iter()
                .any(|t| admin.server.sessions_on(t) > 0)
        };
        current
            .config
            .schedules
            .iter()
            .map(|s| Job {
                pool: current.runtime.pool(&s.pool),
                in_use: s
                    .refresh
                    .iter()
                    .map(|c| (c.clone(), serving(&s.pool, c)))
                    .collect(),
                schedule: s.clone(),
            })
            .collect()
    }

    fn run_due(&self, admin: &Admin) {
        let jobs = Self::jobs(admin);
        let mut outcomes = self.outcomes.lock().unwrap_or_else(|p| p.into_inner());
        // Schedules removed from the configuration are forgotten.
        outcomes.retain(|(p, v), _| {
            jobs.iter()
                .any(|j| j.schedule.pool == *p && j.schedule.spec.volume == *v)
        });
        for job in jobs {
            let key = (job.schedule.pool.clone(), job.schedule.spec.volume.clone());
            let outcome = outcomes.entry(key).or_default();
            let result = match &job.pool {
                Ok(pool) => run_one(&job, pool, outcome),
                Err(e) => Err(format!("pool {}: {e}", job.schedule.pool)),
            };
            if let Err(e) = result {
                if outcome.error.as_ref() != Some(&e) {
                    tracing::warn!(volume = %job.schedule.spec.volume, error = %e, "scheduled snapshot failed");
                }
                outcome.error = Some(e);
            } else {
                outcome.error = None;
            }
        }
    }

    /// `GET /v1/schedules`.
    pub fn report(&self, admin: &Admin) -> Value {
        let schedules = {
            let current = admin.current.lock().unwrap_or_else(|p| p.into_inner());
            current.config.schedules.clone()
        };
        let outcomes = self.outcomes.lock().unwrap_or_else(|p| p.into_inner());
        let now = now();
        let list: Vec<Value> = schedules
            .iter()
            .map(|s| {
                let key = (s.pool.clone(), s.spec.volume.clone());
                let o = outcomes.get(&key).cloned().unwrap_or_default();
                json!({
                    "pool": s.pool,
                    "volume": s.spec.volume,
                    "every_seconds": s.spec.every.as_secs(),
                    "at_seconds": s.spec.at.map(|a| a.as_secs()),
                    "keep": s.spec.keep,
                    "refresh": s.refresh,
                    "last_run": o.last_run,
                    "next_due": schedule::next_due(&s.spec, now),
                    "newest_snapshot": o.newest,
                    "taken": o.taken,
                    "pruned": o.pruned,
                    "held": o.held,
                    "waiting": o.waiting,
                    "error": o.error,
                })
            })
            .collect();
        json!({ "schedules": list })
    }
}

fn snapshots_of<'a>(
    vols: &'a [VolumeInfo],
    volume: &'a str,
) -> impl Iterator<Item = &'a VolumeInfo> {
    vols.iter()
        .filter(move |v| v.kind == VolumeKind::Snapshot && v.parent.as_deref() == Some(volume))
}

fn run_one(job: &Job, pool: &Pool, outcome: &mut Outcome) -> Result<(), String> {
    let spec = &job.schedule.spec;
    let volume = spec.volume.as_str();
    let err = |what: &str, name: &str, e: std::io::Error| format!("{what} {name}: {e}");
    let vols = pool.volumes();
    if !vols.iter().any(|v| v.name == volume) {
        return Err(format!("pool {} has no volume {volume}", job.schedule.pool));
    }
    let names: Vec<String> = snapshots_of(&vols, volume)
        .map(|v| v.name.clone())
        .collect();
    let depended_on = |n: &str| vols.iter().any(|v| v.parent.as_deref() == Some(n));
    let now = now();
    let plan = schedule::plan(spec, now, &names, depended_on);
    if let Some(name) = &plan.take {
        pool.snapshot(volume, name)
            .map_err(|e| err("snapshot", name, e))?;
        outcome.last_run = Some(now);
        outcome.taken += 1;
        tracing::info!(pool = %job.schedule.pool, volume, snapshot = %name, "scheduled snapshot taken");
    }
    for name in &plan.prune {
        pool.delete(name).map_err(|e| err("prune", name, e))?;
        outcome.pruned += 1;
        tracing::info!(volume, snapshot = %name, keep = spec.keep, "scheduled snapshot pruned");
    }
    for name in plan.held.iter().filter(|n| !outcome.held.contains(n)) {
        tracing::info!(volume, snapshot = %name, "snapshot past keep kept: a clone depends on it");
    }
    outcome.held = plan.held;
    let newest = plan.take.or_else(|| {
        names
            .iter()
            .filter_map(|n| schedule::taken_at(volume, n).map(|t| (t, n)))
            .max()
            .map(|(_, n)| n.clone())
    });
    outcome.newest = newest.clone();
    let Some(newest) = newest else {
        return Ok(());
    };
    let mut waiting = Vec::new();
    for clone in &job.schedule.refresh {
        let info = pool
            .volume_info(clone)
            .map_err(|e| err("refresh", clone, e))?;
        if info.parent.as_deref() == Some(newest.as_str()) {
            continue;
        }
        if job.in_use.get(clone).copied().unwrap_or(false) {
            if !outcome.waiting.contains(clone) {
                tracing::info!(clone = %clone, snapshot = %newest, "clone refresh waits: a logged-in session may use it");
            }
            waiting.push(clone.clone());
            continue;
        }
        pool.refresh_clone(clone, &newest)
            .map_err(|e| err("refresh", clone, e))?;
        tracing::info!(clone = %clone, snapshot = %newest, "clone refreshed");
    }
    outcome.waiting = waiting;
    Ok(())
}
