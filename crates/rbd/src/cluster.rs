//! Connections to Ceph clusters: one `rados_t` per (ceph.conf, user,
//! keyring), shared by every image opened through it, since each
//! connection costs a monitor session, threads and a cache of maps.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use crate::errno::{check, check_doing, errno_of};
use crate::ffi;

/// What makes two configurations share a connection.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ClusterKey {
    ceph_conf: PathBuf,
    client: String,
    keyring: Option<PathBuf>,
}

/// The connections in use; an entry dies with its last image.
static CLUSTERS: Mutex<Option<HashMap<ClusterKey, Weak<Cluster>>>> = Mutex::new(None);

/// One connected librados client.
pub(crate) struct Cluster {
    handle: ffi::rados_t,
    description: String,
    /// The cluster blocklisted this client (someone broke a lock one of
    /// its images held): every further request fails, so images opened
    /// from now on get a new connection.
    fenced: AtomicBool,
}

// librados handles are safe to use from any thread.
unsafe impl Send for Cluster {}
unsafe impl Sync for Cluster {}

pub(crate) fn c_string(what: &str, s: &[u8]) -> io::Result<CString> {
    CString::new(s).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} contains a NUL byte"),
        )
    })
}

impl Cluster {
    /// The connection for this configuration file, user and keyring:
    /// the one already open, or a new one. `timeout` bounds connecting
    /// and, from then on, every monitor and OSD operation of a new one.
    pub(crate) fn get(
        ceph_conf: &Path,
        client: &str,
        keyring: Option<&Path>,
        timeout: Duration,
    ) -> io::Result<Arc<Cluster>> {
        let key = ClusterKey {
            ceph_conf: ceph_conf.to_owned(),
            client: client.to_owned(),
            keyring: keyring.map(Path::to_owned),
        };
        // Held while connecting, so that two images of a new cluster do
        // not both connect; connecting is bounded by `timeout`.
        let mut clusters = CLUSTERS.lock();
        let clusters = clusters.get_or_insert_with(HashMap::new);
        if let Some(cluster) = clusters.get(&key).and_then(Weak::upgrade) {
            if !cluster.fenced.load(Ordering::Acquire) {
                return Ok(cluster);
            }
        }
        let cluster = Arc::new(Cluster::connect(&key, timeout)?);
        clusters.retain(|_, c| c.strong_count() > 0);
        clusters.insert(key, Arc::downgrade(&cluster));
        Ok(cluster)
    }

    fn connect(key: &ClusterKey, timeout: Duration) -> io::Result<Cluster> {
        let description = format!("{} as {}", key.ceph_conf.display(), key.client);
        let name = c_string("the client name", key.client.as_bytes())?;
        let cluster_name = c_string("the cluster name", b"ceph")?;
        let mut handle: ffi::rados_t = ptr::null_mut();
        // SAFETY: out-pointer and NUL-terminated strings valid for the call.
        let r = unsafe { ffi::rados_create2(&mut handle, cluster_name.as_ptr(), name.as_ptr(), 0) };
        check_doing(r as i64, || {
            format!("creating a Ceph client {}", key.client)
        })?;
        // From here on `cluster` shuts the handle down if anything fails.
        let cluster = Cluster {
            handle,
            description,
            fenced: AtomicBool::new(false),
        };
        let conf = c_string("the ceph.conf path", key.ceph_conf.as_os_str().as_bytes())?;
        // SAFETY: handle is a created, unconnected client.
        let r = unsafe { ffi::rados_conf_read_file(handle, conf.as_ptr()) };
        check_doing(r as i64, || {
            format!("reading the Ceph configuration {}", key.ceph_conf.display())
        })?;
        if let Some(keyring) = &key.keyring {
            cluster.set_option("keyring", &keyring.display().to_string())?;
        }
        // librbd's write-back cache (the ObjectCacher): a write completes
        // once cached, a flush only once the OSDs hold every cached write,
        // and a write-back that fails leaves its data dirty, so a later
        // flush writes it again rather than succeeding without it. Not
        // the default policy, "writearound", which reports a failed write
        // to one flush only and lets the next succeed without the data.
        // Writeback from the first write: the LUN reports a volatile cache
        // (WCE = 1), so initiators flush, and with WCE = 0 every write is
        // followed by a flush.
        for (option, value) in [
            ("rbd_cache", "true"),
            ("rbd_cache_policy", "writeback"),
            ("rbd_cache_writethrough_until_flush", "false"),
        ] {
            cluster.set_option(option, value)?;
        }
        // Without these a cluster that does not answer makes connecting
        // wait 5 minutes and I/O wait for ever.
        let seconds = timeout.as_secs().max(1).to_string();
        for option in [
            "client_mount_timeout",
            "rados_mon_op_timeout",
            "rados_osd_op_timeout",
        ] {
            cluster.set_option(option, &seconds)?;
        }
        // SAFETY: handle is configured and not yet connected.
        let r = unsafe { ffi::rados_connect(handle) };
        check(r as i64).map_err(|e| {
            let reason = if e.raw_os_error() == Some(libc::ETIMEDOUT) {
                format!("no monitor answered within {}s", timeout.as_secs().max(1))
            } else {
                e.to_string()
            };
            io::Error::new(
                e.kind(),
                format!(
                    "cannot connect to the Ceph cluster of {}: {reason}",
                    cluster.description
                ),
            )
        })?;
        Ok(cluster)
    }

    fn set_option(&self, option: &str, value: &str) -> io::Result<()> {
        let o = c_string("a Ceph option", option.as_bytes())?;
        let v = c_string("a Ceph option value", value.as_bytes())?;
        // SAFETY: valid handle and strings.
        let r = unsafe { ffi::rados_conf_set(self.handle, o.as_ptr(), v.as_ptr()) };
        check_doing(r as i64, || {
            format!("setting the Ceph option {option}={value}")
        })?;
        Ok(())
    }

    /// An I/O context on `pool`.
    pub(crate) fn pool(self: &Arc<Self>, pool: &str) -> io::Result<IoCtx> {
        let name = c_string("the pool name", pool.as_bytes())?;
        let mut handle: ffi::rados_ioctx_t = ptr::null_mut();
        // SAFETY: connected cluster, out-pointer valid for the call.
        let r = unsafe { ffi::rados_ioctx_create(self.handle, name.as_ptr(), &mut handle) };
        check_doing(r as i64, || {
            format!("opening the pool {pool} of {}", self.description)
        })?;
        Ok(IoCtx {
            handle,
            pool: pool.to_owned(),
            cluster: Arc::clone(self),
        })
    }

    /// Notes an error of a request on this connection: ESHUTDOWN is
    /// Ceph's EBLOCKLISTED.
    pub(crate) fn note_error(&self, e: &io::Error) {
        if errno_of(e) == Some(libc::ESHUTDOWN) && !self.fenced.swap(true, Ordering::AcqRel) {
            tracing::warn!(cluster = %self.description, "this client was blocklisted; new images get a new connection");
        }
    }

    pub(crate) fn description(&self) -> &str {
        &self.description
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: every IoCtx holds an Arc to this, so none is left.
        unsafe { ffi::rados_shutdown(self.handle) };
    }
}

/// A pool of a connected cluster; keeps the connection alive.
pub(crate) struct IoCtx {
    pub(crate) handle: ffi::rados_ioctx_t,
    pub(crate) pool: String,
    // Dropped after the ioctx is destroyed (fields drop after `drop`).
    pub(crate) cluster: Arc<Cluster>,
}

// An ioctx may be used from several threads for independent operations.
unsafe impl Send for IoCtx {}
unsafe impl Sync for IoCtx {}

impl Drop for IoCtx {
    fn drop(&mut self) {
        // SAFETY: every image opened on it holds an Arc to this ioctx.
        unsafe { ffi::rados_ioctx_destroy(self.handle) };
    }
}
