//! `openarray ha status|promote|demote|failover`: the mirrors of a running node of
//! an HA pair (`/v1/mirrors`), and planned moves of which node writes.

use std::process::ExitCode;

use clap::Subcommand;
use serde_json::Value;

use crate::api_client::{call, ApiArgs, Endpoint};
use crate::output::human;
use daemon::volume_api::percent_encode;

#[derive(Subcommand)]
pub enum HaCommand {
    /// A mirror's role, the pair's connection, generations, what the peer
    /// lacks and the resync under way; the link's state.
    Status {
        /// The mirror device's name.
        name: String,
        /// The API's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Make this node the one that writes the mirror (refused while the
    /// peer is primary, or while this replica is behind).
    Promote { name: String },
    /// Stop writing the mirror on this node; what it wrote is flushed.
    Demote { name: String },
    /// Move the mirror to this node: the peer steps down (flushing what
    /// it wrote), then this node is promoted. Needs the pair in sync.
    Failover {
        name: String,
        /// Promote without the peer and without the witness's grant. If
        /// the peer still writes, both nodes write and the replicas
        /// diverge (split brain): use it only when the peer is known to
        /// be down.
        #[arg(long)]
        force: bool,
    },
}

/// What `ha failover --force` says before it acts.
pub const FORCE_RISK: &str = "warning: promoting without the peer and without the witness: if the \
peer is still writing, both nodes write and the replicas diverge (split brain), which only an \
operator can resolve, losing one side's writes";

/// `ha status` as text.
pub fn status_text(answer: &Value) -> String {
    let s = &answer["status"];
    let text = |v: &Value| v.as_str().unwrap_or("?").to_string();
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let mut out = vec![
        format!(
            "mirror {} over {}: {} (peer {}), {}",
            text(&answer["name"]),
            text(&answer["over"]),
            text(&s["role"]),
            s["peer_role"].as_str().unwrap_or("unknown"),
            text(&s["connection"]),
        ),
        format!(
            "  generation {:016x}; the peer lacks {}",
            n(&s["generations"]["current"]),
            human(n(&s["out_of_sync_bytes"]))
        ),
    ];
    if s["degraded"] == true {
        out.push("  DEGRADED: writing without the peer".into());
    }
    if let Some(r) = s["resync"].as_object() {
        out.push(format!(
            "  resync: {} of {}",
            human(r["done_bytes"].as_u64().unwrap_or(0)),
            human(r["total_bytes"].as_u64().unwrap_or(0))
        ));
    }
    if let Some(p) = s["problem"].as_str() {
        out.push(format!("  problem: {p}"));
    }
    let link = &answer["link"];
    if link.is_object() {
        let rtt = link["rtt_us"]
            .as_u64()
            .map_or_else(String::new, |us| format!(", round trip {us} µs"));
        out.push(format!(
            "  link {} → {}: {}{rtt}",
            text(&link["node"]),
            text(&link["peer"]),
            if link["connected"] == true {
                "connected"
            } else {
                "down"
            }
        ));
    }
    let w = &answer["witness"];
    if w.is_object() {
        let lease = match w["lease_left_ms"].as_u64() {
            Some(ms) => format!("this node holds the lease ({ms} ms left)"),
            None => "this node holds no lease".into(),
        };
        let forced = if w["forced"] == true {
            "; FORCED: writing without the witness"
        } else {
            ""
        };
        out.push(format!(
            "  witness {}: {lease}{forced}; last answer: {}",
            text(&w["address"]),
            w["last"].as_str().unwrap_or("none yet")
        ));
    }
    out.join("\n") + "\n"
}

fn run_inner(api: &Endpoint, cmd: HaCommand) -> anyhow::Result<ExitCode> {
    let path = |name: &str, action: &str| format!("/v1/mirrors/{}{action}", percent_encode(name));
    let (status, answer) = match &cmd {
        HaCommand::Status { name, .. } => call(api, "GET", &path(name, ""), b"", None)?,
        HaCommand::Promote { name } => call(api, "POST", &path(name, "/promote"), b"", None)?,
        HaCommand::Demote { name } => call(api, "POST", &path(name, "/demote"), b"", None)?,
        HaCommand::Failover { name, force } => {
            if *force {
                eprintln!("{FORCE_RISK}");
            }
            let body = if *force {
                &b"{\"force\": true}"[..]
            } else {
                b""
            };
            call(api, "POST", &path(name, "/failover"), body, None)?
        }
    };
    if status != 200 {
        eprintln!("{}", answer["error"].as_str().unwrap_or("unknown error"));
        return Ok(ExitCode::FAILURE);
    }
    match cmd {
        HaCommand::Status { json: true, .. } => {
            println!("{}", serde_json::to_string_pretty(&answer)?)
        }
        HaCommand::Status { json: false, .. } => print!("{}", status_text(&answer)),
        HaCommand::Promote { name }
        | HaCommand::Demote { name }
        | HaCommand::Failover { name, .. } => {
            println!("{name}: {}", answer["role"].as_str().unwrap_or("?"))
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run(api: &ApiArgs, cmd: HaCommand) -> ExitCode {
    api.run(|e| run_inner(e, cmd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn status_says_when_the_primary_writes_alone() {
        let answer = json!({"name": "vm", "over": "disk", "status": {
            "role": "primary", "peer_role": null, "connection": "connecting",
            "degraded": true, "out_of_sync_bytes": 131072,
            "generations": {"current": 255}, "resync": null,
            "problem": "b failed a request"},
            "link": {"node": "a", "peer": "b", "connected": false, "rtt_us": null},
            "witness": {"address": "w:7791", "lease_ms": 3000, "lease_left_ms": 1200,
                "forced": false, "last": "granted"}});
        let text = status_text(&answer);
        assert!(
            text.contains("mirror vm over disk: primary (peer unknown), connecting"),
            "{text}"
        );
        assert!(
            text.contains("generation 00000000000000ff; the peer lacks 128K"),
            "{text}"
        );
        assert!(text.contains("DEGRADED"), "{text}");
        assert!(text.contains("link a → b: down"), "{text}");
        assert!(
            text.contains(
                "witness w:7791: this node holds the lease (1200 ms left); last answer: granted"
            ),
            "{text}"
        );
    }
}
