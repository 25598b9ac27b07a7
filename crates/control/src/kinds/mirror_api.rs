//! `/v1/mirrors/{name}...`: the mirror devices of the running
//! configuration, and the planned role moves of the pair.
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /v1/mirrors/{name}` | `{"name", "over", "status", "link", "witness"}`: role, connection, generations, out-of-sync bytes, resync progress; the link's state; the witness's lease |
//! | `POST /v1/mirrors/{name}/promote` | this node serves the mirror's writes (refused while the peer is primary, or this replica is behind) |
//! | `POST /v1/mirrors/{name}/demote` | this node stops writing; what it wrote is flushed |
//! | `POST /v1/mirrors/{name}/failover` | the primary peer demotes, then this node promotes; with `{"force": true}`, this node promotes without the peer or the witness |

use serde::Deserialize;
use serde_json::json;

use super::api::{open_of_kind, ApiError, ApiRequest, ApiResult, Daemon, KindApi};
use super::mirror::{as_mirror, MirrorSpec};

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Failover {
    #[serde(default)]
    force: bool,
}

pub const API: KindApi = KindApi {
    prefix: "mirrors",
    route,
};

fn route(daemon: &dyn Daemon, req: &ApiRequest<'_>) -> ApiResult {
    let name = req.name;
    let (device, spec) = open_of_kind::<MirrorSpec>(daemon, name, "mirror")?;
    let mirror = as_mirror(&*device)
        .ok_or_else(|| ApiError::failed(format!("device `{name}` is not open as a mirror")))?;
    let moved = |r: std::io::Result<()>, role: &str| {
        r.map_err(|e| ApiError::conflict(format!("mirror `{name}`: {e}")))?;
        tracing::info!(mirror = %name, "made {role} through the API");
        Ok(json!({ "mirror": name, "role": role, "status": mirror.status() }))
    };
    match (req.method, req.action) {
        ("GET", None) => Ok(json!({
            "name": name,
            "over": spec.over,
            "status": mirror.status(),
            "link": ha::pair::link().map(|l| l.status()),
            "witness": ha::pair::failover().map(|f| f.status(name)),
        })),
        ("POST", Some("promote")) => moved(mirror.promote(), "primary"),
        ("POST", Some("demote")) => moved(mirror.demote(), "secondary"),
        ("POST", Some("failover")) => {
            let force = req.json::<Failover>()?.force;
            if force {
                tracing::warn!(mirror = %name, "forced failover through the API: promoting without the peer or the witness");
            }
            moved(mirror.failover(force), "primary")
        }
        (_, None | Some("promote" | "demote" | "failover")) => {
            Err(ApiError::from_status(405, "method not allowed"))
        }
        (_, Some(other)) => Err(ApiError::not_found(format!(
            "mirrors have no `{other}`: promote, demote or failover"
        ))),
    }
}
