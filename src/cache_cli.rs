//! `openarray cache status|flush|detach|attach|mode`: the cache devices of
//! a running daemon (`/v1/caches`).

use std::process::ExitCode;

use clap::Subcommand;
use serde_json::{json, Value};

use crate::api_client::{call, ApiArgs, Endpoint};
use crate::output::human;
use daemon::volume_api::percent_encode;

#[derive(Subcommand)]
pub enum CacheCommand {
    /// Mode, health, hit ratios, dirty bytes, write-back, occupancy.
    Status {
        /// The cache device's name.
        name: String,
        /// The API's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Write every dirty block back to the backing now.
    Flush { name: String },
    /// Write everything back, then serve from the backing alone.
    Detach { name: String },
    /// Put the cache in front of the backing again.
    Attach { name: String },
    /// Print the mode, or change it live (and in the configuration):
    /// writethrough, writeback, writearound or none. Leaving writeback
    /// writes every dirty block back first.
    Mode { name: String, mode: Option<String> },
}

fn ratio(v: &Value) -> String {
    format!("{:.1}%", v.as_f64().unwrap_or(0.0) * 100.0)
}

/// `cache status` as text.
pub fn status_text(answer: &Value) -> String {
    let s = &answer["status"];
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let health = match s["health"]["state"].as_str() {
        Some("ok") => "ok".to_string(),
        _ => format!(
            "FAILED: {}",
            s["health"]["effect"].as_str().unwrap_or("unknown")
        ),
    };
    let mut out = vec![
        format!(
            "cache {}: {} in front of {}",
            answer["name"].as_str().unwrap_or("?"),
            answer["cache"].as_str().unwrap_or("?"),
            answer["backing"].as_str().unwrap_or("?")
        ),
        format!(
            "  mode {}{}",
            s["mode"].as_str().unwrap_or("?"),
            if s["attached"] == true {
                ""
            } else {
                " (detached: the backing alone serves)"
            }
        ),
        format!("  health {health}"),
        format!(
            "  reads {} hit ({} hit, {} missed); writes {} hit",
            ratio(&s["reads"]["ratio"]),
            human(n(&s["reads"]["hit_bytes"])),
            human(n(&s["reads"]["miss_bytes"])),
            ratio(&s["writes"]["ratio"])
        ),
        format!(
            "  occupancy {} ({} of {} lines of {}), {} evictions",
            ratio(&s["occupancy"]),
            n(&s["occupied_lines"]),
            n(&s["lines"]),
            human(n(&s["line_size"])),
            n(&s["evictions"])
        ),
        format!(
            "  dirty {} in {} lines; written back {} ({}/s now, threshold {}, limit {}/s)",
            human(n(&s["dirty_bytes"])),
            n(&s["dirty_lines"]),
            human(n(&s["writeback"]["written_bytes"])),
            human(n(&s["writeback"]["rate_bytes_per_sec"])),
            human(n(&s["writeback"]["threshold_bytes"])),
            human(n(&s["writeback"]["limit_bytes_per_sec"]))
        ),
        format!(
            "  bypassed {} I/Os, {} (sequential cutoff {})",
            n(&s["bypassed_ios"]),
            human(n(&s["bypassed_bytes"])),
            match n(&s["sequential_cutoff"]) {
                0 => "off".to_string(),
                c => human(c),
            }
        ),
    ];
    if s["backing_marked"] == true {
        out.push(
            "  the backing is marked as needing this cache device: writes not yet written \
             back live only here, so without this device the backing is not served \
             (a mirrored cache device survives the loss of one)"
                .into(),
        );
    }
    if let Some(f) = s["flushing"].as_object() {
        out.push(format!(
            "  writing back: {} of {} left",
            human(f["dirty_bytes_left"].as_u64().unwrap_or(0)),
            human(f["total_bytes"].as_u64().unwrap_or(0))
        ));
    }
    let events = s["events"].as_array().cloned().unwrap_or_default();
    if !events.is_empty() {
        out.push("  events:".into());
        out.extend(
            events
                .iter()
                .map(|e| format!("    {}", e.as_str().unwrap_or(""))),
        );
    }
    out.join("\n") + "\n"
}

fn run_inner(api: &Endpoint, cmd: CacheCommand) -> anyhow::Result<ExitCode> {
    let path = |name: &str, action: &str| {
        let base = format!("/v1/caches/{}", percent_encode(name));
        if action.is_empty() {
            base
        } else {
            format!("{base}/{action}")
        }
    };
    let (status, answer) = match &cmd {
        CacheCommand::Status { name, .. } | CacheCommand::Mode { name, mode: None } => {
            call(api, "GET", &path(name, ""), b"", None)?
        }
        CacheCommand::Flush { name } => call(api, "POST", &path(name, "flush"), b"", None)?,
        CacheCommand::Detach { name } => call(api, "POST", &path(name, "detach"), b"", None)?,
        CacheCommand::Attach { name } => call(api, "POST", &path(name, "attach"), b"", None)?,
        CacheCommand::Mode {
            name,
            mode: Some(mode),
        } => {
            let body = json!({ "mode": mode }).to_string();
            call(api, "POST", &path(name, "mode"), body.as_bytes(), None)?
        }
    };
    if status != 200 {
        eprintln!("{}", answer["error"].as_str().unwrap_or("unknown error"));
        return Ok(ExitCode::FAILURE);
    }
    match cmd {
        CacheCommand::Status { json: true, .. } => {
            println!("{}", serde_json::to_string_pretty(&answer)?)
        }
        CacheCommand::Status { json: false, .. } => print!("{}", status_text(&answer)),
        CacheCommand::Mode { mode: None, .. } => {
            println!("{}", answer["status"]["mode"].as_str().unwrap_or("?"))
        }
        CacheCommand::Flush { name } => println!(
            "{name}: wrote back {}; {} dirty",
            human(answer["written_bytes"].as_u64().unwrap_or(0)),
            human(answer["dirty_bytes"].as_u64().unwrap_or(0))
        ),
        CacheCommand::Mode {
            name,
            mode: Some(_),
        } => println!("{name}: mode {}", answer["mode"].as_str().unwrap_or("?")),
        CacheCommand::Detach { name } | CacheCommand::Attach { name } => {
            println!("{name}: {}", answer["done"].as_str().unwrap_or("done"))
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run(api: &ApiArgs, cmd: CacheCommand) -> ExitCode {
    api.run(|e| run_inner(e, cmd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_says_what_a_failed_write_back_cache_means() {
        let answer = json!({"name": "hybrid", "cache": "ssd", "backing": "hdd", "status": {
            "mode": "writeback", "attached": true,
            "health": {"state": "failed", "stranded_bytes": 4096,
                       "effect": "4096 bytes ... fail with MEDIUM ERROR"},
            "reads": {"ratio": 0.5, "hit_bytes": 1024, "miss_bytes": 1024},
            "writes": {"ratio": 1.0}, "occupancy": 0.25, "occupied_lines": 1, "lines": 4,
            "line_size": 65536, "evictions": 0, "dirty_bytes": 4096, "dirty_lines": 1,
            "writeback": {"written_bytes": 0, "rate_bytes_per_sec": 0,
                          "threshold_bytes": 0, "limit_bytes_per_sec": 0},
            "bypassed_ios": 0, "bypassed_bytes": 0, "sequential_cutoff": 0,
            "flushing": null, "events": ["1: failed"]}});
        let text = status_text(&answer);
        assert!(text.contains("health FAILED: 4096 bytes"), "{text}");
        assert!(
            text.contains("reads 50.0% hit (1K hit, 1K missed)"),
            "{text}"
        );
        assert!(text.contains("sequential cutoff off"), "{text}");
        assert!(text.contains("    1: failed"), "{text}");
    }
}
