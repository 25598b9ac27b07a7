//! Pool and volume operations: the `/v1/pools` and `/v1/volumes`
//! resources of the administration API. The same answers serve
//! `openarray pool|volume` while the daemon is stopped, over the pools of a
//! configuration file opened in that process ([`PoolSource`]).
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /v1/pools` | `{"pools": [pool]}` |
//! | `GET /v1/pools/{pool}` | pool with `"volumes": [volume]` |
//! | `POST /v1/pools/{pool}` | creates the pool of the configuration (formats its devices) unless it exists; the pool |
//! | `POST /v1/pools/{pool}/check` | `{"clean", "problems": [...], ...}`: every unit owned exactly as counted |
//! | `GET /v1/pools/{pool}/jobs[/{id}]` | long operations and their progress |
//! | `GET /v1/volumes[/{pool}]` | `{"volumes": [volume]}` |
//! | `POST /v1/volumes/{pool}` `{"name", "size", "thick"?}` | 201 the volume; thick: 202 with the preallocation `"job"` |
//! | `GET /v1/volumes/{pool}/{name}` | the volume |
//! | `POST /v1/volumes/{pool}/{name}/snapshot` `{"name"}` | 201 the snapshot |
//! | `POST /v1/volumes/{pool}/{snapshot}/clone` `{"name"}` | 201 the clone |
//! | `POST /v1/volumes/{pool}/{name}/rollback` `{"snapshot"}` | the volume |
//! | `POST /v1/volumes/{pool}/{name}/promote` | the volume |
//! | `POST /v1/volumes/{pool}/{name}/resize` `{"size"}` | the volume |
//! | `DELETE /v1/volumes/{pool}/{name}` | 202 `{"job"}` |
//!
//! `snapshot`, `clone` and `resize` also take an RBD image that an `rbd`
//! device serves, when `{pool}` names its Ceph pool and no pool of the
//! array: an RBD snapshot, a layered clone of `{image}@{snapshot}`, a
//! larger image; answered `{"pool", "name", "done"}`.
//!
//! Sizes are bytes or text such as `"10G"`. Names in paths are
//! percent-encoded. Errors are 4xx with `{"error"}`: 404 no such pool or
//! volume, 409 a name taken or a volume a LUN still serves (delete or
//! shrink), 400 a bad request, 507 the pool is full.

pub(crate) mod jobs;
mod rbd;

use std::io;
use std::sync::Arc;

use pool::{Pool, VolumeInfo, VolumeKind};
use serde_json::{json, Value};

use crate::admin::Admin;

/// Where the pools come from: the running daemon, or a configuration file
/// while the daemon is stopped.
pub trait PoolSource {
    /// The pools the configuration declares.
    fn pool_configs(&self) -> Vec<control::PoolConfig>;
    /// The pool, opened (or created on first use) if it is not open yet.
    fn open(&self, config: &control::PoolConfig) -> io::Result<Arc<Pool>>;
    /// The device that serves the volume as a LUN, if one does.
    fn exporter_of(&self, pool: &str, volume: &str) -> Option<String>;
    /// Where long operations run and report.
    fn jobs(&self) -> &Arc<jobs::Jobs>;
    /// The open `rbd` device serving image `image` of Ceph pool `pool`.
    fn rbd_device(&self, pool: &str, image: &str) -> Option<Arc<dyn block::BlockDevice>> {
        let _ = (pool, image);
        None
    }
}

/// The running daemon's pools.
struct Running<'a>(&'a Admin);

impl PoolSource for Running<'_> {
    fn pool_configs(&self) -> Vec<control::PoolConfig> {
        let current = self.0.current.lock().unwrap_or_else(|p| p.into_inner());
        current.runtime.pool_configs().to_vec()
    }

    fn open(&self, config: &control::PoolConfig) -> io::Result<Arc<Pool>> {
        let current = self.0.current.lock().unwrap_or_else(|p| p.into_inner());
        current.runtime.pool(&config.name)
    }

    fn exporter_of(&self, pool: &str, volume: &str) -> Option<String> {
        let current = self.0.current.lock().unwrap_or_else(|p| p.into_inner());
        current.runtime.exporter_of(pool, volume).map(String::from)
    }

    fn jobs(&self) -> &Arc<jobs::Jobs> {
        &self.0.jobs
    }

    fn rbd_device(&self, pool: &str, image: &str) -> Option<Arc<dyn block::BlockDevice>> {
        let current = self.0.current.lock().unwrap_or_else(|p| p.into_inner());
        current
            .config
            .devices
            .iter()
            .filter_map(|d| current.runtime.open_device(&d.name))
            .find(|d| control::kinds::serves_rbd_image(&**d, pool, image))
    }
}

/// The pools of a configuration, in a process that is not the daemon: no
/// volume is exported here. Pools stay open until it is dropped.
pub struct Offline {
    config: control::Config,
    open: std::sync::Mutex<Vec<Arc<Pool>>>,
    jobs: Arc<jobs::Jobs>,
}

impl Offline {
    pub fn new(config: control::Config) -> Offline {
        Offline {
            config,
            open: std::sync::Mutex::new(Vec::new()),
            jobs: Arc::default(),
        }
    }
}

impl PoolSource for Offline {
    fn pool_configs(&self) -> Vec<control::PoolConfig> {
        self.config.pools.clone()
    }

    fn open(&self, config: &control::PoolConfig) -> io::Result<Arc<Pool>> {
        let pool = control::open_pool(&self.config, config)?;
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if !open.iter().any(|p| Arc::ptr_eq(p, &pool)) {
            open.push(pool.clone());
        }
        Ok(pool)
    }

    fn exporter_of(&self, _pool: &str, _volume: &str) -> Option<String> {
        None
    }

    fn jobs(&self) -> &Arc<jobs::Jobs> {
        &self.jobs
    }
}

impl dyn PoolSource + '_ {
    fn pool_names(&self) -> Vec<String> {
        self.pool_configs().into_iter().map(|p| p.name).collect()
    }

    /// An existing pool: reading does not format devices.
    fn pool(&self, name: &str) -> io::Result<Arc<Pool>> {
        self.pool_or_create(name, false)
    }

    /// The pool, formatting its devices first if `create` and it does not
    /// exist yet.
    fn pool_or_create(&self, name: &str, create: bool) -> io::Result<Arc<Pool>> {
        let configs = self.pool_configs();
        let p = configs.iter().find(|p| p.name == name).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("no pool named {name}"))
        })?;
        if !create && !p.metadata.exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("pool {name} is not created yet (openarray pool create)"),
            ));
        }
        self.open(p)
    }
}

/// Answers requests under `/v1/pools` and `/v1/volumes`; `None` for any
/// other path, so the caller can answer 404.
pub fn route(admin: &Admin, method: &str, path: &str, body: &[u8]) -> Option<(u16, Value)> {
    answer(&Running(admin), method, path, body)
}

/// An answer from `source`, for the daemon or the command line alike.
pub fn answer(
    source: &dyn PoolSource,
    method: &str,
    path: &str,
    body: &[u8],
) -> Option<(u16, Value)> {
    let path = path.split('?').next().unwrap_or(path);
    let decoded: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect::<Option<_>>()?;
    let segments: Vec<&str> = decoded.iter().map(String::as_str).collect();
    let result = match segments.as_slice() {
        ["v1", "pools", rest @ ..] => pools(source, method, rest, body),
        ["v1", "volumes", rest @ ..] => volumes(source, method, rest, body),
        _ => return None,
    };
    Some(result.unwrap_or_else(|e| (e.0, json!({ "error": e.1 }))))
}

/// A status and a message.
struct Failure(u16, String);

type Answer = Result<(u16, Value), Failure>;

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Failure {
        let status = match e.kind() {
            io::ErrorKind::NotFound => 404,
            io::ErrorKind::AlreadyExists => 409,
            io::ErrorKind::InvalidInput => 400,
            io::ErrorKind::StorageFull => 507,
            _ => 500,
        };
        Failure(status, e.to_string())
    }
}

fn not_allowed(method: &str) -> Failure {
    Failure(405, format!("{method} is not allowed here"))
}

fn pools(source: &dyn PoolSource, method: &str, rest: &[&str], body: &[u8]) -> Answer {
    match (method, rest) {
        ("GET", []) => {
            let list: Vec<Value> = source
                .pool_names()
                .iter()
                .map(|name| match source.pool(name) {
                    Ok(p) => pool_json(&p, None),
                    Err(e) => json!({ "name": name, "error": e.to_string() }),
                })
                .collect();
            Ok((200, json!({ "pools": list })))
        }
        ("GET", [name]) => {
            let p = source.pool(name)?;
            Ok((200, pool_json(&p, Some(source))))
        }
        ("POST", [name]) => {
            parse_body(body)?;
            let p = source.pool_or_create(name, true)?;
            Ok((200, pool_json(&p, Some(source))))
        }
        ("POST", [name, "check"]) => {
            let r = source.pool(name)?.check()?;
            Ok((
                200,
                json!({
                    "pool": name,
                    "clean": r.is_clean(),
                    "total_units": r.total_units,
                    "used_units": r.used_units,
                    "volumes": r.volumes,
                    "mappings": r.mappings,
                    "problems": r.problems,
                }),
            ))
        }
        ("GET", [name, "jobs"]) => {
            source.pool(name)?;
            Ok((200, json!({ "jobs": source.jobs().of_pool(name) })))
        }
        ("GET", [name, "jobs", id]) => id
            .parse()
            .ok()
            .and_then(|id| source.jobs().get(id))
            .filter(|j| j["pool"] == *name)
            .map(|j| (200, j))
            .ok_or_else(|| Failure(404, format!("no job {id} in pool {name}"))),
        (_, [] | [_] | [_, "check"] | [_, "jobs"] | [_, "jobs", _]) => Err(not_allowed(method)),
        _ => Err(Failure(404, "no such pool resource".into())),
    }
}

fn volumes(source: &dyn PoolSource, method: &str, rest: &[&str], body: &[u8]) -> Answer {
    match (method, rest) {
        ("GET", []) => {
            let mut list = Vec::new();
            for name in source.pool_names() {
                // A pool that cannot be opened has no volumes to list.
                if let Ok(p) = source.pool(&name) {
                    list.extend(volumes_json(&p, source));
                }
            }
            Ok((200, json!({ "volumes": list })))
        }
        ("GET", [pool]) => {
            let p = source.pool(pool)?;
            Ok((200, json!({ "volumes": volumes_json(&p, source) })))
        }
        ("POST", [pool]) => create(source, pool, &parse_body(body)?),
        ("GET", [pool, name]) => {
            let p = source.pool(pool)?;
            Ok((200, volume_json(&p, &p.volume_info(name)?, source)))
        }
        ("DELETE", [pool, name]) => delete(source, pool, name),
        ("POST", [pool, name, operation]) => {
            operate(source, pool, name, operation, &parse_body(body)?)
        }
        (_, [] | [_] | [_, _] | [_, _, _]) => Err(not_allowed(method)),
        _ => Err(Failure(404, "no such volume resource".into())),
    }
}

fn create(source: &dyn PoolSource, pool: &str, body: &Value) -> Answer {
    let name = text_field(body, "name")?;
    let size = size_field(body, "size")?;
    let thick = body["thick"].as_bool().unwrap_or(false);
    let p = source.pool_or_create(pool, true)?;
    let space = p.space();
    if thick && size.div_ceil(space.unit_size) > space.free_units {
        return Err(Failure(
            507,
            format!(
                "a thick {size}-byte volume needs more than the pool's {} free bytes",
                space.free()
            ),
        ));
    }
    let info = p.create_volume(name, size)?;
    if !thick {
        return Ok((201, with_overcommit(&p, volume_json(&p, &info, source))));
    }
    let volume = name.to_string();
    let job = source
        .jobs()
        .start(
            p.clone(),
            "preallocate",
            name,
            Box::new(move |p, progress| p.preallocate(&volume, progress)),
        )
        .map_err(|e| Failure(503, e))?;
    Ok((
        202,
        json!({ "volume": with_overcommit(&p, volume_json(&p, &info, source)), "job": job }),
    ))
}

fn delete(source: &dyn PoolSource, pool: &str, name: &str) -> Answer {
    let p = source.pool(pool)?;
    p.volume_info(name)?;
    if let Some(device) = source.exporter_of(pool, name) {
        return Err(Failure(
            409,
            format!(
                "{name} is served by device {device}; remove its LUNs from the configuration first"
            ),
        ));
    }
    let volume = name.to_string();
    let job = source
        .jobs()
        .start(
            p,
            "delete",
            name,
            Box::new(move |p, progress| p.delete_with_progress(&volume, progress)),
        )
        .map_err(|e| Failure(503, e))?;
    Ok((202, json!({ "job": job })))
}

fn operate(source: &dyn PoolSource, pool: &str, name: &str, op: &str, body: &Value) -> Answer {
    if !source.pool_names().iter().any(|p| p == pool) {
        return rbd::operate(source, pool, name, op, body);
    }
    let p = source.pool(pool)?;
    match op {
        "snapshot" => {
            let info = p.snapshot(name, text_field(body, "name")?)?;
            Ok((201, volume_json(&p, &info, source)))
        }
        "clone" => {
            let info = p.clone_snapshot(name, text_field(body, "name")?)?;
            Ok((201, with_overcommit(&p, volume_json(&p, &info, source))))
        }
        "rollback" => {
            p.rollback(name, text_field(body, "snapshot")?)?;
            Ok((200, volume_json(&p, &p.volume_info(name)?, source)))
        }
        "promote" => {
            p.promote(name)?;
            Ok((200, volume_json(&p, &p.volume_info(name)?, source)))
        }
        "resize" => {
            let size = size_field(body, "size")?;
            if size < p.volume_info(name)?.size {
                if let Some(device) = source.exporter_of(pool, name) {
                    return Err(Failure(
                        409,
                        format!(
                            "{name} is served by device {device}; only an unused volume shrinks"
                        ),
                    ));
                }
            }
            p.resize(name, size)?;
            let volume = volume_json(&p, &p.volume_info(name)?, source);
            Ok((200, with_overcommit(&p, volume)))
        }
        _ => Err(Failure(404, format!("no volume operation {op}"))),
    }
}

fn parse_body(body: &[u8]) -> Result<Value, Failure> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(body).map_err(|e| Failure(400, format!("the body is not JSON: {e}")))
}

fn text_field<'a>(body: &'a Value, field: &str) -> Result<&'a str, Failure> {
    body[field]
        .as_str()
        .ok_or_else(|| Failure(400, format!("`{field}` (a string) is required")))
}

/// A size as a number of bytes or as text such as "10G".
fn size_field(body: &Value, field: &str) -> Result<u64, Failure> {
    match &body[field] {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| Failure(400, format!("`{field}` is not a byte count"))),
        Value::String(s) => {
            control::parse_size(s).map_err(|e| Failure(400, format!("`{field}`: {e}")))
        }
        _ => Err(Failure(
            400,
            format!("`{field}` (bytes or e.g. \"10G\") is required"),
        )),
    }
}

/// Decodes `%XX` escapes; `None` for a malformed escape or bytes that are
/// not UTF-8.
fn percent_decode(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Percent-encodes a name for a path segment.
pub fn percent_encode(name: &str) -> String {
    name.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn pool_json(p: &Pool, with_volumes: Option<&dyn PoolSource>) -> Value {
    let u = p.usage();
    let s = u.space;
    let mut v = json!({
        "name": p.name(),
        "unit_size": s.unit_size,
        "size": s.size(),
        "used": s.used(),
        "free": s.free(),
        "held": s.held_units * s.unit_size,
        "provisioned": u.provisioned,
        "referenced": u.referenced,
        "overcommit": u.overcommit(),
        "max_overcommit": u.max_overcommit,
        "soft_threshold": u.soft_threshold,
        "soft_threshold_reached": u.threshold_reached,
        "allocation_failures": u.allocation_failures,
        "volumes": p.volumes().len(),
    });
    if let Some(source) = with_volumes {
        v["volumes"] = Value::from(volumes_json(p, source));
    }
    v
}

/// A volume's answer to a change of the pool's provisioned size, with how
/// far the pool is over-committed now.
fn with_overcommit(p: &Pool, mut volume: Value) -> Value {
    let u = p.usage();
    volume["pool_provisioned"] = json!(u.provisioned);
    volume["pool_size"] = json!(u.space.size());
    volume["pool_overcommit"] = json!(u.overcommit());
    volume
}

fn volumes_json(p: &Pool, source: &dyn PoolSource) -> Vec<Value> {
    p.volumes()
        .iter()
        .map(|v| volume_json(p, v, source))
        .collect()
}

fn volume_json(p: &Pool, v: &VolumeInfo, source: &dyn PoolSource) -> Value {
    let unit = p.unit_size();
    json!({
        "pool": p.name(),
        "name": v.name,
        "kind": match v.kind {
            VolumeKind::Volume => "volume",
            VolumeKind::Snapshot => "snapshot",
        },
        "size": v.size,
        "parent": v.parent,
        "mapped": v.mapped_units * unit,
        "own": v.exclusive_units * unit,
        "device": source.exporter_of(p.name(), &v.name),
    })
}

#[cfg(test)]
#[path = "volume_api_tests.rs"]
mod tests;
