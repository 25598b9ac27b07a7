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
use serde::Deserialize;
use serde_json::json;

use super::api::{open_of_kind, ApiError, ApiRequest, ApiResult, Daemon, KindApi};
use super::cache::{as_cache, CacheSpec};
use crate::Edit;

pub const API: KindApi = KindApi {
    prefix: "caches",
    route,
};

const ACTIONS: &[&str] = &["flush", "detach", "attach", "mode"];

#[derive(Default, Deserialize)]
struct ModeRequest {
    mode: Option<String>,
}

fn route(daemon: &dyn Daemon, req: &ApiRequest<'_>) -> ApiResult {
    let name = req.name;
    match (req.method, req.action) {
        ("GET", None) => with_cache(daemon, name, |cache, spec| {
            Ok(json!({
                "name": name,
                "cache": spec.cache,
                "backing": spec.backing,
                "status": cache.status(),
            }))
        }),
        ("POST", Some("flush")) => flush(daemon, name),
        ("POST", Some("detach")) => with_cache(daemon, name, |cache, _| {
            cache
                .detach(&mut log_progress(name, "writing back to detach"))
                .map_err(|e| ApiError::failed(format!("cache `{name}`: not detached: {e}")))?;
            Ok(json!({ "cache": name, "done": "detached: the backing alone serves" }))
        }),
        ("POST", Some("attach")) => with_cache(daemon, name, |cache, _| {
            cache
                .attach()
                .map_err(|e| ApiError::failed(format!("cache `{name}`: not attached: {e}")))?;
            Ok(json!({ "cache": name, "done": "attached" }))
        }),
        ("POST", Some("mode")) => mode(daemon, name, &req.json()?),
        _ => Err(req.unknown(ACTIONS)),
    }
}

/// The open cache device `name` and its settings; the configuration lock
/// is not held while the caller uses them.
fn open_cache(
    daemon: &dyn Daemon,
    name: &str,
) -> Result<(Arc<dyn BlockDevice>, CacheSpec), ApiError> {
    open_of_kind(daemon, name, "cache")
}

/// Runs `op` on cache `name`.
fn with_cache(
    daemon: &dyn Daemon,
    name: &str,
    op: impl FnOnce(&CacheDevice, &CacheSpec) -> ApiResult,
) -> ApiResult {
    let (device, spec) = open_cache(daemon, name)?;
    let cache = as_cache(&*device)
        .ok_or_else(|| ApiError::failed(format!("device `{name}` is not open as a cache")))?;
    op(cache, &spec)
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

fn flush(daemon: &dyn Daemon, name: &str) -> ApiResult {
    with_cache(daemon, name, |cache, _| {
        let before = cache.status().writeback.written_bytes;
        cache
            .flush_dirty(&mut log_progress(name, "writing back"))
            .map_err(|e| ApiError::failed(format!("cache `{name}`: writing back failed: {e}")))?;
        let s = cache.status();
        Ok(json!({
            "cache": name,
            "written_bytes": s.writeback.written_bytes - before,
            "dirty_bytes": s.dirty_bytes,
        }))
    })
}

/// Leaving write-back writes every dirty block back first, outside the
/// configuration lock (status shows the progress); the change itself then
/// goes through the configuration like any edit, so it is kept.
fn mode(daemon: &dyn Daemon, name: &str, request: &ModeRequest) -> ApiResult {
    let text = request
        .mode
        .as_deref()
        .ok_or_else(|| ApiError::bad_request("`mode` is missing"))?;
    let mode: Mode = text.parse().map_err(ApiError::bad_request)?;
    with_cache(daemon, name, |cache, _| {
        if cache.mode() == Mode::WriteBack && mode != Mode::WriteBack {
            cache
                .flush_dirty(&mut log_progress(
                    name,
                    "writing back before the mode change",
                ))
                .map_err(|e| {
                    ApiError::failed(format!("cache `{name}`: writing back failed: {e}"))
                })?;
        }
        Ok(json!(null))
    })?;
    let mut answer = daemon.edit(&Edit::DeviceModify {
        name: name.to_string(),
        settings: BTreeMap::from([("mode".to_string(), mode.to_string())]),
    })?;
    answer["cache"] = json!(name);
    answer["mode"] = json!(mode);
    Ok(answer)
}
