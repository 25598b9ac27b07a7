//! Tests of the imperative administration commands' arguments.

use super::*;

#[test]
fn settings_split_at_the_first_equals() {
    assert_eq!(setting("size=1G"), Ok(("size".into(), "1G".into())));
    assert_eq!(setting("serial=a=b"), Ok(("serial".into(), "a=b".into())));
    assert_eq!(setting("alias="), Ok(("alias".into(), String::new())));
    assert!(setting("size").is_err());
    assert!(setting("=1").is_err());
}

#[test]
fn chap_scope_follows_the_flags() {
    let at = |discovery, target: Option<&str>, group: Option<&str>| ChapWhere {
        discovery,
        target: target.map(String::from),
        group: group.map(String::from),
    };
    assert_eq!(at(true, None, None).scope(), ChapScope::Discovery);
    assert_eq!(
        at(false, Some("t"), None).scope(),
        ChapScope::Target { target: "t".into() }
    );
    assert_eq!(
        at(false, Some("t"), Some("g")).scope(),
        ChapScope::Group {
            target: "t".into(),
            group: "g".into()
        }
    );
}

#[test]
fn secrets_come_from_files_without_the_newline() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s");
    std::fs::write(&file, "0123456789abcdef\n").unwrap();
    assert_eq!(read_secret(&file).unwrap(), "0123456789abcdef");
    std::fs::write(&file, "\n").unwrap();
    assert!(read_secret(&file).is_err());
    assert!(read_secret(&dir.path().join("none")).is_err());
}

#[test]
fn device_add_quotes_the_path_and_keeps_the_rest() {
    let Action::Edit(Edit::DeviceAdd { name, settings }, false) = device(DeviceOp::Add {
        name: "vm1".into(),
        kind: "file".into(),
        path: Some("/srv/1234".into()),
        size: Some("1G".into()),
        read_only: true,
        settings: vec![("block_size".into(), "4096".into())],
    }) else {
        panic!("not a device add");
    };
    assert_eq!(name, "vm1");
    let typed = |k: &str| control::typed_value(&settings[k]).to_string();
    assert_eq!(typed("path").trim(), "\"/srv/1234\"");
    assert_eq!(typed("size").trim(), "\"1G\"");
    assert_eq!(typed("kind").trim(), "\"file\"");
    assert_eq!(typed("read_only").trim(), "true");
    assert_eq!(typed("block_size").trim(), "4096");
}
