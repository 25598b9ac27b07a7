use super::*;

const SECTION: &str = r#"
listen = ["127.0.0.1:4420", "::1"]

[[subsystem]]
nqn = "nqn.2026-11.org.openarray:vm"
allow_hosts = ["*"]

[[subsystem.namespace]]
nsid = 1
device = "disk0"

[[subsystem.namespace]]
nsid = 2
device = "mem0"
block_size = 4096
"#;

fn devices() -> BTreeSet<String> {
    ["disk0", "mem0"].iter().map(|s| s.to_string()).collect()
}

fn parsed() -> Config {
    toml::from_str(SECTION).unwrap()
}

#[test]
fn the_section_parses_and_validates() {
    let c = parsed();
    assert_eq!(c.validate(&devices()), vec![]);
    assert_eq!(
        c.listen_addrs(),
        vec![
            "127.0.0.1:4420".parse().unwrap(),
            "[::1]:4420".parse().unwrap()
        ]
    );
    assert_eq!(c.subsystems[0].namespaces[0].block_size, 512);
    assert_eq!(c.subsystems[0].namespaces[1].block_size, 4096);
    assert_eq!(c.devices().len(), 2);
}

#[test]
fn a_section_without_discovery_or_hosts_serializes_as_before() {
    let text = toml::to_string(&parsed()).unwrap();
    assert!(
        !text.contains("discovery_listen") && !text.contains("subsystem.host"),
        "{text}"
    );
    let mut c = parsed();
    c.discovery_listen.push("127.0.0.1".into());
    c.subsystems[0].hosts.push(HostConfig {
        nqn: "nqn.2014-08.org.nvmexpress:uuid:1".into(),
        dhchap_secret_file: "/k".into(),
        dhchap_ctrl_secret_file: None,
    });
    let back: Config = toml::from_str(&toml::to_string(&c).unwrap()).unwrap();
    assert_eq!(back, c);
}

#[test]
fn unknown_fields_are_refused() {
    let bad = SECTION.replace("block_size = 4096", "blocksize = 4096");
    assert!(toml::from_str::<Config>(&bad).is_err());
}

fn only_error(c: &Config) -> ConfigError {
    let mut e = c.validate(&devices());
    assert_eq!(e.len(), 1, "{e:?}");
    e.remove(0)
}

#[test]
fn each_problem_names_its_field_and_why() {
    let mut c = parsed();
    c.subsystems[0].namespaces[1].nsid = 1;
    let e = only_error(&c);
    assert_eq!(e.field, "nvmf.subsystem[0].namespace[1].nsid");
    assert!(e.why.contains("defined twice"), "{e}");

    let mut c = parsed();
    c.subsystems[0].namespaces[0].device = "nope".into();
    let e = only_error(&c);
    assert_eq!(e.field, "nvmf.subsystem[0].namespace[0].device");
    assert!(e.why.contains("\"nope\""));

    let mut c = parsed();
    c.subsystems[0].nqn = "iqn.2026-11.org.openarray:vm".into();
    assert_eq!(only_error(&c).field, "nvmf.subsystem[0].nqn");

    let mut c = parsed();
    c.subsystems.push(c.subsystems[0].clone());
    let e = only_error(&c);
    assert_eq!(e.field, "nvmf.subsystem[1].nqn");

    let mut c = parsed();
    c.subsystems[0].allow_hosts = vec![];
    assert_eq!(only_error(&c).field, "nvmf.subsystem[0].allow_hosts");
    c.subsystems[0].allow_hosts = vec!["host one".into()];
    assert_eq!(only_error(&c).field, "nvmf.subsystem[0].allow_hosts[0]");

    let mut c = parsed();
    c.subsystems[0].namespaces[0].nsid = 0;
    assert_eq!(only_error(&c).field, "nvmf.subsystem[0].namespace[0].nsid");
    let mut c = parsed();
    c.subsystems[0].namespaces[0].block_size = 1024;
    assert_eq!(
        only_error(&c).field,
        "nvmf.subsystem[0].namespace[0].block_size"
    );

    let mut c = parsed();
    c.listen.push("127.0.0.1".into());
    assert_eq!(only_error(&c).field, "nvmf.listen[2]");
    c.listen[2] = "127.0.0.1:notaport".into();
    assert_eq!(only_error(&c).field, "nvmf.listen[2]");
}

#[test]
fn nqns_follow_the_format() {
    assert_eq!(
        nqn_problem("nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427"),
        None
    );
    assert_eq!(nqn_problem("nqn.2026-11.org.openarray:vm"), None);
    assert!(nqn_problem("nqn.2026-11.org.openarray").is_some());
    assert!(nqn_problem("nqn.26-11.org.openarray:x").is_some());
    assert!(nqn_problem("nqn.2026-11.:x").is_some());
    assert!(nqn_problem(&format!("nqn.2026-11.org.x:{}", "a".repeat(220))).is_some());
}

#[test]
fn host_patterns_match_with_wildcards() {
    assert!(glob("*", "nqn.2014-08.org.nvmexpress:uuid:1"));
    assert!(glob(
        "nqn.2014-08.org.nvmexpress:uuid:*",
        "nqn.2014-08.org.nvmexpress:uuid:1"
    ));
    assert!(!glob(
        "nqn.2014-08.org.nvmexpress:uuid:*",
        "nqn.2026-11.org.x:uuid:1"
    ));
    assert!(glob("nqn.*:host-*-a", "nqn.2026-11.org.x:host-7-a"));
    assert!(!glob("nqn.*:host-*-a", "nqn.2026-11.org.x:host-7-b"));
    assert!(glob("exact", "exact") && !glob("exact", "exactly"));
    assert!(!glob("a*a", "a"));
}

#[test]
fn discovery_listeners_default_to_port_8009() {
    let text = format!("discovery_listen = [\"127.0.0.1\", \"[::1]:9000\"]\n{SECTION}");
    let c: Config = toml::from_str(&text).unwrap();
    assert_eq!(c.validate(&devices()), vec![]);
    assert_eq!(
        c.discovery_addrs(),
        vec![
            "127.0.0.1:8009".parse().unwrap(),
            "[::1]:9000".parse().unwrap()
        ]
    );
    let mut c = c;
    c.discovery_listen.push("127.0.0.1:4420".into());
    assert_eq!(only_error(&c).field, "nvmf.discovery_listen[2]");
    let mut c = parsed();
    c.subsystems[0].nqn = DISCOVERY_NQN.into();
    assert_eq!(only_error(&c).field, "nvmf.subsystem[0].nqn");
}

#[test]
fn hosts_with_secrets_are_checked() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("h.key");
    let secret = crate::auth::Secret::new(vec![1; 32], None).unwrap();
    std::fs::write(&key, secret.encode()).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let text = format!(
        "{SECTION}\n[[subsystem.host]]\nnqn = \"nqn.2014-08.org.nvmexpress:uuid:1\"\n\
         dhchap_secret_file = \"{}\"\n",
        key.display()
    );
    let c: Config = toml::from_str(&text).unwrap();
    assert_eq!(c.validate(&devices()), vec![]);
    assert_eq!(c.subsystems[0].hosts[0].dhchap_ctrl_secret_file, None);

    let mut bad = c.clone();
    bad.subsystems[0].allow_hosts = vec!["nqn.2014-08.org.other:*".into()];
    let e = only_error(&bad);
    assert_eq!(e.field, "nvmf.subsystem[0].host[0].nqn");
    assert!(e.why.contains("allow_hosts"), "{e}");
    let mut bad = c.clone();
    let twice = bad.subsystems[0].hosts[0].clone();
    bad.subsystems[0].hosts.push(twice);
    assert_eq!(only_error(&bad).field, "nvmf.subsystem[0].host[1].nqn");
    let mut bad = c.clone();
    bad.subsystems[0].hosts[0].dhchap_ctrl_secret_file =
        Some(dir.path().join("none").display().to_string());
    assert_eq!(
        only_error(&bad).field,
        "nvmf.subsystem[0].host[0].dhchap_ctrl_secret_file"
    );
    std::fs::write(&key, "DHHC-1:00:notbase64!:").unwrap();
    let e = only_error(&c);
    assert_eq!(e.field, "nvmf.subsystem[0].host[0].dhchap_secret_file");
    assert!(e.why.contains("base64"), "{e}");
}
