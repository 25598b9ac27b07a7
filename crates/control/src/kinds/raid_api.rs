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
use serde::Deserialize;
use serde_json::json;

use super::api::{ApiError, ApiRequest, ApiResult, Daemon, KindApi};
use super::raid::{as_pending, as_raid, take_device, RaidSpec};
use crate::Edit;

pub const API: KindApi = KindApi {
    prefix: "raid",
    route,
};

const ACTIONS: &[&str] = &[
    "fail", "remove", "add", "replace", "scrub", "speed", "assemble",
];

/// A member by slot number or configured name.
#[derive(Deserialize)]
#[serde(untagged)]
enum MemberRef {
    Slot(u64),
    Name(String),
}

/// The body of `fail`, `remove`, `add`, `replace` and `assemble`.
#[derive(Default, Deserialize)]
struct MemberRequest {
    member: Option<MemberRef>,
    device: Option<String>,
    #[serde(default)]
    force: bool,
}

#[derive(Default, Deserialize)]
struct ScrubRequest {
    #[serde(default)]
    repair: bool,
    #[serde(default)]
    wait: bool,
}

/// Bytes a second; an absent limit stays as it is.
#[derive(Default, Deserialize)]
struct SpeedRequest {
    min: Option<u64>,
    max: Option<u64>,
}

fn route(daemon: &dyn Daemon, req: &ApiRequest<'_>) -> ApiResult {
    let name = req.name;
    let device = raid_device(daemon, name)
        .ok_or_else(|| ApiError::not_found(format!("no open RAID device `{name}`")))?;
    let pending = as_pending(&*device);
    if let ("POST", Some("assemble")) = (req.method, req.action) {
        let force = req.json::<MemberRequest>()?.force;
        let p = pending
            .filter(|p| p.array().is_none())
            .ok_or_else(|| ApiError::conflict(format!("`{name}` is assembled already")))?;
        p.assemble(name, force)
            .map_err(|e| ApiError::conflict(format!("`{name}` does not assemble: {e}")))?;
        return Ok(json!({ "done": format!("{name} assembled") }));
    }
    let Some(array) = as_raid(&*device) else {
        let reason = pending.map(|p| p.reason()).unwrap_or_default();
        return match (req.method, req.action) {
            ("GET", None) => {
                Ok(json!({ "name": name, "state": "failed", "assembled": false, "reason": reason }))
            }
            _ => Err(ApiError::conflict(format!(
                "`{name}` is not assembled ({reason}): put it together with \
                 `openarray raid assemble {name} [--force]` first"
            ))),
        };
    };
    match (req.method, req.action) {
        ("GET", None) => status(daemon, name, array),
        ("POST", Some("fail")) => {
            let r: MemberRequest = req.json()?;
            with_slot(array, &r, |slot| {
                if let Some(loss) = array.loss_if_failed(slot).filter(|_| !r.force) {
                    return Err(std::io::Error::other(format!(
                        "refused: {loss}; fail it with --force if that is meant"
                    )));
                }
                array.fail(slot).map(|()| "failed".to_string())
            })
        }
        ("POST", Some("remove")) => with_slot(array, &req.json()?, |slot| {
            array.remove(slot).map(|_| "removed".to_string())
        }),
        ("POST", Some("add")) => add(daemon, name, array, &req.json()?),
        ("POST", Some("replace")) => replace(daemon, name, array, &req.json()?),
        ("POST", Some("scrub")) => scrub(array, &req.json()?),
        ("POST", Some("speed")) => speed(array, &req.json()?),
        _ => Err(req.unknown(ACTIONS)),
    }
}

/// The open device `name` when it is an array (assembled or not), held
/// past the configuration lock so that a long scrub does not block the API.
fn raid_device(daemon: &dyn Daemon, name: &str) -> Option<Arc<dyn BlockDevice>> {
    let device = daemon.open_device(name)?;
    (as_raid(&*device).is_some() || as_pending(&*device).is_some()).then_some(device)
}

fn raid_spec(daemon: &dyn Daemon, name: &str) -> Option<RaidSpec> {
    daemon.settings(name)?.as_kind::<RaidSpec>().cloned()
}

fn status(daemon: &dyn Daemon, name: &str, array: &RaidArray) -> ApiResult {
    let st = array.status();
    let mut v = serde_json::to_value(&st).map_err(ApiError::failed)?;
    v["name"] = json!(name);
    // Configured devices the array does not hold stay listed, as md lists
    // a faulty device until it is removed.
    let spec = raid_spec(daemon, name);
    let out = spec
        .iter()
        .flat_map(|spec| spec.member_parts(&st))
        .filter(|(_, p)| p == "out");
    if let Some(list) = v["members"].as_array_mut() {
        for (device, _) in out {
            list.push(json!({ "slot": null, "name": device, "state": "out", "io": null }));
        }
    }
    Ok(v)
}

fn speed(array: &RaidArray, request: &SpeedRequest) -> ApiResult {
    let (min, max) = array.sync_speed();
    let (min, max) = (request.min.unwrap_or(min), request.max.unwrap_or(max));
    array
        .set_sync_speed(min, max)
        .map_err(ApiError::bad_request)?;
    Ok(json!({ "done": format!("sync speed {min} to {max} bytes/s"), "min": min, "max": max }))
}

/// The slot of `request.member`: a member's name or a slot number.
fn slot_of(array: &RaidArray, request: &MemberRequest) -> Result<usize, ApiError> {
    let slots = array.geometry().members;
    match &request.member {
        Some(MemberRef::Slot(n)) => Some(*n as usize)
            .filter(|n| *n < slots)
            .ok_or_else(|| ApiError::bad_request(format!("no slot {n}"))),
        Some(MemberRef::Name(s)) => match s.parse::<usize>() {
            Ok(n) if n < slots => Ok(n),
            Ok(n) => Err(ApiError::bad_request(format!("no slot {n}"))),
            Err(_) => array
                .status()
                .members
                .iter()
                .find(|m| m.slot.is_some() && m.name.as_deref() == Some(s))
                .and_then(|m| m.slot)
                .ok_or_else(|| ApiError::not_found(format!("no member `{s}` in the array"))),
        },
        None => Err(ApiError::bad_request(
            "`member` names a member device or a slot",
        )),
    }
}

fn with_slot(
    array: &RaidArray,
    request: &MemberRequest,
    act: impl FnOnce(usize) -> std::io::Result<String>,
) -> ApiResult {
    let slot = slot_of(array, request)?;
    let done = act(slot).map_err(ApiError::conflict)?;
    Ok(json!({ "slot": slot, "done": done }))
}

fn device_named(request: &MemberRequest) -> Result<&str, ApiError> {
    request
        .device
        .as_deref()
        .ok_or_else(|| ApiError::bad_request("`device` names a configured device"))
}

/// `raid add`: a device the array is configured over (a healed member,
/// a spare) goes back in as mdadm's `--add` puts it (re-added when it
/// still owns its slot, else a spare); any other configured device is
/// checked, then recorded among the array's spares through the same
/// atomic save as `config apply`, which hands it to the running array.
fn add(daemon: &dyn Daemon, name: &str, array: &RaidArray, request: &MemberRequest) -> ApiResult {
    let dev_name = device_named(request)?;
    let spec = raid_spec(daemon, name).ok_or_else(|| {
        ApiError::not_found(format!("no RAID device `{name}` in the configuration"))
    })?;
    if spec
        .members
        .iter()
        .chain(&spec.spares)
        .any(|d| d == dev_name)
    {
        let dev = daemon
            .open_device(dev_name)
            .ok_or_else(|| ApiError::conflict(format!("`{dev_name}` is not open")))?;
        let done = take_device(array, &dev, dev_name).map_err(ApiError::conflict)?;
        return Ok(json!({ "done": done }));
    }
    // Checked on a trial open first: a device the array cannot take is
    // refused before the configuration changes.
    let dev = daemon.open_unused(dev_name)?;
    array.can_add(&dev).map_err(ApiError::conflict)?;
    let mut list = spec.spares;
    list.push(dev_name.to_string());
    let quoted: Vec<String> = list.iter().map(|s| format!("{s:?}")).collect();
    daemon.edit(&Edit::DeviceModify {
        name: name.to_string(),
        settings: [("spares".to_string(), format!("[{}]", quoted.join(", ")))].into(),
    })?;
    let held = array.spare_named(dev_name).is_some()
        || array
            .status()
            .members
            .iter()
            .any(|m| m.name.as_deref() == Some(dev_name));
    if !held {
        return Err(ApiError::failed(format!(
            "{dev_name} was recorded among {name}'s spares but the array did not take it (see the log)"
        )));
    }
    Ok(json!({ "done": format!("{dev_name} added as a spare and recorded in {name}'s spares") }))
}

/// `raid replace`: the device, a hot spare of the array or made one
/// first as `raid add` makes it (recorded in the configuration), is
/// copied beside the member and takes its place when complete.
fn replace(
    daemon: &dyn Daemon,
    name: &str,
    array: &RaidArray,
    request: &MemberRequest,
) -> ApiResult {
    let slot = slot_of(array, request)?;
    let dev_name = device_named(request)?;
    if array.spare_named(dev_name).is_none() {
        add(daemon, name, array, request)?;
    }
    let dev = array.spare_named(dev_name).ok_or_else(|| {
        ApiError::conflict(format!(
            "{dev_name} went back into its own slot, not among the spares: nothing to copy"
        ))
    })?;
    array
        .replace(slot, dev.clone())
        .map_err(ApiError::conflict)?;
    array.name_members(&[(dev, dev_name.to_string())]);
    let done = format!(
        "{dev_name} is copied beside slot {slot}'s member and takes its place when complete"
    );
    Ok(json!({ "slot": slot, "done": done }))
}

fn scrub(array: &RaidArray, request: &ScrubRequest) -> ApiResult {
    if request.wait {
        let report = array
            .scrub(request.repair)
            .map_err(|e| ApiError::failed(format!("scrub stopped: {e}")))?;
        return Ok(json!({ "report": report }));
    }
    drop(array.start_scrub(request.repair));
    Ok(json!({ "done": "scrub started" }))
}
