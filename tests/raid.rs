//! RAID devices in the running daemon: arrays over `faulty`-over-file
//! members serving LUNs, scrubbed, failed and rebuilt live through
//! `openarray raid` and `openarray device fault`, and cut by SIGKILL and
//! power cuts.
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::admin::AdminDaemon;
use common::free_port;
use common::iscsi::{LoginParams, Session};
use serde_json::Value;

const IQN: &str = "iqn.2026-11.org.openarray.test:raid";
const HOST: &str = "iqn.2026-11.org.openarray.test:host";
const BLOCK: u32 = 512;
const CHUNK: u64 = 64 << 10;

/// `[[device]]` tables of a file `NAME.img` of `size` under `dir` and a
/// `faulty` device NAME over it, for each name.
fn faulty_members(dir: &Path, names: &[&str], size: &str) -> String {
    let mut text = String::new();
    for name in names {
        text += &format!(
            "\n[[device]]\nname = \"{name}-disk\"\nkind = \"file\"\npath = \"{}/{name}.img\"\nsize = \"{size}\"\n\
             [[device]]\nname = \"{name}\"\nkind = \"faulty\"\nover = \"{name}-disk\"\n",
            dir.display()
        );
    }
    text
}

fn raid_device(name: &str, level: u32, members: &[&str], spares: &[&str]) -> String {
    let list = |l: &[&str]| {
        l.iter()
            .map(|n| format!("\"{n}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "\n[[device]]\nname = \"{name}\"\nkind = \"raid\"\nlevel = {level}\nmembers = [{}]\nspares = [{}]\nchunk = \"64K\"\n",
        list(members),
        list(spares)
    )
}

fn target(luns: &[(u64, &str)]) -> String {
    let mut text = format!("\n[[target]]\nname = \"{IQN}\"\n");
    for (lun, device) in luns {
        text += &format!("[[target.lun]]\nlun = {lun}\ndevice = \"{device}\"\n");
    }
    text
}

fn start(dir: &Path, config: &str) -> AdminDaemon {
    let path = dir.join("openarray.toml");
    std::fs::write(&path, config).expect("write config");
    AdminDaemon::start_listening(&path, dir, free_port())
}

fn status(daemon: &AdminDaemon, name: &str) -> Value {
    let out = daemon.ok(&["raid", "status", name, "--json"]);
    serde_json::from_str(&out).expect("raid status --json")
}

/// Waits until the array has no resync, rebuild or scrub running and is
/// clean; returns its last status.
fn wait_clean(daemon: &AdminDaemon, name: &str, limit: Duration) -> Value {
    let start = Instant::now();
    loop {
        let s = status(daemon, name);
        if s["sync"].is_null() && s["state"] == "clean" {
            return s;
        }
        assert!(
            start.elapsed() < limit,
            "{name} is not clean after {limit:?}: {s:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn login(daemon: &AdminDaemon, initiator: &str) -> Session {
    let params = LoginParams::normal(initiator, IQN);
    Session::login(daemon.addr(), &params, Duration::from_secs(20)).expect("login")
}

/// One MiB of `lun`'s pattern at MiB `mib`.
fn pattern(lun: u64, mib: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 << 20);
    let mut x = (lun + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (mib + 1);
    while out.len() < 1 << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

fn write_all(s: &mut Session, lun: u64, bytes: u64) {
    for mib in 0..bytes >> 20 {
        let lba = (mib << 20) / u64::from(BLOCK);
        s.write10(lun, lba as u32, &pattern(lun, mib), BLOCK)
            .expect("WRITE(10)");
    }
}

fn check_all(s: &mut Session, lun: u64, bytes: u64, when: &str) {
    for mib in 0..bytes >> 20 {
        let lba = (mib << 20) / u64::from(BLOCK);
        let got = s
            .read10(lun, lba as u32, ((1 << 20) / BLOCK) as u16, BLOCK)
            .expect("READ(10)");
        assert!(
            got == pattern(lun, mib),
            "{when}: LUN {lun} MiB {mib} does not hold what was written"
        );
    }
}

/// Where an array's member data starts: members are `member_size` bytes,
/// and the data area is a whole number of chunks up to their end.
fn data_offset(s: &Value, member_size: u64, data_columns: u64) -> u64 {
    member_size - s["size_bytes"].as_u64().unwrap() / data_columns
}

fn scrub(daemon: &AdminDaemon, name: &str, repair: bool) -> Value {
    let mut args = vec!["raid", "scrub", name, "--json"];
    if repair {
        args.push("--repair");
    }
    let out = daemon.cli(&args);
    let answer: Value = serde_json::from_slice(&out.stdout).expect("scrub --json");
    let report = answer["report"].clone();
    // Mismatches left unrepaired are unhealthy: exit 1, as every check.
    let left = report["mismatches"].as_u64() > report["repaired"].as_u64();
    assert_eq!(out.status.code(), Some(i32::from(left)), "{name}: {report}");
    report
}

/// Corruption injected into one member of RAID1, RAID5 and RAID6 is
/// found by a scrub and repaired from the members that are right: the
/// mirror copy, the RAID5 parity, the RAID6 data chunk P and Q point at.
/// A check afterwards finds nothing, and the LUNs read what was written.
#[test]
fn scrub_finds_and_repairs_corruption_in_one_member() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m1 = ["a0", "a1"];
    let m5 = ["b0", "b1", "b2", "b3"];
    let m6 = ["c0", "c1", "c2", "c3", "c4"];
    let mut config = String::new();
    for names in [&m1[..], &m5, &m6] {
        config += &faulty_members(dir.path(), names, "16M");
    }
    config += &raid_device("r1", 1, &m1, &[]);
    config += &raid_device("r5", 5, &m5, &[]);
    config += &raid_device("r6", 6, &m6, &[]);
    config += &target(&[(0, "r1"), (1, "r5"), (2, "r6")]);
    let daemon = start(dir.path(), &config);
    let member = 16u64 << 20;
    let mut sizes = Vec::new();
    for name in ["r1", "r5", "r6"] {
        sizes.push(wait_clean(&daemon, name, Duration::from_secs(60)));
    }
    let mut s = login(&daemon, HOST);
    for (lun, st) in sizes.iter().enumerate() {
        write_all(&mut s, lun as u64, st["size_bytes"].as_u64().unwrap());
    }

    // RAID1: the second copy of a chunk.
    daemon.ok(&["device", "fault", "a1", "corrupt", "12M", "64K"]);
    // RAID5 of 4: row 8's parity is on slot 3.
    let off5 = data_offset(&sizes[1], member, 3);
    let at5 = (off5 + 8 * CHUNK).to_string();
    daemon.ok(&["device", "fault", "b3", "corrupt", &at5, "64K"]);
    // RAID6 of 5: row 5 has P on slot 4, Q on 0, its first data chunk on 1.
    let off6 = data_offset(&sizes[2], member, 3);
    let at6 = (off6 + 5 * CHUNK).to_string();
    daemon.ok(&["device", "fault", "c1", "corrupt", &at6, "64K"]);

    for (name, slot) in [("r1", 1), ("r5", 3), ("r6", 1)] {
        let found = scrub(&daemon, name, false);
        assert!(found["mismatches"].as_u64() >= Some(1), "{name}: {found}");
        assert_eq!(found["repaired"], 0, "{name}: {found}");
        let fixed = scrub(&daemon, name, true);
        assert!(fixed["repaired"].as_u64() >= Some(1), "{name}: {fixed}");
        if name == "r1" {
            // Two copies that differ: no member can be blamed.
            assert_eq!(fixed["wrong_members"], serde_json::json!({}), "{fixed}");
            assert!(fixed["undecided"].as_u64() >= Some(1), "{fixed}");
        } else {
            assert!(
                fixed["wrong_members"][slot.to_string()].as_u64() >= Some(1),
                "{name}: slot {slot} is not named: {fixed}"
            );
        }
        let again = scrub(&daemon, name, false);
        assert_eq!(again["mismatches"], 0, "{name} after repair: {again}");
        let shown = status(&daemon, name);
        assert_eq!(shown["last_scrub"]["mismatches"], 0, "{shown}");
    }
    for (lun, st) in sizes.iter().enumerate() {
        check_all(
            &mut s,
            lun as u64,
            st["size_bytes"].as_u64().unwrap(),
            "after repair",
        );
    }

    // A RAID5 data chunk gone wrong: a check counts it, though parity
    // alone cannot say which member is wrong.
    let at = (off5 + 9 * CHUNK).to_string();
    daemon.ok(&["device", "fault", "b3", "corrupt", &at, "4K"]);
    let found = scrub(&daemon, "r5", false);
    assert_eq!(found["mismatches"], 1, "{found}");
    drop(s);
    daemon.terminate();
}

/// Three initiator groups, each mapping LUN 201 to the volume.
fn groups_target(lun: u64, device: &str, initiators: &[&str]) -> String {
    let mut text = format!("\n[[target]]\nname = \"{IQN}\"\n");
    for (i, initiator) in initiators.iter().enumerate() {
        text += &format!(
            "[[target.group]]\nname = \"g{i}\"\ninitiators = [\"{initiator}\"]\n\
             [[target.group.lun]]\nlun = {lun}\ndevice = \"{device}\"\n"
        );
    }
    text
}

/// Writes `pattern(tag, mib)` over MiBs `range` of `lun` pass after pass
/// until `stop`; returns the tag each MiB holds last.
fn writer(
    daemon_addr: std::net::SocketAddr,
    initiator: String,
    lun: u64,
    range: std::ops::Range<u64>,
    first_tag: u64,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Vec<(u64, u64)>> {
    std::thread::spawn(move || {
        let params = LoginParams::normal(&initiator, IQN);
        let mut s = Session::login(daemon_addr, &params, Duration::from_secs(20)).expect("login");
        let mut last = Vec::new();
        let mut tag = first_tag;
        'passes: loop {
            for mib in range.clone() {
                if stop.load(std::sync::atomic::Ordering::Relaxed) && !last.is_empty() {
                    break 'passes;
                }
                let lba = (mib << 20) / u64::from(BLOCK);
                s.write10(lun, lba as u32, &pattern(tag, mib), BLOCK)
                    .expect("WRITE(10) while a member fails and a spare rebuilds");
                last.retain(|(m, _)| *m != mib);
                last.push((mib, tag));
            }
            tag += 1;
        }
        last
    })
}

/// The seed scenario: RAID5 of four members and a hot spare under a pool,
/// a thin volume of it as LUN 201 for three initiator groups. One member
/// fails while two initiators write; the spare takes its slot and is
/// rebuilt by itself, the writes all succeed, and everything reads back.
#[test]
fn a_failed_member_is_rebuilt_onto_the_spare_under_io_from_two_initiators() {
    let dir = tempfile::tempdir().expect("tempdir");
    let names = ["m0", "m1", "m2", "m3", "s0"];
    let mut config = faulty_members(dir.path(), &names, "32M");
    // A device nothing uses yet: added as a spare by hand later.
    config += &faulty_members(dir.path(), &["s1"], "32M");
    config += &raid_device("r5", 5, &names[..4], &names[4..]);
    config += &format!(
        "\n[[pool]]\nname = \"tank\"\ndevices = [\"r5\"]\nmetadata = \"{}/tank.meta\"\nunit_size = \"64K\"\n\
         \n[[device]]\nname = \"vdi\"\nkind = \"volume\"\npool = \"tank\"\nsize = \"48M\"\n",
        dir.path().display()
    );
    let hosts = [
        "iqn.2026-11.org.openarray.test:esx0",
        "iqn.2026-11.org.openarray.test:esx1",
        "iqn.2026-11.org.openarray.test:esx2",
    ];
    config += &groups_target(201, "vdi", &hosts);
    let daemon = start(dir.path(), &config);
    wait_clean(&daemon, "r5", Duration::from_secs(60));
    let tree = daemon.ok(&["device", "show", "vdi"]);
    assert!(tree.contains("r5 (raid"), "{tree}");
    assert!(tree.contains("array clean"), "{tree}");

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers = [(0, 0..24), (1, 24..48)].map(|(i, range)| {
        writer(
            daemon.addr(),
            hosts[i].to_string(),
            201,
            range,
            (i as u64 + 1) << 32,
            stop.clone(),
        )
    });
    std::thread::sleep(Duration::from_millis(500));
    daemon.ok(&["device", "fault", "m2", "fail"]);
    // The spare is in slot 2 and rebuilding, or already done.
    let start = Instant::now();
    let rebuilt = loop {
        let s = status(&daemon, "r5");
        let slot2 = &s["members"][2];
        if slot2["name"] == "s0" {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no rebuild: {s:#}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        rebuilt["state"] == "rebuilding" || rebuilt["state"] == "clean",
        "{rebuilt:#}"
    );
    assert_eq!(rebuilt["member_failures"], 1, "{rebuilt:#}");
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let written: Vec<(u64, u64)> = writers
        .into_iter()
        .flat_map(|w| w.join().expect("writer"))
        .collect();
    let done = wait_clean(&daemon, "r5", Duration::from_secs(120));
    assert_eq!(done["members"][2]["state"], "in-sync", "{done:#}");
    let failed = done["members"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["name"] == "m2" && (m["state"] == "failed" || m["state"] == "out"));
    assert!(
        failed || done["members"].as_array().unwrap().len() == 4,
        "{done:#}"
    );
    let text = daemon.ok(&["raid", "status", "r5"]);
    assert!(text.contains("RAID5 clean"), "{text}");
    // A new spare, by hand (the failed member left its slot to s0).
    let refused = daemon.cli(&["raid", "add", "r5", "m0"]);
    assert!(!refused.status.success(), "a member in use was added");
    daemon.ok(&["raid", "add", "r5", "s1"]);
    let spares = status(&daemon, "r5");
    let spare = spares["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "s1")
        .cloned();
    assert_eq!(
        spare.map(|m| m["state"].clone()),
        Some("spare".into()),
        "{spares:#}"
    );

    // Everything reads back, from the third group too, with the rebuilt
    // spare carrying a quarter of it.
    let mut s = login(&daemon, hosts[2]);
    for (mib, tag) in &written {
        let lba = (mib << 20) / u64::from(BLOCK);
        let got = s
            .read10(201, lba as u32, ((1 << 20) / BLOCK) as u16, BLOCK)
            .expect("READ(10)");
        assert!(got == pattern(*tag, *mib), "MiB {mib} lost its last write");
    }
    // And with another member gone too, the data s0 was rebuilt with
    // serves while s1 is rebuilt in its turn.
    daemon.ok(&["device", "fault", "m0", "fail"]);
    for (mib, tag) in &written {
        let lba = (mib << 20) / u64::from(BLOCK);
        let got = s
            .read10(201, lba as u32, ((1 << 20) / BLOCK) as u16, BLOCK)
            .expect("READ(10) degraded");
        assert!(got == pattern(*tag, *mib), "MiB {mib} differs degraded");
    }
    drop(s);
    daemon.terminate();
}

/// The daemon's status page as `openarray status --json` gives it, with
/// its exit code.
fn status_page(daemon: &AdminDaemon) -> (Option<i32>, Value) {
    let out = daemon.cli(&["status", "--json"]);
    let page = serde_json::from_slice(&out.stdout).expect("status --json");
    (out.status.code(), page)
}

/// `openarray status` lists a degraded RAID5 and a failed RAID10 by the
/// LUNs they serve and in its devices, and exits 1 then 2 (as mdadm's
/// `--detail --test`); `raid fail` of a RAID10's last copy of some data
/// is refused unless forced, and says what becomes unreadable.
#[test]
fn status_reports_degraded_and_failed_arrays_and_fail_needs_force_past_redundancy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m5 = ["b0", "b1", "b2", "b3"];
    let m10 = ["t0", "t1", "t2", "t3"];
    let mut config = String::new();
    for names in [&m5[..], &m10] {
        config += &faulty_members(dir.path(), names, "16M");
    }
    config += &raid_device("r5", 5, &m5, &[]);
    config += &raid_device("r10", 10, &m10, &[]);
    config += &target(&[(0, "r5"), (1, "r10")]);
    let daemon = start(dir.path(), &config);
    for name in ["r5", "r10"] {
        wait_clean(&daemon, name, Duration::from_secs(60));
    }
    let (code, page) = status_page(&daemon);
    assert_eq!(code, Some(0), "{page:#}");

    daemon.ok(&["raid", "fail", "r5", "b1"]);
    let (code, page) = status_page(&daemon);
    assert_eq!(code, Some(1), "{page:#}");
    let lun = &page["targets"][0]["luns"][0];
    assert_eq!(lun["state"], "degraded", "{page:#}");
    let problem = lun["problem"].as_str().unwrap_or_default();
    assert!(
        problem.contains("RAID5 degraded") && problem.contains("b1 failed"),
        "{problem}"
    );
    let r5 = page["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "r5");
    assert_eq!(
        r5.map(|d| &d["state"]),
        Some(&Value::from("degraded")),
        "{page:#}"
    );

    // RAID10 near-2 over four: slots 0 and 1 hold the same chunks.
    daemon.ok(&["raid", "fail", "r10", "t0"]);
    let out = daemon.cli(&["raid", "fail", "r10", "t1"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("last in-sync copy") && said.contains("--force"),
        "{said}"
    );
    assert_eq!(
        status(&daemon, "r10")["state"],
        "degraded",
        "nothing was failed"
    );
    daemon.ok(&["raid", "fail", "r10", "t1", "--force"]);
    assert_eq!(status(&daemon, "r10")["state"], "failed");
    let (code, page) = status_page(&daemon);
    assert_eq!(code, Some(2), "{page:#}");
    assert_eq!(page["failed"], true);
    let lun = &page["targets"][0]["luns"][1];
    assert_eq!(lun["state"], "failed", "{page:#}");
    let text = daemon.cli(&["status"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.starts_with("state: FAILED"), "{text}");
    assert!(text.contains("RAID10 failed"), "{text}");
    daemon.terminate();
}

/// A RAID5 whose members failed one after another (one failed, then
/// another missed the update of taking it out) is refused at the next
/// start, but the daemon starts: every other LUN serves, the array's LUN
/// answers NOT READY, `status` names it failed (exit 2), and `raid
/// assemble --force` puts it together live from the freshest members.
#[test]
fn an_array_that_cannot_assemble_fails_alone_and_assembles_live() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m5 = ["b0", "b1", "b2", "b3"];
    let mut config = faulty_members(dir.path(), &m5, "16M");
    config += &raid_device("r5", 5, &m5, &[]);
    config += &format!(
        "\n[[device]]\nname = \"other\"\nkind = \"file\"\npath = \"{}/other.img\"\nsize = \"4M\"\n",
        dir.path().display()
    );
    config += &target(&[(0, "r5"), (1, "other")]);
    let daemon = start(dir.path(), &config);
    let size = wait_clean(&daemon, "r5", Duration::from_secs(60))["size_bytes"]
        .as_u64()
        .unwrap();
    let mut s = login(&daemon, HOST);
    write_all(&mut s, 0, size);
    write_all(&mut s, 1, 4 << 20);
    // Stable on every member before they start failing.
    for lun in [0, 1] {
        s.command_good(lun, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0)
            .expect("SYNCHRONIZE CACHE");
    }
    drop(s);
    daemon.ok(&["raid", "fail", "r5", "b0"]);
    daemon.ok(&["device", "fault", "b1", "fail"]);
    daemon.ok(&["raid", "remove", "r5", "b0"]);
    assert_eq!(status(&daemon, "r5")["state"], "failed");
    daemon.terminate();

    let daemon = start(dir.path(), &config);
    let log = daemon.log();
    assert!(log.contains("RAID array not assembled"), "{log}");
    let mut s = login(&daemon, HOST);
    check_all(&mut s, 1, 4 << 20, "the other LUN, beside a failed array");
    // The first command of a LUN may get its power-on UNIT ATTENTION.
    let read = |s: &mut Session| {
        s.command(0, &[0x28, 0, 0, 0, 0, 0, 0, 0, 8, 0], &[], 4096)
            .expect("READ(10)")
    };
    let mut c = read(&mut s);
    if c.sense_key() == Some(6) {
        c = read(&mut s);
    }
    assert_eq!(c.sense_key(), Some(2), "NOT READY: {c:?}");
    assert_eq!(
        (c.sense.get(12), c.sense.get(13)),
        (Some(&4), Some(&3)),
        "{c:?}"
    );
    let (code, page) = status_page(&daemon);
    assert_eq!(code, Some(2), "{page:#}");
    let problem = page["targets"][0]["luns"][0]["problem"]
        .as_str()
        .unwrap_or_default();
    assert!(
        problem.contains("not assembled") && problem.contains("too few members"),
        "{problem}"
    );

    let out = daemon.cli(&["raid", "assemble", "r5"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("too few members"), "{said}");
    daemon.ok(&["raid", "assemble", "r5", "--force"]);
    check_all(&mut s, 0, size, "after a forced assembly");
    let st = wait_clean(&daemon, "r5", Duration::from_secs(60));
    assert_eq!(st["forced"].as_array().map(Vec::len), Some(1), "{st:#}");
    let (code, page) = status_page(&daemon);
    assert_eq!(code, Some(0), "{page:#}");
    drop(s);
    daemon.terminate();
}

/// The member life cycle through the daemon, as mdadm users run it: a
/// healed member is re-added live and catches up; `raid add` of a new
/// device is recorded among the spares in the configuration file, and
/// the device is open under the array (shown, and not removable); a
/// member superseded by it is left out at the next start, never served,
/// and added back it becomes a spare.
#[test]
fn members_are_re_added_recorded_and_never_served_stale() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = faulty_members(dir.path(), &["a0", "a1", "n0", "x0"], "16M");
    config += &raid_device("r1", 1, &["a0", "a1"], &[]);
    config += &target(&[(0, "r1")]);
    let path = dir.path().join("openarray.toml");
    let daemon = start(dir.path(), &config);
    let size = wait_clean(&daemon, "r1", Duration::from_secs(60))["size_bytes"]
        .as_u64()
        .unwrap();
    let mut s = login(&daemon, HOST);
    write_all(&mut s, 0, size);
    // A flush leaves the write-intent bitmap clean.
    s.command_good(0, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0)
        .expect("SYNCHRONIZE CACHE");
    let rewrite = |s: &mut Session, tag: u64| {
        for mib in 2..5u64 {
            let lba = (mib << 20) / u64::from(BLOCK);
            s.write10(0, lba as u32, &pattern(tag, mib), BLOCK)
                .expect("WRITE(10)");
        }
    };
    let check = |s: &mut Session, tag: u64, when: &str| {
        for mib in 0..size >> 20 {
            let want = pattern(if (2..5).contains(&mib) { tag } else { 0 }, mib);
            let lba = (mib << 20) / u64::from(BLOCK);
            let got = s
                .read10(0, lba as u32, ((1 << 20) / BLOCK) as u16, BLOCK)
                .expect("READ(10)");
            assert!(
                got == want,
                "{when}: MiB {mib} does not hold what was written"
            );
        }
    };

    // a1 fails under I/O, is healed, and goes back in: a catch-up.
    daemon.ok(&["device", "fault", "a1", "fail"]);
    rewrite(&mut s, 7);
    assert_eq!(status(&daemon, "r1")["state"], "degraded");
    daemon.ok(&["device", "fault", "a1", "heal"]);
    let out = daemon.ok(&["raid", "add", "r1", "a1"]);
    assert!(out.contains("re-added"), "{out}");
    let st = wait_clean(&daemon, "r1", Duration::from_secs(60));
    let caught = st["bitmap"]["last_catch_up_bytes"].as_u64().unwrap_or(0);
    assert!(
        caught > 0 && caught < size,
        "a catch-up, not a rebuild: {st:#}"
    );

    // a0 failed by hand; a write; n0 added: recorded, rebuilt into slot 0.
    daemon.ok(&["raid", "fail", "r1", "a0"]);
    rewrite(&mut s, 8);
    let out = daemon.ok(&["raid", "add", "r1", "n0"]);
    assert!(out.contains("recorded"), "{out}");
    let saved = std::fs::read_to_string(&path).unwrap();
    assert!(saved.contains(r#"spares = ["n0"]"#), "{saved}");
    let st = wait_clean(&daemon, "r1", Duration::from_secs(60));
    assert_eq!(st["members"][0]["name"], "n0", "{st:#}");
    let shown = daemon.ok(&["device", "show", "n0"]);
    assert!(!shown.contains("not open"), "{shown}");
    let out = daemon.cli(&["device", "remove", "n0"]);
    assert_eq!(out.status.code(), Some(1), "n0 serves in r1");
    s.command_good(0, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0)
        .expect("SYNCHRONIZE CACHE");
    drop(s);
    daemon.terminate();

    // The next start, from the file as saved: n0 holds slot 0; a0, whose
    // slot n0 took over, is left out and never read.
    let daemon = AdminDaemon::start_listening(&path, dir.path(), free_port());
    let st = wait_clean(&daemon, "r1", Duration::from_secs(60));
    assert_eq!(st["members"][0]["name"], "n0", "{st:#}");
    assert!(
        daemon.log().contains("no longer owns slot 0"),
        "{}",
        daemon.log()
    );
    // It stays listed, out of the array, in status and device show.
    let out = st["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "a0");
    assert_eq!(
        out.map(|m| &m["state"]),
        Some(&Value::from("out")),
        "{st:#}"
    );
    let shown = daemon.ok(&["device", "show", "r1"]);
    assert!(
        shown.contains("a0 out, a1 slot 1 in-sync, n0 slot 0 in-sync"),
        "{shown}"
    );
    let mut s = login(&daemon, HOST);
    for _ in 0..3 {
        check(&mut s, 8, "after the restart");
    }
    assert_eq!(scrub(&daemon, "r1", false)["mismatches"], 0);
    // Added back, a0 is a spare; n0 failed, a0 is rebuilt in full.
    let out = daemon.ok(&["raid", "add", "r1", "a0"]);
    assert!(out.contains("a spare"), "{out}");
    daemon.ok(&["raid", "fail", "r1", "n0"]);
    let st = wait_clean(&daemon, "r1", Duration::from_secs(60));
    assert_eq!(st["members"][0]["name"], "a0", "{st:#}");
    // A replace onto a device no array uses records it too.
    let out = daemon.ok(&["raid", "replace", "r1", "a1", "x0"]);
    assert!(out.contains("takes its place"), "{out}");
    let saved = std::fs::read_to_string(&path).unwrap();
    assert!(saved.contains(r#"spares = ["n0", "x0"]"#), "{saved}");
    let st = wait_clean(&daemon, "r1", Duration::from_secs(60));
    assert_eq!(st["members"][1]["name"], "x0", "{st:#}");
    daemon.ok(&["raid", "fail", "r1", "x0"]);
    check(&mut s, 8, "from a0 alone");
    drop(s);
    daemon.terminate();
}

/// A RAID5 under a pool, served only through a volume of the pool, has a
/// health and figures of its own: `status` lists it degraded (exit 1)
/// and `/metrics` gives its state and members beside the pool's space.
#[test]
fn an_array_under_a_pool_shows_in_status_and_metrics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = ["p0", "p1", "p2"];
    let mut config = faulty_members(dir.path(), &m, "16M");
    config += &raid_device("rp", 5, &m, &[]);
    config += &format!(
        "\n[[pool]]\nname = \"tank\"\ndevices = [\"rp\"]\nmetadata = \"{}/tank.meta\"\nunit_size = \"64K\"\n\
         [[device]]\nname = \"v\"\nkind = \"volume\"\npool = \"tank\"\nsize = \"8M\"\n",
        dir.path().display()
    );
    config += &target(&[(0, "v")]);
    let daemon = start(dir.path(), &config);
    wait_clean(&daemon, "rp", Duration::from_secs(60));
    let metrics = || {
        let stream = std::os::unix::net::UnixStream::connect(&daemon.socket).expect("socket");
        common::http_get(stream, "/metrics").1
    };
    let sample = |text: &str, name: &str, labels: &str| {
        common::prometheus_sample(text, name, labels).map(|v| v as u64)
    };
    let text = metrics();
    assert_eq!(
        sample(&text, "openarray_raid_state", "device=\"rp\""),
        Some(0),
        "{text}"
    );
    assert!(
        sample(&text, "openarray_pool_size_bytes", "pool=\"tank\"").is_some_and(|v| v > 0),
        "{text}"
    );

    daemon.ok(&["raid", "fail", "rp", "p1"]);
    let (code, page) = status_page(&daemon);
    assert_eq!(code, Some(1), "{page:#}");
    let rp = page["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "rp");
    assert_eq!(
        rp.map(|d| &d["state"]),
        Some(&Value::from("degraded")),
        "{page:#}"
    );
    let text = metrics();
    assert_eq!(
        sample(&text, "openarray_raid_state", "device=\"rp\""),
        Some(1),
        "{text}"
    );
    let up = |member: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("openarray_raid_member_up{")
                    && l.contains("device=\"rp\"")
                    && l.contains(&format!("member=\"{member}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .map(String::from)
    };
    assert_eq!(up("p1").as_deref(), Some("0"), "{text}");
    assert_eq!(up("p0").as_deref(), Some("1"), "{text}");
    daemon.terminate();
}
