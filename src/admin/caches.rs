//! `/v1/caches/{name}...`: the cache devices of the running configuration.
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /v1/caches/{name}` | `{"name", "cache", "backing", "status"}`: hit ratios, dirty bytes, health, ... |
//! | `POST /v1/caches/{name}/flush` | every dirty block written back: `{"written_bytes"}` |
//! | `POST /v1/caches/{name}/detach` | everything written back, then the backing alone serves |
//! | `POST /v1/caches/{name}/attach` | the cache in front again (after `detach`, or a repaired failure) |
//! | `POST /v1/caches/{name}/mode` (`{"mode"}`) | the mode changed live and in the configuration |
//!
//! The long operations run without the configuration lock, so that
//! `status` shows their progress meanwhile.

use std::collections::BTreeMap;
use std::sync::Arc;

use block::BlockDevice;
use cache::{CacheDevice, FlushProgress, Mode};
use control::kinds::{as_cache, CacheSpec};
use serde_json::{json, Value};

use super::{error, Admin};

pub(crate) fn route(admin: &Admin, method: &str, path: &str, body: &[u8]) -> Option<(u16, Value)> {
    let rest = path.strip_prefix("/v1/caches/")?;
    let (name, action) = match rest.split_once('/') {
        Some((name, action)) => (name, Some(action)),
        None => (rest, None),
    };
    Some(match (method, action) {
        ("GET", None) => status(admin, name),
        ("POST", Some("flush")) => flush(admin, name),
        ("POST", Some("detach")) => detach(admin, name),
        ("POST", Some("attach")) => attach(admin, name),
        ("POST", Some("mode")) => mode(admin, name, body),
        (_, None | Some("flush" | "detach" | "attach" | "mode")) => {
            error(405, "method not allowed")
        }
        _ => error(404, format!("no such resource {path}")),
    })
}

/// The open cache device `name` and its settings; the configuration lock
/// is released before the caller uses it.
fn open_cache(
    admin: &Admin,
    name: &str,
) -> Result<(Arc<dyn BlockDevice>, CacheSpec), (u16, Value)> {
    let current = admin.lock();
    let dev = current
        .config
        .device(name)
        .ok_or_else(|| error(404, format!("no device `{name}`")))?;
    let spec = dev.spec.as_kind::<CacheSpec>().cloned().ok_or_else(|| {
        error(
            409,
            format!("device `{name}` is a `{}` device, not a cache", dev.kind()),
        )
    })?;
    let device = current.runtime.open_device(name).ok_or_else(|| {
        error(
            409,
            format!("cache `{name}` is not open (no LUN or pool uses it)"),
        )
    })?;
    Ok((device, spec))
}

/// Runs `op` on cache `name`.
fn with_cache(
    admin: &Admin,
    name: &str,
    op: impl FnOnce(&CacheDevice, &CacheSpec) -> (u16, Value),
) -> (u16, Value) {
    match open_cache(admin, name) {
        Ok((device, spec)) => match as_cache(&*device) {
            Some(cache) => op(cache, &spec),
            None => error(500, format!("device `{name}` is not open as a cache")),
        },
        Err(e) => e,
    }
}

fn status(admin: &Admin, name: &str) -> (u16, Value) {
    with_cache(admin, name, |cache, spec| {
        (
            200,
            json!({
                "name": name,
                "cache": spec.cache,
                "backing": spec.backing,
                "status": cache.status(),
            }),
        )
    })
}

fn log_progress<'a>(name: &'a str, what: &'static str) -> impl FnMut(FlushProgress) + 'a {
    move |p| {
        tracing::info!(
            cache = %name,
            written = p.written_bytes,
            left = p.dirty_bytes_left,
            "{what}"
        )
    }
}

fn flush(admin: &Admin, name: &str) -> (u16, Value) {
    with_cache(admin, name, |cache, _| {
        let before = cache.status().writeback.written_bytes;
        match cache.flush_dirty(&mut log_progress(name, "writing back")) {
            Ok(()) => {
                let s = cache.status();
                (
                    200,
                    json!({
                        "cache": name,
                        "written_bytes": s.writeback.written_bytes - before,
                        "dirty_bytes": s.dirty_bytes,
                    }),
                )
            }
            Err(e) => error(500, format!("cache `{name}`: writing back failed: {e}")),
        }
    })
}

fn detach(admin: &Admin, name: &str) -> (u16, Value) {
    with_cache(admin, name, |cache, _| {
        match cache.detach(&mut log_progress(name, "writing back to detach")) {
            Ok(()) => (
                200,
                json!({ "cache": name, "done": "detached: the backing alone serves" }),
            ),
            Err(e) => error(500, format!("cache `{name}`: not detached: {e}")),
        }
    })
}

fn attach(admin: &Admin, name: &str) -> (u16, Value) {
    with_cache(admin, name, |cache, _| match cache.attach() {
        Ok(()) => (200, json!({ "cache": name, "done": "attached" })),
        Err(e) => error(500, format!("cache `{name}`: not attached: {e}")),
    })
}

/// Leaving write-back writes every dirty block back first, outside the
/// configuration lock (status shows the progress); the change itself then
/// goes through the configuration like any edit, so it is kept.
fn mode(admin: &Admin, name: &str, body: &[u8]) -> (u16, Value) {
    let request: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return error(400, format!("the body is not JSON: {e}")),
    };
    let Some(text) = request["mode"].as_str() else {
        return error(400, "`mode` is missing");
    };
    let mode: Mode = match text.parse() {
        Ok(m) => m,
        Err(e) => return error(400, e),
    };
    let drained = with_cache(admin, name, |cache, _| {
        if cache.mode() != Mode::WriteBack || mode == Mode::WriteBack {
            return (200, Value::Null);
        }
        match cache.flush_dirty(&mut log_progress(
            name,
            "writing back before the mode change",
        )) {
            Ok(()) => (200, Value::Null),
            Err(e) => error(500, format!("cache `{name}`: writing back failed: {e}")),
        }
    });
    if drained.0 != 200 {
        return drained;
    }
    let edit = control::Edit::DeviceModify {
        name: name.to_string(),
        settings: BTreeMap::from([("mode".to_string(), mode.to_string())]),
    };
    let (status, mut answer) = super::edit_running(admin, &edit, false);
    if status == 200 {
        answer["cache"] = json!(name);
        answer["mode"] = json!(mode);
    }
    (status, answer)
}
