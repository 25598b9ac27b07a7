//! [`RbdDevice`]: an RBD image as a [`BlockDevice`].
//!
//! Every call puts one request in flight with librbd's asynchronous API and
//! waits for its completion at most the configured timeout, so many callers
//! (and `read_batch`) keep many requests in flight on one image, and a
//! cluster that stops answering turns into `ETIMEDOUT` rather than a hang.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use block::{Allocation, BatchRead, BlockDevice, Capabilities, Done};

use crate::aio::{self, Buffers, InFlight};
use crate::async_io::{Start, Target};
use crate::cluster::Cluster;
use crate::config::RbdConfig;
use crate::errno::{check, errno_of};
use crate::ffi;
use crate::image::Image;
use crate::lock::{ExclusiveLock, LockOps, LockStatus};
use crate::snapshots::Snapshot;
use crate::watch::{UpdateCallback, UpdateWatch, Updates};

/// An open RBD image.
pub struct RbdDevice {
    // Unregistered before the image closes (fields drop in order).
    _watch: UpdateWatch,
    image: Arc<Image>,
    config: RbdConfig,
    /// The pool's id and the image's id: the same on every gateway, for
    /// as long as the image exists.
    identity: String,
    /// Bytes, as last read from the image.
    size: AtomicU64,
    object_size: u64,
    updates: Arc<Updates>,
    lock: Arc<ExclusiveLock>,
}

impl LockOps for Image {
    fn acquire(&self) -> io::Result<()> {
        self.lock_acquire()
    }
    fn is_owner(&self) -> io::Result<bool> {
        self.is_lock_owner()
    }
}

impl RbdDevice {
    /// Connects to the cluster (or shares the connection of the same
    /// ceph.conf, user and keyring), opens the image, creating it when it
    /// is missing and `config.create` is set, and tries to take its
    /// exclusive lock (see [`RbdDevice::lock_status`]).
    pub fn open(config: &RbdConfig) -> io::Result<RbdDevice> {
        match Self::open_on_connection(config) {
            // The shared connection was fenced (another client broke a
            // lock it held): a new one is not.
            Err(e) if errno_of(&e) == Some(libc::ESHUTDOWN) => Self::open_on_connection(config),
            result => result,
        }
    }

    fn open_on_connection(config: &RbdConfig) -> io::Result<RbdDevice> {
        let cluster = Cluster::get(
            &config.ceph_conf,
            &config.client_name(),
            config.keyring.as_deref(),
            config.timeout,
        )?;
        let ioctx = Arc::new(cluster.pool(&config.pool)?);
        let opened = Image::open(&ioctx, &config.image).inspect_err(|e| cluster.note_error(e));
        let image = match opened? {
            Some(image) => image,
            None if config.create => {
                let size = config.size.ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("creating the RBD image {} needs a size", config.spec()),
                    )
                })?;
                Image::create(&ioctx, &config.image, size)?;
                Image::open(&ioctx, &config.image)?
                    .ok_or_else(|| missing(config, " right after creating it"))?
            }
            None => return Err(missing(config, " (set create and size to create it)")),
        };
        // SAFETY: valid ioctx.
        let pool_id = unsafe { ffi::rados_ioctx_get_id(ioctx.handle) };
        let identity = format!("{pool_id}.{}", image.id()?);
        let size = image.size()?;
        let object_size = image.object_size()?;
        let lock = Arc::new(ExclusiveLock::take(&image));
        let image = Arc::new(image);
        let updates = Arc::new(Updates::default());
        let watch = UpdateWatch::register(&image, &updates)?;
        Ok(RbdDevice {
            _watch: watch,
            image,
            config: config.clone(),
            identity,
            size: AtomicU64::new(size),
            object_size,
            updates,
            lock,
        })
    }

    /// `pool-id.image-id`: stable across gateways, restarts and renames,
    /// for the LUN's NAA designator.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The configuration the device was opened with.
    pub fn config(&self) -> &RbdConfig {
        &self.config
    }

    /// The cluster connection this device shares, as `conf as client`.
    pub fn cluster(&self) -> &str {
        self.image.ioctx.cluster.description()
    }

    /// Whether this device may write (see [`LockStatus`]).
    pub fn lock_status(&self) -> LockStatus {
        self.lock.status(&*self.image)
    }

    /// Takes the exclusive lock on purpose, after it was lost or while on
    /// standby.
    pub fn reacquire_lock(&self) -> io::Result<()> {
        self.lock.reacquire(&*self.image)
    }

    /// Gives the exclusive lock up (writes then take it again).
    pub fn release_lock(&self) -> io::Result<()> {
        self.image.lock_release()?;
        self.lock.released();
        Ok(())
    }

    /// The clients holding the image's lock, as the cluster sees them.
    pub fn lock_owners(&self) -> io::Result<Vec<String>> {
        self.image.lock_owners()
    }

    /// Calls `callback` (on a librbd thread; it should only wake someone)
    /// whenever the image's header changes, e.g. another client resized
    /// it; [`RbdDevice::refresh_size`] then reads the new size.
    pub fn on_update(&self, callback: UpdateCallback) {
        *self.updates.callback.lock() = Some(callback);
    }

    /// Re-reads the image's size; `Some(new size)` when it changed since
    /// the last read (capacity changed).
    pub fn refresh_size(&self) -> io::Result<Option<u64>> {
        self.updates.changed.store(false, Ordering::Release);
        let size = self.image.size()?;
        let old = self.size.swap(size, Ordering::AcqRel);
        Ok((old != size).then_some(size))
    }

    /// Whether a header change was notified since the last
    /// [`RbdDevice::refresh_size`]: cheap enough to poll.
    pub fn update_pending(&self) -> bool {
        self.updates.changed.load(Ordering::Acquire)
    }

    /// Grows or shrinks the image.
    pub fn resize(&self, size: u64) -> io::Result<()> {
        self.image.resize(size)?;
        self.refresh_size()?;
        Ok(())
    }

    pub fn create_snapshot(&self, name: &str) -> io::Result<()> {
        self.image.snap_create(name)
    }

    pub fn snapshots(&self) -> io::Result<Vec<Snapshot>> {
        self.image.snap_list()
    }

    pub fn delete_snapshot(&self, name: &str) -> io::Result<()> {
        self.image.snap_remove(name)
    }

    /// Returns the image's content to the snapshot's; the size is re-read.
    pub fn rollback_snapshot(&self, name: &str) -> io::Result<()> {
        self.image.snap_rollback(name)?;
        self.refresh_size()?;
        Ok(())
    }

    pub fn protect_snapshot(&self, name: &str) -> io::Result<()> {
        self.image.snap_protect(name)
    }

    pub fn unprotect_snapshot(&self, name: &str) -> io::Result<()> {
        self.image.snap_unprotect(name)
    }

    /// A layered clone `child` in `child_pool` of snapshot `snap`, which
    /// is protected first (RBD clones need that).
    pub fn clone_snapshot(&self, snap: &str, child_pool: &str, child: &str) -> io::Result<()> {
        self.image.snap_protect(snap)?;
        let ioctx = self.image.ioctx.cluster.pool(child_pool)?;
        self.image.clone_snapshot(snap, &ioctx, child)
    }

    /// Deletes the image `name` of `pool` on this device's cluster (a
    /// clone, say; not this device's own image).
    pub fn remove_image(&self, pool: &str, name: &str) -> io::Result<()> {
        let ioctx = self.image.ioctx.cluster.pool(pool)?;
        Image::remove(&ioctx, name)
    }

    /// COMPARE AND WRITE: writes `write` at `offset` if the image holds
    /// `compare` there, atomically. `Ok(None)` when written,
    /// `Ok(Some(i))` when byte `i` of the range differed (nothing written).
    pub fn compare_and_write(
        &self,
        compare: &[u8],
        write: &[u8],
        offset: u64,
    ) -> io::Result<Option<u64>> {
        if compare.len() != write.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "compare and write buffers differ in length",
            ));
        }
        self.check_range(offset, write.len() as u64)?;
        self.lock.before_write(&*self.image)?;
        let buffers = Buffers {
            data: write.to_vec(),
            compare: compare.to_vec(),
            mismatch: 0,
        };
        let handle = self.image.handle;
        let request = aio::submit(buffers, |c, raw| unsafe {
            // SAFETY: the buffers live until the completion fires.
            ffi::rbd_aio_compare_and_write(
                handle,
                offset,
                raw.data_len,
                raw.compare as *const _,
                raw.data as *const _,
                c,
                raw.mismatch,
                0,
            ) as i64
        })?;
        let (ret, buffers) = request.wait(self.deadline())?;
        // librbd's cache writes back the range before the request but does
        // not drop what it holds of it, so reads after a match would return
        // the old data from the cache: it is emptied (after writing back).
        self.image.invalidate_cache()?;
        if ret == -(libc::EILSEQ as i64) {
            // librbd reports the mismatch relative to the request.
            return Ok(Some(buffers.mismatch));
        }
        self.write_result(ret)?;
        Ok(None)
    }

    /// What an asynchronous request needs of this device.
    fn target(&self) -> Target {
        Target {
            image: self.image.clone(),
            lock: self.lock.clone(),
            timeout: self.config.timeout,
        }
    }

    fn deadline(&self) -> Instant {
        aio::deadline(self.config.timeout)
    }

    fn check_range(&self, offset: u64, len: u64) -> io::Result<()> {
        block::check_range_of("image", self.size(), offset, len)
    }

    fn start_read(&self, len: usize, offset: u64) -> io::Result<InFlight> {
        let handle = self.image.handle;
        let buffers = Buffers {
            data: vec![0; len],
            ..Buffers::default()
        };
        aio::submit(buffers, |c, raw| unsafe {
            // SAFETY: the buffer lives until the completion fires.
            ffi::rbd_aio_read(handle, offset, raw.data_len, raw.data as *mut _, c) as i64
        })
    }

    /// Copies a completed read into `buf`.
    fn finish_read(result: io::Result<(i64, Buffers)>, buf: &mut [u8]) -> io::Result<()> {
        let (ret, buffers) = result?;
        let n = (check(ret)? as usize).min(buf.len());
        buf[..n].copy_from_slice(&buffers.data[..n]);
        buf[n..].fill(0);
        Ok(())
    }

    /// Submits a write-type request (after the lock check) and waits.
    fn write_request(
        &self,
        data: Vec<u8>,
        start: impl FnOnce(ffi::rbd_image_t, ffi::rbd_completion_t, aio::Raw) -> i64,
    ) -> io::Result<()> {
        self.lock.before_write(&*self.image)?;
        let handle = self.image.handle;
        let buffers = Buffers {
            data,
            ..Buffers::default()
        };
        let request = aio::submit(buffers, |c, raw| start(handle, c, raw))?;
        let (ret, _) = request.wait(self.deadline())?;
        self.write_result(ret)
    }

    fn write_result(&self, ret: i64) -> io::Result<()> {
        check(ret)
            .map(drop)
            .map_err(|e| self.lock.after_write_error(e))
    }
}

fn missing(config: &RbdConfig, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("the RBD image {} does not exist{why}", config.spec()),
    )
}

impl BlockDevice for RbdDevice {
    /// So that the configuration can reach the image's identity and lock.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn size(&self) -> u64 {
        // Another client changed the image's header (a resize, maybe):
        // read the size again once, so that the logical unit, which asks
        // before every command, raises the capacity-changed unit attention.
        if self.update_pending() && self.refresh_size().is_err() {
            self.updates.changed.store(true, Ordering::Release);
        }
        self.size.load(Ordering::Acquire)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        let request = self.start_read(buf.len(), offset)?;
        Self::finish_read(request.wait(self.deadline()), buf)
    }

    fn reads_in_batches(&self) -> bool {
        true
    }

    fn read_batch(&self, reads: &mut [BatchRead], done: &mut dyn FnMut(usize, &mut BatchRead)) {
        // All in flight at once, then answered in order.
        let started: Vec<io::Result<InFlight>> = reads
            .iter()
            .map(|r| {
                self.check_range(r.offset, r.buf.len() as u64)?;
                self.start_read(r.buf.len(), r.offset)
            })
            .collect();
        let deadline = self.deadline();
        for (i, (read, request)) in reads.iter_mut().zip(started).enumerate() {
            read.result = request.and_then(|r| Self::finish_read(r.wait(deadline), &mut read.buf));
            done(i, read);
        }
    }

    fn completes_async(&self) -> bool {
        true
    }

    fn read_async(&self, offset: u64, len: usize, done: Done<Vec<u8>>) {
        match self.check_range(offset, len as u64) {
            Ok(()) => self.target().read(offset, len, done),
            Err(e) => done(Err(e)),
        }
    }

    fn write_async(&self, data: Vec<u8>, offset: u64, fua: bool, done: Done<()>) {
        if let Err(e) = self.check_range(offset, data.len() as u64) {
            return done(Err(e));
        }
        let start: Start = Box::new(move |image, c, raw| unsafe {
            // SAFETY: the buffer lives until the completion fires.
            ffi::rbd_aio_write(image, offset, raw.data_len, raw.data as *const _, c) as i64
        });
        self.target().write(data, fua, done, start);
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.write_parts_at(&[buf], offset, fua)
    }

    fn write_parts_at(&self, parts: &[&[u8]], offset: u64, fua: bool) -> io::Result<()> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        self.check_range(offset, len as u64)?;
        // librbd writes from this memory after the call returns (it does
        // not copy), so the request owns a copy.
        let data = parts.concat();
        self.write_request(data, |image, c, raw| unsafe {
            // SAFETY: the buffer lives until the completion fires.
            ffi::rbd_aio_write(image, offset, raw.data_len, raw.data as *const _, c) as i64
        })?;
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.lock.before_flush()?;
        let handle = self.image.handle;
        // SAFETY: open image; no buffers.
        let request = aio::submit(Buffers::default(), |c, _| unsafe {
            ffi::rbd_aio_flush(handle, c) as i64
        })?;
        let (ret, _) = request.wait(self.deadline())?;
        // A fenced client's dirty data can never reach the image.
        self.write_result(ret)
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_range(offset, len)?;
        self.write_request(Vec::new(), |image, c, _| unsafe {
            // SAFETY: open image; no buffers.
            ffi::rbd_aio_discard(image, offset, len, c) as i64
        })
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_range(offset, len)?;
        self.write_request(Vec::new(), |image, c, _| unsafe {
            // SAFETY: open image; no buffers.
            ffi::rbd_aio_write_zeroes(image, offset, len as usize, c, 0, 0) as i64
        })
    }

    fn allocation(&self, offset: u64, len: u64) -> io::Result<(Allocation, u64)> {
        self.check_range(offset, len)?;
        self.image.allocation(offset, len)
    }

    fn granularity(&self) -> u64 {
        self.object_size
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            thin: true,
            // librbd's writeback cache holds writes until a flush.
            volatile_cache: true,
            may_block: true,
            // Discards of part of an object are skipped, so a discarded
            // range does not reliably read back as zeros.
            discard_zeroes: false,
            discard: true,
            read_only: false,
        }
    }

    fn describe(&self) -> String {
        format!("rbd:{}", self.config.spec())
    }
}
