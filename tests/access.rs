//! Access control against the real daemon with libiscsi's tools and our
//! own initiator: initiator groups with their own LUN maps, read-only
//! mappings, CHAP one-way, mutual and for discovery, and the login status
//! a refused initiator gets.

mod common;

use std::process::{Command, Output};
use std::time::Duration;

use common::iscsi::{LoginParams, Session};
use common::{require_tool, run_echoed, Daemon};

const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

const GROUPS_TARGET: &str = "iqn.2026-11.org.test:groups";
const CHAP_TARGET: &str = "iqn.2026-11.org.test:chap";
const MUTUAL_TARGET: &str = "iqn.2026-11.org.test:mutual";

const ESX1: &str = "iqn.1998-01.com.vmware:esx1";
const ESX_PATTERNED: &str = "iqn.1998-01.com.vmware:esx-b7";
const BACKUP: &str = "iqn.2026-11.org.test:backup";
const STRANGER: &str = "iqn.2026-11.org.test:stranger";

const DEVICES: &str = r#"
[[portal]]
listen = "127.0.0.1:3260"

[[device]]
name = "shared"
kind = "mem"
size = "4M"

[[device]]
name = "other"
kind = "mem"
size = "4M"
"#;

/// One target with two groups: the ESX hosts see `shared` as LUN 201 and
/// `other` as LUN 3; the backup host sees `shared` read-only as LUN 0.
fn groups_config(extra: &str) -> String {
    format!(
        r#"{DEVICES}
{extra}

[[target]]
name = "{GROUPS_TARGET}"

[[target.group]]
name = "esx"
initiators = ["{ESX1}", "iqn.1998-01.com.vmware:esx-*"]
[[target.group.lun]]
lun = 201
device = "shared"
[[target.group.lun]]
lun = 3
device = "other"

[[target.group]]
name = "backup"
initiators = ["{BACKUP}"]
[[target.group.lun]]
lun = 0
device = "shared"
read_only = true
"#
    )
}

fn chap_config() -> String {
    format!(
        r#"{DEVICES}

[[target]]
name = "{CHAP_TARGET}"
chap = {{ user = "alice", secret = "alice-secret-123" }}
[[target.lun]]
lun = 0
device = "other"

[[target]]
name = "{MUTUAL_TARGET}"
chap = {{ user = "bob", secret = "bob-secret-12345", mutual_user = "array", mutual_secret = "array-secret-678" }}
[[target.lun]]
lun = 0
device = "other"
"#
    )
}

fn run(cmd: Command) -> Output {
    run_echoed(cmd, CLIENT_TIMEOUT)
}

/// `iscsi-ls -s -i INITIATOR URL`: target name -> LUN numbers.
fn ls(daemon: &Daemon, initiator: &str, credentials: &str) -> (bool, Vec<(String, Vec<u64>)>) {
    require_tool("iscsi-ls");
    let mut cmd = Command::new("iscsi-ls");
    cmd.arg("-s")
        .arg("-i")
        .arg(initiator)
        .arg(format!("iscsi://{credentials}127.0.0.1:{}", daemon.port()));
    let out = run(cmd);
    let mut targets: Vec<(String, Vec<u64>)> = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(rest) = line.strip_prefix("Target:") {
            let name = rest.split_whitespace().next().unwrap_or("").to_string();
            targets.push((name, Vec::new()));
        } else if let Some(rest) = line.strip_prefix("Lun:") {
            let lun = rest.split_whitespace().next().and_then(|n| n.parse().ok());
            if let (Some(lun), Some(t)) = (lun, targets.last_mut()) {
                t.1.push(lun);
            }
        }
    }
    (out.status.success(), targets)
}

/// `iscsi-inq` against a URL, with extra environment; true on success.
fn inq(url: &str, initiator: Option<&str>, env: &[(&str, &str)]) -> bool {
    require_tool("iscsi-inq");
    let mut cmd = Command::new("iscsi-inq");
    if let Some(i) = initiator {
        cmd.arg("-i").arg(i);
    }
    cmd.arg(url);
    for (k, v) in env {
        cmd.env(k, v);
    }
    run(cmd).status.success()
}

fn chap_url(daemon: &Daemon, user: &str, secret: &str, target: &str) -> String {
    format!(
        "iscsi://{user}%{secret}@127.0.0.1:{}/{target}/0",
        daemon.port()
    )
}

fn login(daemon: &Daemon, initiator: &str, target: &str) -> std::io::Result<Session> {
    Session::login(
        daemon.addr(),
        &LoginParams::normal(initiator, target),
        Duration::from_secs(10),
    )
}

#[test]
fn each_group_sees_exactly_its_luns() {
    let daemon = Daemon::start_with_config(&groups_config(""));
    let (ok, targets) = ls(&daemon, ESX1, "");
    assert!(ok);
    assert_eq!(targets, vec![(GROUPS_TARGET.to_string(), vec![3, 201])]);
    // A wildcard member lands in the same group.
    let (ok, targets) = ls(&daemon, ESX_PATTERNED, "");
    assert!(ok);
    assert_eq!(targets, vec![(GROUPS_TARGET.to_string(), vec![3, 201])]);
    let (ok, targets) = ls(&daemon, BACKUP, "");
    assert!(ok);
    assert_eq!(targets, vec![(GROUPS_TARGET.to_string(), vec![0])]);
    assert!(inq(&daemon.url(GROUPS_TARGET, 201), Some(ESX1), &[]));
}

#[test]
fn an_unlisted_initiator_can_neither_discover_nor_log_in() {
    let daemon = Daemon::start_with_config(&groups_config(""));
    let (ok, targets) = ls(&daemon, STRANGER, "");
    assert!(ok, "discovery itself is allowed");
    assert!(targets.is_empty(), "{targets:?}");
    assert!(!inq(&daemon.url(GROUPS_TARGET, 201), Some(STRANGER), &[]));
    let err = login(&daemon, STRANGER, GROUPS_TARGET).err().unwrap();
    assert!(
        err.to_string().contains("status class 0x2 detail 0x2"),
        "authorization failure expected: {err}"
    );
    // The audit line names initiator, target, portal, status and reason.
    let log = daemon.log();
    assert!(
        log.lines().any(|l| l.contains("login refused")
            && l.contains(STRANGER)
            && l.contains(GROUPS_TARGET)
            && l.contains("portal=127.0.0.1:")
            && l.contains("0x0202")
            && l.contains("authorization failure")),
        "{log}"
    );
}

#[test]
fn read_only_mapping_rejects_writes_and_shows_the_shared_data() {
    let daemon = Daemon::start_with_config(&groups_config(""));
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut esx = login(&daemon, ESX1, GROUPS_TARGET).unwrap();
    esx.write10(201, 16, &pattern, 512).unwrap();
    // Not mapped for this group.
    assert!(esx.read10(0, 0, 1, 512).is_err());

    let mut backup = login(&daemon, BACKUP, GROUPS_TARGET).unwrap();
    assert_eq!(backup.read10(0, 16, 8, 512).unwrap(), pattern);
    let mut write = None;
    for _ in 0..4 {
        let c = backup
            .command(0, &common::iscsi::rw10_cdb(0x2a, 16, 1), &[0u8; 512], 0)
            .unwrap();
        if c.sense_key() != Some(6) {
            write = Some(c);
            break;
        }
    }
    let write = write.expect("a completion other than a unit attention");
    assert_eq!(write.status, 0x02, "CHECK CONDITION");
    assert_eq!(write.sense_key(), Some(0x07), "DATA PROTECT");
    assert_eq!((write.sense[12], write.sense[13]), (0x27, 0x00));
    // The data is unchanged.
    assert_eq!(esx.read10(201, 16, 8, 512).unwrap(), pattern);
    esx.logout().unwrap();
    backup.logout().unwrap();
}

#[test]
fn one_way_chap_needs_the_right_secret() {
    let daemon = Daemon::start_with_config(&chap_config());
    assert!(inq(
        &chap_url(&daemon, "alice", "alice-secret-123", CHAP_TARGET),
        None,
        &[]
    ));
    assert!(!inq(
        &chap_url(&daemon, "alice", "alice-secret-124", CHAP_TARGET),
        None,
        &[]
    ));
    assert!(!inq(
        &chap_url(&daemon, "mallory", "alice-secret-123", CHAP_TARGET),
        None,
        &[]
    ));
    assert!(!inq(&daemon.url(CHAP_TARGET, 0), None, &[]));
    // Our initiator offers no authentication at all.
    let err = login(&daemon, STRANGER, CHAP_TARGET).err().unwrap();
    assert!(
        err.to_string().contains("status class 0x2 detail 0x1"),
        "authentication failure expected: {err}"
    );
    let log = daemon.log();
    assert!(log.contains("0x0201"), "{log}");
    assert!(
        !log.contains("alice-secret"),
        "a secret reached the log:\n{log}"
    );
}

#[test]
fn mutual_chap_authenticates_both_sides() {
    let daemon = Daemon::start_with_config(&chap_config());
    let url = chap_url(&daemon, "bob", "bob-secret-12345", MUTUAL_TARGET);
    let target_env = |secret: &'static str| {
        [
            ("LIBISCSI_CHAP_TARGET_USERNAME", "array"),
            ("LIBISCSI_CHAP_TARGET_PASSWORD", secret),
        ]
    };
    assert!(inq(&url, None, &target_env("array-secret-678")));
    // The initiator does not accept a target that proves a wrong secret.
    assert!(!inq(&url, None, &target_env("array-secret-679")));
    // The target insists on mutual CHAP.
    assert!(!inq(&url, None, &[]));
    // A target with one-way CHAP cannot answer an initiator's challenge.
    let one_way = chap_url(&daemon, "alice", "alice-secret-123", CHAP_TARGET);
    assert!(!inq(&one_way, None, &target_env("array-secret-678")));
    let log = daemon.log();
    assert!(!log.contains("secret-"), "a secret reached the log:\n{log}");
}

#[test]
fn discovery_chap_guards_send_targets() {
    let discovery = r#"[discovery]
chap = { user = "disc", secret = "discovery-secret" }"#;
    let daemon = Daemon::start_with_config(&groups_config(discovery));
    let (ok, targets) = ls(&daemon, ESX1, "");
    assert!(!ok);
    assert!(targets.is_empty());
    let (ok, _) = ls(&daemon, ESX1, "disc%discovery-secreT@");
    assert!(!ok);
    let (ok, targets) = ls(&daemon, ESX1, "disc%discovery-secret@");
    assert!(ok);
    assert_eq!(targets, vec![(GROUPS_TARGET.to_string(), vec![3, 201])]);
    // Normal sessions of that target need no CHAP.
    assert!(inq(&daemon.url(GROUPS_TARGET, 3), Some(ESX1), &[]));
}

/// (ran, passed, failed) from iscsi-test-cu's run summary.
fn cu_summary(out: &Output) -> (u32, u32, u32) {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("tests "))
        .unwrap_or_else(|| panic!("no summary in:\n{text}"));
    let n: Vec<u32> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|w| w.parse().ok())
        .collect();
    (n[1], n[2], n[3])
}

#[test]
fn conformance_tests_with_two_group_members_over_mutual_chap() {
    require_tool("iscsi-test-cu");
    let config = format!(
        r#"{DEVICES}
[[target]]
name = "{MUTUAL_TARGET}"
chap = {{ user = "bob", secret = "bob-secret-12345", mutual_user = "array", mutual_secret = "array-secret-678" }}
[[target.group]]
name = "esx"
initiators = ["{ESX1}", "iqn.1998-01.com.vmware:esx-*"]
[[target.group.lun]]
lun = 201
device = "shared"
"#
    );
    let daemon = Daemon::start_with_config(&config);
    let url = format!(
        "iscsi://bob%bob-secret-12345@127.0.0.1:{}/{MUTUAL_TARGET}/201",
        daemon.port()
    );
    let cu = |second: &str| {
        let mut cmd = Command::new("iscsi-test-cu");
        cmd.args([
            "-i",
            ESX1,
            "-I",
            second,
            "--dataloss",
            "--test=ALL.ProutReserve",
        ])
        .arg(&url)
        .env("LIBISCSI_CHAP_TARGET_USERNAME", "array")
        .env("LIBISCSI_CHAP_TARGET_PASSWORD", "array-secret-678");
        run(cmd)
    };
    // Reservation tests log in as both initiators, both group members.
    let (ran, passed, failed) = cu_summary(&cu(ESX_PATTERNED));
    assert!(ran >= 10, "{ran} tests ran");
    assert_eq!((passed, failed), (ran, 0));
    // A second initiator outside the group cannot log in at all.
    let out = cu(STRANGER);
    let (_, _, failed) = cu_summary(&out);
    assert!(failed > 0);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("Authorization failure"), "{text}");
}

/// `[iscsi] max_sessions_per_initiator` bounds an initiator's sessions;
/// the old `[daemon]` spelling still does, with a warning naming it.
#[test]
fn sessions_per_initiator_are_bounded_by_the_iscsi_section() {
    for (table, warned) in [("iscsi", false), ("daemon", true)] {
        let text = format!(
            "[{table}]\nmax_sessions_per_initiator = 1\n{}",
            groups_config("")
        );
        let daemon = Daemon::start_with_config(&text);
        let mut params = LoginParams::normal(ESX1, GROUPS_TARGET);
        let first = Session::login(daemon.addr(), &params, CLIENT_TIMEOUT).unwrap();
        params.isid[5] ^= 1;
        assert!(
            Session::login(daemon.addr(), &params, CLIENT_TIMEOUT).is_err(),
            "[{table}]: a second session of {ESX1} is refused"
        );
        first.logout().unwrap();
        let log = daemon.log();
        assert_eq!(
            log.contains("keys=max_sessions_per_initiator") && log.contains("belong in [iscsi]"),
            warned,
            "{log}"
        );
    }
}
