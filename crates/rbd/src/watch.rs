//! librbd's notification that an image's header changed (resize, new
//! snapshot, features): the device marks its size as possibly stale and
//! tells whoever asked, so that a resize by another client raises the
//! capacity-changed unit attention.

use std::ffi::c_void;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::errno::check_doing;
use crate::ffi;
use crate::image::Image;

/// What to call when the image's header changed.
pub type UpdateCallback = Box<dyn Fn() + Send + Sync>;

/// Shared with librbd's callback.
#[derive(Default)]
pub(crate) struct Updates {
    /// Set by every notification, cleared by whoever re-reads the size.
    pub(crate) changed: AtomicBool,
    pub(crate) callback: Mutex<Option<UpdateCallback>>,
}

/// A registered watch; unregistered on drop, which must come before the
/// image's close.
pub(crate) struct UpdateWatch {
    image: ffi::rbd_image_t,
    handle: u64,
    /// The reference the callback's argument points at.
    updates: *const Updates,
}

// The raw pointers are only passed back to librbd or dropped.
unsafe impl Send for UpdateWatch {}
unsafe impl Sync for UpdateWatch {}

unsafe extern "C" fn on_update(arg: *mut c_void) {
    // SAFETY: `arg` is the reference `UpdateWatch::register` leaked; it
    // lives until the watch is unregistered, after which librbd makes no
    // more calls.
    let updates = unsafe { &*(arg as *const Updates) };
    updates.changed.store(true, Ordering::Release);
    // librbd calls are not made from here: the callback runs on librbd's
    // own thread, and a size read there could wait on that very thread.
    if let Some(callback) = updates.callback.lock().as_ref() {
        callback();
    }
}

impl UpdateWatch {
    pub(crate) fn register(image: &Image, updates: &Arc<Updates>) -> io::Result<Self> {
        let arg = Arc::into_raw(Arc::clone(updates));
        let mut handle = 0;
        // SAFETY: open image; `arg` stays valid until unregistered.
        let r = unsafe {
            ffi::rbd_update_watch(
                image.handle,
                &mut handle,
                Some(on_update),
                arg as *mut c_void,
            )
        };
        if let Err(e) = check_doing(r as i64, || format!("watching {} for changes", image.spec)) {
            // SAFETY: no watch refers to it.
            drop(unsafe { Arc::from_raw(arg) });
            return Err(e);
        }
        Ok(UpdateWatch {
            image: image.handle,
            handle,
            updates: arg,
        })
    }
}

impl Drop for UpdateWatch {
    fn drop(&mut self) {
        // SAFETY: the image is still open (see the struct's comment);
        // after unwatching librbd no longer calls `on_update`.
        let r = unsafe { ffi::rbd_update_unwatch(self.image, self.handle) };
        if r < 0 {
            // The callback might still run: keep its argument alive.
            return;
        }
        // SAFETY: the reference `register` leaked, now unused.
        drop(unsafe { Arc::from_raw(self.updates) });
    }
}
