//! Validation reports every problem of a file in one run, each at the
//! line of its setting and with its field.

use crate::parse_config;

/// (line, field, part of the reason) of each mistake in the file.
const TEN_MISTAKES: [(usize, &str, &str); 10] = [
    (4, "portal[0].listen", "is not an address with port"),
    (
        11,
        "device[1].name",
        "device `d0` is already defined (line 6)",
    ),
    (17, "device[2].colour", "unknown field `colour`"),
    (51, "device[10].members", "no [[device]] is named `ghost`"),
    (56, "device[11].level", "expected 0, 1, 10, 5 or 6, found 7"),
    (
        62,
        "device[12].cache",
        "`ssd` is already used by device `parity`",
    ),
    (
        69,
        "device[13].backing",
        "the cache and the backing must be two devices",
    ),
    (76, "device[14].chunk", "a chunk is a multiple of 4K"),
    (
        85,
        "target[0].lun[1].device",
        "no [[device]] is named `nothing`",
    ),
    (87, "target[0].lun[2].lun", "LUN 0 is already mapped here"),
];

#[test]
fn ten_independent_mistakes_are_all_reported_at_their_settings() {
    let text = include_str!("ten_mistakes.toml");
    let err = parse_config(text, "ten.toml").unwrap_err();
    let found: Vec<(usize, &str, &str)> = err
        .issues
        .iter()
        .map(|i| (i.location.map_or(0, |l| l.line), &*i.field, &*i.reason))
        .collect();
    for (line, field, why) in TEN_MISTAKES {
        assert!(
            found
                .iter()
                .any(|(l, f, r)| (*l, *f) == (line, field) && r.contains(why)),
            "no `{line}: {field}: ...{why}` in:\n{err}"
        );
    }
    assert_eq!(found.len(), TEN_MISTAKES.len(), "{err}");
}

/// The device-graph checks, each alone: the setting is named, not the
/// table, and its line.
#[test]
fn graph_problems_name_the_setting() {
    let devices = "[[device]]\nname = \"a\"\nkind = \"mem\"\n\n\
                   [[device]]\nname = \"b\"\nkind = \"faulty\"\nover = \"a\"\n\n";
    for (extra, expect) in [
        (
            "[[device]]\nname = \"c\"\nkind = \"delay\"\nover = \"a\"\n",
            "t.toml:13:8: device[2].over: `a` is already used by device `b`",
        ),
        (
            "[[device]]\nname = \"c\"\nkind = \"faulty\"\nover = \"c\"\n",
            "t.toml:13:8: device[2].over: devices form a loop: c → c",
        ),
        (
            "[[pool]]\nname = \"p\"\ndevices = [\"a\", \"x\"]\nmetadata = \"/m\"\n",
            "t.toml:12:17: pool[0].devices[1]: no [[device]] is named `x`",
        ),
        (
            "[[target]]\nname = \"iqn.2026-11.org.example:t\"\n[[target.lun]]\nlun = 0\ndevice = \"a\"\n",
            "t.toml:14:10: target[0].lun[0].device: `a` is under device `b` and cannot also be a LUN",
        ),
    ] {
        let err = parse_config(&format!("{devices}{extra}"), "t.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains(expect), "expected `{expect}` in:\n{err}");
    }
}

/// A device with a problem of its own still counts in the graph, and a
/// duplicate name is found even when the first of the two is bad.
#[test]
fn graph_problems_of_bad_devices_show_with_theirs() {
    let text = "[[device]]\nname = \"a\"\nkind = \"mem\"\nsize = \"1Q\"\n\n\
                [[device]]\nname = \"r\"\nkind = \"raid\"\nlevel = 3\nmembers = [\"a\", \"b\"]\n\n\
                [[device]]\nname = \"a\"\nkind = \"null\"\n";
    let err = parse_config(text, "t.toml").unwrap_err().to_string();
    for part in [
        "t.toml:4:8: device[0].size",
        "t.toml:9:9: device[1].level",
        "t.toml:10:11: device[1].members: no [[device]] is named `b`",
        "t.toml:13:8: device[2].name: device `a` is already defined (line 1)",
    ] {
        assert!(err.contains(part), "expected `{part}` in:\n{err}");
    }
}
