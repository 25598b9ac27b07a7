//! Copying to the peer what it lacks, while I/O goes on: region by
//! region (each kept from foreground writes while it is copied),
//! throttled, the bits cleared in batches once the peer flushed them.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use regions::RegionSet;

use super::wire::{self, Request};
use super::{Connection, Inner};
use crate::link::{lost, Session, MAX_DATA};

/// Regions copied between commits of the bitmap.
const BATCH: u64 = 64;

pub(super) fn run(inner: Arc<Inner>, session: Arc<Session>, epoch: u64, full: bool) {
    let outcome = copy(&inner, &session, epoch, full);
    let mut st = inner.state.lock();
    if st.connection != Connection::SyncSource || !inner.session_ok(&st, &session, epoch) {
        return; // the session ended; the next one decides again
    }
    match outcome {
        Ok(()) => {
            st.connection = Connection::Connected;
            st.problem = None;
            tracing::info!(
                mirror = %inner.name,
                "resync to {} ended: {} bytes copied",
                inner.peer_name,
                inner.resync_done.load(Ordering::Relaxed)
            );
            // Either side may have changed while the copy ran (a first
            // promotion here, the peer's adopted generations there): the
            // states heard since decide again.
            inner.evaluate(&mut st);
        }
        Err(e) => {
            tracing::warn!(mirror = %inner.name, "resync to {} stopped: {e}", inner.peer_name);
            st.peer_failed = true;
            st.connection = Connection::Refused;
            st.problem = Some(format!("resync to {} stopped: {e}", inner.peer_name));
        }
    }
}

fn ask(inner: &Inner, session: &Session, req: Request<'_>) -> io::Result<Vec<u8>> {
    let body = session
        .request(&inner.name, &req.encode())?
        .wait(inner.options.peer_timeout)?;
    wire::reply(&body, &inner.peer_name)
}

fn copy(inner: &Inner, session: &Session, epoch: u64, full: bool) -> io::Result<()> {
    let layout = inner.layout;
    let theirs = RegionSet::from_bytes(&ask(inner, session, Request::Bitmap)?, layout.regions);
    let todo = {
        let mut st = inner.state.lock();
        let mut todo = if full {
            RegionSet::full(layout.regions)
        } else {
            st.intent.differing()
        };
        todo.union(&theirs);
        // What the peer lacks stays on disk here until it has it.
        if st.intent.mark_out_of_sync(todo.iter()) {
            inner.persist_bitmap(&st)?;
        }
        todo
    };
    inner
        .resync_total
        .store(inner.bytes_of(&todo), Ordering::Relaxed);
    let started = Instant::now();
    let mut sent = 0u64;
    let mut batch = RegionSet::new(layout.regions);
    for (n, r) in todo.iter().enumerate() {
        let (start, len) = layout.region_range(r);
        if len > 0 {
            copy_region(inner, session, start, len)?;
        }
        batch.set(r, true);
        sent += len;
        inner.resync_copied.fetch_add(len, Ordering::Relaxed);
        inner.resync_done.fetch_add(len, Ordering::Relaxed);
        throttle(&inner.resync_rate, sent, started);
        if (n as u64 + 1).is_multiple_of(BATCH) {
            commit(inner, session, epoch, &mut batch)?;
        }
    }
    commit(inner, session, epoch, &mut batch)?;
    // This node's bitmap base becomes history before the peer adopts the
    // generation: should the peer not hear of it, the two compare as
    // newer and older-than-the-bitmap, which a full resync answers.
    let generations = {
        let mut st = inner.state.lock();
        if !inner.session_ok(&st, session, epoch) {
            return Err(lost(&inner.peer_name));
        }
        st.header.generations.synced_as_source();
        inner.persist_header(&mut st)?;
        st.header.generations
    };
    ask(inner, session, Request::ResyncDone { generations })?;
    Ok(())
}

fn copy_region(inner: &Inner, session: &Session, start: u64, len: u64) -> io::Result<()> {
    let _alone = inner.locks.copy(start / inner.layout.region_size);
    let mut buf = vec![0u8; len as usize];
    inner.local.read_at(&mut buf, start)?;
    let gen = inner.state.lock().header.generations.current;
    let pending: Vec<_> = buf
        .chunks(MAX_DATA)
        .enumerate()
        .map(|(i, data)| {
            let req = Request::Write {
                gen,
                offset: start + (i * MAX_DATA) as u64,
                fua: false,
                resync: true,
                data,
            };
            session.request(&inner.name, &req.encode())
        })
        .collect();
    inner.wait_all(pending)
}

/// The peer flushed what was copied: those regions are in sync.
fn commit(inner: &Inner, session: &Session, epoch: u64, batch: &mut RegionSet) -> io::Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    ask(inner, session, Request::Flush)?;
    let mut st = inner.state.lock();
    if !inner.session_ok(&st, session, epoch) {
        return Err(lost(&inner.peer_name));
    }
    st.intent.clear_synced(batch);
    inner.persist_bitmap(&st)?;
    *batch = RegionSet::new(inner.layout.regions);
    Ok(())
}

/// Sleeps until `sent` bytes are within `rate` since `started`, in
/// short steps so that a changed rate takes effect soon.
fn throttle(rate: &AtomicU64, sent: u64, started: Instant) {
    loop {
        let r = rate.load(Ordering::Relaxed);
        if r == 0 {
            return;
        }
        let due = Duration::from_secs_f64(sent as f64 / r as f64);
        match due.checked_sub(started.elapsed()) {
            Some(wait) if !wait.is_zero() => {
                std::thread::sleep(wait.min(Duration::from_millis(100)))
            }
            _ => return,
        }
    }
}
