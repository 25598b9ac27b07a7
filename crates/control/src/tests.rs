//! Parsing and validation of whole configuration files.

use super::*;
use crate::kinds::{FileSpec, MemSpec};

fn errors(text: &str) -> String {
    parse_config(text, "test.toml").unwrap_err().to_string()
}

fn assert_error(text: &str, expect: &[&str]) {
    let msg = errors(text);
    for part in expect {
        assert!(msg.contains(part), "expected `{part}` in:\n{msg}");
    }
}

const MINIMAL: &str = r#"
[[portal]]
listen = "127.0.0.1:3260"

[[device]]
name = "d0"
kind = "mem"

[[target]]
name = "iqn.2026-11.org.example:t0"
[[target.lun]]
lun = 0
device = "d0"
"#;

#[test]
fn default_config_is_one_gib_mem_lun_on_loopback() {
    let c = default_config();
    assert_eq!(c.origin, DEFAULT_ORIGIN);
    assert_eq!(c.portals.len(), 1);
    assert_eq!(c.portals[0].listen, "127.0.0.1:3260".parse().unwrap());
    assert_eq!(c.targets.len(), 1);
    let t = &c.targets[0];
    assert_eq!(t.name, "iqn.2026-11.org.openarray:default");
    assert_eq!(t.luns.len(), 1);
    assert_eq!(t.luns[0].lun, 0);
    let dev = c.device(&t.luns[0].device).unwrap();
    assert_eq!(dev.kind(), "mem");
    assert_eq!(dev.spec.as_kind::<MemSpec>().unwrap().size, 1 << 30);
    assert_eq!(dev.identity.block_size, 512);
    let nbd = c
        .nbd
        .as_ref()
        .expect("the default configuration serves NBD");
    assert_eq!(
        nbd.listen,
        [export::ListenAddr::parse("127.0.0.1:10809", 1).unwrap()]
    );
    assert_eq!(c.nbd_exports_of(&dev.name), ["default"]);
}

#[test]
fn example_config_parses() {
    let text = include_str!("../../../examples/openarray.toml");
    let c = parse_config(text, "examples/openarray.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.portals.len(), 2);
    assert!(c.portals.iter().any(|p| p.listen.is_ipv6()));
    assert!(c
        .devices
        .iter()
        .any(|d| d.spec.as_kind::<FileSpec>().is_some_and(|f| f.direct)
            && d.identity.block_size == 4096));
    let db = &c.targets[0];
    assert!(db.luns.iter().any(|l| l.lun == 201));
    assert_eq!(c.target_portals(db).len(), 2);
    assert_eq!(
        c.target_portals(&c.targets[1]),
        vec!["127.0.0.1:3260".parse().unwrap()]
    );
    assert_eq!(
        c.daemon.state_dir.as_deref(),
        Some(Path::new("/var/lib/openarray"))
    );
}

#[test]
fn minimal_config_gets_defaults() {
    let c = parse_config(MINIMAL, "m.toml").unwrap();
    let d = &c.devices[0];
    assert_eq!(
        (d.identity.block_size, d.read_only, d.write_cache),
        (512, false, true)
    );
    assert_eq!(
        d.spec.as_kind::<MemSpec>(),
        Some(&MemSpec { size: 1 << 30 })
    );
    assert_eq!(d.identity.naa, None);
    assert_eq!(d.at.map(|l| l.line), Some(5));
    assert_eq!(c.targets[0].portals, None);
    assert_eq!(c.daemon, Daemon::default());
}

#[test]
fn unknown_field_names_file_line_and_field() {
    let text = MINIMAL.replace("kind = \"mem\"", "kind = \"mem\"\nsise = \"1G\"");
    assert_error(
        &text,
        &["test.toml:8:1: device[0].sise: unknown field `sise`"],
    );
}

#[test]
fn unknown_section_is_an_error() {
    assert_error(
        "[deamon]\nstate_dir = \"/x\"\n",
        &["test.toml:1:2: deamon: unknown field `deamon`"],
    );
}

#[test]
fn missing_field_names_the_field() {
    let text = MINIMAL.replace("device = \"d0\"", "");
    assert_error(&text, &["target[0].lun[0].device: missing field `device`"]);
    assert_error(
        "[[device]]\nkind = \"mem\"\n",
        &["test.toml:1:1: device[0].name: missing field `name`"],
    );
}

#[test]
fn wrong_types_point_at_the_value() {
    let text = MINIMAL.replace("lun = 0", "lun = \"zero\"");
    assert_error(
        &text,
        &["test.toml:12:7: target[0].lun[0].lun: invalid type: string \"zero\""],
    );
    let text = MINIMAL.replace("kind = \"mem\"", "kind = \"disk\"");
    assert_error(
        &text,
        &["device[0].kind: unknown kind `disk`: one of `file`, `mem`"],
    );
}

#[test]
fn syntax_errors_have_a_position() {
    let msg = errors("[[device]\nname = 1\n");
    assert!(msg.starts_with("test.toml:1:"), "{msg}");
    assert!(!msg.contains('\n'), "one line: {msg}");
}

#[test]
fn bad_sizes() {
    let text = MINIMAL.replace("kind = \"mem\"", "kind = \"mem\"\nsize = \"12X\"");
    assert_error(
        &text,
        &["test.toml:8:8: device[0].size: unknown size unit `X`"],
    );
    let text = MINIMAL.replace("kind = \"mem\"", "kind = \"mem\"\nsize = 1000");
    assert_error(
        &text,
        &["device[0].size: 1000 bytes is not a whole number of 512-byte blocks"],
    );
    let text = MINIMAL.replace(
        "kind = \"mem\"",
        "kind = \"mem\"\nsize = \"1M\"\nblock_size = 4096",
    );
    assert!(parse_config(&text, "t").is_ok());
    let text = MINIMAL.replace("kind = \"mem\"", "kind = \"mem\"\nsize = 0");
    assert_error(&text, &["device[0].size: must be more than zero"]);
    let text = MINIMAL.replace("kind = \"mem\"", "kind = \"mem\"\nsize = true");
    assert_error(&text, &["device[0].size: expected bytes"]);
    let text = MINIMAL.replace("kind = \"mem\"", "kind = \"mem\"\nblock_size = 1024");
    assert_error(
        &text,
        &["device[0].block_size: 1024 is not a supported block size"],
    );
}

#[test]
fn physical_block_size_is_a_power_of_two_multiple_of_the_block_size() {
    let with = |extra: &str| MINIMAL.replace("kind = \"mem\"", &format!("kind = \"mem\"\n{extra}"));
    let config = parse_config(&with("physical_block_size = 4096"), "t").unwrap();
    assert_eq!(
        (
            config.devices[0].identity.block_size,
            config.devices[0].identity.physical_block_size
        ),
        (512, 4096)
    );
    let config = parse_config(&with(""), "t").unwrap();
    assert_eq!(config.devices[0].identity.physical_block_size, 512);
    for (extra, bad) in [
        ("physical_block_size = 1536", "1536"),
        ("physical_block_size = 256", "256"),
        ("block_size = 4096\nphysical_block_size = 2048", "2048"),
        ("physical_block_size = 131072", "131072"),
    ] {
        assert_error(
            &with(extra),
            &[&format!(
                "device[0].physical_block_size: {bad} is not a power-of-two multiple"
            )],
        );
    }
}

#[test]
fn duplicates_are_errors() {
    let text = format!("{MINIMAL}\n[[device]]\nname = \"d0\"\nkind = \"null\"\n");
    assert_error(
        &text,
        &["device[1].name: device `d0` is already defined (line 5)"],
    );
    let text = format!("{MINIMAL}\n[[target.lun]]\nlun = 0\ndevice = \"d0\"\n");
    assert_error(&text, &["target[0].lun[1].lun: LUN 0 is already mapped"]);
    let text = format!("{MINIMAL}\n[[portal]]\nlisten = \"127.0.0.1:3260\"\n");
    assert_error(
        &text,
        &["portal[1].listen: 127.0.0.1:3260 is already a portal"],
    );
    let text = format!("{MINIMAL}\n[[target]]\nname = \"iqn.2026-11.org.example:t0\"\n");
    assert_error(
        &text,
        &["target[1].name: target `iqn.2026-11.org.example:t0` is already defined"],
    );
}

#[test]
fn dangling_and_out_of_range_luns() {
    let text = MINIMAL.replace("device = \"d0\"", "device = \"d9\"");
    assert_error(
        &text,
        &["test.toml:13:10: target[0].lun[0].device: no [[device]] is named `d9`"],
    );
    let text = MINIMAL.replace("lun = 0", "lun = 16384");
    assert_error(
        &text,
        &["target[0].lun[0].lun: LUN 16384 is outside 0..=16383"],
    );
    let text = MINIMAL.replace("lun = 0", "lun = 16383");
    assert_eq!(
        parse_config(&text, "t").unwrap().targets[0].luns[0].lun,
        16383
    );
}

#[test]
fn a_bad_device_does_not_also_fail_its_luns() {
    let text = MINIMAL.replace("kind = \"mem\"", "kind = \"mem\"\nsize = \"x\"");
    let err = parse_config(&text, "t").unwrap_err();
    assert_eq!(err.issues.len(), 1, "{err}");
}

#[test]
fn every_issue_is_reported_in_file_order() {
    let text = MINIMAL
        .replace(
            "name = \"iqn.2026-11.org.example:t0\"",
            "name = \"target0\"",
        )
        .replace("listen = \"127.0.0.1:3260\"", "listen = \"localhost\"");
    let err = parse_config(&text, "t.toml").unwrap_err();
    assert_eq!(err.issues.len(), 2, "{err}");
    assert_eq!(err.issues[0].field, "portal[0].listen");
    assert_eq!(err.issues[1].field, "target[0].name");
    assert!(err
        .to_string()
        .contains("t.toml:10:8: target[0].name: an iSCSI name starts with"));
}

#[test]
fn file_devices_need_a_path_and_others_must_not_have_one() {
    let text = MINIMAL.replace("kind = \"mem\"", "kind = \"file\"");
    assert_error(
        &text,
        &["test.toml:5:1: device[0].path: a `file` device needs `path`"],
    );
    let text = MINIMAL.replace(
        "kind = \"mem\"",
        "kind = \"mem\"\npath = \"/tmp/x\"\ndirect = true",
    );
    assert_error(
        &text,
        &[
            "device[0].path: only `file` devices have `path`",
            "device[0].direct: only `file` devices have `direct`",
        ],
    );
}

#[test]
fn identifiers_are_checked() {
    let text = MINIMAL.replace(
        "kind = \"mem\"",
        "kind = \"mem\"\nnaa = \"1234\"\nproduct_id = \"THIS-NAME-IS-TOO-LONG\"",
    );
    assert_error(
        &text,
        &[
            "device[0].naa: an NAA designator is 32 hex digits",
            "device[0].product_id: must have 1 to 16",
        ],
    );
    let text = MINIMAL
        .replace("name = \"d0\"", "name = \"d/0\"")
        .replace("device = \"d0\"", "device = \"d/0\"");
    assert_error(&text, &["device[0].name: a device name uses letters"]);
    let naa = "naa = \"6001405a1b2c3d4e5f60718293a4b5c6\"";
    let text = format!(
        "{}\n[[device]]\nname = \"d1\"\nkind = \"mem\"\n{naa}\n",
        MINIMAL.replace("kind = \"mem\"", &format!("kind = \"mem\"\n{naa}"))
    );
    assert_error(
        &text,
        &["device[1].naa: device `d0` has the same NAA designator"],
    );
}

#[test]
fn target_portals_must_be_configured_portals() {
    let text = MINIMAL.replace(
        "name = \"iqn.2026-11.org.example:t0\"",
        "name = \"iqn.2026-11.org.example:t0\"\nportals = [\"127.0.0.1:3261\"]",
    );
    assert_error(
        &text,
        &["target[0].portals[0]: 127.0.0.1:3261 is not the `listen` of any [[portal]]"],
    );
    let text = MINIMAL.replace(
        "name = \"iqn.2026-11.org.example:t0\"",
        "name = \"iqn.2026-11.org.example:t0\"\nportals = []",
    );
    assert_error(&text, &["target[0].portals: lists no portal"]);
}

#[test]
fn listen_addresses() {
    assert_eq!(
        parse_listen("[::1]:3260").unwrap(),
        "[::1]:3260".parse().unwrap()
    );
    assert_eq!(
        parse_listen("10.0.0.1").unwrap(),
        "10.0.0.1:3260".parse().unwrap()
    );
    assert_eq!(parse_listen("[fe80::1]").unwrap().port(), 3260);
    assert_eq!(parse_listen("::").unwrap(), "[::]:3260".parse().unwrap());
    assert!(parse_listen("127.0.0.1:0").unwrap_err().contains("port 0"));
    assert!(parse_listen("example.com:3260").is_err());
}

#[test]
fn override_listen_replaces_portals_for_every_target() {
    let mut c = parse_config(include_str!("../../../examples/openarray.toml"), "e").unwrap();
    let addr: std::net::SocketAddr = "[::1]:13260".parse().unwrap();
    c.override_listen(&[addr, addr]);
    assert_eq!(c.portals.len(), 1);
    for t in &c.targets {
        assert_eq!(c.target_portals(t), vec![addr]);
    }
}

#[test]
fn load_config_names_unreadable_files() {
    let err = load_config(Path::new("/nonexistent/openarray.toml")).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("/nonexistent/openarray.toml: cannot read the configuration"),
        "{err}"
    );
}

const GROUPS: &str = r#"
[[portal]]
listen = "127.0.0.1:3260"

[discovery]
chap = { user = "disc", secret = "discovery-secret" }

[[device]]
name = "d0"
kind = "mem"

[[target]]
name = "iqn.2026-11.org.example:t0"
chap = { user = "tuser", secret = "target-secret-1", mutual_user = "tgt", mutual_secret = "mutual-secret-1" }

[[target.group]]
name = "esx"
initiators = ["iqn.1998-01.com.vmware:esx1", "iqn.1998-01.com.vmware:esx-*"]
[[target.group.lun]]
lun = 201
device = "d0"

[[target.group]]
name = "backup"
initiators = ["iqn.2026-11.org.example:backup"]
chap = { user = "buser", secret = "backup-secret-1" }
[[target.group.lun]]
lun = 0
device = "d0"
read_only = true
"#;

#[test]
fn groups_and_chap_parse() {
    let c = parse_config(GROUPS, "test.toml").unwrap_or_else(|e| panic!("{e}"));
    assert!(c.has_secrets());
    assert_eq!(c.discovery_chap.as_ref().unwrap().initiator.user, "disc");
    let t = &c.targets[0];
    assert!(t.luns.is_empty());
    let chap = t.chap.as_ref().unwrap();
    assert_eq!(chap.mutual.as_ref().unwrap().user, "tgt");
    assert_eq!(t.groups.len(), 2);
    assert_eq!(t.groups[0].initiators.len(), 2);
    assert_eq!(t.groups[0].luns[0].lun, 201);
    assert!(!t.groups[0].luns[0].read_only);
    assert!(t.groups[1].luns[0].read_only);
    assert_eq!(t.groups[1].chap.as_ref().unwrap().initiator.user, "buser");
    // Secrets stay out of debug output.
    assert!(!format!("{c:?}").contains("target-secret-1"));
    assert!(!parse_config(MINIMAL, "m.toml").unwrap().has_secrets());
}

#[test]
fn access_errors_name_the_field_and_never_the_secret() {
    let short = GROUPS.replace("backup-secret-1", "short");
    let msg = errors(&short);
    assert!(
        msg.contains("test.toml:26:") && msg.contains("target[0].group[1].chap.secret"),
        "{msg}"
    );
    assert!(msg.contains("at least 12 bytes"), "{msg}");
    assert!(!msg.contains("short\""), "{msg}");

    assert_error(
        &GROUPS.replace("mutual-secret-1", "target-secret-1"),
        &["target[0].chap.mutual_secret: must differ from `secret`"],
    );
    assert_error(
        &GROUPS.replace(", mutual_secret = \"mutual-secret-1\"", ""),
        &["target[0].chap.mutual_user: mutual CHAP needs both"],
    );
    assert_error(
        &GROUPS.replace(
            "\"iqn.2026-11.org.example:backup\"",
            "\"iqn.1998-01.com.vmware:esx1\"",
        ),
        &["target[0].group[1].initiators[0]: `iqn.1998-01.com.vmware:esx1` is already a member of group `esx`"],
    );
    assert_error(
        &GROUPS.replace("name = \"backup\"", "name = \"esx\""),
        &["target[0].group[1].name: group `esx` is already defined"],
    );
    assert_error(
        &GROUPS.replace("esx-*", "esx *"),
        &["target[0].group[0].initiators[1]: an initiator pattern has no spaces"],
    );
    assert_error(
        &GROUPS.replace("\"iqn.2026-11.org.example:backup\"", "\"not-a-name\""),
        &["target[0].group[1].initiators[0]"],
    );
    assert_error(
        &GROUPS.replace("name = \"backup\"", "name = \"default\""),
        &["target[0].group[1].initiators: the `default` group serves initiators no other group names"],
    );
    assert_error(
        &GROUPS.replace("lun = 201\ndevice = \"d0\"", "lun = 201\ndevice = \"nope\""),
        &["target[0].group[0].lun[0].device: no [[device]] is named `nope`"],
    );
    let with_target_luns = GROUPS.replace(
        "[[target.group]]\nname = \"esx\"",
        "[[target.lun]]\nlun = 3\ndevice = \"d0\"\n\n[[target.group]]\nname = \"esx\"",
    );
    assert_error(
        &with_target_luns,
        &["target[0].lun: a target with groups maps LUNs in its groups"],
    );
    assert_error(
        &GROUPS.replace(
            "[discovery]\nchap = { user = \"disc\", ",
            "[discovery]\nchap = { user = \"\", ",
        ),
        &["discovery.chap.user: must not be empty"],
    );
}

#[test]
fn sessions_per_initiator_limit() {
    let text = format!(
        "[daemon]\nmax_sessions_per_initiator = 4\nmax_connections_per_portal = 9\n{MINIMAL}"
    );
    let c = parse_config(&text, "test.toml").unwrap();
    assert_eq!(c.daemon.max_sessions_per_initiator, Some(4));
    assert_eq!(c.daemon.max_connections_per_portal, Some(9));
    assert_error(
        &format!("[daemon]\nmax_connections_per_portal = -1\n{MINIMAL}"),
        &["daemon.max_connections_per_portal: -1 is outside 1..=65535"],
    );
    assert_error(
        &format!("[daemon]\nmax_sessions_per_initiator = 0\n{MINIMAL}"),
        &["test.toml:2:30: daemon.max_sessions_per_initiator: 0 is outside 1..=65535"],
    );
}

#[test]
fn pool_limits_parse_and_bad_ones_name_their_line_and_field() {
    let pool = "[[pool]]\nname = \"tank\"\ndevices = [\"/srv/t0.img\"]\n";
    let good = format!("{pool}soft_threshold = \"80%\"\nmax_overcommit = 2.5\n");
    let c = parse_config(&good, "test.toml").unwrap();
    assert_eq!(
        c.pools[0].soft_threshold,
        Some(pool::SoftThreshold::Percent(80))
    );
    assert_eq!(c.pools[0].max_overcommit, Some(250));
    let sized = format!("{pool}soft_threshold = \"800M\"\nmax_overcommit = 3\n");
    let c = parse_config(&sized, "test.toml").unwrap();
    assert_eq!(
        c.pools[0].soft_threshold,
        Some(pool::SoftThreshold::Bytes(800 << 20))
    );
    assert_eq!(c.pools[0].max_overcommit, Some(300));
    let unset = parse_config(pool, "test.toml").unwrap();
    assert_eq!(unset.pools[0].soft_threshold, None);
    assert_eq!(unset.pools[0].max_overcommit, None);

    for (value, line, expect) in [
        (
            "soft_threshold = \"120%\"",
            4,
            "pool[0].soft_threshold: \"120%\" is not a whole percentage",
        ),
        (
            "soft_threshold = \"0%\"",
            4,
            "pool[0].soft_threshold: \"0%\" is not a whole percentage",
        ),
        (
            "soft_threshold = \"8O%\"",
            4,
            "pool[0].soft_threshold: \"8O%\" is not",
        ),
        (
            "soft_threshold = \"lots\"",
            4,
            "pool[0].soft_threshold: `lots` is not a size",
        ),
        (
            "soft_threshold = 0.8",
            4,
            "pool[0].soft_threshold: expected a percentage",
        ),
        (
            "max_overcommit = 0.5",
            4,
            "pool[0].max_overcommit: 0.5 is outside 1.0..=1000",
        ),
        (
            "max_overcommit = \"3x\"",
            4,
            "pool[0].max_overcommit: expected a number",
        ),
    ] {
        let text = format!("{pool}{value}\n");
        let err = errors(&text);
        let at = format!("test.toml:{line}:");
        assert!(
            err.starts_with(&at) && err.contains(expect),
            "{value}: {err}"
        );
    }
}

#[test]
fn failure_rehearsal_example_parses_into_a_graph() {
    let text = include_str!("../../../examples/failure-rehearsal.toml");
    let c = parse_config(text, "examples/failure-rehearsal.toml").unwrap_or_else(|e| panic!("{e}"));
    let kind = |name: &str| c.device(name).map(|d| d.kind());
    assert_eq!(kind("flaky0"), Some("faulty"));
    assert_eq!(c.device("flaky0").unwrap().spec.children(), ["slow0"]);
    assert_eq!(c.device("slow0").unwrap().spec.children(), ["disk0"]);
    assert_eq!(c.pools[0].member_devices().collect::<Vec<_>>(), ["f0"]);
}
