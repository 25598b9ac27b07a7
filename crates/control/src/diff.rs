//! What differs between two configurations, entity by entity, as lines an
//! administrator reads: the drift between a file and the running state,
//! or what an apply is about to change. Source positions do not count, and
//! secrets are never shown (only that they changed).

use std::collections::BTreeSet;

use crate::model::{Chap, Config, Group, Lun, NbdExport, Target};
use crate::render::{
    changed_fields, daemon_fields, device_fields, list, pool_fields, schedule_fields, Field,
};

/// Every difference from `old` to `new`; empty when they are the same.
/// A changed setting reads `~ WHERE FIELD: OLD → NEW`.
pub fn diff(old: &Config, new: &Config) -> Vec<String> {
    let mut out = Vec::new();
    let old_portals: BTreeSet<_> = old.portals.iter().map(|p| p.listen).collect();
    let new_portals: BTreeSet<_> = new.portals.iter().map(|p| p.listen).collect();
    for p in old_portals.difference(&new_portals) {
        out.push(format!("- portal {p}"));
    }
    for p in new_portals.difference(&old_portals) {
        out.push(format!("+ portal {p}"));
    }
    changed_fields(
        &mut out,
        "daemon",
        &daemon_fields(&old.daemon),
        &daemon_fields(&new.daemon),
    );
    chap_change(
        &mut out,
        "discovery",
        &old.discovery_chap,
        &new.discovery_chap,
    );
    by_fields(
        &mut out,
        &old.pools,
        &new.pools,
        |p| &p.name,
        pool_fields,
        "pool",
    );
    by_fields(
        &mut out,
        &old.schedules,
        &new.schedules,
        |s| &s.spec.volume,
        schedule_fields,
        "schedule",
    );
    by_fields(
        &mut out,
        &old.devices,
        &new.devices,
        |d| &d.name,
        device_fields,
        "device",
    );
    by_name(
        &mut out,
        &old.targets,
        &new.targets,
        |t| t.name.as_str(),
        target_changes,
        "target",
    );
    nbd_changes(&mut out, old, new);
    crate::sections::diff(&old.sections, &new.sections, &mut out);
    out
}

/// Where NBD listens, its TLS, and its exports.
fn nbd_changes(out: &mut Vec<String>, old: &Config, new: &Config) {
    let fields = |c: &Config| -> Vec<Field> {
        let Some(n) = &c.nbd else {
            return vec![("listen", "(off)".into())];
        };
        let mut fields = vec![("listen", list(&n.listen, |a| a.to_string(), "(none)"))];
        if let Some(t) = &n.tls {
            let require = if t.require { ", required" } else { "" };
            let tls = format!("{} {}{require}", t.cert.display(), t.key.display());
            fields.push(("tls", tls));
        }
        fields
    };
    changed_fields(out, "nbd", &fields(old), &fields(new));
    let export_fields = |e: &NbdExport| -> Vec<Field> {
        vec![
            ("device", e.device.clone()),
            ("read_only", e.read_only.to_string()),
            ("allow", list(&e.allow, |a| a.clone(), "(every client)")),
            ("description", e.description.clone()),
        ]
    };
    let exports = |c: &Config| c.nbd_exports().cloned().collect::<Vec<_>>();
    by_fields(
        out,
        &exports(old),
        &exports(new),
        |e| &e.name,
        export_fields,
        "nbd export",
    );
}

/// Removed, added and (through `changes`) changed entities of one kind.
fn by_name<T>(
    out: &mut Vec<String>,
    old: &[T],
    new: &[T],
    name: impl Fn(&T) -> &str,
    changes: impl Fn(&mut Vec<String>, &T, &T),
    kind: &str,
) {
    for o in old {
        match new.iter().find(|n| name(n) == name(o)) {
            None => out.push(format!("- {kind} {}", name(o))),
            Some(n) => changes(out, o, n),
        }
    }
    for n in new {
        if !old.iter().any(|o| name(o) == name(n)) {
            out.push(format!("+ {kind} {}", name(n)));
        }
    }
}

/// Entities of one kind whose settings are compared one by one.
fn by_fields<T>(
    out: &mut Vec<String>,
    old: &[T],
    new: &[T],
    name: impl Fn(&T) -> &String,
    fields: impl Fn(&T) -> Vec<Field>,
    kind: &str,
) {
    let changes = |out: &mut Vec<String>, a: &T, b: &T| {
        let at = format!("{kind} {}", name(a));
        changed_fields(out, &at, &fields(a), &fields(b));
    };
    by_name(out, old, new, |t| name(t).as_str(), changes, kind);
}

fn target_changes(out: &mut Vec<String>, a: &Target, b: &Target) {
    let at = format!("target {}", a.name);
    let alias = |t: &Target| t.alias.clone().unwrap_or_else(|| "(none)".into());
    let portals = |t: &Target| match &t.portals {
        None => "(every portal)".to_string(),
        Some(p) => list(p, |a| a.to_string(), "(none)"),
    };
    changed_fields(
        out,
        &at,
        &[("alias", alias(a)), ("portals", portals(a))],
        &[("alias", alias(b)), ("portals", portals(b))],
    );
    chap_change(out, &at, &a.chap, &b.chap);
    lun_changes(out, &at, &a.luns, &b.luns);
    for g in &a.groups {
        match b.groups.iter().find(|h| h.name == g.name) {
            None => out.push(format!("- {at} group {}", g.name)),
            Some(h) => group_changes(out, &at, g, h),
        }
    }
    for h in &b.groups {
        if !a.groups.iter().any(|g| g.name == h.name) {
            out.push(format!("+ {at} group {}", h.name));
        }
    }
}

fn group_changes(out: &mut Vec<String>, target: &str, a: &Group, b: &Group) {
    let at = format!("{target} group {}", a.name);
    let members = |g: &Group| list(&g.initiators, String::clone, "(none)");
    changed_fields(
        out,
        &at,
        &[("initiators", members(a))],
        &[("initiators", members(b))],
    );
    chap_change(out, &at, &a.chap, &b.chap);
    lun_changes(out, &at, &a.luns, &b.luns);
}

fn lun_changes(out: &mut Vec<String>, at: &str, a: &[Lun], b: &[Lun]) {
    let show = |l: &Lun| {
        format!(
            "LUN {} = {}{}",
            l.lun,
            l.device,
            if l.read_only { " (read-only)" } else { "" }
        )
    };
    let fields = |l: &Lun| {
        [
            ("device", l.device.clone()),
            ("read_only", l.read_only.to_string()),
        ]
    };
    for l in a {
        match b.iter().find(|m| m.lun == l.lun) {
            None => out.push(format!("- {at} {}", show(l))),
            Some(m) => changed_fields(out, &format!("{at} LUN {}", l.lun), &fields(l), &fields(m)),
        }
    }
    for m in b {
        if !a.iter().any(|l| l.lun == m.lun) {
            out.push(format!("+ {at} {}", show(m)));
        }
    }
}

/// CHAP changes by user name; a changed secret is named, never shown.
fn chap_change(out: &mut Vec<String>, at: &str, a: &Option<Chap>, b: &Option<Chap>) {
    match (a, b) {
        (None, None) => {}
        (Some(_), None) => out.push(format!("- {at} chap")),
        (None, Some(c)) => out.push(format!("+ {at} chap (user {})", c.initiator.user)),
        (Some(x), Some(y)) if x != y => {
            let users = |c: &Chap| {
                [
                    ("user", c.initiator.user.clone()),
                    (
                        "mutual_user",
                        c.mutual
                            .as_ref()
                            .map_or_else(|| "(none)".into(), |m| m.user.clone()),
                    ),
                ]
            };
            let before = out.len();
            changed_fields(out, &format!("{at} chap"), &users(x), &users(y));
            if out.len() == before {
                out.push(format!("~ {at} chap secret changed"));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_config;

    const BASE: &str = r#"
[[portal]]
listen = "127.0.0.1:3260"
[[device]]
name = "d0"
kind = "mem"
[[device]]
name = "d1"
kind = "mem"
[[target]]
name = "iqn.2026-11.org.example:t"
chap = { user = "u", secret = "first-secret-1" }
[[target.group]]
name = "esx"
initiators = ["iqn.1998-01.com.vmware:esx1"]
[[target.group.lun]]
lun = 201
device = "d0"
"#;

    fn config(text: &str) -> Config {
        parse_config(text, "t.toml").unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn same_file_elsewhere_in_the_text_is_no_change() {
        let moved = format!("\n\n# comment\n{BASE}");
        assert!(diff(&config(BASE), &config(&moved)).is_empty());
    }

    #[test]
    fn changes_are_named_and_secrets_hidden() {
        let changed = BASE
            .replace("first-secret-1", "second-secret-2")
            .replace("lun = 201\ndevice = \"d0\"", "lun = 201\ndevice = \"d1\"")
            .replace("esx1\"]", "esx1\", \"iqn.1998-01.com.vmware:esx2\"]")
            + r#"
[[target.group]]
name = "backup"
initiators = ["iqn.2026-11.org.example:backup"]
[[target.group.lun]]
lun = 0
device = "d0"
read_only = true
"#;
        let lines = diff(&config(BASE), &config(&changed));
        let t = "iqn.2026-11.org.example:t";
        assert_eq!(
            lines,
            vec![
                format!("~ target {t} chap secret changed"),
                format!(
                    "~ target {t} group esx initiators: iqn.1998-01.com.vmware:esx1 → iqn.1998-01.com.vmware:esx1, iqn.1998-01.com.vmware:esx2"
                ),
                format!("~ target {t} group esx LUN 201 device: d0 → d1"),
                format!("+ target {t} group backup"),
            ]
        );
        assert!(!lines.iter().any(|l| l.contains("secret-")));
        let back = diff(&config(&changed), &config(BASE));
        assert!(back.contains(&format!("- target {t} group backup")));
    }

    #[test]
    fn devices_portals_and_targets() {
        let changed = BASE
            .replace(
                "name = \"d1\"\nkind = \"mem\"",
                "name = \"d2\"\nkind = \"null\"",
            )
            .replace("127.0.0.1:3260", "127.0.0.1:3261");
        let lines = diff(&config(BASE), &config(&changed));
        assert_eq!(
            lines,
            vec![
                "- portal 127.0.0.1:3260".to_string(),
                "+ portal 127.0.0.1:3261".to_string(),
                "- device d1".to_string(),
                "+ device d2".to_string(),
            ]
        );
    }

    #[test]
    fn pools_take_part_field_by_field() {
        let pool =
            "\n[[pool]]\nname = \"tank\"\ndevices = [\"/srv/tank0.img\"]\ndevice_size = \"128M\"\n";
        let with_pool = format!("{BASE}{pool}");
        let grown = with_pool.replace("128M", "256M");
        assert_eq!(
            diff(&config(&with_pool), &config(&grown)),
            vec!["~ pool tank device_size: 128M → 256M".to_string()]
        );
        let moved = with_pool.replace("/srv/tank0.img", "/srv/other.img");
        assert_eq!(
            diff(&config(&with_pool), &config(&moved)),
            vec![
                "~ pool tank devices: /srv/tank0.img → /srv/other.img".to_string(),
                "~ pool tank metadata: /srv/tank0.img.meta → /srv/other.img.meta".to_string(),
            ]
        );
        let limited = format!("{with_pool}soft_threshold = \"80%\"\nmax_overcommit = 2.5\n");
        assert_eq!(
            diff(&config(&with_pool), &config(&limited)),
            vec![
                "~ pool tank soft_threshold: (not set) → 80%".to_string(),
                "~ pool tank max_overcommit: (not set) → 2.5".to_string(),
            ]
        );
        assert_eq!(
            diff(&config(BASE), &config(&with_pool)),
            vec!["+ pool tank".to_string()]
        );
        assert_eq!(
            diff(&config(&with_pool), &config(BASE)),
            vec!["- pool tank".to_string()]
        );
    }

    #[test]
    fn devices_and_daemon_settings_read_as_written() {
        let changed = BASE
            .replace(
                "name = \"d0\"\nkind = \"mem\"",
                "name = \"d0\"\nkind = \"mem\"\nsize = \"64M\"\nproduct_id = \"X\"",
            )
            .replace(
                "[[portal]]",
                "[daemon]\nlogin_timeout = \"30s\"\nnop_interval = \"off\"\n[[portal]]",
            );
        let lines = diff(&config(BASE), &config(&changed));
        assert_eq!(
            lines,
            vec![
                "~ daemon login_timeout: (default) → 30s",
                "~ daemon nop_interval: (default) → off",
                "~ device d0 size: 1G → 64M",
                "~ device d0 product_id: (not set) → X",
            ]
        );
        assert!(!lines.iter().any(|l| l.contains("Some(") || l.contains('{')));
    }

    #[test]
    fn nbd_listen_and_exports_take_part() {
        let nbd = "\n[nbd]\n[[nbd.export]]\nname = \"vm\"\ndevice = \"d0\"\n";
        let with = format!("{BASE}{nbd}");
        assert_eq!(
            diff(&config(BASE), &config(&with)),
            vec!["~ nbd listen: (off) → 127.0.0.1:10809", "+ nbd export vm"]
        );
        let changed = with.replace(
            "\"vm\"\ndevice = \"d0\"\n",
            "\"vm\"\ndevice = \"d0\"\nread_only = true\n",
        );
        assert_eq!(
            diff(&config(&with), &config(&changed)),
            vec!["~ nbd export vm read_only: false → true"]
        );
        assert_eq!(diff(&config(&with), &config(BASE)).len(), 2);
    }
}
