//! The server `openarray serve` runs (`serve.rs`: start and shutdown;
//! `admin`: the administration API; `volume_api`, `schedules`, the
//! `/metrics` sources), and here the running configuration and the one
//! transaction that changes it, whether the change comes as a whole file
//! (`config apply`) or as one edit (`device add`, `lun add`...): the new
//! configuration is
//! validated as a whole, checked against what the running objects can take
//! (a change that replaces a LUN's data only with `force`), built over the
//! running objects, new portals are bound, the file is written atomically,
//! and only then is the change made live: the new exports go to every
//! transport. Anything failing before that leaves the running state and
//! the file as they were.

pub mod admin;
pub mod device_metrics;
pub mod ha_pair;
mod iscsi_options;
pub mod iscsi_section;
pub mod listener_metrics;
mod live_listeners;
pub mod nbd_serve;
pub mod nvmf_transport;
pub mod portals;
pub mod schedules;
pub mod serve;
pub mod systemd;
pub mod transports;
pub mod volume_api;

pub use iscsi_options::iscsi_options;
pub use live_listeners::{LiveListeners, PreparedListeners};
pub use nvmf_transport::{Nvmf, NvmfTransport};

/// Makes the transports and services this daemon serves, and their
/// sections, part of it; called once at start.
pub fn register_builtins() {
    transports::register(Nvmf);
    control::sections::register(ha_pair::HaOwner);
    control::sections::register(iscsi_section::IscsiOwner);
}

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// How long a change waits for a removed portal's listener to close.
const PORTAL_CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The configuration being served and the objects built from it.
pub struct Current {
    pub config: control::Config,
    /// The text `config` was read from (what `save` writes).
    pub text: String,
    /// Where the configuration is kept; `None` when serving the built-in
    /// default, which has nowhere to persist changes to.
    pub path: Option<PathBuf>,
    pub runtime: control::Runtime,
    /// `--listen` addresses that replace every configuration's portals.
    pub listen_override: Vec<SocketAddr>,
    /// `--nbd-listen` addresses that replace every configuration's
    /// `[nbd] listen`.
    pub nbd_listen_override: Vec<nbd::ListenAddr>,
    /// `--nvmf-listen` addresses that replace every configuration's
    /// `[nvmf] listen`.
    pub nvmf_listen_override: Vec<SocketAddr>,
}

/// Why a change was not made, as the API answers it.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The configuration is not valid, or cannot be built (400).
    Invalid(String),
    /// The running objects cannot take it, or nothing can persist it (409).
    Conflict(String),
    /// The file could not be written (500).
    Failed(String),
}

impl Refused {
    /// The HTTP status the API answers with.
    pub fn status(&self) -> u16 {
        match self {
            Refused::Invalid(_) => 400,
            Refused::Conflict(_) => 409,
            Refused::Failed(_) => 500,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Refused::Invalid(m) | Refused::Conflict(m) | Refused::Failed(m) => m,
        }
    }
}

/// What a change did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// One line per change, then one `!` line per device whose data goes.
    pub changes: Vec<String>,
    /// False when the configuration was already running.
    pub applied: bool,
    pub note: Option<String>,
}

/// The transports and listeners a change reaches.
pub struct Transports<'a> {
    pub portals: &'a Mutex<portals::Portals>,
    /// The listeners of transports other than iSCSI's portals.
    pub listeners: &'a [Arc<dyn LiveListeners>],
    pub frontends: &'a [Arc<dyn export::Frontend>],
}

/// `text` validated, with the daemon's `--listen` and `--nbd-listen`
/// overrides applied as at start.
pub fn proposed(current: &Current, text: &str, origin: &str) -> Result<control::Config, Refused> {
    let mut config =
        control::parse_config(text, origin).map_err(|e| Refused::Invalid(e.to_string()))?;
    if !current.listen_override.is_empty() {
        config.override_listen(&current.listen_override);
    }
    if !current.nbd_listen_override.is_empty() {
        config.override_nbd_listen(&current.nbd_listen_override);
    }
    if !current.nvmf_listen_override.is_empty() {
        nvmf_transport::override_listen(&mut config, &current.nvmf_listen_override);
    }
    Ok(config)
}

/// Validates `text` as a whole, checks the running objects can take the
/// change (a change that replaces a LUN's data only with `force`), builds
/// the new objects over the running ones, binds new portals, writes the
/// file atomically, and only then makes the change live. Anything failing
/// before that leaves the running state and the file as they were.
pub fn apply_text(
    transports: &Transports<'_>,
    current: &mut Current,
    text: String,
    origin: &str,
    force: bool,
) -> Result<Applied, Refused> {
    let config = proposed(current, &text, origin)?;
    let mut changes = control::diff(&current.config, &config);
    if changes.is_empty() {
        return Ok(Applied::default());
    }
    let losses = control::check_live_change(&current.config, &config, force)
        .map_err(|e| Refused::Conflict(e.to_string()))?;
    changes.extend(losses);
    let Some(path) = current.path.clone() else {
        return Err(Refused::Conflict(
            "serving the built-in default: start with --config FILE to change the configuration"
                .into(),
        ));
    };
    let runtime =
        control::rebuild(&config, &current.runtime).map_err(|e| Refused::Invalid(e.to_string()))?;
    let mut portals = transports.portals.lock().unwrap_or_else(|p| p.into_inner());
    let (added, removed) = portals::changes(&portals.addrs(), &runtime.listen);
    let mut listeners = Vec::with_capacity(added.len());
    for addr in added {
        let l = portals::bind(addr)
            .map_err(|e| Refused::Invalid(format!("portal: cannot listen on {addr}: {e}")))?;
        listeners.push((addr, l));
    }
    let prepared = transports
        .listeners
        .iter()
        .map(|l| l.prepare(&config))
        .collect::<Result<Vec<_>, _>>()
        .map_err(Refused::Invalid)?;
    // Persist before going live: a file that cannot be written leaves
    // everything as it was.
    write_atomically(&path, &text)
        .map_err(|e| Refused::Failed(format!("cannot write {}: {e}", path.display())))?;
    runtime.commit(Some(&current.runtime));
    for frontend in transports.frontends {
        frontend.replace_exports(&runtime.exports);
        // Sessions whose initiator lost the target are asked to log out.
        frontend.end_refused_sessions();
    }
    for (addr, listener) in listeners {
        tracing::info!(%addr, "portal added");
        portals.start(addr, listener);
    }
    for change in prepared {
        change.commit();
    }
    let closing: Vec<_> = removed
        .into_iter()
        .filter_map(|a| portals.stop(a))
        .collect();
    drop(portals);
    // Answer once removed portals are closed, so their address can be
    // bound by the next change (`remove` then `add` moves a portal).
    // (Polled rather than awaited: changes run on a blocking thread.)
    let waiting = std::time::Instant::now();
    while closing.iter().any(|t| !t.is_finished()) && waiting.elapsed() < PORTAL_CLOSE_WAIT {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // The transports read their [daemon] settings once, at start.
    let restart_needed = current.config.daemon != config.daemon
        || iscsi_section::section(&current.config) != iscsi_section::section(&config);
    let previous = std::mem::replace(&mut current.runtime, runtime);
    current.config = config;
    current.text = text;
    // Devices the new configuration dropped are flushed before they go.
    if let Err(e) = previous.flush_all() {
        tracing::warn!(error = %e, "flushing the previous configuration's devices");
    }
    if let Err(e) = previous.close_replaced(&current.runtime) {
        tracing::warn!(error = %e, "closing the devices the configuration dropped");
    }
    for change in &changes {
        tracing::info!(change = %change, "configuration applied");
    }
    Ok(Applied {
        changes,
        applied: true,
        note: restart_needed
            .then(|| "[daemon] and [iscsi] settings take effect at the next start".to_string()),
    })
}

/// Replace `path` with `text` so that a crash leaves the old file or the
/// new one, never a mix: a temporary file beside it (mode 0600, for the
/// secrets), fsync, rename over, fsync the directory.
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn atomic_write_replaces_with_owner_only_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "old").unwrap();
        write_atomically(&path, "new text").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new text");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        // A directory that does not exist fails without touching anything.
        assert!(write_atomically(&dir.path().join("no/c.toml"), "x").is_err());
    }
}
