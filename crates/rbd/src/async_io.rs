//! [`RbdDevice`](crate::RbdDevice)'s requests answered where librbd ends
//! them ([`block::BlockDevice::read_async`]): the caller's thread submits
//! and goes on, librbd's completion thread answers. A transport then keeps
//! as many requests in flight as its initiators send, with no thread
//! parked on each.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use block::Done;

use crate::aio::{Buffers, Raw};
use crate::answered;
use crate::errno::check;
use crate::ffi;
use crate::image::Image;
use crate::lock::ExclusiveLock;

/// What an asynchronous request needs of its device, cheap to clone and
/// free to cross threads.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) image: Arc<Image>,
    pub(crate) lock: Arc<ExclusiveLock>,
    pub(crate) timeout: Duration,
}

/// Starts one write-type request on `image` from a completion and pointers
/// into its buffers.
pub(crate) type Start = Box<dyn FnOnce(ffi::rbd_image_t, ffi::rbd_completion_t, Raw) -> i64 + Send>;

impl Target {
    /// Reads `len` bytes at `offset` (already checked against the size).
    pub(crate) fn read(&self, offset: u64, len: usize, done: Done<Vec<u8>>) {
        let handle = self.image.handle;
        let buffers = Buffers {
            data: vec![0; len],
            ..Buffers::default()
        };
        let answer = Box::new(move |result: io::Result<(i64, Buffers)>| {
            done(result.and_then(|(ret, buffers)| {
                let n = check(ret)? as usize;
                let mut data = buffers.data;
                // librbd reads short only past the end, as zeros.
                data[n.min(len)..].fill(0);
                Ok(data)
            }))
        });
        answered::submit(buffers, self.timeout, answer, |c, raw| unsafe {
            // SAFETY: the buffer lives until the completion fires.
            ffi::rbd_aio_read(handle, offset, raw.data_len, raw.data as *mut _, c) as i64
        });
    }

    /// A write-type request (`start` submits it) after the lock check, then
    /// a flush when `fua` asks for stable data.
    pub(crate) fn write(&self, data: Vec<u8>, fua: bool, done: Done<()>, start: Start) {
        if self.lock.may_wait() {
            // Taking the lock may wait for another gateway, which the
            // caller's thread must not: a thread of its own does it.
            let work = Arc::new(parking_lot::Mutex::new(Some((
                self.clone(),
                data,
                done,
                start,
            ))));
            let taken = work.clone();
            let spawned = std::thread::Builder::new()
                .name("oa-rbd-lock".into())
                .spawn(move || {
                    if let Some((target, data, done, start)) = taken.lock().take() {
                        target.write_locked(data, fua, done, start);
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start a thread to take the RBD lock");
                // Not taken by a thread: written here, waiting or not.
                if let Some((target, data, done, start)) = work.lock().take() {
                    target.write_locked(data, fua, done, start);
                }
            }
            return;
        }
        self.write_locked(data, fua, done, start)
    }

    fn write_locked(&self, data: Vec<u8>, fua: bool, done: Done<()>, start: Start) {
        if let Err(e) = self.lock.before_write(&*self.image) {
            return done(Err(e));
        }
        let handle = self.image.handle;
        let then = self.clone();
        let answer = Box::new(move |result: io::Result<(i64, Buffers)>| {
            let written = result.and_then(|(ret, _)| check(ret).map(drop));
            match written {
                Ok(()) if fua => then.flush(done),
                Ok(()) => done(Ok(())),
                Err(e) => done(Err(then.lock.after_write_error(e))),
            }
        });
        let buffers = Buffers {
            data,
            ..Buffers::default()
        };
        answered::submit(buffers, self.timeout, answer, |c, raw| {
            start(handle, c, raw)
        });
    }

    /// Makes every completed write stable.
    pub(crate) fn flush(&self, done: Done<()>) {
        if let Err(e) = self.lock.before_flush() {
            return done(Err(e));
        }
        let handle = self.image.handle;
        let lock = self.lock.clone();
        let answer = Box::new(move |result: io::Result<(i64, Buffers)>| {
            let flushed = result.and_then(|(ret, _)| check(ret).map(drop));
            done(flushed.map_err(|e| lock.after_write_error(e)))
        });
        answered::submit(Buffers::default(), self.timeout, answer, |c, _| unsafe {
            // SAFETY: open image; no buffers.
            ffi::rbd_aio_flush(handle, c) as i64
        });
    }
}
