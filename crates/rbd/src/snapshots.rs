//! RBD snapshots and layered clones of an open image.

use std::ffi::CStr;
use std::io;

use crate::cluster::{c_string, IoCtx};
use crate::errno::check_doing;
use crate::ffi;
use crate::image::Image;

/// One snapshot of an image, as `rbd snap ls` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub id: u64,
    pub name: String,
    /// The image's size when the snapshot was taken.
    pub size: u64,
}

impl Image {
    pub(crate) fn snap_create(&self, name: &str) -> io::Result<()> {
        let c = c_string("the snapshot name", name.as_bytes())?;
        // SAFETY: open image, valid string.
        let r = unsafe { ffi::rbd_snap_create(self.handle, c.as_ptr()) };
        check_doing(r as i64, || {
            format!("creating the snapshot {}@{name}", self.spec)
        })?;
        Ok(())
    }

    pub(crate) fn snap_list(&self) -> io::Result<Vec<Snapshot>> {
        let mut room: i32 = 16;
        loop {
            // SAFETY: plain C structs, all zeros is valid.
            let mut infos: Vec<ffi::rbd_snap_info_t> =
                vec![unsafe { std::mem::zeroed() }; room as usize + 1];
            let mut max = room;
            // SAFETY: array of `max` entries (plus the terminator).
            let r = unsafe { ffi::rbd_snap_list(self.handle, infos.as_mut_ptr(), &mut max) };
            if r == -libc::ERANGE {
                room = max.max(room * 2);
                continue;
            }
            let count = check_doing(r as i64, || {
                format!("listing the snapshots of {}", self.spec)
            })? as usize;
            let snaps = infos[..count]
                .iter()
                .map(|s| Snapshot {
                    id: s.id,
                    // SAFETY: librbd filled a NUL-terminated name.
                    name: unsafe { CStr::from_ptr(s.name) }
                        .to_string_lossy()
                        .into_owned(),
                    size: s.size,
                })
                .collect();
            // SAFETY: the names librbd allocated, released once.
            unsafe { ffi::rbd_snap_list_end(infos.as_mut_ptr()) };
            return Ok(snaps);
        }
    }

    pub(crate) fn snap_remove(&self, name: &str) -> io::Result<()> {
        let c = c_string("the snapshot name", name.as_bytes())?;
        // SAFETY: open image, valid string.
        let r = unsafe { ffi::rbd_snap_remove(self.handle, c.as_ptr()) };
        check_doing(r as i64, || {
            format!("deleting the snapshot {}@{name}", self.spec)
        })?;
        Ok(())
    }

    pub(crate) fn snap_rollback(&self, name: &str) -> io::Result<()> {
        let c = c_string("the snapshot name", name.as_bytes())?;
        // SAFETY: open image, valid string.
        let r = unsafe { ffi::rbd_snap_rollback(self.handle, c.as_ptr()) };
        check_doing(r as i64, || {
            format!("rolling {} back to its snapshot {name}", self.spec)
        })?;
        Ok(())
    }

    /// Protects a snapshot from deletion, as cloning it requires; already
    /// protected is fine.
    pub(crate) fn snap_protect(&self, name: &str) -> io::Result<()> {
        let c = c_string("the snapshot name", name.as_bytes())?;
        // SAFETY: open image, valid string.
        let r = unsafe { ffi::rbd_snap_protect(self.handle, c.as_ptr()) };
        if r == -libc::EBUSY {
            return Ok(());
        }
        check_doing(r as i64, || {
            format!("protecting the snapshot {}@{name}", self.spec)
        })?;
        Ok(())
    }

    pub(crate) fn snap_unprotect(&self, name: &str) -> io::Result<()> {
        let c = c_string("the snapshot name", name.as_bytes())?;
        // SAFETY: open image, valid string.
        let r = unsafe { ffi::rbd_snap_unprotect(self.handle, c.as_ptr()) };
        check_doing(r as i64, || {
            format!("unprotecting the snapshot {}@{name}", self.spec)
        })?;
        Ok(())
    }

    /// A layered clone `child` (in `child_pool`) of this image's protected
    /// snapshot `snap`, with this image's features.
    pub(crate) fn clone_snapshot(
        &self,
        snap: &str,
        child_pool: &IoCtx,
        child: &str,
    ) -> io::Result<()> {
        let c_snap = c_string("the snapshot name", snap.as_bytes())?;
        let c_child = c_string("the clone's name", child.as_bytes())?;
        let features = self.features()?;
        let mut order = 0;
        // SAFETY: valid ioctxs, strings and out-pointer.
        let r = unsafe {
            ffi::rbd_clone(
                self.ioctx.handle,
                self.name.as_ptr(),
                c_snap.as_ptr(),
                child_pool.handle,
                c_child.as_ptr(),
                features,
                &mut order,
            )
        };
        check_doing(r as i64, || {
            format!(
                "cloning {}@{snap} to {}/{child}",
                self.spec, child_pool.pool
            )
        })?;
        Ok(())
    }
}
