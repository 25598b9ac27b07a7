//! A long-lived pool of threads for work that may block (SCSI commands on
//! devices that wait for real I/O).
//!
//! Why not `spawn_blocking` per command: every hand-off there allocates a
//! task, takes the blocking pool's lock and wakes a thread, and on a busy
//! machine most of the CPU per I/O went into waking threads. Here workers
//! stay awake while work is queued and take it one job after another, and
//! what jobs produce is delivered in batches ([`Job::flush`]), so a burst
//! of commands costs a wake-up or two instead of several per command.
//!
//! How many workers run at once follows how long jobs take:
//! - Fast jobs (a page-cache copy takes a few µs): one worker drains the
//!   queue; waking more would only make them fight over the cores.
//! - Slow jobs (a disk read): each queued job gets a worker of its own
//!   (woken when the job is queued, or by a worker that takes a job while
//!   more wait), so the device sees the queue depth the initiator sent, and
//!   each result is delivered as soon as its job ends.
//! - Batchable jobs (reads of an O_DIRECT file): one worker takes all that
//!   are queued and runs them together ([`Job::run_batch`]); the device
//!   gets the depth from the batch instead of from threads.
//! - Stuck jobs (a SANITIZE running for seconds): a monitor notices work
//!   that has waited too long and wakes or starts another worker, so one
//!   long command never holds up the others.
//!
//! Workers beyond the first few leave after a while without work.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

/// Work the pool runs.
pub(crate) trait Job: Send + 'static {
    /// What a worker keeps between jobs until it delivers it.
    type Batch: Default + Send;

    /// Run the job, leaving its result in `batch`.
    fn run(self, batch: &mut Self::Batch);

    /// Whether this job runs better together with others of its kind
    /// ([`Job::run_batch`]), e.g. reads a device serves all at once.
    fn batchable(&self) -> bool {
        false
    }

    /// Run several batchable jobs together, leaving their results in
    /// `batch`.
    fn run_batch(jobs: Vec<Self>, batch: &mut Self::Batch)
    where
        Self: Sized,
    {
        for job in jobs {
            job.run(batch);
        }
    }

    /// Deliver everything in `batch` and leave it empty. Called before a
    /// worker waits for work and after every [`Limits::batch`] jobs.
    fn flush(batch: &mut Self::Batch);
}

/// How the pool sizes itself.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Workers that never leave.
    pub core: usize,
    /// Most workers at any time.
    pub max: usize,
    /// A job taking at least this long counts as slow; while most recent
    /// jobs are slow, more workers are woken for queued work.
    pub slow: Duration,
    /// When queued work sees no worker take any job for this long, another
    /// worker is woken or started.
    pub stall: Duration,
    /// A worker beyond `core` leaves after this long without work.
    pub idle_exit: Duration,
    /// Jobs run between two deliveries.
    pub batch: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            core: 2,
            max: 256,
            slow: Duration::from_micros(40),
            stall: Duration::from_millis(2),
            idle_exit: Duration::from_secs(10),
            batch: 16,
        }
    }
}

const SLOW_SCORE_MAX: u8 = 8;

/// Most batchable jobs one worker takes at once.
const MAX_BATCH: usize = 64;

struct State<J> {
    queue: VecDeque<J>,
    /// Jobs taken from the queue so far: the monitor's measure of progress.
    taken: u64,
    /// Worker threads alive.
    threads: usize,
    /// Workers waiting for work.
    idle: usize,
    /// Workers awake and not running a job (about to look at the queue),
    /// including those woken but not yet running.
    searching: usize,
    /// Workers inside a job.
    running: usize,
    /// Rises with every slow job and falls with every fast one, within
    /// 0..=SLOW_SCORE_MAX: jobs count as slow while it is at least half
    /// way. A count, not an average of durations, so that one job whose
    /// thread lost its core for a few ms does not make the pool think the
    /// device is slow.
    slow_score: u8,
    /// The monitor has been told there is work to watch.
    monitor_awake: bool,
    shutdown: bool,
}

impl<J> State<J> {
    fn jobs_are_slow(&self) -> bool {
        self.slow_score >= SLOW_SCORE_MAX / 2
    }

    fn record_service(&mut self, took: Duration, limits: &Limits) {
        self.slow_score = if took >= limits.slow {
            (self.slow_score + 1).min(SLOW_SCORE_MAX)
        } else {
            self.slow_score.saturating_sub(1)
        };
    }
}

struct Shared<J> {
    state: Mutex<State<J>>,
    /// Idle workers wait here.
    work: Condvar,
    /// The monitor waits here while there is nothing to watch.
    monitor: Condvar,
    limits: Limits,
    name: &'static str,
}

/// A pool of worker threads running jobs of type `J`.
pub(crate) struct Pool<J: Job> {
    shared: Arc<Shared<J>>,
}

impl<J: Job> Pool<J> {
    /// Start `limits.core` workers and the monitor. Threads are named
    /// after `name`.
    pub fn new(name: &'static str, limits: Limits) -> Pool<J> {
        let limits = Limits {
            core: limits.core.max(1),
            max: limits.max.max(limits.core.max(1)),
            batch: limits.batch.max(1),
            ..limits
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                taken: 0,
                threads: 0,
                idle: 0,
                searching: 0,
                running: 0,
                slow_score: 0,
                monitor_awake: false,
                shutdown: false,
            }),
            work: Condvar::new(),
            monitor: Condvar::new(),
            limits,
            name,
        });
        {
            let mut st = shared.state.lock();
            for _ in 0..limits.core {
                start_worker(&shared, &mut st);
            }
        }
        let monitor = shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("{name}-monitor"))
            .spawn(move || monitor_loop(&monitor));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the I/O pool monitor");
        }
        Pool { shared }
    }

    /// Queue a job.
    pub fn submit(&self, job: J) {
        let mut st = self.shared.state.lock();
        self.queue(&mut st, job);
    }

    /// Queue several jobs at once, so that a worker finds them together.
    pub fn submit_all(&self, jobs: impl IntoIterator<Item = J>) {
        let mut st = self.shared.state.lock();
        for job in jobs {
            self.queue(&mut st, job);
        }
    }

    fn queue(&self, st: &mut MutexGuard<'_, State<J>>, job: J) {
        let shared = &self.shared;
        // A batchable job needs just one worker awake: it takes all the
        // batchable jobs queued. Slow jobs: every queued job wants a worker
        // of its own now, so the device sees the initiator's queue depth
        // without waiting for a chain of wake-ups. Fast jobs: someone awake
        // will look at the queue, and a worker busy with them will be back
        // sooner than a sleeping one could wake.
        let batchable = job.batchable();
        st.queue.push_back(job);
        let covered = if batchable {
            st.searching > 0
        } else if st.jobs_are_slow() {
            st.searching >= st.queue.len()
        } else {
            st.searching > 0 || st.running > 0
        };
        if !covered {
            wake_or_start(shared, st);
        }
        if !st.monitor_awake {
            st.monitor_awake = true;
            shared.monitor.notify_one();
        }
    }

    #[cfg(test)]
    fn threads(&self) -> usize {
        self.shared.state.lock().threads
    }
}

impl<J: Job> Drop for Pool<J> {
    fn drop(&mut self) {
        let mut st = self.shared.state.lock();
        st.shutdown = true;
        self.shared.work.notify_all();
        self.shared.monitor.notify_all();
    }
}

/// Wake an idle worker, or start one if none is idle and the pool may grow.
fn wake_or_start<J: Job>(shared: &Arc<Shared<J>>, st: &mut MutexGuard<'_, State<J>>) {
    if st.idle > 0 && shared.work.notify_one() {
        // The woken worker's counts move here, so that a second submit
        // before it runs sees it as searching.
        st.idle -= 1;
        st.searching += 1;
    } else if st.threads < shared.limits.max {
        start_worker(shared, st);
    }
}

fn start_worker<J: Job>(shared: &Arc<Shared<J>>, st: &mut MutexGuard<'_, State<J>>) {
    let worker = shared.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("{}-{}", shared.name, st.threads))
        .spawn(move || worker_loop(&worker));
    match spawned {
        Ok(_) => {
            st.threads += 1;
            st.searching += 1;
        }
        Err(e) => tracing::warn!(error = %e, "cannot start an I/O worker"),
    }
}

fn worker_loop<J: Job>(shared: &Arc<Shared<J>>) {
    let limits = shared.limits;
    let mut batch = J::Batch::default();
    let mut unflushed = 0usize;
    // End of the previous job, the start of the next one when the worker
    // goes straight on: one clock read per job.
    let mut mark: Option<Instant> = None;
    let mut st = shared.state.lock();
    // This worker starts out counted as searching.
    loop {
        if let Some(job) = st.queue.pop_front() {
            let batchable = job.batchable();
            let mut together = Vec::new();
            if batchable {
                while together.len() + 1 < MAX_BATCH && st.queue.front().is_some_and(J::batchable) {
                    together.extend(st.queue.pop_front());
                }
            }
            st.taken += 1 + together.len() as u64;
            st.searching -= 1;
            st.running += 1;
            if st.jobs_are_slow() && st.queue.len() > st.searching {
                wake_or_start(shared, &mut st);
            }
            drop(st);
            let started = mark.unwrap_or_else(Instant::now);
            // A batchable job goes the batch's way even alone, so that
            // there is one path for its kind.
            if batchable {
                together.insert(0, job);
                J::run_batch(together, &mut batch);
            } else {
                job.run(&mut batch);
            }
            let ended = Instant::now();
            let took = ended - started;
            mark = Some(ended);
            unflushed += 1;
            // A slow job's result goes out at once: holding it for a batch
            // would add the next jobs' device time to its latency, and the
            // initiator could not refill its queue meanwhile.
            if unflushed >= limits.batch || took >= limits.slow {
                J::flush(&mut batch);
                unflushed = 0;
                mark = None;
            }
            st = shared.state.lock();
            st.running -= 1;
            st.searching += 1;
            st.record_service(took, &limits);
            continue;
        }
        if unflushed > 0 {
            // Deliver before sleeping; new work may arrive meanwhile.
            drop(st);
            J::flush(&mut batch);
            unflushed = 0;
            mark = None;
            st = shared.state.lock();
            continue;
        }
        if st.shutdown {
            st.searching -= 1;
            st.threads -= 1;
            return;
        }
        st.searching -= 1;
        st.idle += 1;
        let timed_out = shared.work.wait_for(&mut st, limits.idle_exit).timed_out();
        if timed_out {
            // Not woken: the counts are still ours to move.
            st.idle -= 1;
            if st.queue.is_empty() && st.threads > limits.core {
                st.threads -= 1;
                return;
            }
            st.searching += 1;
        }
    }
}

/// Watches queued work while there is any: when no worker has taken a job
/// for about `stall`, another worker is woken or started.
fn monitor_loop<J: Job>(shared: &Arc<Shared<J>>) {
    let limits = shared.limits;
    let tick = (limits.stall / 2).max(Duration::from_micros(200));
    let mut last_taken = 0u64;
    let mut still_ticks = 0u32;
    // Keep ticking for a while after the queue empties, so a steady stream
    // of work does not have to wake the monitor again and again.
    let linger = 64u32;
    let mut quiet = 0u32;
    let mut st = shared.state.lock();
    loop {
        if st.shutdown {
            return;
        }
        if !st.monitor_awake {
            shared.monitor.wait(&mut st);
            quiet = 0;
            continue;
        }
        shared.monitor.wait_for(&mut st, tick);
        let progressed = st.taken != last_taken;
        last_taken = st.taken;
        if st.queue.is_empty() || progressed {
            still_ticks = 0;
        } else {
            still_ticks += 1;
        }
        match st.queue.front() {
            Some(_) if still_ticks >= 2 => {
                quiet = 0;
                still_ticks = 0;
                if st.searching == 0 {
                    wake_or_start(shared, &mut st);
                }
            }
            Some(_) => quiet = 0,
            None => {
                quiet += 1;
                if quiet >= linger {
                    st.monitor_awake = false;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    /// Waits for its gate to open, sleeps, then reports its id; deliveries
    /// and the most jobs running at once are counted.
    struct Sleep {
        id: usize,
        nap: Duration,
        done: mpsc::Sender<Vec<usize>>,
        flushes: Arc<AtomicUsize>,
        gate: Arc<std::sync::RwLock<()>>,
        running: Arc<Running>,
    }

    #[derive(Default)]
    struct Running {
        now: AtomicUsize,
        most: AtomicUsize,
    }

    #[derive(Default)]
    struct Collected {
        ids: Vec<usize>,
        to: Option<mpsc::Sender<Vec<usize>>>,
        flushes: Option<Arc<AtomicUsize>>,
    }

    impl Job for Sleep {
        type Batch = Collected;

        fn run(self, batch: &mut Collected) {
            drop(self.gate.read());
            let now = self.running.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.running.most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(self.nap);
            self.running.now.fetch_sub(1, Ordering::SeqCst);
            batch.ids.push(self.id);
            batch.to = Some(self.done);
            batch.flushes = Some(self.flushes);
        }

        fn flush(batch: &mut Collected) {
            if let Some(to) = &batch.to {
                let _ = to.send(std::mem::take(&mut batch.ids));
            }
            if let Some(f) = &batch.flushes {
                f.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    fn collect(rx: &mpsc::Receiver<Vec<usize>>, n: usize) -> Vec<usize> {
        let mut all = Vec::new();
        while all.len() < n {
            let got = rx
                .recv_timeout(Duration::from_secs(10))
                .expect("jobs finish");
            all.extend(got);
        }
        all.sort_unstable();
        all
    }

    #[test]
    fn fast_jobs_are_delivered_in_batches() {
        let pool = Pool::new("test-fast", Limits::default());
        let (tx, rx) = mpsc::channel();
        let flushes = Arc::new(AtomicUsize::new(0));
        // Every job waits at the gate until all are queued, so workers find
        // a full queue whatever the scheduler does.
        let gate = Arc::new(std::sync::RwLock::new(()));
        let closed = gate.write().expect("gate");
        for id in 0..200 {
            pool.submit(Sleep {
                id,
                nap: Duration::ZERO,
                done: tx.clone(),
                flushes: flushes.clone(),
                gate: gate.clone(),
                running: Arc::default(),
            });
        }
        drop(closed);
        assert_eq!(collect(&rx, 200), (0..200).collect::<Vec<_>>());
        let f = flushes.load(Ordering::SeqCst);
        assert!(f < 200, "{f} deliveries for 200 jobs");
    }

    #[test]
    fn slow_jobs_run_concurrently() {
        let limits = Limits {
            core: 1,
            ..Limits::default()
        };
        let pool = Pool::new("test-slow", limits);
        let (tx, rx) = mpsc::channel();
        let flushes = Arc::new(AtomicUsize::new(0));
        let running = Arc::new(Running::default());
        for id in 0..16 {
            pool.submit(Sleep {
                id,
                nap: Duration::from_millis(50),
                done: tx.clone(),
                flushes: flushes.clone(),
                gate: Arc::default(),
                running: running.clone(),
            });
        }
        assert_eq!(collect(&rx, 16), (0..16).collect::<Vec<_>>());
        let most = running.most.load(Ordering::SeqCst);
        assert!(most > 1, "slow jobs ran one at a time");
        assert!(pool.threads() > 1);
    }

    #[test]
    fn a_stuck_job_does_not_hold_up_the_next() {
        let limits = Limits {
            core: 1,
            ..Limits::default()
        };
        let pool = Pool::new("test-stuck", limits);
        let (tx, rx) = mpsc::channel();
        let flushes = Arc::new(AtomicUsize::new(0));
        let stuck_gate = Arc::new(std::sync::RwLock::new(()));
        let closed = stuck_gate.write().expect("gate");
        let job = |id, gate| Sleep {
            id,
            nap: Duration::ZERO,
            done: tx.clone(),
            flushes: flushes.clone(),
            gate,
            running: Arc::default(),
        };
        // Job 1 is stuck until job 2 has come back.
        pool.submit(job(1, stuck_gate.clone()));
        // Submitted right behind it, while the pool still thinks jobs are fast.
        pool.submit(job(2, Arc::default()));
        let first = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("not held up");
        assert_eq!(first, vec![2]);
        drop(closed);
        assert_eq!(collect(&rx, 1), vec![1]);
    }

    /// Counts the jobs each batch call ran.
    struct Batched {
        id: usize,
        batches: mpsc::Sender<Vec<usize>>,
    }

    impl Job for Batched {
        type Batch = ();

        fn run(self, _: &mut ()) {
            let _ = self.batches.send(vec![self.id]);
        }

        fn batchable(&self) -> bool {
            true
        }

        fn run_batch(jobs: Vec<Self>, _: &mut ()) {
            if let Some(first) = jobs.first() {
                let _ = first.batches.send(jobs.iter().map(|j| j.id).collect());
            }
        }

        fn flush(_: &mut ()) {}
    }

    #[test]
    fn batchable_jobs_queued_together_run_in_one_batch() {
        let pool = Pool::new("test-batch", Limits::default());
        let (tx, rx) = mpsc::channel();
        let job = |id| Batched {
            id,
            batches: tx.clone(),
        };
        pool.submit_all((0..40).map(job));
        let mut seen = Vec::new();
        let mut calls = 0;
        while seen.len() < 40 {
            let batch = rx
                .recv_timeout(Duration::from_secs(10))
                .expect("batches run");
            calls += 1;
            seen.extend(batch);
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..40).collect::<Vec<_>>());
        // Queued under one lock: whichever worker wakes first finds them
        // all, and takes them in as few batches as MAX_BATCH allows.
        assert_eq!(calls, 1, "40 jobs queued together ran in {calls} batches");
    }
}
