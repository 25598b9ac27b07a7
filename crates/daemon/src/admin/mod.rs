//! The administration API: HTTP/1.1 with JSON bodies on a unix socket that
//! only its owner may use (mode 0600), and optionally on TCP with a bearer
//! token (`http.rs`, `guard.rs`). The full reference is docs/admin.md.
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
//! | `GET /v1/stats/live` | Server-Sent Events of IOPS, throughput and latency percentiles per LUN, initiator and NBD export, a sample a second (TCP listener only: `http.rs`, the `console` crate's sampler) |
//! | `GET /metrics` | the same in the Prometheus text format |
//! | `/v1/sessions...` | live sessions; ending one (`sessions.rs`) |
//! | `GET /v1/status` | everything on one page, with what is degraded (`status.rs`) |
//! | `/v1/devices/{name}...` | a device's tree and state; faults injected (`devices.rs`) |
//! | `/v1/raid/{name}...` | a RAID device's status; members failed, removed, added, replaced; scrub (the kind's routes: `control::kinds::raid_api`) |
//! | `/v1/caches/{name}...` | a cache's status; flush, detach, attach, mode (`control::kinds::cache_api`) |
//!
//! Errors answer 4xx/5xx with `{"error"}`; a configuration error names the
//! file, line, field and reason. `apply` and `edit` validate the whole
//! configuration, build the new objects over the running ones, bind new
//! portals, write the file atomically, and only then make the change live;
//! a change that fails anywhere leaves the running state and the file as
//! they were. Applying what is already running changes nothing. A change
//! the running objects cannot take (a formatted pool's layout) is refused,
//! and so is one that replaces data a LUN serves unless `force=true`.

mod console;
mod devices;
mod guard;
mod http;
mod kind_routes;
mod sessions;
mod socket;
mod status;

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

pub use guard::{ApiGuard, Token};
pub use http::{serve_metrics, serve_tcp, serve_unix, Deadlines};
pub use socket::{bind, held_by_a_daemon, SocketFile};

pub use crate::{portals, write_atomically, Current};

/// Where `serve --admin-socket` listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/openarray.sock";

pub struct Admin {
    pub current: Mutex<Current>,
    /// The iSCSI transport, for its sessions.
    pub server: Arc<iscsi::Server>,
    /// Every transport, each given the exports of a change.
    pub frontends: Vec<Arc<dyn export::Frontend>>,
    /// The listeners of the transports other than iSCSI, moved by a change.
    pub listeners: Vec<Arc<dyn crate::LiveListeners>>,
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
            match crate::proposed(&current, text, &origin)
                .map_err(|r| error(r.status(), r.message()))
            {
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
            .or_else(|| kind_routes::route(admin, method, path, &req.body))
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
    edit_running(admin, &edit, req.force())
}

/// `edit` made to the running configuration's text, applied as a whole
/// file would be.
pub(crate) fn edit_running(admin: &Admin, edit: &control::Edit, force: bool) -> (u16, Value) {
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
    let text = match control::apply_edit(&current.text, edit) {
        Ok(t) => t,
        Err(e) => return error(400, e),
    };
    let origin = match &current.path {
        Some(p) => format!("{} (as edited)", p.display()),
        None => "<edit>".into(),
    };
    apply_text(admin, &mut current, text, &origin, force)
}

/// The change made through the daemon's one transaction, as an answer.
fn apply_text(
    admin: &Admin,
    current: &mut Current,
    text: String,
    origin: &str,
    force: bool,
) -> (u16, Value) {
    let transports = crate::Transports {
        portals: &admin.portals,
        listeners: &admin.listeners,
        frontends: &admin.frontends,
    };
    match crate::apply_text(&transports, current, text, origin, force) {
        Ok(done) => {
            let mut answer = json!({ "changes": done.changes, "applied": done.applied });
            if let Some(note) = done.note {
                answer["note"] = json!(note);
            }
            (200, answer)
        }
        Err(refused) => error(refused.status(), refused.message()),
    }
}
