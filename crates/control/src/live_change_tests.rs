use super::*;
use crate::parse_config;

/// Pool `tank` whose files are under `dir`, and some devices.
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

fn check(old: &str, new: &str) -> Result<(), String> {
    check_live_change(&config(old), &config(new)).map_err(|e| e.to_string())
}

#[test]
fn a_formatted_pool_refuses_layout_changes_and_a_new_one_takes_them() {
    let dir = tempfile::tempdir().unwrap();
    let old = base(dir.path());
    let grown = old.replace("128M", "256M");
    // Not formatted yet: the pool will be created with the new size.
    assert_eq!(check(&old, &grown), Ok(()));
    crate::open_pool(&config(&old).pools[0]).unwrap();
    let err = check(&old, &grown).unwrap_err();
    assert!(
        err.starts_with("new.toml:4:1: pool[0].device_size: pool `tank` exists"),
        "{err}"
    );
    assert!(err.contains("cannot grow or shrink"), "{err}");
    assert!(err.contains("it stays 128M (asked: 256M)"), "{err}");
    let reunit = old.replace(
        "device_size = \"128M\"",
        "device_size = \"128M\"\nunit_size = \"1M\"",
    );
    let err = check(&old, &reunit).unwrap_err();
    assert!(
        err.contains("pool[0].unit_size: pool `tank` exists"),
        "{err}"
    );
    // Adding another pool is a change the running daemon takes.
    let added = format!(
        "{old}[[pool]]\nname = \"spare\"\ndevices = [\"{}/spare0.img\"]\n",
        dir.path().display()
    );
    assert_eq!(check(&old, &added), Ok(()));
}
