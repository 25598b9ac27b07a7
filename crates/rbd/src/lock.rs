//! Whether this client may write the image: the exclusive-lock state seen
//! by the device, so that two gateways never write one image unknowingly.
//!
//! A device starts as the lock's owner, or on standby when another client
//! holds it. On standby each write first tries to take the lock (so the
//! device takes over when the other client goes away).
//!
//! An owner does not ask librbd before each write (that call took about
//! 67 µs, more than the rest of a gateway's work on a 4K write). The
//! cluster fences instead: the lock is taken in librbd's managed mode, so
//! librbd never hands it over by itself, and a client that breaks it
//! (`rbd lock rm`, a failover) blocklists this one first, after which the
//! OSDs refuse its requests. Such a refusal (`ESHUTDOWN`, Ceph's
//! `EBLOCKLISTED`), or librbd's own `EROFS` once it knows the lock is gone,
//! makes the device *lost*: that write and every later one fail with
//! `EROFS` (DATA PROTECT), never as a success, until the lock is taken
//! again on purpose: data written after another client took over would be
//! overwritten or would overwrite its writes.

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
/// scripted one in tests). `is_owner` is asked only for the status shown
/// to people, never on the I/O path.
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

    /// Ok when a write may go to the image now: an owner goes without
    /// asking librbd (the cluster refuses the writes of a fenced client).
    pub(crate) fn before_write(&self, ops: &impl LockOps) -> io::Result<()> {
        let mut state = self.state.lock();
        match state.status {
            LockStatus::Owner => Ok(()),
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

    /// Ok when a flush may go to the image: not once the lock is lost,
    /// when writes librbd's cache took can no longer reach the image, so
    /// no flush may say they did.
    pub(crate) fn before_flush(&self) -> io::Result<()> {
        match self.state.lock().status {
            LockStatus::Lost => Err(refused()),
            LockStatus::Owner | LockStatus::Standby => Ok(()),
        }
    }

    /// Whether [`ExclusiveLock::before_write`] may try to take the lock,
    /// which can wait for another client: on standby.
    pub(crate) fn may_wait(&self) -> bool {
        self.state.lock().status == LockStatus::Standby
    }

    /// Notes a failed write or flush, and returns the error to report: one
    /// that says this client was fenced or the lock is gone loses the lock
    /// and is reported as `EROFS`, as every later write will be.
    pub(crate) fn after_write_error(&self, e: io::Error) -> io::Error {
        if !means_lock_lost(&e) {
            return e;
        }
        let mut state = self.state.lock();
        if state.status == LockStatus::Owner {
            state.status = LockStatus::Lost;
            tracing::warn!("an RBD write failed with {e}: lock lost; refusing writes");
        }
        refused()
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
                              // Shown as lost, and writes refused from then on.
        assert_eq!(l.status(&ops), LockStatus::Lost);
        assert_refused(l.before_write(&ops));
        ops.free.set(true);
        assert_refused(l.before_write(&ops));
        l.reacquire(&ops).unwrap();
        l.before_write(&ops).unwrap();
    }

    #[test]
    fn an_owner_writes_without_asking_librbd() {
        struct NeverAsk;
        impl LockOps for NeverAsk {
            fn acquire(&self) -> io::Result<()> {
                Ok(())
            }
            fn is_owner(&self) -> io::Result<bool> {
                panic!("asked librbd on the write path")
            }
        }
        let l = ExclusiveLock::take(&NeverAsk);
        for _ in 0..3 {
            l.before_write(&NeverAsk).unwrap();
        }
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
        let e = l.after_write_error(io::Error::from_raw_os_error(libc::EIO));
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "other errors pass");
        assert_eq!(l.status(&ops), LockStatus::Owner);
        // Blocklisted: reported as refused, and so is every later write.
        assert_refused(Err(
            l.after_write_error(io::Error::from_raw_os_error(libc::ESHUTDOWN))
        ));
        assert_refused(l.before_write(&ops));
        assert_refused(l.before_flush());
        assert_eq!(l.status(&ops), LockStatus::Lost);
    }
}
