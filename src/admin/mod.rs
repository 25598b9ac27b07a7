//! The administration API: HTTP/1.1 with JSON bodies on a unix socket that
//! only its owner may use (mode 0600), and optionally on TCP with a bearer
//! token (`http.rs`). The full reference is docs/admin.md.
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /v1/config` | `{"path", "toml"}`: the running configuration |
//! | `GET /v1/objects` | devices, targets, groups, LUN maps (no secrets) |
//! | `POST /v1/config/diff` (TOML body) | `{"changes": [...]}` from running to the body |
//! | `POST /v1/config/apply[?force=true]` (TOML body) | `{"changes": [...], "applied"}` |
//! | `POST /v1/config/save` | `{"path"}`: the running configuration written out |
//! | `POST /v1/edit[?force=true]` (JSON [`control::Edit`]) | `{"changes": [...], "applied"}` |
//! | `GET /v1/stats` | `{"entries": [...]}`: I/O counters and latency histograms per target, LUN and initiator |
//! | `GET /metrics` | the same in the Prometheus text format |
//! | `/v1/sessions...` | live sessions; ending one (`sessions.rs`) |
//! | `GET /v1/status` | everything on one page, with what is degraded (`status.rs`) |
//! | `/v1/devices/{name}...` | a device's tree and state; faults injected (`devices.rs`) |
//!
//! Errors answer 4xx/5xx with `{"error"}`; a configuration error names the
//! file, line, field and reason. `apply` and `edit` validate the whole
//! configuration, build the new objects over the running ones, bind new
//! portals, write the file atomically, and only then make the change live;
//! a change that fails anywhere leaves the running state and the file as
//! they were. Applying what is already running changes nothing. A change
//! the running objects cannot take (a formatted pool's layout) is refused,
//! and so is one that replaces data a LUN serves unless `force=true`.

mod devices;
mod http;
pub mod portals;
mod sessions;
mod socket;
mod status;

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

pub use http::{serve_metrics, serve_tcp, serve_unix, Deadlines, Token};
pub use socket::{bind, held_by_a_daemon, SocketFile};

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
}

pub struct Admin {
    pub current: Mutex<Current>,
    /// The iSCSI transport, for its sessions.
    pub server: Arc<iscsi::Server>,
    /// Every transport, each given the exports of a change.
    pub frontends: Vec<Arc<dyn export::Frontend>>,
    /// The daemon's I/O statistics (one registry for its whole life).
    pub stats: Arc<stats::Registry>,
    /// The iSCSI listeners, one per portal (lock after `current`).
    pub portals: Mutex<portals::Portals>,
    /// Long pool operations and their progress.
    pub jobs: Arc<crate::volume_api::jobs::Jobs>,
    /// The `[[schedule]]` runner and what it did.
    pub schedules: Arc<crate::schedules::Scheduler>,
}

impl Admin {
    fn lock(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A request as the routes see it.
pub(crate) struct Request {
    pub method: String,
    pub path: String,
    /// What follows `?` in the target, e.g. `force=true`.
    pub query: String,
    /// `X-Config-Origin`: the file name a configuration body came from.
    pub origin: Option<String>,
    pub body: Vec<u8>,
}

impl Request {
    /// `?force=true`: accept a change that replaces data a LUN serves.
    fn force(&self) -> bool {
        self.query
            .split('&')
            .any(|kv| matches!(kv, "force" | "force=true" | "force=1"))
    }
}

fn error(status: u16, message: impl std::fmt::Display) -> (u16, Value) {
    (status, json!({ "error": message.to_string() }))
}

pub(crate) fn route(admin: &Admin, req: Request) -> (u16, Value) {
    match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/v1/config") => {
            let current = admin.lock();
            (
                200,
                json!({
                    "path": current.path.as_ref().map(|p| p.display().to_string()),
                    "toml": current.text,
                }),
            )
        }
        ("GET", "/v1/objects") => (200, objects(&admin.lock().config)),
        ("GET", "/v1/stats") => (200, json!({ "entries": admin.stats.snapshot() })),
        ("GET", "/v1/schedules") => (200, admin.schedules.report(admin)),
        ("POST", "/v1/config/diff") => {
            let Ok(text) = std::str::from_utf8(&req.body) else {
                return error(400, "the configuration is not UTF-8");
            };
            let origin = req.origin.clone().unwrap_or_else(|| "<request>".into());
            let current = admin.lock();
            match proposed(&current, text, &origin) {
                Ok(config) => {
                    let mut changes = control::diff(&current.config, &config);
                    // What `apply` would need --force for.
                    changes.extend(control::loss_notes(&current.config, &config));
                    (200, json!({ "changes": changes }))
                }
                Err(e) => e,
            }
        }
        ("POST", "/v1/config/apply") => apply(admin, &req),
        ("POST", "/v1/edit") => edit(admin, &req),
        ("POST", "/v1/config/save") => {
            let current = admin.lock();
            let Some(path) = current.path.clone() else {
                return error(
                    409,
                    "serving the built-in default: there is no file to save to",
                );
            };
            match write_atomically(&path, &current.text) {
                Ok(()) => (200, json!({ "path": path.display().to_string() })),
                Err(e) => error(500, format!("cannot write {}: {e}", path.display())),
            }
        }
        (
            _,
            "/v1/config" | "/v1/objects" | "/v1/config/diff" | "/v1/config/apply"
            | "/v1/config/save" | "/v1/stats" | "/v1/edit",
        ) => error(405, "method not allowed"),
        (method, path) => sessions::route(admin, method, path)
            .or_else(|| devices::route(admin, method, path, &req.body))
            .or_else(|| status::route(admin, method, path))
            .or_else(|| crate::volume_api::route(admin, method, path, &req.body))
            .unwrap_or_else(|| error(404, format!("no such resource {path}"))),
    }
}

/// The running objects as JSON; CHAP shows only its user names.
fn objects(config: &control::Config) -> Value {
    let luns = |luns: &[control::Lun]| -> Vec<Value> {
        luns.iter()
            .map(|l| json!({ "lun": l.lun, "device": l.device, "read_only": l.read_only }))
            .collect()
    };
    let chap = |c: &Option<control::Chap>| -> Value {
        match c {
            None => Value::Null,
            Some(c) => json!({
                "user": c.initiator.user,
                "mutual_user": c.mutual.as_ref().map(|m| m.user.clone()),
            }),
        }
    };
    json!({
        "portals": config.portals.iter().map(|p| p.listen.to_string()).collect::<Vec<_>>(),
        "discovery_chap": chap(&config.discovery_chap),
        "devices": config.devices.iter().map(|d| json!({
            "name": d.name,
            "kind": d.kind(),
            "size": d.spec.size(),
            "settings": d.spec.settings().into_iter().collect::<std::collections::BTreeMap<_, _>>(),
        })).collect::<Vec<_>>(),
        "nbd": config.nbd.as_ref().map(|n| json!({
            "listen": n.listen.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
            "exports": n.exports.iter().map(|e| json!({
                "name": e.name,
                "device": e.device,
                "read_only": e.read_only,
                "allow": e.allow,
                "description": e.description,
            })).collect::<Vec<_>>(),
        })),
        "targets": config.targets.iter().map(|t| json!({
            "name": t.name,
            "alias": t.alias,
            "chap": chap(&t.chap),
            "luns": luns(&t.luns),
            "groups": t.groups.iter().map(|g| json!({
                "name": g.name,
                "initiators": g.initiators,
                "chap": chap(&g.chap),
                "luns": luns(&g.luns),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

/// `text` validated, with the daemon's `--listen` override applied as at
/// start.
fn proposed(current: &Current, text: &str, origin: &str) -> Result<control::Config, (u16, Value)> {
    let mut config = control::parse_config(text, origin).map_err(|e| error(400, e))?;
    if !current.listen_override.is_empty() {
        config.override_listen(&current.listen_override);
    }
    if !current.nbd_listen_override.is_empty() {
        config.override_nbd_listen(&current.nbd_listen_override);
    }
    Ok(config)
}

/// `POST /v1/config/apply`: the body is the whole configuration.
fn apply(admin: &Admin, req: &Request) -> (u16, Value) {
    let Ok(text) = String::from_utf8(req.body.clone()) else {
        return error(400, "the configuration is not UTF-8");
    };
    let origin = req.origin.clone().unwrap_or_else(|| "<request>".into());
    let mut current = admin.lock();
    apply_text(admin, &mut current, text, &origin, req.force())
}

/// `POST /v1/edit`: one [`control::Edit`] made to the running
/// configuration's text, which then goes through [`apply_text`] like a
/// whole file.
fn edit(admin: &Admin, req: &Request) -> (u16, Value) {
    let edit: control::Edit = match serde_json::from_slice(&req.body) {
        Ok(e) => e,
        Err(e) => return error(400, format!("not an edit: {e}")),
    };
    let mut current = admin.lock();
    let portal_edit = matches!(
        edit,
        control::Edit::PortalAdd { .. } | control::Edit::PortalRemove { .. }
    );
    if portal_edit && !current.listen_override.is_empty() {
        return error(
            409,
            "portal: the daemon was started with --listen, which replaces the configured portals; \
             restart it without --listen to manage portals",
        );
    }
    let text = match control::apply_edit(&current.text, &edit) {
        Ok(t) => t,
        Err(e) => return error(400, e),
    };
    let origin = match &current.path {
        Some(p) => format!("{} (as edited)", p.display()),
        None => "<edit>".into(),
    };
    apply_text(admin, &mut current, text, &origin, req.force())
}

/// Validates `text` as a whole, checks the running objects can take the
/// change (a change that replaces a LUN's data only with `force`), builds
/// the new objects over the running ones, binds new portals, writes the
/// file atomically, and only then makes the change live. Anything failing
/// before that leaves the running state and the file as they were.
fn apply_text(
    admin: &Admin,
    current: &mut Current,
    text: String,
    origin: &str,
    force: bool,
) -> (u16, Value) {
    let config = match proposed(current, &text, origin) {
        Ok(c) => c,
        Err(e) => return e,
    };
    let mut changes = control::diff(&current.config, &config);
    if changes.is_empty() {
        return (200, json!({ "changes": changes, "applied": false }));
    }
    match control::check_live_change(&current.config, &config, force) {
        Ok(losses) => changes.extend(losses),
        Err(e) => return error(409, e),
    }
    let Some(path) = current.path.clone() else {
        return error(
            409,
            "serving the built-in default: start with --config FILE to change the configuration",
        );
    };
    let runtime = match control::rebuild(&config, &current.runtime) {
        Ok(r) => r,
        Err(e) => return error(400, e),
    };
    let mut portals = admin.portals.lock().unwrap_or_else(|p| p.into_inner());
    let (added, removed) = portals::changes(&portals.addrs(), &runtime.listen);
    let mut listeners = Vec::with_capacity(added.len());
    for addr in added {
        match portals::bind(addr) {
            Ok(l) => listeners.push((addr, l)),
            Err(e) => return error(400, format!("portal: cannot listen on {addr}: {e}")),
        }
    }
    // Persist before going live: a file that cannot be written leaves
    // everything as it was.
    if let Err(e) = write_atomically(&path, &text) {
        return error(500, format!("cannot write {}: {e}", path.display()));
    }
    runtime.commit(Some(&current.runtime));
    for frontend in &admin.frontends {
        frontend.replace_exports(&runtime.exports);
        // Sessions whose initiator lost the target are asked to log out.
        frontend.end_refused_sessions();
    }
    for (addr, listener) in listeners {
        tracing::info!(%addr, "portal added");
        portals.start(addr, listener);
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
    // The transport reads its [daemon] settings once, at start.
    let nbd_listeners =
        |c: &control::Config| c.nbd.as_ref().map(|n| (n.listen.clone(), n.tls.clone()));
    let restart_needed = current.config.daemon != config.daemon
        || nbd_listeners(&current.config) != nbd_listeners(&config);
    let previous = std::mem::replace(&mut current.runtime, runtime);
    current.config = config;
    current.text = text;
    // Devices the new configuration dropped are flushed before they go.
    if let Err(e) = previous.flush_all() {
        tracing::warn!(error = %e, "flushing the previous configuration's devices");
    }
    for change in &changes {
        tracing::info!(change = %change, "configuration applied");
    }
    let mut answer = json!({ "changes": changes, "applied": true });
    if restart_needed {
        answer["note"] = json!(
            "[daemon] settings and where NBD listens (listen, tls) take effect at the next start"
        );
    }
    (200, answer)
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
