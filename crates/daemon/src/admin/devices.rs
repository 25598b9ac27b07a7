//! `GET /v1/devices/{name}`: the device and everything under it, with each
//! node's state; `POST /v1/devices/{name}/fault`: a fault injected into a
//! `faulty` device (`{"fault": "fail"|"fail-reads"|"fail-writes"|"heal"|
//! "corrupt"|"drop-unflushed", "offset"?, "len"?}`); `POST
//! /v1/devices/{name}/rbd`: an operation on an `rbd` device's image
//! (`{"op": "snapshot"|"clone"|"resize", "snapshot"?, "image"?, "size"?}`).

use serde_json::{json, Map, Value};

use super::{error, Admin};
use control::kinds::{Fault, RbdOp};

pub(crate) fn route(admin: &Admin, method: &str, path: &str, body: &[u8]) -> Option<(u16, Value)> {
    let rest = path.strip_prefix("/v1/devices/")?;
    let (name, action) = match rest.split_once('/') {
        Some((name, action)) => (name, Some(action)),
        None => (rest, None),
    };
    Some(match (method, action) {
        ("GET", None) => show(admin, name),
        ("POST", Some("fault")) => fault(admin, name, body),
        ("POST", Some("rbd")) => rbd(admin, name, body),
        (_, None | Some("fault" | "rbd")) => error(405, "method not allowed"),
        _ => error(404, format!("no such resource {path}")),
    })
}

fn show(admin: &Admin, name: &str) -> (u16, Value) {
    let current = admin.lock();
    match current.runtime.device_tree(&current.config, name) {
        Some(tree) => (200, node_json(&tree)),
        None => error(404, format!("no device `{name}`")),
    }
}

fn pairs(list: &[(&str, String)]) -> Value {
    let map: Map<String, Value> = list
        .iter()
        .map(|(k, v)| (k.to_string(), Value::String(v.clone())))
        .collect();
    Value::Object(map)
}

fn node_json(node: &control::DeviceNode) -> Value {
    json!({
        "name": node.name,
        "kind": node.kind,
        "open": node.open,
        "size": node.size,
        "settings": pairs(&node.settings),
        "state": pairs(&node.state),
        "children": node.children.iter().map(node_json).collect::<Vec<_>>(),
    })
}

fn fault(admin: &Admin, name: &str, body: &[u8]) -> (u16, Value) {
    let request: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return error(400, format!("the body is not JSON: {e}")),
    };
    let number = |key: &str| request[key].as_u64();
    let fault = match request["fault"].as_str() {
        Some("fail") => Fault::Fail {
            reads: true,
            writes: true,
        },
        Some("fail-reads") => Fault::Fail {
            reads: true,
            writes: false,
        },
        Some("fail-writes") => Fault::Fail {
            reads: false,
            writes: true,
        },
        Some("heal") => Fault::Heal,
        Some("drop-unflushed") => Fault::DropUnflushed,
        Some("corrupt") => match (number("offset"), number("len")) {
            (Some(offset), Some(len)) => Fault::Corrupt { offset, len },
            _ => return error(400, "`corrupt` needs `offset` and `len` in bytes"),
        },
        other => {
            return error(
                400,
                format!(
                    "unknown fault {other:?}: one of fail, fail-reads, fail-writes, heal, corrupt, drop-unflushed"
                ),
            )
        }
    };
    let current = admin.lock();
    if current.config.device(name).is_none() {
        return error(404, format!("no device `{name}`"));
    }
    match current.runtime.inject_fault(name, fault) {
        Ok(done) => (200, json!({ "device": name, "done": done })),
        Err(e) => error(409, e),
    }
}

fn rbd(admin: &Admin, name: &str, body: &[u8]) -> (u16, Value) {
    let request: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return error(400, format!("the body is not JSON: {e}")),
    };
    let text = |key: &str| request[key].as_str().filter(|s| !s.is_empty());
    let op = match (request["op"].as_str(), text("snapshot")) {
        (Some("snapshot"), Some(snapshot)) => RbdOp::Snapshot {
            snapshot: snapshot.into(),
        },
        (Some("clone"), Some(snapshot)) => match text("image") {
            Some(image) => RbdOp::Clone {
                snapshot: snapshot.into(),
                image: image.into(),
            },
            None => return error(400, "`clone` needs `image`"),
        },
        (Some("resize"), _) => match request["size"].as_u64() {
            Some(size) => RbdOp::Resize { size },
            None => return error(400, "`resize` needs `size` in bytes"),
        },
        (Some("snapshot" | "clone"), None) => return error(400, "needs `snapshot`"),
        (other, _) => {
            return error(
                400,
                format!("unknown operation {other:?}: one of snapshot, clone, resize"),
            )
        }
    };
    let current = admin.lock();
    if current.config.device(name).is_none() {
        return error(404, format!("no device `{name}`"));
    }
    let Some(device) = current.runtime.open_device(name) else {
        return error(
            409,
            format!("device `{name}` is not open (no LUN or pool uses it)"),
        );
    };
    match control::kinds::rbd_operation(&*device, &op) {
        Ok(done) => (200, json!({ "device": name, "done": done })),
        Err(e) => error(409, format!("device `{name}`: {e}")),
    }
}
