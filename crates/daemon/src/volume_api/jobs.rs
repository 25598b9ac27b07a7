//! Long pool operations (preallocating a thick volume, deleting a
//! volume) run on a thread of their own as jobs; a client polls a job for
//! its progress. Jobs live in this process only: a restart forgets them
//! (each step of a job is committed, so the pool stays consistent). The
//! daemon keeps one table, and so does a CLI process working on the pools
//! of a stopped daemon.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use pool::Pool;
use serde_json::{json, Value};

/// Jobs kept for polling; the oldest finished ones go first.
const KEPT: usize = 256;
/// Jobs running at once; more are refused until one finishes.
const RUNNING: usize = 16;

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Done,
    Failed,
}

struct Job {
    pool: String,
    operation: &'static str,
    volume: String,
    done: u64,
    total: u64,
    state: State,
    error: Option<String>,
}

#[derive(Default)]
struct List {
    next: u64,
    list: BTreeMap<u64, Job>,
}

/// The jobs of one process.
#[derive(Default)]
pub struct Jobs(Mutex<List>);

/// What a long operation does, told where to report its progress.
pub type Work = Box<dyn FnOnce(&Pool, &mut dyn FnMut(u64, u64)) -> std::io::Result<()> + Send>;

impl Jobs {
    fn lock(&self) -> MutexGuard<'_, List> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts `work` on `pool` as a job; its JSON, or why it cannot start.
    pub fn start(
        self: &Arc<Self>,
        pool: Arc<Pool>,
        operation: &'static str,
        volume: &str,
        work: Work,
    ) -> Result<Value, String> {
        let id = {
            let mut all = self.lock();
            let running = all
                .list
                .values()
                .filter(|j| j.state == State::Running)
                .count();
            if running >= RUNNING {
                return Err(format!("{running} jobs are running; wait for one to end"));
            }
            while all.list.len() >= KEPT {
                let Some(oldest) = all
                    .list
                    .iter()
                    .find(|(_, j)| j.state != State::Running)
                    .map(|(&id, _)| id)
                else {
                    break;
                };
                all.list.remove(&oldest);
            }
            all.next += 1;
            let id = all.next;
            all.list.insert(
                id,
                Job {
                    pool: pool.name().to_string(),
                    operation,
                    volume: volume.to_string(),
                    done: 0,
                    total: 0,
                    state: State::Running,
                    error: None,
                },
            );
            id
        };
        let table = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("job-{id}"))
            .spawn(move || {
                let mut progress = |done: u64, total: u64| {
                    if let Some(j) = table.lock().list.get_mut(&id) {
                        j.done = done;
                        j.total = total;
                    }
                };
                let result = work(&pool, &mut progress);
                // Closed (if nothing else holds it) before the job is seen to
                // end, so whoever waited for it can open the pool again.
                drop(pool);
                if let Some(j) = table.lock().list.get_mut(&id) {
                    match result {
                        Ok(()) => j.state = State::Done,
                        Err(e) => {
                            j.state = State::Failed;
                            j.error = Some(e.to_string());
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            self.lock().list.remove(&id);
            return Err(format!("cannot start the job: {e}"));
        }
        Ok(self.get(id).unwrap_or(Value::Null))
    }
}

fn describe(id: u64, j: &Job) -> Value {
    let percent = if j.state == State::Done {
        100
    } else {
        j.done.saturating_mul(100).checked_div(j.total).unwrap_or(0)
    };
    json!({
        "id": id,
        "pool": j.pool,
        "operation": j.operation,
        "volume": j.volume,
        "done": j.done,
        "total": j.total,
        "percent": percent,
        "state": match j.state {
            State::Running => "running",
            State::Done => "done",
            State::Failed => "failed",
        },
        "error": j.error,
    })
}

impl Jobs {
    /// One job's JSON.
    pub fn get(&self, id: u64) -> Option<Value> {
        self.lock().list.get(&id).map(|j| describe(id, j))
    }

    /// The jobs of one pool, oldest first.
    pub fn of_pool(&self, pool: &str) -> Vec<Value> {
        self.lock()
            .list
            .iter()
            .filter(|(_, j)| j.pool == pool)
            .map(|(&id, j)| describe(id, j))
            .collect()
    }
}
