//! Tests of building and rebuilding live objects.
use super::*;
use crate::{default_config, parse_config};

/// The I_T nexus of `initiator` on `target` through portal group 1.
fn nexus_of(initiator: &str, target: &str) -> scsi_api::Nexus {
    scsi_api::Nexus {
        initiator_name: initiator.into(),
        isid: [0; 6],
        target_name: target.into(),
        relative_port: 1,
        portal_group: 1,
    }
}

#[test]
fn builds_the_default_configuration() {
    let runtime = build(&default_config()).unwrap();
    assert_eq!(runtime.listen, vec!["127.0.0.1:3260".parse().unwrap()]);
    assert_eq!(runtime.exports.scsi_targets.len(), 1);
    let t = &runtime.exports.scsi_targets[0];
    assert_eq!(t.name, "iqn.2026-11.org.openarray:default");
    assert_eq!(t.portals, runtime.listen);
    let units: Vec<_> = runtime.logical_units().collect();
    assert_eq!(units.len(), 1);
    let lu = units[0].1.config();
    assert_eq!(lu.block_size, 512);
    assert_eq!(lu.naa, scsi::naa_from_seed("mem0"));
    assert_eq!(lu.serial.len(), 16);
    runtime.flush_all().unwrap();
    // The RAM disk is also exported over NBD, over the unit's backing.
    let nbd = &runtime.exports.device_exports;
    assert_eq!(nbd.len(), 1);
    assert_eq!(
        (nbd[0].name.as_str(), nbd[0].device.as_str()),
        ("default", "mem0")
    );
    assert!(Arc::ptr_eq(&nbd[0].backing, units[0].1.backing()));
    assert!(!nbd[0].read_only);
}

#[test]
fn an_export_alone_opens_its_device_and_a_read_only_device_stays_read_only() {
    let text = r#"
[[portal]]
listen = "127.0.0.1:3260"

[[device]]
name = "ro"
kind = "mem"
size = "1M"
read_only = true

[[device]]
name = "unused"
kind = "mem"
size = "1M"

[nbd]
[[nbd.export]]
name = "golden"
device = "ro"
"#;
    let runtime = build(&parse_config(text, "t.toml").unwrap()).unwrap();
    let nbd = &runtime.exports.device_exports;
    assert_eq!(nbd.len(), 1);
    assert!(
        nbd[0].read_only,
        "the device is read-only; so is its export"
    );
    assert_eq!(nbd[0].backing.device().size(), 1 << 20);
    let open: Vec<&String> = runtime.exports.devices.keys().collect();
    assert_eq!(open, ["ro"], "only the exported device is opened");
}

#[test]
fn shares_one_logical_unit_between_targets_and_keeps_settings() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        r#"
[daemon]
state_dir = "{state}"

[[portal]]
listen = "127.0.0.1:3260"
[[portal]]
listen = "[::1]:3260"

[[device]]
name = "img"
kind = "file"
path = "{image}"
size = "4M"
block_size = 4096
product_id = "FILE-LUN"
serial = "SER123"
naa = "6001405a1b2c3d4e5f60718293a4b5c6"
write_cache = false

[[device]]
name = "unused"
kind = "file"
path = "{unused}"
size = "4M"

[[target]]
name = "iqn.2026-11.org.example:a"
portals = ["[::1]:3260"]
[[target.lun]]
lun = 201
device = "img"

[[target]]
name = "iqn.2026-11.org.example:b"
alias = "second"
[[target.lun]]
lun = 0
device = "img"
"#,
        state = dir.path().join("state").display(),
        image = dir.path().join("img.raw").display(),
        unused = dir.path().join("unused.raw").display(),
    );
    let config = parse_config(&text, "t.toml").unwrap();
    let runtime = build(&config).unwrap();
    assert!(dir.path().join("state").is_dir());
    assert_eq!(
        std::fs::metadata(dir.path().join("img.raw")).unwrap().len(),
        4 << 20
    );
    // Devices no target uses are not opened (nor created).
    assert!(!dir.path().join("unused.raw").exists());
    let units: Vec<_> = runtime.logical_units().collect();
    assert_eq!(units.len(), 1);
    let lu = units[0].1.config();
    assert_eq!(lu.product, "FILE-LUN");
    assert_eq!(lu.serial, "SER123");
    assert_eq!(lu.naa[0], 0x60);
    assert_eq!(lu.block_size, 4096);
    assert!(!lu.write_cache);
    assert_eq!(
        lu.pr_state_file,
        Some(dir.path().join("state").join("img.pr"))
    );
    assert_eq!(
        runtime.exports.scsi_targets[0].portals,
        vec!["[::1]:3260".parse().unwrap()]
    );
    assert_eq!(runtime.exports.scsi_targets[1].portals.len(), 2);
    assert_eq!(
        runtime.exports.scsi_targets[1].alias.as_deref(),
        Some("second")
    );
    runtime.flush_all().unwrap();
}

#[test]
fn groups_become_views_and_access_rules() {
    use scsi_api::{ScsiCommand, TaskAttr};

    let text = r#"
[[portal]]
listen = "127.0.0.1:3260"
[[device]]
name = "d"
kind = "mem"
size = "1M"
[[target]]
name = "iqn.2026-11.org.example:open"
[[target.lun]]
lun = 0
device = "d"
[[target]]
name = "iqn.2026-11.org.example:guarded"
chap = { user = "u", secret = "twelve-bytes" }
[[target.group]]
name = "hosts"
initiators = ["iqn.2026-11.org.example:host*"]
[[target.group.lun]]
lun = 201
device = "d"
read_only = true
[[target.group]]
name = "default"
[[target.group.lun]]
lun = 5
device = "d"
"#;
    let runtime = build(&parse_config(text, "t.toml").unwrap()).unwrap();
    assert!(runtime.exports.discovery_chap.is_none());
    let access_of = |name: &str| {
        let t = runtime.exports.scsi_targets.iter().find(|t| t.name == name);
        t.unwrap().access.clone()
    };
    // A target without groups or CHAP admits everybody to its LUNs.
    assert!(access_of("iqn.2026-11.org.example:open").is_none());
    let guarded = "iqn.2026-11.org.example:guarded";
    let access = access_of(guarded).unwrap();
    assert_eq!(access.chap.as_ref().unwrap().initiator.user, "u");
    assert_eq!(access.groups.len(), 1);
    assert_eq!(access.groups[0].name, "hosts");
    assert_eq!(
        access.groups[0].initiators,
        ["iqn.2026-11.org.example:host*"]
    );
    assert!(access.groups[0].chap.is_none());
    let host = access.groups[0].view.clone();
    let other = access
        .default_view
        .clone()
        .expect("the default group's view");
    let nexus = nexus_of("iqn.2026-11.org.example:host1", guarded);
    assert!(host.lun_exists(&nexus, 201));
    assert!(!host.lun_exists(&nexus, 5));
    assert!(other.lun_exists(&nexus, 5));
    // WRITE(10) of one block through the read-only mapping.
    let cdb = [0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    let data = vec![0u8; 512];
    let cmd = ScsiCommand {
        lun: 201,
        cdb: &cdb,
        data_out: &data,
        data_in_len: 0,
        data_out_len: 512,
        task_attr: TaskAttr::Simple,
        tag: 1,
        zero_copy: false,
        data_out_parts: &[],
    };
    host.nexus_added(&nexus);
    // The first command reports the power-on unit attention.
    let mut r = host.execute(&nexus, &cmd);
    if r.sense.get(2).is_some_and(|k| k & 0x0f == 0x06) {
        r = host.execute(&nexus, &cmd);
    }
    assert_eq!(r.status, 0x02);
    // DATA PROTECT, WRITE PROTECTED.
    assert_eq!(r.sense[2] & 0x0f, 0x07);
    assert_eq!((r.sense[12], r.sense[13]), (0x27, 0x00));
    // The read-only unit and the writable one share the device's backing
    // (range locks, write cache), which every transport's exports name.
    let ro = runtime.live.read_only["d"].backing().clone();
    let rw = runtime.live.devices["d"].2.backing().clone();
    assert!(Arc::ptr_eq(&ro, &rw));
    assert!(Arc::ptr_eq(&runtime.exports.devices["d"], &rw));
}

#[test]
fn rebuild_keeps_units_and_views_and_commits_at_once() {
    let base = r#"
[[portal]]
listen = "127.0.0.1:3260"
[[device]]
name = "d0"
kind = "mem"
size = "1M"
[[device]]
name = "d1"
kind = "mem"
size = "1M"
[[target]]
name = "iqn.2026-11.org.example:t"
[[target.group]]
name = "esx"
initiators = ["iqn.2026-11.org.example:esx"]
[[target.group.lun]]
lun = 201
device = "d0"
[[target.group]]
name = "old"
initiators = ["iqn.2026-11.org.example:old"]
[[target.group.lun]]
lun = 0
device = "d1"
"#;
    let t = "iqn.2026-11.org.example:t";
    // The view of the group named after `i`'s last part.
    let view_of = |r: &Runtime, i: &str| {
        let group = i.rsplit(':').next().unwrap();
        let target = r.exports.scsi_targets.iter().find(|x| x.name == t)?;
        let access = target.access.as_ref()?;
        let found = access.groups.iter().find(|g| g.name == group)?;
        assert_eq!(found.initiators, [i]);
        Some(found.view.clone())
    };
    let first = build(&parse_config(base, "t.toml").unwrap()).unwrap();
    let esx = view_of(&first, "iqn.2026-11.org.example:esx").unwrap();
    let old = view_of(&first, "iqn.2026-11.org.example:old").unwrap();
    let nexus = nexus_of("iqn.2026-11.org.example:esx", t);

    let changed = base
        .replace(
            "lun = 201\ndevice = \"d0\"",
            "lun = 201\ndevice = \"d0\"\n[[target.group.lun]]\nlun = 5\ndevice = \"d1\"",
        )
        .replace(
            "name = \"old\"\ninitiators = [\"iqn.2026-11.org.example:old\"]",
            "name = \"new\"\ninitiators = [\"iqn.2026-11.org.example:new\"]",
        );
    let second = rebuild(&parse_config(&changed, "t.toml").unwrap(), &first).unwrap();
    // Nothing is live before the commit.
    assert!(!esx.lun_exists(&nexus, 5));
    assert!(view_of(&first, "iqn.2026-11.org.example:new").is_none());
    second.commit(Some(&first));
    assert!(esx.lun_exists(&nexus, 5) && esx.lun_exists(&nexus, 201));
    // The same view object, so live sessions see the new map.
    let again = view_of(&second, "iqn.2026-11.org.example:esx").unwrap();
    assert!(Arc::ptr_eq(&again, &esx));
    // Units whose settings stayed are the same logical units.
    let units = |r: &Runtime| -> Vec<Arc<LogicalUnit>> {
        r.logical_units().map(|(_, lu)| lu.clone()).collect()
    };
    assert!(units(&first)
        .iter()
        .zip(units(&second).iter())
        .all(|(a, b)| Arc::ptr_eq(a, b)));
    // A dropped group's view loses its LUNs; the new group is admitted.
    assert!(!old.lun_exists(&nexus, 0));
    assert!(view_of(&second, "iqn.2026-11.org.example:old").is_none());
    assert!(view_of(&second, "iqn.2026-11.org.example:new").is_some());
}

#[test]
fn device_open_failures_name_the_field() {
    let text = r#"
[[portal]]
listen = "127.0.0.1:3260"
[[device]]
name = "d"
kind = "file"
path = "/nonexistent/dir/disk.img"
[[target]]
name = "iqn.2026-11.org.example:a"
[[target.lun]]
lun = 0
device = "d"
"#;
    let err = build(&parse_config(text, "t.toml").unwrap())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.starts_with("t.toml:4:1: device[0].path: cannot open /nonexistent/dir/disk.img"),
        "{err}"
    );
}

#[test]
fn no_portal_is_a_build_error() {
    let mut config = default_config();
    config.portals.clear();
    let err = build(&config).err().unwrap().to_string();
    assert!(err.contains("portal: no [[portal]] to listen on"), "{err}");
}

#[test]
fn pools_are_reached_by_name_and_exported_volumes_are_known() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        r#"
[[portal]]
listen = "127.0.0.1:3260"
[[pool]]
name = "tank"
devices = ["{d}/tank0.img"]
device_size = "8M"
[[pool]]
name = "spare"
devices = ["{d}/spare0.img"]
device_size = "8M"
[[device]]
name = "lun0"
kind = "volume"
pool = "tank"
volume = "vm1"
size = "1G"
[[target]]
name = "iqn.2026-11.org.example:t"
[[target.lun]]
lun = 0
device = "lun0"
"#,
        d = dir.path().display()
    );
    let runtime = build(&parse_config(&text, "t.toml").unwrap()).unwrap();
    let names: Vec<&str> = runtime
        .pool_configs()
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(names, ["tank", "spare"]);
    let tank = runtime.pool("tank").unwrap();
    // The pool under the LUN, not a second opener of its metadata.
    assert!(Arc::ptr_eq(&tank, &runtime.pool("tank").unwrap()));
    assert!(tank.volume_info("vm1").is_ok());
    assert_eq!(runtime.exporter_of("tank", "vm1"), Some("lun0"));
    assert_eq!(runtime.exporter_of("tank", "lun0"), None);
    assert_eq!(runtime.exporter_of("spare", "vm1"), None);
    // A pool no LUN uses is created on first use.
    assert_eq!(runtime.pool("spare").unwrap().volumes().len(), 0);
    assert!(dir.path().join("spare0.img.meta").exists());
    let err = runtime.pool("none").err().unwrap();
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
}

#[test]
fn identity_changes_keep_the_open_device_and_its_data() {
    let base = r#"
[[portal]]
listen = "127.0.0.1:3260"
[[device]]
name = "scratch"
kind = "mem"
size = "1M"
[[target]]
name = "iqn.2026-11.org.example:t"
[[target.lun]]
lun = 0
device = "scratch"
"#;
    let first = build(&parse_config(base, "t.toml").unwrap()).unwrap();
    let (_, device, lu) = first.live.devices["scratch"].clone();
    device.write_at(&[0xa5; 4096], 8192, false).unwrap();

    let renamed = base.replace("size = \"1M\"", "size = \"1M\"\nproduct_id = \"RENAMED\"");
    let second = rebuild(&parse_config(&renamed, "t.toml").unwrap(), &first).unwrap();
    second.commit(Some(&first));
    let (_, kept, new_lu) = second.live.devices["scratch"].clone();
    assert!(Arc::ptr_eq(&kept, &device), "the backing device stays");
    assert!(!Arc::ptr_eq(&new_lu, &lu), "the unit is rebuilt around it");
    assert_eq!(new_lu.config().product, "RENAMED");
    let mut back = [0u8; 4096];
    kept.read_at(&mut back, 8192).unwrap();
    assert_eq!(back, [0xa5; 4096]);

    // Another size is another RAM device (the caller asked --force).
    let resized = renamed.replace("size = \"1M\"", "size = \"2M\"");
    let third = rebuild(&parse_config(&resized, "t.toml").unwrap(), &second).unwrap();
    let (_, fresh, _) = third.live.devices["scratch"].clone();
    assert!(!Arc::ptr_eq(&fresh, &device));
    assert_eq!(fresh.size(), 2 << 20);
}

#[test]
fn a_cache_takes_its_mode_in_place_on_commit_and_closes_when_dropped() {
    use crate::kinds::as_cache;
    let base = r#"
[[portal]]
listen = "127.0.0.1:3260"
[[device]]
name = "ssd"
kind = "mem"
size = "4M"
[[device]]
name = "hdd"
kind = "mem"
size = "32M"
[[device]]
name = "hybrid"
kind = "cache"
cache = "ssd"
backing = "hdd"
mode = "writeback"
block = "16K"
sequential_cutoff = "0"
[[target]]
name = "iqn.2026-11.org.example:t"
[[target.lun]]
lun = 0
device = "hybrid"
"#;
    let first = build(&parse_config(base, "t.toml").unwrap()).unwrap();
    let (_, device, lu) = first.live.devices["hybrid"].clone();
    device.write_at(&[0x5a; 4096], 0, false).unwrap();
    assert_eq!(as_cache(&*device).unwrap().status().dirty_bytes, 4096);

    let through = base.replace("mode = \"writeback\"", "mode = \"writethrough\"");
    let second = rebuild(&parse_config(&through, "t.toml").unwrap(), &first).unwrap();
    // Nothing changes before the commit.
    assert_eq!(as_cache(&*device).unwrap().mode(), cache::Mode::WriteBack);
    second.commit(Some(&first));
    let (_, kept, kept_lu) = second.live.devices["hybrid"].clone();
    assert!(Arc::ptr_eq(&kept, &device), "the open cache stays");
    assert!(Arc::ptr_eq(&kept_lu, &lu), "and so does its logical unit");
    let status = as_cache(&*kept).unwrap().status();
    assert_eq!(status.mode, cache::Mode::WriteThrough);
    assert_eq!(status.dirty_bytes, 0, "leaving write-back wrote back");
    second.close_replaced(&first).unwrap();
    assert!(
        kept.read_at(&mut [0; 512], 0).is_ok(),
        "a kept device is not closed"
    );

    // Another line size is another cache: the old one closes.
    let relined = through.replace("block = \"16K\"", "block = \"32K\"");
    let config = parse_config(&relined, "t.toml").unwrap();
    assert!(
        rebuild(&config, &second).is_err(),
        "the cache device holds 16K lines"
    );
    second.close_all().unwrap();
    assert!(kept.read_at(&mut [0; 512], 0).is_err(), "closed");
}
