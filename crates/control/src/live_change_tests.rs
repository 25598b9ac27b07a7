use super::*;
use crate::parse_config;

/// A RAM device `scratch` served as LUN 0, a file device `img` as LUN 1,
/// and pool `tank` whose files are under `dir`.
fn base(dir: &std::path::Path) -> String {
    format!(
        r#"
[[portal]]
listen = "127.0.0.1:3260"
[[pool]]
name = "tank"
devices = ["{d}/tank0.img"]
device_size = "128M"
[[device]]
name = "scratch"
kind = "mem"
size = "64M"
[[device]]
name = "img"
kind = "file"
path = "{d}/img.raw"
size = "1M"
[[target]]
name = "iqn.2026-11.org.example:t"
[[target.lun]]
lun = 0
device = "scratch"
[[target.lun]]
lun = 1
device = "img"
"#,
        d = dir.display()
    )
}

fn config(text: &str) -> Config {
    parse_config(text, "new.toml").unwrap_or_else(|e| panic!("{e}"))
}

fn check(old: &str, new: &str, force: bool) -> Result<Vec<String>, String> {
    check_live_change(&config(old), &config(new), force).map_err(|e| e.to_string())
}

#[test]
fn identity_and_unit_settings_keep_the_backing_device() {
    let dir = tempfile::tempdir().unwrap();
    let old = base(dir.path());
    let new = old
        .replace(
            "size = \"64M\"",
            "size = \"64M\"\nproduct_id = \"X\"\nserial = \"S1\"\nread_only = true\nwrite_cache = false",
        )
        .replace("size = \"1M\"", "size = \"1M\"\nblock_size = 4096");
    assert_eq!(check(&old, &new, false), Ok(vec![]));
    let (a, b) = (config(&old), config(&new));
    for (x, y) in a.devices.iter().zip(&b.devices) {
        assert!(keeps_backing(x, y), "{}", x.name);
    }
}

#[test]
fn a_ram_device_resized_or_reblocked_needs_force_and_says_what_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let old = base(dir.path());
    let bigger = old.replace("size = \"64M\"", "size = \"128M\"");
    let err = check(&old, &bigger, false).unwrap_err();
    assert!(
        err.starts_with("new.toml:8:1: device[0].size: a RAM device cannot be resized in place"),
        "{err}"
    );
    assert!(
        err.contains("the 64M of data it holds are lost; pass --force"),
        "{err}"
    );
    let notes = check(&old, &bigger, true).unwrap();
    assert_eq!(notes.len(), 1);
    assert!(
        notes[0].starts_with("! device scratch: a RAM device cannot be resized")
            && notes[0].contains("re-created empty with 128M"),
        "{notes:?}"
    );
    let reblocked = old.replace("size = \"64M\"", "size = \"64M\"\nblock_size = 4096");
    let err = check(&old, &reblocked, false).unwrap_err();
    assert!(err.contains("device[0].block_size"), "{err}");
    let (a, b) = (config(&old), config(&reblocked));
    assert!(!keeps_backing(&a.devices[0], &b.devices[0]));
}

#[test]
fn replacing_or_dropping_served_data_needs_force() {
    let dir = tempfile::tempdir().unwrap();
    let old = base(dir.path());
    let moved = old.replace("img.raw", "other.raw");
    let err = check(&old, &moved, false).unwrap_err();
    assert!(
        err.contains("device[1].path: `img` would serve another file"),
        "{err}"
    );
    let kind = old.replace("kind = \"mem\"\nsize = \"64M\"", "kind = \"null\"");
    let err = check(&old, &kind, false).unwrap_err();
    assert!(
        err.contains("device[0].kind: changing the kind of `scratch` (mem → null)"),
        "{err}"
    );
    // No LUN left on the RAM device: it would be closed.
    let unmapped = old.replace("[[target.lun]]\nlun = 0\ndevice = \"scratch\"\n", "");
    let err = check(&old, &unmapped, false).unwrap_err();
    assert!(
        err.contains("device[0]: no LUN maps RAM device `scratch` any more"),
        "{err}"
    );
    let removed = unmapped.replace(
        "[[device]]\nname = \"scratch\"\nkind = \"mem\"\nsize = \"64M\"\n",
        "",
    );
    let err = check(&old, &removed, false).unwrap_err();
    assert!(
        err.contains("device `scratch`: removing RAM device `scratch`"),
        "{err}"
    );
    assert_eq!(check(&old, &removed, true).unwrap().len(), 1);
    // A file device opened again keeps its file: no force needed.
    let grown = old.replace("size = \"1M\"", "size = \"2M\"\ndirect = true");
    assert_eq!(check(&old, &grown, false), Ok(vec![]));
    let (a, b) = (config(&old), config(&grown));
    assert!(!keeps_backing(&a.devices[1], &b.devices[1]));
}

#[test]
fn a_formatted_pool_refuses_layout_changes_and_a_new_one_takes_them() {
    let dir = tempfile::tempdir().unwrap();
    let old = base(dir.path());
    let grown = old.replace("128M", "256M");
    // Not formatted yet: the pool will be created with the new size.
    assert_eq!(check(&old, &grown, false), Ok(vec![]));
    {
        let c = config(&old);
        crate::open_pool(&c, &c.pools[0])
    }
    .unwrap();
    for force in [false, true] {
        let err = check(&old, &grown, force).unwrap_err();
        assert!(
            err.starts_with("new.toml:4:1: pool[0].device_size: pool `tank` exists"),
            "{err}"
        );
        assert!(err.contains("cannot grow or shrink"), "{err}");
        assert!(err.contains("it stays 128M (asked: 256M)"), "{err}");
    }
    let reunit = old.replace(
        "device_size = \"128M\"",
        "device_size = \"128M\"\nunit_size = \"1M\"",
    );
    let err = check(&old, &reunit, true).unwrap_err();
    assert!(
        err.contains("pool[0].unit_size: pool `tank` exists"),
        "{err}"
    );
    // Adding another pool is a change the running daemon takes.
    let added = format!(
        "{old}[[pool]]\nname = \"spare\"\ndevices = [\"{}/spare0.img\"]\n",
        dir.path().display()
    );
    assert_eq!(check(&old, &added, false), Ok(vec![]));
}

#[test]
fn a_formatted_pool_takes_new_limits_live() {
    let dir = tempfile::tempdir().unwrap();
    let old = base(dir.path());
    let pool = {
        let c = config(&old);
        crate::open_pool(&c, &c.pools[0])
    }
    .unwrap();
    let limited = old.replace(
        "device_size = \"128M\"",
        "device_size = \"128M\"\nsoft_threshold = \"50%\"\nmax_overcommit = 1.5",
    );
    assert_eq!(check(&old, &limited, false), Ok(vec![]));
    // Opening it again, as a configuration change does, sets them.
    {
        let c = config(&limited);
        crate::open_pool(&c, &c.pools[0])
    }
    .unwrap();
    let usage = pool.usage();
    let half = usage.space.total_units.div_ceil(2) * usage.space.unit_size;
    assert_eq!(usage.soft_threshold, Some(half));
    assert_eq!(usage.max_overcommit, Some(1.5));
    {
        let c = config(&old);
        crate::open_pool(&c, &c.pools[0])
    }
    .unwrap();
    assert_eq!(pool.usage().soft_threshold, None);
}
