//! `openarray raid replace` in the running daemon: a RAID5 LUN over
//! `faulty`-over-file members, a hot spare copied beside a member while
//! an initiator writes; another member lost during the copy; the daemon
//! restarted after the swap and killed in the middle of a second one.
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::admin::AdminDaemon;
use common::free_port;
use common::iscsi::{LoginParams, Session};
use serde_json::Value;

const IQN: &str = "iqn.2026-11.org.openarray.test:raid-replace";
const HOST: &str = "iqn.2026-11.org.openarray.test:host";
const BLOCK: u32 = 512;
const MEMBERS: [&str; 4] = ["m0", "m1", "m2", "m3"];
const SPARES: [&str; 3] = ["n0", "n1", "n2"];

fn config(dir: &Path) -> String {
    let mut text = String::new();
    for name in MEMBERS.iter().chain(&SPARES) {
        text += &format!(
            "[[device]]\nname = \"{name}-disk\"\nkind = \"file\"\npath = \"{}/{name}.img\"\nsize = \"16M\"\n\
             [[device]]\nname = \"{name}\"\nkind = \"faulty\"\nover = \"{name}-disk\"\n",
            dir.display()
        );
    }
    // Slow syncs, so that the test sees a replace under way; raised with
    // `raid speed` when it waits for one to end.
    text += "[[device]]\nname = \"r5\"\nkind = \"raid\"\nlevel = 5\n\
             members = [\"m0\", \"m1\", \"m2\", \"m3\"]\nspares = [\"n0\", \"n1\", \"n2\"]\n\
             chunk = \"64K\"\nsync_speed_min = \"512K\"\nsync_speed_max = \"1M\"\n";
    text += &format!("[[target]]\nname = \"{IQN}\"\n[[target.lun]]\nlun = 0\ndevice = \"r5\"\n");
    text
}

fn start(dir: &Path) -> AdminDaemon {
    let path = dir.join("openarray.toml");
    std::fs::write(&path, config(dir)).expect("write config");
    AdminDaemon::start_listening(&path, dir, free_port())
}

fn status(daemon: &AdminDaemon) -> Value {
    serde_json::from_str(&daemon.ok(&["raid", "status", "r5", "--json"])).expect("status")
}

/// Polls the status until `done` says so.
fn wait_for(daemon: &AdminDaemon, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let s = status(daemon);
        if done(&s) {
            return s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{what}: not after 60 s: {s:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn fast(daemon: &AdminDaemon) {
    daemon.ok(&["raid", "speed", "r5", "--min", "100M", "--max", "1G"]);
}

fn replacement(s: &Value) -> Option<&Value> {
    s["members"]
        .as_array()?
        .iter()
        .find(|m| m["state"] == "replacement")
}

fn login(daemon: &AdminDaemon) -> Session {
    let params = LoginParams::normal(HOST, IQN);
    Session::login(daemon.addr(), &params, Duration::from_secs(20)).expect("login")
}

/// 256 KiB of `tag`'s pattern for piece `piece`.
const PIECE: u64 = 256 << 10;
fn pattern(tag: u64, piece: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(PIECE as usize);
    let mut x = (tag + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (piece + 1);
    while out.len() < PIECE as usize {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

fn write(s: &mut Session, piece: u64, tag: u64) {
    let lba = (piece * PIECE / u64::from(BLOCK)) as u32;
    s.write10(0, lba, &pattern(tag, piece), BLOCK)
        .expect("WRITE(10)");
}

fn check(s: &mut Session, tags: &[u64], when: &str) {
    for (piece, tag) in tags.iter().enumerate() {
        let lba = (piece as u64 * PIECE / u64::from(BLOCK)) as u32;
        let got = s
            .read10(0, lba, (PIECE / u64::from(BLOCK)) as u16, BLOCK)
            .expect("READ(10)");
        assert!(
            got == pattern(*tag, piece as u64),
            "{when}: piece {piece} does not hold tag {tag}"
        );
    }
}

#[test]
fn replace_copies_beside_the_member_survives_a_loss_and_restarts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = start(dir.path());
    fast(&daemon);
    let clean = wait_for(&daemon, "initial resync", |s| {
        s["state"] == "clean" && s["sync"].is_null()
    });
    let pieces = clean["size_bytes"].as_u64().unwrap() / PIECE;
    let mut tags = vec![1u64; pieces as usize];
    let mut s = login(&daemon);
    for p in 0..pieces {
        write(&mut s, p, 1);
    }
    daemon.ok(&["raid", "speed", "r5", "--min", "512K", "--max", "1M"]);

    // n0, a hot spare, is copied beside m1, which stays in sync.
    let out = daemon.ok(&["raid", "replace", "r5", "m1", "n0"]);
    assert!(out.contains("takes its place when complete"), "{out}");
    assert!(
        !out.contains("will not find it"),
        "n0 is a configured spare: {out}"
    );
    let under_way = wait_for(&daemon, "copy progress", |s| {
        replacement(s).is_some_and(|r| r["recovered_bytes"].as_u64() > Some(0))
    });
    assert_eq!(under_way["state"], "clean", "{under_way:#}");
    assert_eq!(under_way["members"][1]["name"], "m1");
    assert_eq!(under_way["members"][1]["state"], "in-sync");
    assert_eq!(under_way["members"][1]["replaced_by"], "n0");
    let r = replacement(&under_way).unwrap();
    assert_eq!((&r["name"], &r["replacing"]), (&"n0".into(), &1.into()));
    assert_eq!(under_way["sync"]["kind"], "replace", "{under_way:#}");
    let text = daemon.ok(&["raid", "status", "r5"]);
    assert!(text.contains("(1) n0"), "{text}");

    // Writes during the copy, on both sides of its progress.
    for p in (0..pieces).step_by(3) {
        write(&mut s, p, 2);
        tags[p as usize] = 2;
    }
    // Another member lost during the copy: the data stays whole, since
    // m1 is still in.
    daemon.ok(&["device", "fault", "m2", "fail"]);
    check(&mut s, &tags, "m2 lost during the replace");
    let degraded = status(&daemon);
    assert_eq!(degraded["state"], "degraded", "{degraded:#}");
    assert!(replacement(&degraded).is_some(), "{degraded:#}");
    for p in (1..pieces).step_by(4) {
        write(&mut s, p, 3);
        tags[p as usize] = 3;
    }
    fast(&daemon);
    // n1, the other spare, rebuilds m2's slot; n0 takes m1's.
    let done = wait_for(&daemon, "replace and rebuild", |s| {
        s["state"] == "clean" && s["sync"].is_null() && replacement(s).is_none()
    });
    let names: Vec<&str> = done["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["slot"].is_u64())
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert_eq!(names, ["m0", "n0", "n1", "m3"], "{done:#}");
    check(&mut s, &tags, "after the replace");
    drop(s);
    // A scrub: clean, and its time is kept across the restart (the
    // `scrub_every` schedule counts from it).
    let scrub: Value =
        serde_json::from_str(&daemon.ok(&["raid", "scrub", "r5", "--json"])).unwrap();
    assert_eq!(scrub["report"]["mismatches"], 0, "{scrub:#}");
    let scrubbed = status(&daemon)["last_scrub_at_ms"].clone();
    assert!(scrubbed.as_u64() > Some(0), "{scrubbed}");

    // A restart after the swap: m1 is released and stays out, n0 holds
    // its slot; m2, healthy again but stale, is left out too (n1 holds
    // its slot).
    daemon.terminate();
    let daemon = start(dir.path());
    let again = wait_for(&daemon, "assembly after the swap", |s| s["sync"].is_null());
    assert_eq!(again["members"][1]["name"], "n0", "{again:#}");
    assert_eq!(again["state"], "clean", "{again:#}");
    assert_eq!(again["last_scrub_at_ms"], scrubbed, "{again:#}");
    assert!(
        daemon
            .log()
            .contains("a replacement took this RAID member's place"),
        "{}",
        daemon.log()
    );
    let mut s = login(&daemon);
    check(&mut s, &tags, "after a restart");

    // A second replace, of m3 by the last spare, killed in the middle:
    // the replacement's superblock brings it back beside m3.
    daemon.ok(&["raid", "speed", "r5", "--min", "512K", "--max", "1M"]);
    daemon.ok(&["raid", "replace", "r5", "m3", "n2"]);
    wait_for(&daemon, "second copy progress", |s| {
        replacement(s).is_some_and(|r| r["recovered_bytes"].as_u64() > Some(0))
    });
    for p in (2..pieces).step_by(5) {
        write(&mut s, p, 4);
        tags[p as usize] = 4;
    }
    // SYNCHRONIZE CACHE: what the members (and the replacement) hold in
    // their caches becomes stable, then SIGKILL.
    s.command_good(0, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0)
        .expect("SYNCHRONIZE CACHE");
    drop(s);
    drop(daemon);
    let daemon = start(dir.path());
    let resumed = status(&daemon);
    let r = replacement(&resumed).unwrap_or_else(|| panic!("{resumed:#}"));
    assert_eq!((&r["name"], &r["replacing"]), (&"n2".into(), &3.into()));
    assert_eq!(resumed["members"][3]["name"], "m3", "{resumed:#}");
    let mut s = login(&daemon);
    check(&mut s, &tags, "after a kill during the replace");
    fast(&daemon);
    let done = wait_for(&daemon, "second replace", |s| {
        s["state"] == "clean" && s["sync"].is_null() && replacement(s).is_none()
    });
    assert_eq!(done["members"][3]["name"], "n2", "{done:#}");
    // Any one member lost now: the data stands.
    daemon.ok(&["device", "fault", "n2", "fail"]);
    check(&mut s, &tags, "with the second replacement lost again");
    drop(s);
    daemon.terminate();
}
