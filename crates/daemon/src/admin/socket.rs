//! The administration socket's file: only a stale socket is ever replaced,
//! and the socket is owner-only (0600) from the moment it has its name.

use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;
use tokio::net::UnixListener;

/// Which file the bound socket is, so that shutdown removes it only while
/// it is still ours.
pub struct SocketFile {
    path: PathBuf,
    id: (u64, u64),
}

impl SocketFile {
    /// Remove the socket file unless something else has taken its name.
    pub fn remove(&self) {
        if file_id(&self.path) == Some(self.id) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn file_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Something at the socket's path that must not be replaced: a daemon
/// serving there, or a file that is not a socket.
#[derive(Debug)]
pub struct Occupied(String);

impl std::fmt::Display for Occupied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Occupied {}

/// Whether `bind` failed because something at the path must be kept,
/// rather than because the path could not be made.
pub fn held_by_a_daemon(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Occupied>().is_some()
}

/// What is at the socket's path now.
enum Existing {
    Nothing,
    /// A socket nobody answers on (left by a daemon that is gone).
    Stale,
}

fn existing(path: &Path) -> anyhow::Result<Existing> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Existing::Nothing),
        Err(e) => return Err(e).with_context(|| format!("cannot examine {}", path.display())),
    };
    if !meta.file_type().is_socket() {
        return Err(Occupied(format!(
            "{} exists and is not a socket; refusing to replace it (remove it or choose \
             another --admin-socket path)",
            path.display()
        ))
        .into());
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(Occupied(format!("another daemon is serving on {}", path.display())).into()),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => Ok(Existing::Stale),
        // Gone between the two looks.
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(Existing::Nothing),
        Err(e) => Err(e).with_context(|| {
            format!(
                "{} is a socket that cannot be checked; not replacing it",
                path.display()
            )
        }),
    }
}

/// A unix socket at `path` only its owner can connect to. An existing
/// socket nobody answers on is replaced; anything else at `path` is left
/// alone and is an error.
///
/// The socket is bound in a fresh owner-only directory beside `path`,
/// made 0600 there, and only then given its name, so it is never
/// reachable with a wider mode whatever the umask (which is process-wide,
/// so not changed while other threads run).
pub fn bind(path: &Path) -> anyhow::Result<(UnixListener, SocketFile)> {
    let found = existing(path)?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let private = private_dir(dir)?;
    let staged = private.join("s");
    let result = (|| {
        let listener = UnixListener::bind(&staged)
            .with_context(|| format!("cannot listen on {}", staged.display()))?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("cannot restrict {}", staged.display()))?;
        match found {
            // A link never replaces: a file that appeared meanwhile stays.
            Existing::Nothing => std::fs::hard_link(&staged, path).map_err(|e| {
                if e.kind() == ErrorKind::AlreadyExists {
                    anyhow::anyhow!("{} appeared while the daemon started", path.display())
                } else {
                    anyhow::Error::new(e).context(format!("cannot create {}", path.display()))
                }
            })?,
            // Atomic: the name always refers to one socket or the other.
            Existing::Stale => std::fs::rename(&staged, path)
                .with_context(|| format!("cannot replace the stale socket {}", path.display()))?,
        }
        let id = file_id(path).with_context(|| format!("{} vanished", path.display()))?;
        let file = SocketFile {
            path: path.to_path_buf(),
            id,
        };
        Ok((listener, file))
    })();
    let _ = std::fs::remove_file(&staged);
    let _ = std::fs::remove_dir(&private);
    result
}

/// A new directory in `dir` that only the owner can enter.
fn private_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    for attempt in 0..16u32 {
        let candidate = dir.join(format!(
            ".oa{}-{:x}",
            std::process::id(),
            stamp.wrapping_add(attempt)
        ));
        match std::fs::DirBuilder::new().mode(0o700).create(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot create a directory in {}", dir.display()))
            }
        }
    }
    anyhow::bail!("cannot create a private directory in {}", dir.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_regular_file_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "data").unwrap();
        let err = runtime()
            .block_on(async { bind(&path).err() })
            .unwrap()
            .to_string();
        assert!(err.contains("is not a socket"), "{err}");
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "data");
        // Nothing is left behind beside it.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_stale_socket_is_replaced_and_a_live_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        runtime().block_on(async {
            let (_listener, socket) = bind(&path).unwrap();
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
            let err = bind(&path).err().unwrap().to_string();
            assert!(err.contains("another daemon is serving on"), "{err}");
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
            socket.remove();
            assert!(!path.exists());
        });
    }

    #[test]
    fn removal_spares_a_file_that_took_the_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        runtime().block_on(async {
            let (_listener, socket) = bind(&path).unwrap();
            std::fs::remove_file(&path).unwrap();
            std::fs::write(&path, "other").unwrap();
            socket.remove();
            assert_eq!(std::fs::read_to_string(&path).unwrap(), "other");
        });
    }
}
