//! Runs the running configuration's `[[schedule]]`s: once a second each
//! schedule's plan (crates/schedule) is carried out on its pool, and
//! clones named in `refresh` are re-pointed at the newest snapshot once no
//! session uses them. `GET /v1/schedules` reports what each did last.
//!
//! A run with something to do is a job of its pool (`scheduled snapshot`
//! in `GET /v1/pools/{pool}/jobs`), one at a time per schedule.

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
    /// The job carrying out the last run, while it runs.
    job: Option<u64>,
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

    fn read_schedules(admin: &Admin) -> Vec<Job> {
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

    fn run_due(self: &Arc<Self>, admin: &Admin) {
        let jobs = Self::read_schedules(admin);
        let mut outcomes = self.outcomes.lock().unwrap_or_else(|p| p.into_inner());
        // Schedules removed from the configuration are forgotten.
        outcomes.retain(|(p, v), _| {
            jobs.iter()
                .any(|j| j.schedule.pool == *p && j.schedule.spec.volume == *v)
        });
        for job in jobs {
            let key = (job.schedule.pool.clone(), job.schedule.spec.volume.clone());
            let outcome = outcomes.entry(key.clone()).or_default();
            if outcome.job.is_some_and(|id| still_running(&admin.jobs, id)) {
                continue;
            }
            let pool = match &job.pool {
                Ok(pool) => pool.clone(),
                Err(e) => {
                    let e = format!("pool {}: {e}", job.schedule.pool);
                    record(outcome, Err(e), &job.schedule.spec.volume);
                    continue;
                }
            };
            if !has_work(&job, &pool, outcome) {
                continue;
            }
            let me = self.clone();
            let volume = job.schedule.spec.volume.clone();
            let work = Box::new(move |pool: &Pool, _: &mut dyn FnMut(u64, u64)| {
                let mut outcome = me.outcome(&key);
                let result = run_one(&job, pool, &mut outcome);
                record(&mut outcome, result.clone(), &job.schedule.spec.volume);
                me.outcomes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(
                        key,
                        Outcome {
                            job: None,
                            ..outcome
                        },
                    );
                result.map_err(std::io::Error::other)
            });
            match admin.jobs.start(pool, "scheduled snapshot", &volume, work) {
                Ok(started) => outcome.job = started["id"].as_u64(),
                Err(e) => record(outcome, Err(e), &volume),
            }
        }
    }

    fn outcome(&self, key: &(String, String)) -> Outcome {
        let outcomes = self.outcomes.lock().unwrap_or_else(|p| p.into_inner());
        outcomes.get(key).cloned().unwrap_or_default()
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

fn still_running(jobs: &crate::volume_api::jobs::Jobs, id: u64) -> bool {
    jobs.get(id).is_some_and(|j| j["state"] == "running")
}

/// Keep the last error, logging it when it changes.
fn record(outcome: &mut Outcome, result: Result<(), String>, volume: &str) {
    match result {
        Err(e) => {
            if outcome.error.as_ref() != Some(&e) {
                tracing::warn!(volume, error = %e, "scheduled snapshot failed");
            }
            outcome.error = Some(e);
        }
        Ok(()) => outcome.error = None,
    }
}

/// The plan for now, and the newest scheduled snapshot before it runs.
fn plan_now(spec: &schedule::Spec, vols: &[VolumeInfo]) -> (schedule::Plan, Option<String>) {
    let volume = spec.volume.as_str();
    let names: Vec<String> = vols
        .iter()
        .filter(|v| v.kind == VolumeKind::Snapshot && v.parent.as_deref() == Some(volume))
        .map(|v| v.name.clone())
        .collect();
    let depended_on = |n: &str| vols.iter().any(|v| v.parent.as_deref() == Some(n));
    let newest = names
        .iter()
        .filter_map(|n| schedule::taken_at(volume, n).map(|t| (t, n)))
        .max()
        .map(|(_, n)| n.clone());
    (schedule::plan(spec, now(), &names, depended_on), newest)
}

/// Clones of `job` not yet on `newest`, each with whether a logged-in
/// session may use it (then its refresh waits).
fn behind<'a>(
    job: &'a Job,
    vols: &'a [VolumeInfo],
    newest: &'a str,
) -> impl Iterator<Item = (&'a String, bool)> {
    job.schedule
        .refresh
        .iter()
        .filter(move |c| {
            vols.iter()
                .any(|v| v.name == **c && v.parent.as_deref() != Some(newest))
        })
        .map(|c| (c, job.in_use.get(c).copied().unwrap_or(false)))
}

/// Clones of `job` not yet on `newest` that no session uses now.
fn clones_to_refresh<'a>(
    job: &'a Job,
    vols: &'a [VolumeInfo],
    newest: &'a str,
) -> impl Iterator<Item = &'a String> {
    behind(job, vols, newest)
        .filter(|&(_, in_use)| !in_use)
        .map(|(c, _)| c)
}

/// Whether a run would change anything now; notes what waits or is
/// missing without a job.
fn has_work(job: &Job, pool: &Pool, outcome: &mut Outcome) -> bool {
    let spec = &job.schedule.spec;
    let vols = pool.volumes();
    if !vols.iter().any(|v| v.name == spec.volume) {
        let e = format!("pool {} has no volume {}", job.schedule.pool, spec.volume);
        record(outcome, Err(e), &spec.volume);
        return false;
    }
    let (plan, newest) = plan_now(spec, &vols);
    if plan.take.is_some() || !plan.prune.is_empty() {
        return true;
    }
    let Some(newest) = newest else {
        return false;
    };
    let waiting: Vec<String> = behind(job, &vols, &newest)
        .filter(|&(_, in_use)| in_use)
        .map(|(c, _)| c.clone())
        .collect();
    for clone in waiting.iter().filter(|c| !outcome.waiting.contains(c)) {
        tracing::info!(clone = %clone, snapshot = %newest, "clone refresh waits: a logged-in session may use it");
    }
    outcome.waiting = waiting;
    let refresh = clones_to_refresh(job, &vols, &newest).next().is_some();
    refresh
}

fn run_one(job: &Job, pool: &Pool, outcome: &mut Outcome) -> Result<(), String> {
    let spec = &job.schedule.spec;
    let volume = spec.volume.as_str();
    let err = |what: &str, name: &str, e: std::io::Error| format!("{what} {name}: {e}");
    let vols = pool.volumes();
    let (plan, newest) = plan_now(spec, &vols);
    if let Some(name) = &plan.take {
        pool.snapshot(volume, name)
            .map_err(|e| err("snapshot", name, e))?;
        outcome.last_run = Some(now());
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
    let newest = plan.take.or(newest);
    outcome.newest = newest.clone();
    let Some(newest) = newest else {
        return Ok(());
    };
    let vols = pool.volumes();
    for clone in clones_to_refresh(job, &vols, &newest) {
        pool.refresh_clone(clone, &newest)
            .map_err(|e| err("refresh", clone, e))?;
        tracing::info!(clone = %clone, snapshot = %newest, "clone refreshed");
    }
    Ok(())
}
