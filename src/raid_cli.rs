//! `openarray raid status|add|remove|replace|fail|assemble|scrub|speed`: a running
//! daemon's RAID devices (`/v1/raid/{name}`).

use std::process::ExitCode;

use clap::Subcommand;
use serde_json::{json, Value};

use crate::api_client::{call, ApiArgs, Endpoint};
use crate::output::Format;
use daemon::volume_api::percent_encode;

#[derive(Subcommand)]
pub enum RaidCommand {
    /// The array's state, each member's state and I/O, rebuild or scrub
    /// progress, the bitmap, and a member markedly slower than its peers.
    Status {
        name: String,
        #[command(flatten)]
        format: Format,
    },
    /// Mark a member failed (a hot spare takes its slot and rebuilds).
    /// Refused when it would take the array past its redundancy.
    Fail {
        name: String,
        member: String,
        /// Fail it even when that fails the array (its data unreadable).
        #[arg(long)]
        force: bool,
    },
    /// Take a failed member out of its slot.
    Remove { name: String, member: String },
    /// Add a configured device no LUN or pool uses as a hot spare.
    Add { name: String, device: String },
    /// Copy a hot spare of the array, or a configured device nothing
    /// uses, beside a member; it takes the member's place when complete
    /// (the member serves and takes writes until then).
    Replace {
        name: String,
        member: String,
        device: String,
    },
    /// Put together an array whose members refused assembly at start (it
    /// stands failed, its LUNs answering NOT READY), once they are back.
    Assemble {
        name: String,
        /// Take the freshest stale members as in sync when too few are
        /// current (md's --force): writes they missed are lost.
        #[arg(long)]
        force: bool,
    },
    /// Change the resync and rebuild speed limits of a running array
    /// (like md's sync_speed_min/max): at least MIN a second even under
    /// foreground I/O, at most MAX.
    Speed {
        name: String,
        #[arg(long, value_parser = speed)]
        min: Option<u64>,
        #[arg(long, value_parser = speed)]
        max: Option<u64>,
    },
    /// Read every stripe and check mirrors and parity (waits for the end
    /// and prints what was found).
    Scrub {
        name: String,
        /// Rewrite what disagrees: the wrong copy or parity, or on RAID6
        /// the data chunk P and Q both point at.
        #[arg(long)]
        repair: bool,
        /// Start it and return; `raid status` shows progress and the
        /// report.
        #[arg(long)]
        background: bool,
        #[arg(long)]
        json: bool,
    },
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn ms(v: &Value) -> String {
    v.as_u64()
        .map_or("-".into(), |ns| format!("{:.2}", ns as f64 / 1e6))
}

/// `raid status` as text.
pub fn status_text(s: &Value, f: &Format) -> String {
    let mut out = format!(
        "{}: RAID{} {}, {} in {} chunks, {} events, {} member failures\n",
        text(&s["name"]),
        text(&s["level"]),
        text(&s["state"]),
        f.size_of(&s["size_bytes"]),
        f.size_of(&s["chunk_bytes"]),
        text(&s["events"]),
        text(&s["member_failures"]),
    );
    if let Some(p) = s["sync"].as_object() {
        let (done, total) = (
            p["done_bytes"].as_u64().unwrap_or(0),
            p["total_bytes"].as_u64().unwrap_or(0),
        );
        let pct = if total == 0 {
            100.0
        } else {
            done as f64 * 100.0 / total as f64
        };
        out.push_str(&format!(
            "{}: {pct:.1}% ({} of {}) at {}/s (limits {}/s to {}/s)\n",
            text(&p["kind"]),
            f.size(done),
            f.size(total),
            f.size(p["bytes_per_sec"].as_u64().unwrap_or(0)),
            f.size_of(&s["sync_speed_min"]),
            f.size_of(&s["sync_speed_max"]),
        ));
    }
    out.push_str(&format!(
        "{:>4} {:<16} {:<18} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8} {:>7}\n",
        "SLOT", "MEMBER", "STATE", "READ", "WRITTEN", "R50ms", "R99ms", "W50ms", "W99ms", "ERRORS"
    ));
    for m in s["members"].as_array().into_iter().flatten() {
        let io = &m["io"];
        let mut state = text(&m["state"]);
        if let Some(b) = m["recovered_bytes"].as_u64() {
            state = format!("{state} {}", f.size(b));
        }
        // A replacement shows the slot it is copied into, in brackets.
        let slot = match m["replacing"].as_u64() {
            Some(r) => format!("({r})"),
            None => text(&m["slot"]),
        };
        out.push_str(&format!(
            "{:>4} {:<16} {:<18} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8} {:>7}\n",
            slot,
            text(&m["name"]),
            state,
            f.size_of(&io["read_bytes"]),
            f.size_of(&io["write_bytes"]),
            ms(&io["read_p50_ns"]),
            ms(&io["read_p99_ns"]),
            ms(&io["write_p50_ns"]),
            ms(&io["write_p99_ns"]),
            text(&io["errors"]),
        ));
    }
    let b = &s["bitmap"];
    out.push_str(&format!(
        "bitmap: {} regions of {}, {} dirty; last resync {}, last catch-up {}\n",
        text(&b["regions"]),
        f.size_of(&b["region_bytes"]),
        text(&b["dirty_regions"]),
        f.size_of(&b["last_resync_bytes"]),
        f.size_of(&b["last_catch_up_bytes"]),
    ));
    if let Some(r) = s["last_scrub"].as_object() {
        out.push_str(&format!(
            "last scrub: {} stripes checked, {} mismatches, {} repaired\n",
            text(&r["stripes_checked"]),
            text(&r["mismatches"]),
            text(&r["repaired"]),
        ));
    }
    if let Some(w) = s["weakest_link"]["finding"].as_str() {
        out.push_str(&format!("weakest link: {w}\n"));
    }
    out
}

/// A speed such as `4M` (bytes a second).
fn speed(text: &str) -> Result<u64, String> {
    control::parse_size(text).map_err(|e| format!("`{text}`: {e}"))
}

fn request(cmd: &RaidCommand) -> (&'static str, String, Value) {
    let at = |name: &str, action: &str| format!("/v1/raid/{}/{action}", percent_encode(name));
    match cmd {
        RaidCommand::Status { name, .. } => (
            "GET",
            format!("/v1/raid/{}", percent_encode(name)),
            json!({}),
        ),
        RaidCommand::Fail {
            name,
            member,
            force,
        } => (
            "POST",
            at(name, "fail"),
            json!({ "member": member, "force": force }),
        ),
        RaidCommand::Remove { name, member } => {
            ("POST", at(name, "remove"), json!({ "member": member }))
        }
        RaidCommand::Add { name, device } => ("POST", at(name, "add"), json!({ "device": device })),
        RaidCommand::Replace {
            name,
            member,
            device,
        } => (
            "POST",
            at(name, "replace"),
            json!({ "member": member, "device": device }),
        ),
        RaidCommand::Assemble { name, force } => {
            ("POST", at(name, "assemble"), json!({ "force": force }))
        }
        RaidCommand::Speed { name, min, max } => {
            ("POST", at(name, "speed"), json!({ "min": min, "max": max }))
        }
        RaidCommand::Scrub {
            name,
            repair,
            background,
            ..
        } => (
            "POST",
            at(name, "scrub"),
            json!({ "repair": repair, "wait": !background }),
        ),
    }
}

fn run_inner(api: &Endpoint, cmd: RaidCommand) -> anyhow::Result<ExitCode> {
    let (method, path, body) = request(&cmd);
    let body = if method == "GET" {
        Vec::new()
    } else {
        body.to_string().into_bytes()
    };
    let (status, answer) = call(api, method, &path, &body, None)?;
    if status != 200 {
        eprintln!("{}", answer["error"].as_str().unwrap_or("unknown error"));
        return Ok(ExitCode::FAILURE);
    }
    match cmd {
        RaidCommand::Status { format, .. } if format.json => {
            println!("{}", serde_json::to_string_pretty(&answer)?)
        }
        RaidCommand::Status { format, .. } => print!("{}", status_text(&answer, &format)),
        RaidCommand::Scrub { json, .. } if answer["report"].is_object() => {
            let r = &answer["report"];
            if json {
                println!("{}", serde_json::to_string_pretty(&answer)?);
            } else {
                println!("{}", scrub_text(r));
            }
            return Ok(scrub_exit(r));
        }
        RaidCommand::Scrub { json: true, .. } => {
            println!("{}", serde_json::to_string_pretty(&answer)?)
        }
        _ => println!("{}", text(&answer["done"])),
    }
    Ok(ExitCode::SUCCESS)
}

/// A scrub's report in words: what was checked, and which members held
/// the mismatches (by slot), when any did.
fn scrub_text(r: &Value) -> String {
    let mut out = format!(
        "{} stripes checked, {} skipped, {} mismatches, {} repaired",
        text(&r["stripes_checked"]),
        text(&r["stripes_skipped"]),
        text(&r["mismatches"]),
        text(&r["repaired"]),
    );
    let wrong: Vec<String> = r["wrong_members"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(slot, n)| format!("slot {slot}: {}", text(n)))
        .collect();
    if !wrong.is_empty() {
        out += &format!("; wrong copies by member: {}", wrong.join(", "));
    }
    if let Some(n) = r["undecided"].as_u64().filter(|n| *n > 0) {
        out += &format!("; {n} mirror chunk(s) whose copies disagree with no majority: which is right cannot be told");
    }
    out
}

/// 1 when the scrub left mismatches unrepaired (the convention of every
/// check: unhealthy is 1), else 0.
fn scrub_exit(r: &Value) -> ExitCode {
    let found = r["mismatches"].as_u64().unwrap_or(0);
    let repaired = r["repaired"].as_u64().unwrap_or(0);
    if found > repaired {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

pub fn run(api: &ApiArgs, cmd: RaidCommand) -> ExitCode {
    api.run(|e| run_inner(e, cmd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scrub_that_leaves_mismatches_exits_1_and_names_members_by_slot() {
        let found = json!({"stripes_checked": 10, "stripes_skipped": 0, "mismatches": 3,
                           "repaired": 0, "wrong_members": {"1": 3}});
        assert_eq!(scrub_exit(&found), ExitCode::FAILURE);
        let t = scrub_text(&found);
        assert!(
            t.ends_with("3 mismatches, 0 repaired; wrong copies by member: slot 1: 3"),
            "{t}"
        );
        let repaired = json!({"mismatches": 3, "repaired": 3, "wrong_members": {}});
        assert_eq!(scrub_exit(&repaired), ExitCode::SUCCESS);
        assert!(!scrub_text(&repaired).contains("wrong"), "no raw `{{}}`");
        assert_eq!(
            scrub_exit(&json!({"mismatches": 0, "repaired": 0})),
            ExitCode::SUCCESS
        );
    }

    #[test]
    fn status_text_names_members_progress_and_the_weakest_link() {
        let s = json!({
            "name": "r5", "level": 5, "state": "rebuilding", "size_bytes": 3 << 20,
            "chunk_bytes": 65536, "events": 4, "member_failures": 1,
            "sync": {"kind": "rebuild", "slot": 2, "done_bytes": 1 << 20,
                     "total_bytes": 4 << 20, "bytes_per_sec": 1 << 20},
            "sync_speed_min": 1 << 20, "sync_speed_max": 200 << 20,
            "members": [{"slot": 2, "name": "s0", "state": "recovering",
                         "recovered_bytes": 1 << 20, "io": null},
                        {"slot": null, "name": "n0", "state": "replacement",
                         "recovered_bytes": 2 << 20, "replacing": 1, "io": null}],
            "bitmap": {"regions": 4, "region_bytes": 1 << 20, "dirty_regions": 0},
            "weakest_link": {"finding": "m1 is 4.0x slower"},
        });
        let t = status_text(&s, &Format::default());
        assert!(t.starts_with("r5: RAID5 rebuilding"), "{t}");
        assert!(t.contains("rebuild: 25.0%"), "{t}");
        assert!(t.contains("limits 1M/s to 200M/s"), "{t}");
        assert!(t.contains("s0"), "{t}");
        assert!(t.contains("recovering 1M"), "{t}");
        assert!(t.contains(" (1) n0"), "{t}");
        assert!(t.contains("replacement 2M"), "{t}");
        assert!(t.contains("weakest link: m1 is 4.0x slower"), "{t}");
        // Columns stay in line whatever the state's length.
        let header = t.lines().find(|l| l.contains("SLOT")).unwrap();
        for row in t
            .lines()
            .filter(|l| l.contains("recovering") || l.contains("replacement"))
        {
            assert_eq!(row.len(), header.len(), "{t}");
        }
    }
}
