//! `GET /v1/status`: the whole daemon on one page, with what is degraded.
//!
//! `{"healthy", "failed", "degraded": [{"kind", "name", "problem",
//! "severity"}], "portals", "targets", "sessions", "nbd_exports",
//! "transports", "devices", "pools", "schedules"}`; `transports` holds
//! what a transport tells of itself (`"nvme-tcp"`: listeners and
//! subsystems), and its problems are among the degraded. Each device's kind gives its own
//! verdict (a RAID degraded, rebuilding, resyncing or failed; a cache
//! failed; a file gone), and a LUN or export is as bad as the worst
//! device under it. `failed` (severity "failed"): some data cannot be
//! served. Degraded means too: a configured portal
//! whose listener is not accepting, a pool above [`POOL_FULL_PERCENT`]
//! used, a pool that cannot be opened or whose metadata or a data device
//! file is gone, and a LUN whose file device's path no longer names the
//! file it serves (or an NBD export's device, likewise), and a
//! `[[schedule]]` whose last run failed.

use std::net::SocketAddr;

use serde_json::{json, Value};

use super::{error, Admin, Current};

/// A pool used above this share of its size is degraded: thin volumes
/// fail writes once it is full.
pub const POOL_FULL_PERCENT: f64 = 90.0;

/// Answers `/v1/status`; `None` for any other path.
pub(crate) fn route(admin: &Admin, method: &str, path: &str) -> Option<(u16, Value)> {
    if path != "/v1/status" {
        return None;
    }
    if method != "GET" {
        return Some(error(405, "method not allowed"));
    }
    Some((200, status(admin)))
}

/// One degraded object.
fn problem(kind: &str, name: &str, problem: &str) -> Value {
    json!({ "kind": kind, "name": name, "problem": problem, "severity": "degraded" })
}

/// What is wrong under the device `name` (itself, what it is built on,
/// and for a pool volume the pool's data devices), nearest first, and
/// whether any of it is failed (data unreadable).
fn trouble(
    current: &Current,
    devices: &[control::DeviceHealth],
    name: &str,
) -> (Option<String>, bool, Vec<String>) {
    let mut found = control::problems_under(devices, name);
    let pool = devices
        .iter()
        .find(|d| d.name == name)
        .and_then(|d| d.pool.clone());
    if let Some(pool) = pool.and_then(|p| current.config.pools.iter().find(|c| c.name == p)) {
        for member in &pool.devices {
            if let control::PoolMember::Device(d) = member {
                found.extend(control::problems_under(devices, d));
            }
        }
    }
    let text = found.first().map(|d| match d.name == name {
        true => d.problem.clone().unwrap_or_default(),
        false => format!(
            "{} {}: {}",
            d.kind,
            d.name,
            d.problem.clone().unwrap_or_default()
        ),
    });
    let failed = found.iter().any(|d| d.failed);
    (text, failed, found.iter().map(|d| d.name.clone()).collect())
}

/// Marks a `degraded` entry failed when it makes data unreadable.
fn mark(entry: &mut Value, failed: bool) {
    if failed {
        entry["severity"] = json!("failed");
    }
}

fn status(admin: &Admin) -> Value {
    // Before the lock: the report takes it too.
    let schedules = admin.schedules.report(admin)["schedules"].take();
    let current = admin.lock();
    let listening = admin
        .portals
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .listening();
    let sessions = super::sessions::all(admin);
    let counts = admin.server.session_counts();
    let mut degraded = Vec::new();

    let portals: Vec<Value> = current
        .runtime
        .listen
        .iter()
        .map(|addr| {
            let accepting = listening.iter().any(|(a, up)| a == addr && *up);
            if !accepting {
                degraded.push(problem(
                    "portal",
                    &addr.to_string(),
                    "not accepting connections",
                ));
            }
            let on_it = sessions
                .iter()
                .filter(|s| {
                    let portals = s["connections"].as_array().into_iter().flatten();
                    portals
                        .filter_map(|c| c["portal"].as_str()?.parse().ok())
                        .any(|portal| serves(*addr, portal))
                })
                .count();
            json!({ "address": addr.to_string(), "listening": accepting, "sessions": on_it })
        })
        .collect();

    let devices = current.runtime.device_health();
    // Devices a LUN's or an export's entry already names.
    let mut reported: Vec<String> = Vec::new();
    let targets: Vec<Value> = current
        .config
        .targets
        .iter()
        .map(|t| {
            let mut luns = Vec::new();
            let maps = std::iter::once((None, &t.luns))
                .chain(t.groups.iter().map(|g| (Some(g.name.as_str()), &g.luns)));
            for (group, map) in maps {
                for l in map {
                    let device = devices.iter().find(|d| d.name == l.device);
                    let (trouble, failed, under) = trouble(&current, &devices, &l.device);
                    reported.extend(under);
                    if let Some(p) = &trouble {
                        let name = match group {
                            Some(g) => format!("{} group {g} LUN {}", t.name, l.lun),
                            None => format!("{} LUN {}", t.name, l.lun),
                        };
                        let mut entry = problem("lun", &name, &format!("device {}: {p}", l.device));
                        mark(&mut entry, failed);
                        degraded.push(entry);
                    }
                    luns.push(json!({
                        "lun": l.lun,
                        "group": group,
                        "device": l.device,
                        "pool": device.and_then(|d| d.pool.clone()),
                        "read_only": l.read_only,
                        "state": lun_state(&trouble, failed),
                        "problem": trouble,
                    }));
                }
            }
            let on_it = counts
                .by_target
                .iter()
                .find(|(name, _)| *name == t.name)
                .map_or(0, |(_, n)| *n);
            json!({ "name": t.name, "alias": t.alias, "sessions": on_it, "luns": luns })
        })
        .collect();

    let nbd_exports = nbd_exports(admin, &current, &devices, &mut degraded, &mut reported);
    // Transports that tell their own status (NVMe/TCP).
    let mut transports = serde_json::Map::new();
    for f in &admin.frontends {
        if let Some(s) = f.status() {
            for (what, why) in &s.problems {
                degraded.push(problem(f.transport(), what, why));
            }
            transports.insert(f.transport().to_string(), s.summary);
        }
    }
    let pools = pools(&current, &mut degraded);
    // A RAID, cache or file in trouble that no LUN or export serves yet.
    for d in devices.iter().filter(|d| !reported.contains(&d.name)) {
        if let Some(p) = &d.problem {
            let mut entry = problem("device", &d.name, p);
            mark(&mut entry, d.failed);
            degraded.push(entry);
        }
    }
    let device_list: Vec<Value> = devices
        .iter()
        .map(|d| {
            json!({
                "name": d.name,
                "kind": d.kind,
                "state": lun_state(&d.problem, d.failed),
                "problem": d.problem,
            })
        })
        .collect();
    for sch in schedules.as_array().into_iter().flatten() {
        if let Some(e) = sch["error"].as_str() {
            degraded.push(problem("schedule", sch["volume"].as_str().unwrap_or(""), e));
        }
    }
    let sessions: Vec<Value> = sessions
        .iter()
        .filter(|s| s["transport"] == "iscsi")
        .map(|full| {
            json!({
                "id": full["id"],
                "initiator": full["initiator"],
                "target": full["target"],
                "portal": full["portal"],
                "peer": full["peer"],
                "luns_used": full["luns_used"],
            })
        })
        .collect();
    json!({
        "healthy": degraded.is_empty(),
        "failed": degraded.iter().any(|d| d["severity"] == "failed"),
        "degraded": degraded,
        "portals": portals,
        "targets": targets,
        "sessions": sessions,
        "nbd_exports": nbd_exports,
        "transports": transports,
        "devices": device_list,
        "pools": pools,
        "schedules": schedules,
    })
}

/// Every NBD export with its device's state and its sessions now.
fn nbd_exports(
    admin: &Admin,
    current: &Current,
    devices: &[control::DeviceHealth],
    degraded: &mut Vec<Value>,
    reported: &mut Vec<String>,
) -> Vec<Value> {
    let sessions = super::sessions::all(admin);
    current
        .config
        .nbd_exports()
        .map(|e| {
            let (trouble, failed, under) = trouble(current, devices, &e.device);
            reported.extend(under);
            if let Some(p) = &trouble {
                let what = format!("device {}: {p}", e.device);
                let mut entry = problem("nbd_export", &e.name, &what);
                mark(&mut entry, failed);
                degraded.push(entry);
            }
            let peers: Vec<&str> = sessions
                .iter()
                .filter(|s| s["transport"] == "nbd" && s["export"] == e.name.as_str())
                .filter_map(|s| s["peer"].as_str())
                .collect();
            json!({
                "name": e.name,
                "device": e.device,
                "read_only": e.read_only,
                "sessions": peers.len(),
                "peers": peers,
                "state": lun_state(&trouble, failed),
                "problem": trouble,
            })
        })
        .collect()
}

fn lun_state(trouble: &Option<String>, failed: bool) -> &'static str {
    match (trouble, failed) {
        (None, _) => "ok",
        (Some(_), false) => "degraded",
        (Some(_), true) => "failed",
    }
}

/// Whether a connection that arrived at `local` came through the portal
/// `portal` (a wildcard portal takes its port on every address).
fn serves(portal: SocketAddr, local: SocketAddr) -> bool {
    portal == local
        || (portal.ip().is_unspecified()
            && portal.port() == local.port()
            && portal.is_ipv4() == local.is_ipv4())
}

/// Every pool of the configuration with its use; problems go to
/// `degraded`. A pool not created yet is listed, not degraded.
fn pools(current: &Current, degraded: &mut Vec<Value>) -> Vec<Value> {
    current
        .runtime
        .pool_configs()
        .iter()
        .map(|p| {
            if !p.metadata.exists() {
                return json!({ "name": p.name, "state": "not created" });
            }
            let mut problems: Vec<String> = p
                .devices
                .iter()
                .filter_map(|d| match d {
                    control::PoolMember::Path(path) => (!path.exists()).then_some(path),
                    control::PoolMember::Device(_) => None,
                })
                .map(|d| format!("data device {} is missing", d.display()))
                .collect();
            let mut v = json!({ "name": p.name });
            match current.runtime.pool(&p.name) {
                Ok(pool) => {
                    let s = pool.space();
                    let percent = if s.size() == 0 {
                        0.0
                    } else {
                        s.used() as f64 * 100.0 / s.size() as f64
                    };
                    if percent > POOL_FULL_PERCENT {
                        problems.push(format!(
                            "{percent:.1}% used (above {POOL_FULL_PERCENT}%): thin volumes fail writes once it is full"
                        ));
                    }
                    v["size"] = json!(s.size());
                    v["used"] = json!(s.used());
                    v["free"] = json!(s.free());
                    v["used_percent"] = json!((percent * 10.0).round() / 10.0);
                    v["volumes"] = json!(pool.volumes().len());
                }
                Err(e) => problems.push(format!("cannot be opened: {e}")),
            }
            for p_ in &problems {
                degraded.push(problem("pool", &p.name, p_));
            }
            v["state"] = json!(if problems.is_empty() { "ok" } else { "degraded" });
            v["problems"] = json!(problems);
            v
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_portals_serve_their_port_on_every_address() {
        let at = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(serves(at("10.0.0.1:3260"), at("10.0.0.1:3260")));
        assert!(!serves(at("10.0.0.1:3260"), at("10.0.0.2:3260")));
        assert!(serves(at("0.0.0.0:3260"), at("10.0.0.2:3260")));
        assert!(!serves(at("0.0.0.0:3260"), at("10.0.0.2:3261")));
        assert!(!serves(at("0.0.0.0:3260"), at("[::1]:3260")));
        assert!(serves(at("[::]:3260"), at("[::1]:3260")));
    }
}
