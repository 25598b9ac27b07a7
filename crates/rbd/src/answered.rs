//! librbd requests answered from librbd's own completion thread, with no
//! thread of ours waiting for each: the caller's callback gets the result
//! where the request ended.
//!
//! As in [`crate::aio`], the request owns its buffers until librbd is done
//! with them, since there is no way to cancel a request. A request that
//! outlives its timeout is answered `ETIMEDOUT` by a watchdog thread; the
//! completion, whenever it comes, then only frees the buffers.

use std::ffi::c_void;
use std::io;
use std::ptr;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::aio::{Buffers, Raw};
use crate::errno::check;
use crate::ffi;

/// What a request ends with: librbd's return value (a negative errno on
/// failure) and the buffers, or `ETIMEDOUT`.
pub(crate) type Callback = Box<dyn FnOnce(io::Result<(i64, Buffers)>) + Send>;

/// The callback of a request not answered yet, shared by its completion
/// and the watchdog: whichever takes it first answers.
struct Answer {
    callback: Mutex<Option<Callback>>,
    deadline: Instant,
}

/// What librbd holds for a request until its completion fires.
struct InLibrbd {
    buffers: Buffers,
    answer: Arc<Answer>,
}

/// Submits one request as [`crate::aio::submit`] does, but `callback` is
/// called with its result on librbd's completion thread (or with
/// `ETIMEDOUT` by the watchdog after `timeout`, or here when librbd
/// refuses the request). It must not block.
pub(crate) fn submit(
    buffers: Buffers,
    timeout: Duration,
    callback: Callback,
    start: impl FnOnce(ffi::rbd_completion_t, Raw) -> i64,
) {
    let answer = Arc::new(Answer {
        callback: Mutex::new(Some(callback)),
        deadline: Instant::now() + timeout,
    });
    let mut held = Box::new(InLibrbd {
        buffers,
        answer: answer.clone(),
    });
    let b = &mut held.buffers;
    let raw = Raw {
        data: b.data.as_mut_ptr(),
        data_len: b.data.len(),
        compare: b.compare.as_ptr(),
        mismatch: &mut b.mismatch,
    };
    let arg = Box::into_raw(held) as *mut c_void;
    let mut completion: ffi::rbd_completion_t = ptr::null_mut();
    // SAFETY: `arg` stays valid until `on_complete` takes it back.
    let r = unsafe { ffi::rbd_aio_create_completion(arg, Some(on_complete), &mut completion) };
    if let Err(e) = check(r as i64) {
        // SAFETY: no completion exists that could use `arg`.
        drop(unsafe { Box::from_raw(arg as *mut InLibrbd) });
        let callback = answer.callback.lock().take();
        if let Some(callback) = callback {
            callback(Err(e));
        }
        return;
    }
    // Moving the box did not move the heap memory `raw` points into.
    let r = start(completion, raw);
    if r < 0 {
        // As in `aio::submit`: the completion may or may not fire, so it
        // keeps the buffers (a small leak rather than a use after free);
        // the callback is answered now and never again.
        let callback = answer.callback.lock().take();
        if let Some(callback) = callback {
            callback(Err(io::Error::from_raw_os_error(-r as i32)));
        }
        return;
    }
    watchdog().watch(&answer);
}

/// Called by librbd on one of its threads when a request ends.
unsafe extern "C" fn on_complete(completion: ffi::rbd_completion_t, arg: *mut c_void) {
    // SAFETY: librbd calls this once per completion, with the `arg` that
    // `submit` leaked.
    let held = unsafe { Box::from_raw(arg as *mut InLibrbd) };
    let ret = unsafe { ffi::rbd_aio_get_return_value(completion) };
    unsafe { ffi::rbd_aio_release(completion) };
    let InLibrbd { buffers, answer } = *held;
    let callback = answer.callback.lock().take();
    if let Some(callback) = callback {
        callback(Ok((ret as i64, buffers)));
    }
}

/// Answers requests past their deadline. One thread for the process,
/// started with the first request; it looks twice a second.
struct Watchdog {
    watched: Mutex<Vec<Weak<Answer>>>,
}

const WATCH_TICK: Duration = Duration::from_millis(500);

fn watchdog() -> &'static Watchdog {
    static WATCHDOG: OnceLock<Watchdog> = OnceLock::new();
    WATCHDOG.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("oa-rbd-timeouts".into())
            .spawn(|| loop {
                std::thread::sleep(WATCH_TICK);
                watchdog().expire(Instant::now());
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the RBD request watchdog");
        }
        Watchdog {
            watched: Mutex::new(Vec::new()),
        }
    })
}

impl Watchdog {
    fn watch(&self, answer: &Arc<Answer>) {
        self.watched.lock().push(Arc::downgrade(answer));
    }

    /// Forgets answered requests and answers those past their deadline.
    fn expire(&self, now: Instant) {
        let mut late = Vec::new();
        self.watched.lock().retain(|weak| {
            let Some(answer) = weak.upgrade() else {
                return false;
            };
            if answer.deadline > now {
                return true;
            }
            late.extend(answer.callback.lock().take());
            false
        });
        // Called outside the list's lock: a callback may submit again.
        for callback in late {
            callback(Err(io::Error::from_raw_os_error(libc::ETIMEDOUT)));
        }
    }
}
