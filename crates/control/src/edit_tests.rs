use std::collections::BTreeMap;

use super::*;
use crate::parse_config;

const T1: &str = "iqn.2026-11.org.test:one";
const T2: &str = "iqn.2026-11.org.test:two";
const ESX: &str = "iqn.1998-01.com.vmware:esx1";

fn base() -> String {
    format!(
        r#"# the lab array
[[portal]]
listen = "127.0.0.1:3260"

[[device]]
name = "a"
kind = "mem"
size = "4M"

[[device]]
name = "b"
kind = "null"

[[target]]
name = "{T1}"
[[target.group]]
name = "esx"
initiators = ["{ESX}"]
[[target.group.lun]]
lun = 201
device = "a"

# second target, open to all
[[target]]
name = "{T2}"
[[target.lun]]
lun = 0
device = "b"
"#
    )
}

fn settings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Makes each edit in turn, validating the whole file after each.
fn edited(text: &str, edits: &[Edit]) -> String {
    let mut text = text.to_string();
    for e in edits {
        text = apply_edit(&text, e).unwrap_or_else(|err| panic!("{e:?}: {err}"));
        parse_config(&text, "edited.toml").unwrap_or_else(|err| panic!("{e:?}:\n{err}\n{text}"));
    }
    text
}

#[test]
fn edits_land_in_the_right_tables_and_keep_comments() {
    let text = edited(
        &base(),
        &[
            Edit::DeviceAdd {
                name: "c".into(),
                settings: settings(&[("kind", "mem"), ("size", "8M"), ("block_size", "4096")]),
            },
            // The first target's group, though a second target follows.
            Edit::LunAdd {
                target: T1.into(),
                group: Some("esx".into()),
                lun: 7,
                device: "c".into(),
                read_only: true,
            },
            Edit::GroupAdd {
                target: T1.into(),
                group: "linux".into(),
                initiators: vec!["iqn.2026-11.org.test:linux-*".into()],
            },
            Edit::InitiatorAdd {
                target: T1.into(),
                group: "linux".into(),
                initiator: "iqn.2026-11.org.test:linux-2".into(),
            },
            Edit::LunAdd {
                target: T1.into(),
                group: Some("linux".into()),
                lun: 0,
                device: "a".into(),
                read_only: false,
            },
            Edit::TargetModify {
                name: T2.into(),
                settings: settings(&[("alias", "second")]),
            },
        ],
    );
    assert!(text.starts_with("# the lab array\n"), "{text}");
    assert!(text.contains("# second target, open to all"), "{text}");
    let config = parse_config(&text, "x").unwrap();
    assert_eq!(config.devices[2].name, "c");
    assert_eq!(
        config.devices[2].spec.as_kind::<crate::kinds::MemSpec>(),
        Some(&crate::kinds::MemSpec { size: 8 << 20 })
    );
    assert_eq!(config.devices[2].identity.block_size, 4096);
    let one = &config.targets[0];
    let esx = &one.groups[0];
    let mut luns: Vec<(u64, &str, bool)> = esx
        .luns
        .iter()
        .map(|l| (l.lun, l.device.as_str(), l.read_only))
        .collect();
    luns.sort();
    assert_eq!(luns, vec![(7, "c", true), (201, "a", false)]);
    let linux = &one.groups[1];
    assert_eq!(
        linux.initiators,
        vec![
            "iqn.2026-11.org.test:linux-*",
            "iqn.2026-11.org.test:linux-2"
        ]
    );
    assert_eq!(linux.luns[0].lun, 0);
    let two = &config.targets[1];
    assert_eq!(two.alias.as_deref(), Some("second"));
    assert_eq!(two.luns.len(), 1);
    assert!(two.groups.is_empty());
}

#[test]
fn removals_and_read_only_changes() {
    let text = edited(
        &base(),
        &[
            Edit::LunModify {
                target: T1.into(),
                group: Some("esx".into()),
                lun: 201,
                read_only: true,
            },
            Edit::InitiatorAdd {
                target: T1.into(),
                group: "esx".into(),
                initiator: "iqn.1998-01.com.vmware:esx2".into(),
            },
            Edit::InitiatorRemove {
                target: T1.into(),
                group: "esx".into(),
                initiator: ESX.into(),
            },
            Edit::LunRemove {
                target: T2.into(),
                group: None,
                lun: 0,
            },
            Edit::DeviceRemove { name: "b".into() },
            Edit::PortalAdd {
                listen: "127.0.0.1:3261".into(),
            },
            Edit::PortalRemove {
                listen: "127.0.0.1:3260".into(),
            },
        ],
    );
    let config = parse_config(&text, "x").unwrap();
    assert!(config.targets[0].groups[0].luns[0].read_only);
    assert_eq!(
        config.targets[0].groups[0].initiators,
        vec!["iqn.1998-01.com.vmware:esx2"]
    );
    assert!(config.targets[1].luns.is_empty());
    assert_eq!(config.devices.len(), 1);
    assert_eq!(config.portals[0].listen.port(), 3261);
    assert_eq!(config.portals.len(), 1);

    // Back to writable drops the key rather than writing `false`.
    let text = edited(
        &text,
        &[Edit::LunModify {
            target: T1.into(),
            group: Some("esx".into()),
            lun: 201,
            read_only: false,
        }],
    );
    assert!(!text.contains("read_only"), "{text}");
    let text = edited(
        &text,
        &[
            Edit::GroupAdd {
                target: T1.into(),
                group: "default".into(),
                initiators: vec![],
            },
            Edit::GroupRemove {
                target: T1.into(),
                group: "esx".into(),
            },
        ],
    );
    let groups = &parse_config(&text, "x").unwrap().targets[0].groups;
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].name, "default");
}

#[test]
fn chap_is_set_and_cleared_per_scope() {
    let secret = "0123456789abcdef";
    let text = edited(
        &base(),
        &[
            Edit::ChapSet {
                scope: ChapScope::Group {
                    target: T1.into(),
                    group: "esx".into(),
                },
                user: "esx".into(),
                secret: secret.into(),
                mutual_user: Some("array".into()),
                mutual_secret: Some("fedcba9876543210".into()),
            },
            Edit::ChapSet {
                scope: ChapScope::Discovery,
                user: "disc".into(),
                secret: secret.into(),
                mutual_user: None,
                mutual_secret: None,
            },
            Edit::ChapSet {
                scope: ChapScope::Target { target: T2.into() },
                user: "two".into(),
                secret: secret.into(),
                mutual_user: None,
                mutual_secret: None,
            },
        ],
    );
    let config = parse_config(&text, "x").unwrap();
    let group_chap = config.targets[0].groups[0].chap.as_ref().unwrap();
    assert_eq!(group_chap.initiator.user, "esx");
    assert_eq!(group_chap.mutual.as_ref().unwrap().user, "array");
    assert_eq!(
        config.discovery_chap.as_ref().unwrap().initiator.user,
        "disc"
    );
    assert_eq!(
        config.targets[1].chap.as_ref().unwrap().initiator.user,
        "two"
    );

    let text = edited(
        &text,
        &[Edit::ChapClear {
            scope: ChapScope::Target { target: T2.into() },
        }],
    );
    assert!(parse_config(&text, "x").unwrap().targets[1].chap.is_none());
    let again = apply_edit(
        &text,
        &Edit::ChapClear {
            scope: ChapScope::Target { target: T2.into() },
        },
    );
    assert_eq!(again.unwrap_err(), "no CHAP is set there");
}

#[test]
fn refused_edits_say_why() {
    let text = base();
    let err = |e: Edit| apply_edit(&text, &e).unwrap_err();
    let e = err(Edit::DeviceRemove { name: "a".into() });
    assert!(
        e.contains(
            "device `a` is still mapped as target iqn.2026-11.org.test:one group esx LUN 201"
        ),
        "{e}"
    );
    assert_eq!(
        err(Edit::DeviceAdd {
            name: "A".into(),
            settings: BTreeMap::new()
        }),
        "device `A` already exists"
    );
    assert_eq!(
        err(Edit::LunAdd {
            target: T1.into(),
            group: Some("esx".into()),
            lun: 201,
            device: "b".into(),
            read_only: false
        }),
        "LUN 201 is already mapped there"
    );
    assert_eq!(
        err(Edit::GroupAdd {
            target: "iqn.2026-11.org.test:none".into(),
            group: "g".into(),
            initiators: vec![ESX.into()]
        }),
        "no target `iqn.2026-11.org.test:none`"
    );
    assert_eq!(
        err(Edit::InitiatorAdd {
            target: T1.into(),
            group: "nope".into(),
            initiator: ESX.into()
        }),
        format!("target `{T1}` has no group `nope`")
    );
    assert!(err(Edit::DeviceModify {
        name: "a".into(),
        settings: settings(&[("name", "z")])
    })
    .contains("cannot change"));
    assert!(err(Edit::GroupAdd {
        target: T1.into(),
        group: "esx".into(),
        initiators: vec![]
    })
    .contains("already has a group"));
    assert!(err(Edit::PortalAdd {
        listen: "127.0.0.1:3260".into()
    })
    .contains("already exists"));
}

#[test]
fn an_edit_the_validation_refuses_names_the_field() {
    // The edit itself applies; the whole-file check then refuses it.
    let text = apply_edit(
        &base(),
        &Edit::LunAdd {
            target: T1.into(),
            group: Some("esx".into()),
            lun: 5,
            device: "missing".into(),
            read_only: false,
        },
    )
    .unwrap();
    let err = parse_config(&text, "c.toml").unwrap_err().to_string();
    assert!(err.contains("target[0].group[0].lun[1].device"), "{err}");
}

#[test]
fn typed_values_follow_the_text() {
    assert_eq!(typed_value("true").as_bool(), Some(true));
    assert_eq!(typed_value("4096").as_integer(), Some(4096));
    assert_eq!(typed_value("1G").as_str(), Some("1G"));
    assert_eq!(typed_value("\"0042\"").as_str(), Some("0042"));
    assert_eq!(
        typed_value("/var/lib/x.img").as_str(),
        Some("/var/lib/x.img")
    );
}

#[test]
fn values_with_long_runs_of_quotes_are_written_back_exactly() {
    // 256 quotes in a row once overflowed the TOML writer's count of them.
    let quotes = format!("{}{}", "'".repeat(300), "\"".repeat(300));
    let text = apply_edit(
        &base(),
        &Edit::TargetModify {
            name: T2.into(),
            settings: settings(&[("alias", &quotes)]),
        },
    )
    .unwrap();
    let doc: DocumentMut = text.parse().unwrap();
    assert_eq!(doc["target"][1]["alias"].as_str(), Some(quotes.as_str()));
    let err = parse_config(&text, "x").unwrap_err().to_string();
    assert!(err.contains("at most 255 bytes"), "{err}");

    let short = "'''\"\"\"".repeat(40);
    let text = edited(
        &base(),
        &[Edit::TargetModify {
            name: T2.into(),
            settings: settings(&[("alias", &short)]),
        }],
    );
    let config = parse_config(&text, "x").unwrap();
    assert_eq!(config.targets[1].alias.as_deref(), Some(short.as_str()));
}

#[test]
fn nbd_exports_are_added_and_removed_and_hold_their_device() {
    let text = edited(
        &base(),
        &[
            Edit::DeviceAdd {
                name: "c".into(),
                settings: settings(&[("kind", "mem"), ("size", "1M")]),
            },
            Edit::NbdExportAdd {
                name: "vm1".into(),
                device: "c".into(),
                read_only: true,
                allow: vec!["127.0.0.0/8".into()],
                description: Some("the first VM".into()),
            },
        ],
    );
    let config = parse_config(&text, "edited.toml").unwrap();
    let nbd = config.nbd.as_ref().expect("an [nbd] section");
    assert_eq!(nbd.listen[0].to_string(), crate::DEFAULT_NBD_LISTEN);
    let e = &nbd.exports[0];
    assert_eq!(
        (e.name.as_str(), e.device.as_str(), e.read_only),
        ("vm1", "c", true)
    );
    assert_eq!(e.allow, ["127.0.0.0/8"]);
    assert!(config.mapped_devices().contains("c"));
    let again = apply_edit(
        &text,
        &Edit::NbdExportAdd {
            name: "vm1".into(),
            device: "a".into(),
            read_only: false,
            allow: vec![],
            description: None,
        },
    );
    assert_eq!(again.unwrap_err(), "NBD export `vm1` already exists");
    let held = apply_edit(&text, &Edit::DeviceRemove { name: "c".into() }).unwrap_err();
    assert!(
        held.contains("device `c` is still mapped as NBD export vm1"),
        "{held}"
    );
    let text = edited(
        &text,
        &[
            Edit::NbdExportRemove { name: "vm1".into() },
            Edit::DeviceRemove { name: "c".into() },
        ],
    );
    assert!(parse_config(&text, "edited.toml")
        .unwrap()
        .nbd_exports()
        .next()
        .is_none());
    let gone = apply_edit(&text, &Edit::NbdExportRemove { name: "vm1".into() });
    assert_eq!(gone.unwrap_err(), "no NBD export `vm1`");
}

#[test]
fn removing_a_device_under_another_names_its_user() {
    let text = format!(
        "{}\n[[device]]\nname = \"ssd2\"\nkind = \"mem\"\n\n\
         [[device]]\nname = \"hdd2\"\nkind = \"mem\"\n\n\
         [[device]]\nname = \"hybrid2\"\nkind = \"cache\"\ncache = \"ssd2\"\nbacking = \"hdd2\"\n\n\
         [[pool]]\nname = \"tank\"\ndevices = [\"b\"]\nmetadata = \"/m\"\n",
        base().replace("device = \"b\"", "device = \"hybrid2\"")
    );
    parse_config(&text, "t.toml").unwrap();
    let err = |name: &str| apply_edit(&text, &Edit::DeviceRemove { name: name.into() });
    assert_eq!(
        err("ssd2").unwrap_err(),
        "device `ssd2` is used by cache `hybrid2`; change or remove that first"
    );
    assert_eq!(
        err("b").unwrap_err(),
        "device `b` is used by pool `tank`; change or remove that first"
    );
    assert_eq!(err("nothing").unwrap_err(), "no device `nothing`");
}
