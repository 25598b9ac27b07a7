//! The volume verbs on RBD images, which live in a Ceph pool rather than
//! in a pool of this array.

use serde_json::{json, Value};

use super::{size_field, text_field, Answer, Failure, PoolSource};

/// The volume verbs on an RBD image a device serves, when `pool` names a
/// Ceph pool rather than a pool of this array: `snapshot` takes an RBD
/// snapshot, `clone` of `IMAGE@SNAPSHOT` makes a layered clone in the
/// same Ceph pool, `resize` grows the image.
pub(super) fn operate(
    source: &dyn PoolSource,
    pool: &str,
    name: &str,
    op: &str,
    body: &Value,
) -> Answer {
    let (image, snapshot) = match name.split_once('@') {
        Some((image, snapshot)) => (image, Some(snapshot)),
        None => (name, None),
    };
    let Some(device) = source.rbd_device(pool, image) else {
        return Err(Failure(
            404,
            format!("no pool named {pool}, and no rbd device serves an image {pool}/{image}"),
        ));
    };
    let rbd_op = match (op, snapshot) {
        ("snapshot", None) => control::kinds::RbdOp::Snapshot {
            snapshot: text_field(body, "name")?.to_string(),
        },
        ("clone", Some(snapshot)) => control::kinds::RbdOp::Clone {
            snapshot: snapshot.to_string(),
            image: text_field(body, "name")?.to_string(),
        },
        ("clone", None) => {
            return Err(Failure(
                400,
                format!("clone an RBD snapshot, named IMAGE@SNAPSHOT, not {name}"),
            ))
        }
        ("resize", None) => control::kinds::RbdOp::Resize {
            size: size_field(body, "size")?,
        },
        _ => {
            return Err(Failure(
                400,
                format!("`{op}` of {pool}/{name}: RBD images take snapshot, clone (of IMAGE@SNAPSHOT) and resize"),
            ))
        }
    };
    let done = control::kinds::rbd_operation(&*device, &rbd_op).map_err(|e| Failure(409, e))?;
    let status = if op == "resize" { 200 } else { 201 };
    Ok((status, json!({ "pool": pool, "name": name, "done": done })))
}
