//! One librbd asynchronous request and a bounded wait for it.
//!
//! librbd reads into and writes from the caller's memory until the
//! completion fires (writes are zero-copy), and there is no way to cancel
//! a request. So that a wait can give up after its timeout without leaving
//! librbd with a dangling pointer, the request owns its buffers: they live
//! in a shared [`Pending`] that the completion callback holds until it runs.

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::io;
use std::ptr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::errno::check;
use crate::ffi;

/// The memory a request reads into or writes from.
#[derive(Default)]
pub(crate) struct Buffers {
    /// Read into, or written from.
    pub(crate) data: Vec<u8>,
    /// What compare-and-write compares with.
    pub(crate) compare: Vec<u8>,
    /// Where compare-and-write reports the first differing byte.
    pub(crate) mismatch: u64,
}

struct Pending {
    /// librbd's return value, once the request completed.
    result: Mutex<Option<i64>>,
    completed: Condvar,
    /// Touched only before submission and after `result` is set: librbd
    /// owns it in between.
    buffers: UnsafeCell<Buffers>,
}

// `buffers` is never shared: see its comment.
unsafe impl Sync for Pending {}
unsafe impl Send for Pending {}

/// Raw pointers into a request's buffers, to hand to librbd.
pub(crate) struct Raw {
    pub(crate) data: *mut u8,
    pub(crate) data_len: usize,
    pub(crate) compare: *const u8,
    pub(crate) mismatch: *mut u64,
}

/// A request in flight.
pub(crate) struct InFlight {
    pending: Arc<Pending>,
}

/// Submits one request: `start` gets a fresh completion and pointers into
/// `buffers`, calls one `rbd_aio_*` function and returns its result.
pub(crate) fn submit(
    buffers: Buffers,
    start: impl FnOnce(ffi::rbd_completion_t, Raw) -> i64,
) -> io::Result<InFlight> {
    let pending = Arc::new(Pending {
        result: Mutex::new(None),
        completed: Condvar::new(),
        buffers: UnsafeCell::new(buffers),
    });
    let arg = Arc::into_raw(Arc::clone(&pending)) as *mut c_void;
    let mut completion: ffi::rbd_completion_t = ptr::null_mut();
    // SAFETY: `arg` stays valid until `on_complete` takes it back.
    let r = unsafe { ffi::rbd_aio_create_completion(arg, Some(on_complete), &mut completion) };
    if let Err(e) = check(r as i64) {
        // SAFETY: no completion exists that could use `arg`.
        drop(unsafe { Arc::from_raw(arg as *const Pending) });
        return Err(e);
    }
    // SAFETY: not yet submitted, so nothing else touches the buffers.
    let b = unsafe { &mut *pending.buffers.get() };
    let raw = Raw {
        data: b.data.as_mut_ptr(),
        data_len: b.data.len(),
        compare: b.compare.as_ptr(),
        mismatch: &mut b.mismatch,
    };
    let r = start(completion, raw);
    if r < 0 {
        // librbd reports nearly every failure through the completion; a
        // request it refuses up front may or may not have fired it, so
        // the completion and its reference are left alone (a small leak
        // rather than a use after free).
        return Err(io::Error::from_raw_os_error(-r as i32));
    }
    Ok(InFlight { pending })
}

/// Called by librbd on one of its threads when a request ends.
unsafe extern "C" fn on_complete(completion: ffi::rbd_completion_t, arg: *mut c_void) {
    // SAFETY: librbd calls this once per completion, with the `arg` that
    // `submit` leaked a reference for.
    let pending = unsafe { Arc::from_raw(arg as *const Pending) };
    let ret = unsafe { ffi::rbd_aio_get_return_value(completion) };
    unsafe { ffi::rbd_aio_release(completion) };
    *pending.result.lock() = Some(ret as i64);
    pending.completed.notify_all();
}

impl InFlight {
    /// Waits for the request until `deadline`; its return value (a
    /// negative errno on failure) and buffers, or `ETIMEDOUT` (the buffers
    /// then stay with librbd until the request ends).
    pub(crate) fn wait(self, deadline: Instant) -> io::Result<(i64, Buffers)> {
        let mut result = self.pending.result.lock();
        while result.is_none() {
            if self
                .pending
                .completed
                .wait_until(&mut result, deadline)
                .timed_out()
                && result.is_none()
            {
                return Err(io::Error::from_raw_os_error(libc::ETIMEDOUT));
            }
        }
        let ret = result.expect("loop ends once completed");
        drop(result);
        // SAFETY: the request completed (seen under the mutex the callback
        // set it under), so librbd is done with the buffers.
        let buffers = std::mem::take(unsafe { &mut *self.pending.buffers.get() });
        Ok((ret, buffers))
    }
}

/// The moment a request started now must have completed by.
pub(crate) fn deadline(timeout: Duration) -> Instant {
    Instant::now() + timeout
}
