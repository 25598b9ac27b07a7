//! Whether this client may write the image: the exclusive-lock state seen
//! by the device, so that two gateways never write one image unknowingly.
//!
//! A device starts as the lock's owner, or on standby when another client
//! holds it. On standby each write first tries to take the lock (so the
//! device takes over when the other client goes away). An owner checks
//! before each write that librbd still sees it as owner; once it is not
//! (the lock was broken, the client fenced) the device has *lost* the lock
//! and refuses every write until the lock is taken again on purpose: data
//! written after another client took over would be overwritten or would
//! overwrite its writes.

use std::io;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Who may write, as far as this device knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockStatus {
    /// This device holds the exclusive lock and writes.
    Owner,
    /// Another client held the lock when this device last tried; writes
    /// try to take it.
    Standby,
    /// This device held the lock and lost it; writes are refused.
    Lost,
}

/// The librbd calls the state machine drives (an open image, or a
/// scripted one in tests).
pub(crate) trait LockOps {
    fn acquire(&self) -> io::Result<()>;
    fn is_owner(&self) -> io::Result<bool>;
}

/// How long a standby device waits after a failed attempt before writes
/// try to take the lock again; in between they fail at once instead of
/// each asking the cluster.
const STANDBY_RETRY: Duration = Duration::from_millis(500);

pub(crate) struct ExclusiveLock {
    state: Mutex<State>,
}

struct State {
    status: LockStatus,
    /// On standby: no new attempt before this.
    next_attempt: Instant,
}

/// The error of a write this device may not make.
fn refused() -> io::Error {
    io::Error::from_raw_os_error(libc::EROFS)
}

/// Errors with which librbd says this client is no longer the writer:
/// EROFS (the lock is gone and it will not take it back by itself),
/// ESHUTDOWN (Ceph's EBLOCKLISTED: the client was fenced).
pub(crate) fn means_lock_lost(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EROFS) | Some(libc::ESHUTDOWN))
}

impl ExclusiveLock {
    /// Tries to take the lock: an owner if that worked, on standby if
    /// another client has it.
    pub(crate) fn take(ops: &impl LockOps) -> Self {
        let status = match ops.acquire() {
            Ok(()) => LockStatus::Owner,
            Err(_) => LockStatus::Standby,
        };
        ExclusiveLock {
            state: Mutex::new(State {
                status,
                next_attempt: Instant::now() + STANDBY_RETRY,
            }),
        }
    }

    /// Ok when a write may go to the image now.
    pub(crate) fn before_write(&self, ops: &impl LockOps) -> io::Result<()> {
        let mut state = self.state.lock();
        match state.status {
            LockStatus::Owner => {
                if ops.is_owner()? {
                    return Ok(());
                }
                state.status = LockStatus::Lost;
                tracing::warn!("lost the RBD image's exclusive lock; refusing writes");
                Err(refused())
            }
            LockStatus::Standby => {
                if Instant::now() < state.next_attempt {
                    return Err(refused());
                }
                match ops.acquire() {
                    Ok(()) => {
                        state.status = LockStatus::Owner;
                        tracing::info!("took the RBD image's exclusive lock");
                        Ok(())
                    }
                    Err(_) => {
                        state.next_attempt = Instant::now() + STANDBY_RETRY;
                        Err(refused())
                    }
                }
            }
            LockStatus::Lost => Err(refused()),
        }
    }

    /// Notes a failed write: one that says the lock is gone loses it.
    /// Whether [`ExclusiveLock::before_write`] may try to take the lock,
    /// which can wait for another client: on standby.
    pub(crate) fn may_wait(&self) -> bool {
        self.state.lock().status == LockStatus::Standby
    }

    pub(crate) fn after_write_error(&self, e: &io::Error) {
        let mut state = self.state.lock();
        if state.status == LockStatus::Owner && means_lock_lost(e) {
            state.status = LockStatus::Lost;
            tracing::warn!("an RBD write failed with {e}: lock lost; refusing writes");
        }
    }

    /// The status, after checking that an owner still owns the lock.
    pub(crate) fn status(&self, ops: &impl LockOps) -> LockStatus {
        let mut state = self.state.lock();
        if state.status == LockStatus::Owner && !ops.is_owner().unwrap_or(false) {
            state.status = LockStatus::Lost;
        }
        state.status
    }

    /// Notes that the lock was given up on purpose: the next write takes
    /// it again.
    pub(crate) fn released(&self) {
        let mut state = self.state.lock();
        state.status = LockStatus::Standby;
        state.next_attempt = Instant::now();
    }

    /// Takes the lock again after it was lost or while on standby, on
    /// purpose (an operator, or a failover decision).
    pub(crate) fn reacquire(&self, ops: &impl LockOps) -> io::Result<()> {
        let mut state = self.state.lock();
        ops.acquire()?;
        state.status = LockStatus::Owner;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A lock that another client may hold, and that this one may lose.
    struct Scripted {
        free: Cell<bool>,
        owner: Cell<bool>,
        acquires: Cell<u32>,
    }

    // Tests are single-threaded; the trait wants no Sync.
    impl LockOps for Scripted {
        fn acquire(&self) -> io::Result<()> {
            self.acquires.set(self.acquires.get() + 1);
            if self.free.get() || self.owner.get() {
                self.owner.set(true);
                self.free.set(false);
                Ok(())
            } else {
                Err(io::Error::from_raw_os_error(libc::EBUSY))
            }
        }
        fn is_owner(&self) -> io::Result<bool> {
            Ok(self.owner.get())
        }
    }

    fn lock(free: bool) -> Scripted {
        Scripted {
            free: Cell::new(free),
            owner: Cell::new(false),
            acquires: Cell::new(0),
        }
    }

    fn assert_refused(r: io::Result<()>) {
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EROFS));
    }

    #[test]
    fn a_free_lock_is_taken_and_writes_go() {
        let ops = lock(true);
        let l = ExclusiveLock::take(&ops);
        assert_eq!(l.status(&ops), LockStatus::Owner);
        l.before_write(&ops).unwrap();
    }

    #[test]
    fn no_write_after_the_lock_is_lost_even_if_it_is_free_again() {
        let ops = lock(true);
        let l = ExclusiveLock::take(&ops);
        ops.owner.set(false); // broken by another client
        assert_refused(l.before_write(&ops));
        ops.free.set(true);
        assert_refused(l.before_write(&ops));
        assert_eq!(l.status(&ops), LockStatus::Lost);
        l.reacquire(&ops).unwrap();
        l.before_write(&ops).unwrap();
    }

    #[test]
    fn standby_takes_the_lock_once_it_is_free() {
        let ops = lock(false);
        let l = ExclusiveLock::take(&ops);
        assert_eq!(l.status(&ops), LockStatus::Standby);
        assert_refused(l.before_write(&ops));
        ops.free.set(true);
        // Within the retry interval writes fail without asking again.
        let asked = ops.acquires.get();
        assert_refused(l.before_write(&ops));
        assert_eq!(ops.acquires.get(), asked);
        l.state.lock().next_attempt = Instant::now();
        l.before_write(&ops).unwrap();
        assert_eq!(l.status(&ops), LockStatus::Owner);
    }

    #[test]
    fn a_write_failing_as_fenced_loses_the_lock() {
        let ops = lock(true);
        let l = ExclusiveLock::take(&ops);
        l.after_write_error(&io::Error::from_raw_os_error(libc::EIO));
        assert_eq!(l.status(&ops), LockStatus::Owner);
        l.after_write_error(&io::Error::from_raw_os_error(libc::ESHUTDOWN));
        assert_refused(l.before_write(&ops));
    }
}
