//! `/v1/raid/{name}...`: a RAID device's status and its members managed
//! by hand.
//!
//! | Route | Body | Answer |
//! |---|---|---|
//! | `GET /v1/raid/{name}` | | the array's status: state, members, sync, bitmap, scrub, weakest link |
//! | `POST /v1/raid/{name}/fail` | `{"member", "force"?}` | the member marked failed; a spare takes its slot. Refused (409) when it would fail the array, unless `force` |
//! | `POST /v1/raid/{name}/remove` | `{"member"}` | a failed member taken out of its slot |
//! | `POST /v1/raid/{name}/add` | `{"device"}` | a configured device added as a hot spare |
//! | `POST /v1/raid/{name}/replace` | `{"member", "device"}` | the device (a spare of the array, or unused) copied beside the member, taking its place when complete |
//! | `POST /v1/raid/{name}/assemble` | `{"force"?}` | an array whose members refused assembly at start, put together now (`force`: from the freshest stale members) |
//! | `POST /v1/raid/{name}/scrub` | `{"repair"?, "wait"?}` | with `wait`, the scrub's report |
//! | `POST /v1/raid/{name}/speed` | `{"min"?, "max"?}` (bytes a second) | the resync and rebuild speed limits, changed live |
//!
//! A member is named by its configured device name or by its slot number.

use std::sync::Arc;

use block::BlockDevice;
use raid::RaidArray;
use serde_json::{json, Value};

use super::{error, Admin};

pub(crate) fn route(admin: &Admin, method: &str, path: &str, body: &[u8]) -> Option<(u16, Value)> {
    let rest = path.strip_prefix("/v1/raid/")?;
    let (name, action) = match rest.split_once('/') {
        Some((name, action)) => (name, Some(action)),
        None => (rest, None),
    };
    let Some(device) = raid_device(admin, name) else {
        return Some(error(404, format!("no open RAID device `{name}`")));
    };
    let request: Value = if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => return Some(error(400, format!("the body is not JSON: {e}"))),
        }
    };
    let pending = control::kinds::as_pending(&*device);
    if let ("POST", Some("assemble")) = (method, action) {
        let force = request["force"].as_bool().unwrap_or(false);
        return Some(match pending.filter(|p| p.array().is_none()) {
            None => error(409, format!("`{name}` is assembled already")),
            Some(p) => match p.assemble(name, force) {
                Ok(_) => (200, json!({ "done": format!("{name} assembled") })),
                Err(e) => error(409, format!("`{name}` does not assemble: {e}")),
            },
        });
    }
    let Some(array) = control::kinds::as_raid(&*device) else {
        let reason = pending.map(|p| p.reason()).unwrap_or_default();
        return Some(match (method, action) {
            ("GET", None) => (
                200,
                json!({ "name": name, "state": "failed", "assembled": false, "reason": reason }),
            ),
            _ => error(
                409,
                format!(
                    "`{name}` is not assembled ({reason}): put it together with \
                     `openarray raid assemble {name} [--force]` first"
                ),
            ),
        });
    };
    Some(match (method, action) {
        ("GET", None) => status(admin, name, array),
        ("POST", Some("fail")) => {
            let force = request["force"].as_bool().unwrap_or(false);
            with_slot(array, &request, |slot| {
                if let Some(loss) = array.loss_if_failed(slot).filter(|_| !force) {
                    return Err(std::io::Error::other(format!(
                        "refused: {loss}; fail it with --force if that is meant"
                    )));
                }
                array.fail(slot).map(|()| "failed".to_string())
            })
        }
        ("POST", Some("remove")) => with_slot(array, &request, |slot| {
            array.remove(slot).map(|_| "removed".to_string())
        }),
        ("POST", Some("add")) => add(admin, name, array, &request),
        ("POST", Some("replace")) => replace(admin, name, array, &request),
        ("POST", Some("scrub")) => scrub(&device, &request),
        ("POST", Some("speed")) => speed(array, &request),
        (
            _,
            None | Some("fail" | "remove" | "add" | "replace" | "scrub" | "speed" | "assemble"),
        ) => error(405, "method not allowed"),
        _ => error(404, format!("no such resource {path}")),
    })
}

/// The open device `name`, held past the configuration lock so that a
/// long scrub does not block the API.
fn raid_device(admin: &Admin, name: &str) -> Option<Arc<dyn BlockDevice>> {
    let current = admin.lock();
    let device = current.runtime.open_device(name)?;
    if control::kinds::as_raid(&*device).is_none() && control::kinds::as_pending(&*device).is_none()
    {
        return None;
    }
    Some(device)
}

fn status(admin: &Admin, name: &str, array: &RaidArray) -> (u16, Value) {
    let st = array.status();
    let spec = admin
        .lock()
        .config
        .device(name)
        .and_then(|d| d.spec.as_kind::<control::kinds::RaidSpec>().cloned());
    match serde_json::to_value(&st) {
        Ok(mut v) => {
            v["name"] = json!(name);
            // Configured devices the array does not hold stay listed, as
            // md lists a faulty device until it is removed.
            let out = spec
                .iter()
                .flat_map(|spec| spec.member_parts(&st))
                .filter(|(_, p)| p == "out");
            if let Some(list) = v["members"].as_array_mut() {
                for (device, _) in out {
                    list.push(json!({ "slot": null, "name": device, "state": "out", "io": null }));
                }
            }
            (200, v)
        }
        Err(e) => error(500, e),
    }
}

/// Sets `request.min` and `request.max` (bytes a second; either kept as
/// it is when absent) as the array's sync speed limits.
fn speed(array: &RaidArray, request: &Value) -> (u16, Value) {
    let (mut min, mut max) = array.sync_speed();
    for (field, value) in [("min", &mut min), ("max", &mut max)] {
        match &request[field] {
            Value::Null => {}
            v => match v.as_u64() {
                Some(n) => *value = n,
                None => return error(400, format!("`{field}` is bytes a second, not {v}")),
            },
        }
    }
    match array.set_sync_speed(min, max) {
        Ok(()) => (
            200,
            json!({ "done": format!("sync speed {min} to {max} bytes/s"), "min": min, "max": max }),
        ),
        Err(e) => error(400, e),
    }
}

/// The slot of `request.member`: a member's name or a slot number.
fn slot_of(array: &RaidArray, request: &Value) -> Result<usize, (u16, Value)> {
    let status = array.status();
    let slots = status.members.iter().filter_map(|m| Some((m.slot?, m)));
    match &request["member"] {
        Value::Number(n) => n
            .as_u64()
            .map(|n| n as usize)
            .filter(|n| *n < array.geometry().members)
            .ok_or_else(|| error(400, format!("no slot {n}"))),
        Value::String(s) => {
            if let Ok(n) = s.parse::<usize>() {
                return slot_of(array, &json!({ "member": n }));
            }
            let mut found = slots.filter(|(_, m)| m.name.as_deref() == Some(s));
            found
                .next()
                .map(|(slot, _)| slot)
                .ok_or_else(|| error(404, format!("no member `{s}` in the array")))
        }
        _ => Err(error(400, "`member` names a member device or a slot")),
    }
}

fn with_slot(
    array: &RaidArray,
    request: &Value,
    act: impl FnOnce(usize) -> std::io::Result<String>,
) -> (u16, Value) {
    let slot = match slot_of(array, request) {
        Ok(s) => s,
        Err(e) => return e,
    };
    match act(slot) {
        Ok(done) => (200, json!({ "slot": slot, "done": done })),
        Err(e) => error(409, e),
    }
}

/// `request.device`: a configured device no LUN or pool has open,
/// opened for the array.
fn spare_device(
    admin: &Admin,
    request: &Value,
) -> Result<(Arc<dyn BlockDevice>, String), (u16, Value)> {
    let Some(name) = request["device"].as_str() else {
        return Err(error(400, "`device` names a configured device"));
    };
    let current = admin.lock();
    if current.config.device(name).is_none() {
        return Err(error(404, format!("no device `{name}`")));
    }
    if current.runtime.open_device(name).is_some() {
        return Err(error(409, format!("device `{name}` is in use")));
    }
    control::open_device(&current.config, name)
        .map(|d| (d, name.to_string()))
        .map_err(|e| error(409, format!("device `{name}`: {e}")))
}

/// `raid add`: a device the array is configured over (a healed member,
/// a spare) goes back in as mdadm's `--add` puts it (re-added when it
/// still owns its slot, else a spare); any other configured device is
/// checked, then recorded among the array's spares through the same
/// atomic save as `config apply`, which hands it to the running array.
fn add(admin: &Admin, name: &str, array: &RaidArray, request: &Value) -> (u16, Value) {
    let Some(dev_name) = request["device"].as_str() else {
        return error(400, "`device` names a configured device");
    };
    let spares = {
        let current = admin.lock();
        let spec = current
            .config
            .device(name)
            .and_then(|d| d.spec.as_kind::<control::kinds::RaidSpec>().cloned());
        let Some(spec) = spec else {
            return error(404, format!("no RAID device `{name}` in the configuration"));
        };
        let listed = spec
            .members
            .iter()
            .chain(&spec.spares)
            .any(|d| d == dev_name);
        if listed {
            let Some(dev) = current.runtime.open_device(dev_name) else {
                return error(409, format!("`{dev_name}` is not open"));
            };
            return match control::kinds::take_device(array, &dev, dev_name) {
                Ok(done) => (200, json!({ "done": done })),
                Err(e) => error(409, e),
            };
        }
        spec.spares
    };
    // Checked on a trial open first: a device the array cannot take is
    // refused before the configuration changes.
    match spare_device(admin, request) {
        Ok((dev, _)) => {
            if let Err(e) = array.can_add(&dev) {
                return error(409, e);
            }
        }
        Err(e) => return e,
    }
    let mut list: Vec<String> = spares;
    list.push(dev_name.to_string());
    let quoted: Vec<String> = list.iter().map(|s| format!("{s:?}")).collect();
    let edit = control::Edit::DeviceModify {
        name: name.to_string(),
        settings: [("spares".to_string(), format!("[{}]", quoted.join(", ")))].into(),
    };
    let (status, answer) = super::edit_running(admin, &edit, false);
    if status != 200 {
        return (status, answer);
    }
    let held = array.spare_named(dev_name).is_some()
        || array
            .status()
            .members
            .iter()
            .any(|m| m.name.as_deref() == Some(dev_name));
    if !held {
        return error(
            500,
            format!("{dev_name} was recorded among {name}'s spares but the array did not take it (see the log)"),
        );
    }
    (
        200,
        json!({ "done": format!("{dev_name} added as a spare and recorded in {name}'s spares") }),
    )
}

/// `raid replace`: the device, a hot spare of the array or made one
/// first as `raid add` makes it (recorded in the configuration), is
/// copied beside the member and takes its place when complete.
fn replace(admin: &Admin, name: &str, array: &RaidArray, request: &Value) -> (u16, Value) {
    let slot = match slot_of(array, request) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let Some(dev_name) = request["device"].as_str() else {
        return error(400, "`device` names a configured device");
    };
    if array.spare_named(dev_name).is_none() {
        let (status, answer) = add(admin, name, array, request);
        if status != 200 {
            return (status, answer);
        }
    }
    let Some(dev) = array.spare_named(dev_name) else {
        return error(
            409,
            format!(
                "{dev_name} went back into its own slot, not among the spares: nothing to copy"
            ),
        );
    };
    match array.replace(slot, dev.clone()) {
        Ok(()) => {
            array.name_members(&[(dev, dev_name.to_string())]);
            let done = format!(
                "{dev_name} is copied beside slot {slot}'s member and takes its place when complete"
            );
            (200, json!({ "slot": slot, "done": done }))
        }
        Err(e) => error(409, e),
    }
}

fn scrub(device: &Arc<dyn BlockDevice>, request: &Value) -> (u16, Value) {
    let repair = request["repair"].as_bool().unwrap_or(false);
    let array = control::kinds::as_raid(&**device).expect("checked a RAID device");
    if request["wait"].as_bool().unwrap_or(false) {
        return match array.scrub(repair) {
            Ok(report) => (200, json!({ "report": report })),
            Err(e) => error(500, format!("scrub stopped: {e}")),
        };
    }
    drop(array.start_scrub(repair));
    (200, json!({ "done": "scrub started" }))
}
