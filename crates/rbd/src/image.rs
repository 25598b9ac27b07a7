//! An open RBD image handle and the synchronous librbd calls on it that
//! are not I/O: size, identity, resize, exclusive lock.

use std::ffi::{c_char, CStr, CString};
use std::io;
use std::ptr;
use std::sync::Arc;

use crate::cluster::{c_string, IoCtx};
use crate::errno::{check, check_doing};
use crate::ffi;

/// One open image; closed on drop.
pub(crate) struct Image {
    pub(crate) handle: ffi::rbd_image_t,
    /// `pool/image`, for messages.
    pub(crate) spec: String,
    pub(crate) name: CString,
    // Dropped after the image is closed (fields drop after `drop`).
    pub(crate) ioctx: Arc<IoCtx>,
}

// librbd image handles are thread-safe for I/O and metadata calls.
unsafe impl Send for Image {}
unsafe impl Sync for Image {}

/// `-errno` of the image's absence, as librbd returns it.
const MISSING: i64 = -(libc::ENOENT as i64);

impl Image {
    /// Opens `name` in `ioctx`'s pool; `Ok(None)` when there is no such
    /// image.
    pub(crate) fn open(ioctx: &Arc<IoCtx>, name: &str) -> io::Result<Option<Image>> {
        let spec = format!("{}/{name}", ioctx.pool);
        let c_name = c_string("the image name", name.as_bytes())?;
        let mut handle: ffi::rbd_image_t = ptr::null_mut();
        // SAFETY: valid ioctx and string; a null snapshot opens the head.
        let r = unsafe { ffi::rbd_open(ioctx.handle, c_name.as_ptr(), &mut handle, ptr::null()) };
        if r as i64 == MISSING {
            return Ok(None);
        }
        check_doing(r as i64, || format!("opening the RBD image {spec}"))?;
        Ok(Some(Image {
            handle,
            spec,
            name: c_name,
            ioctx: Arc::clone(ioctx),
        }))
    }

    /// Creates `name` with `size` bytes and the cluster's default features
    /// (layering, exclusive-lock, object-map, ...).
    pub(crate) fn create(ioctx: &IoCtx, name: &str, size: u64) -> io::Result<()> {
        let c_name = c_string("the image name", name.as_bytes())?;
        // 0: the default object size (4 MiB).
        let mut order = 0;
        // SAFETY: valid ioctx, string and out-pointer.
        let r = unsafe { ffi::rbd_create(ioctx.handle, c_name.as_ptr(), size, &mut order) };
        check_doing(r as i64, || {
            format!("creating the RBD image {}/{name}", ioctx.pool)
        })?;
        Ok(())
    }

    /// Deletes the image `name` of `ioctx`'s pool.
    pub(crate) fn remove(ioctx: &IoCtx, name: &str) -> io::Result<()> {
        let c_name = c_string("the image name", name.as_bytes())?;
        // SAFETY: valid ioctx and string.
        let r = unsafe { ffi::rbd_remove(ioctx.handle, c_name.as_ptr()) };
        check_doing(r as i64, || {
            format!("removing the RBD image {}/{name}", ioctx.pool)
        })?;
        Ok(())
    }

    pub(crate) fn size(&self) -> io::Result<u64> {
        let mut size = 0;
        // SAFETY: open image, out-pointer.
        let r = unsafe { ffi::rbd_get_size(self.handle, &mut size) };
        check_doing(r as i64, || format!("reading the size of {}", self.spec))?;
        Ok(size)
    }

    /// The object size: the unit of allocation and of whole-object
    /// discards.
    pub(crate) fn object_size(&self) -> io::Result<u64> {
        // SAFETY: plain C struct, all zeros is a valid value.
        let mut info: ffi::rbd_image_info_t = unsafe { std::mem::zeroed() };
        // SAFETY: open image, out-pointer of the size given.
        let r = unsafe {
            ffi::rbd_stat(
                self.handle,
                &mut info,
                std::mem::size_of::<ffi::rbd_image_info_t>(),
            )
        };
        check_doing(r as i64, || format!("reading the layout of {}", self.spec))?;
        Ok(info.obj_size)
    }

    /// The image id: assigned at creation, unchanged by renames, the same
    /// for every client, so fit to derive a stable identity from.
    pub(crate) fn id(&self) -> io::Result<String> {
        let mut buf = vec![0u8; 64];
        loop {
            // SAFETY: open image, buffer of the length given.
            let r =
                unsafe { ffi::rbd_get_id(self.handle, buf.as_mut_ptr() as *mut c_char, buf.len()) };
            if r == -libc::ERANGE && buf.len() < 4096 {
                buf.resize(buf.len() * 4, 0);
                continue;
            }
            check_doing(r as i64, || format!("reading the id of {}", self.spec))?;
            let id = CStr::from_bytes_until_nul(&buf).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidData, "image id is not terminated")
            })?;
            return Ok(id.to_string_lossy().into_owned());
        }
    }

    pub(crate) fn features(&self) -> io::Result<u64> {
        let mut features = 0;
        // SAFETY: open image, out-pointer.
        let r = unsafe { ffi::rbd_get_features(self.handle, &mut features) };
        check_doing(r as i64, || {
            format!("reading the features of {}", self.spec)
        })?;
        Ok(features)
    }

    pub(crate) fn resize(&self, size: u64) -> io::Result<()> {
        // SAFETY: open image.
        let r = unsafe { ffi::rbd_resize(self.handle, size) };
        check_doing(r as i64, || {
            format!("resizing {} to {size} bytes", self.spec)
        })?;
        Ok(())
    }

    /// Writes back and drops everything librbd's cache holds of the image.
    pub(crate) fn invalidate_cache(&self) -> io::Result<()> {
        // SAFETY: open image.
        let r = unsafe { ffi::rbd_invalidate_cache(self.handle) };
        check(r as i64)?;
        Ok(())
    }

    /// Takes the exclusive lock, and keeps it: once taken through this
    /// call librbd no longer hands it over when another client asks.
    pub(crate) fn lock_acquire(&self) -> io::Result<()> {
        // SAFETY: open image.
        let r = unsafe {
            ffi::rbd_lock_acquire(self.handle, ffi::rbd_lock_mode_t_RBD_LOCK_MODE_EXCLUSIVE)
        };
        check(r as i64)?;
        Ok(())
    }

    pub(crate) fn lock_release(&self) -> io::Result<()> {
        // SAFETY: open image.
        let r = unsafe { ffi::rbd_lock_release(self.handle) };
        check(r as i64)?;
        Ok(())
    }

    /// Whether this handle holds the exclusive lock (librbd's own view,
    /// no round trip to the cluster).
    pub(crate) fn is_lock_owner(&self) -> io::Result<bool> {
        let mut owner = 0;
        // SAFETY: open image, out-pointer.
        let r = unsafe { ffi::rbd_is_exclusive_lock_owner(self.handle, &mut owner) };
        check(r as i64)?;
        Ok(owner != 0)
    }

    /// The clients holding the image's lock, as the cluster sees them
    /// (`client.4242` style addresses); empty when nobody does.
    pub(crate) fn lock_owners(&self) -> io::Result<Vec<String>> {
        let mut mode: ffi::rbd_lock_mode_t = ffi::rbd_lock_mode_t_RBD_LOCK_MODE_EXCLUSIVE;
        let mut owners: Vec<*mut c_char> = vec![ptr::null_mut(); 8];
        let mut count = owners.len();
        // SAFETY: open image, array of `count` pointers.
        let r = unsafe {
            ffi::rbd_lock_get_owners(self.handle, &mut mode, owners.as_mut_ptr(), &mut count)
        };
        if r == -libc::ENOENT {
            return Ok(Vec::new());
        }
        check_doing(r as i64, || {
            format!("listing the lock owners of {}", self.spec)
        })?;
        let names = owners[..count]
            .iter()
            // SAFETY: librbd filled `count` NUL-terminated strings.
            .map(|&p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            .collect();
        // SAFETY: the strings librbd allocated, released once.
        unsafe { ffi::rbd_lock_get_owners_cleanup(owners.as_mut_ptr(), count) };
        Ok(names)
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        // SAFETY: open image, closed once; waits for its requests.
        let r = unsafe { ffi::rbd_close(self.handle) };
        if r < 0 {
            tracing::warn!(image = %self.spec, "closing the RBD image: {}", io::Error::from_raw_os_error(-r));
        }
    }
}
