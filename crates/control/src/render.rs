//! Settings as an administrator writes them, for change reports: `128M`
//! rather than a byte count, `15s` rather than a `Duration`'s debug form.

use std::fmt::Display;
use std::path::Path;
use std::time::Duration;

use crate::model::{Daemon, Device, PoolConfig, Schedule};

/// Shown for a key that is not set.
pub const UNSET: &str = "(not set)";

/// `n` bytes in the largest binary unit that divides it exactly.
pub fn size(n: u64) -> String {
    for (unit, shift) in [("P", 50), ("T", 40), ("G", 30), ("M", 20), ("K", 10)] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

/// Bytes with a binary unit, one decimal where it is not whole (a rate
/// or a measurement, which is rarely a round number).
pub fn approx_size(n: u64) -> String {
    for (unit, shift) in [("P", 50), ("T", 40), ("G", 30), ("M", 20), ("K", 10)] {
        if n >= 1 << shift {
            let v = n as f64 / (1u64 << shift) as f64;
            return if n.is_multiple_of(1 << shift) {
                format!("{}{unit}", n >> shift)
            } else {
                format!("{v:.1}{unit}")
            };
        }
    }
    n.to_string()
}

pub fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, per) in [("h", 3_600_000), ("m", 60_000), ("s", 1_000)] {
        if ms >= per && ms.is_multiple_of(per) {
            return format!("{}{unit}", ms / per);
        }
    }
    format!("{ms}ms")
}

fn opt<T>(v: &Option<T>, show: impl Fn(&T) -> String, absent: &str) -> String {
    v.as_ref().map_or_else(|| absent.to_string(), show)
}

fn shown<T: Display>(v: &T) -> String {
    v.to_string()
}

fn path(p: &impl AsRef<Path>) -> String {
    p.as_ref().display().to_string()
}

/// Items joined with `, `; `empty` when there are none.
pub fn list<T>(items: &[T], show: impl Fn(&T) -> String, empty: &str) -> String {
    if items.is_empty() {
        return empty.to_string();
    }
    items.iter().map(show).collect::<Vec<_>>().join(", ")
}

/// A setting's name and value as shown in change reports.
pub type Field = (&'static str, String);

pub fn device_fields(d: &Device) -> Vec<Field> {
    let id = &d.identity;
    let mut fields = vec![("kind", d.kind().to_string())];
    fields.extend(d.spec.settings());
    fields.extend([
        ("product_id", opt(&id.product_id, String::clone, UNSET)),
        (
            "serial",
            opt(&id.serial, String::clone, "(derived from the NAA)"),
        ),
        (
            "naa",
            opt(
                &id.naa,
                |n| n.iter().map(|b| format!("{b:02x}")).collect(),
                "(derived from the name)",
            ),
        ),
        ("block_size", id.block_size.to_string()),
        ("physical_block_size", id.physical_block_size.to_string()),
        ("read_only", d.read_only.to_string()),
        ("write_cache", d.write_cache.to_string()),
    ]);
    fields
}

pub fn pool_fields(p: &PoolConfig) -> Vec<Field> {
    vec![
        ("devices", list(&p.devices, shown, "(none)")),
        ("device_size", opt(&p.device_size, |n| size(*n), UNSET)),
        ("metadata", path(&p.metadata)),
        ("unit_size", size(p.unit_size)),
        (
            "soft_threshold",
            opt(&p.soft_threshold, |t| soft_threshold(*t), UNSET),
        ),
        (
            "max_overcommit",
            opt(&p.max_overcommit, |m| overcommit(*m), UNSET),
        ),
    ]
}

pub fn schedule_fields(s: &Schedule) -> Vec<Field> {
    let time = |d: &Duration| {
        let secs = d.as_secs();
        format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
    };
    vec![
        ("pool", s.pool.clone()),
        ("every", duration(s.spec.every)),
        ("at", opt(&s.spec.at, time, UNSET)),
        ("keep", s.spec.keep.to_string()),
        ("refresh", list(&s.refresh, String::clone, "(none)")),
    ]
}

/// The pool settings a running pool takes at once.
pub const LIVE_POOL_FIELDS: [&str; 2] = ["soft_threshold", "max_overcommit"];

pub fn soft_threshold(t: pool::SoftThreshold) -> String {
    match t {
        pool::SoftThreshold::Percent(p) => format!("{p}%"),
        pool::SoftThreshold::Bytes(n) => size(n),
    }
}

/// A ratio kept in hundredths, as written: `3.0`, `2.5`, `1.25`.
pub fn overcommit(hundredths: u32) -> String {
    let whole = hundredths / 100;
    match hundredths % 100 {
        0 => format!("{whole}.0"),
        f if f % 10 == 0 => format!("{whole}.{}", f / 10),
        f => format!("{whole}.{f:02}"),
    }
}

pub fn daemon_fields(d: &Daemon) -> Vec<Field> {
    const DEFAULT: &str = "(default)";
    let dur = |v: &Option<Duration>| opt(v, |d| duration(*d), DEFAULT);
    vec![
        ("state_dir", opt(&d.state_dir, path, UNSET)),
        (
            "max_sessions_per_initiator",
            opt(&d.max_sessions_per_initiator, shown, DEFAULT),
        ),
        (
            "max_connections_per_portal",
            opt(&d.max_connections_per_portal, shown, DEFAULT),
        ),
        ("login_timeout", dur(&d.login_timeout)),
        (
            "nop_interval",
            opt(
                &d.nop_interval,
                |v| v.map_or_else(|| "off".to_string(), duration),
                DEFAULT,
            ),
        ),
        ("nop_timeout", dur(&d.nop_timeout)),
        ("write_timeout", dur(&d.write_timeout)),
        (
            "max_logins_per_source",
            opt(&d.max_logins_per_source, shown, DEFAULT),
        ),
        ("max_logins", opt(&d.max_logins, shown, DEFAULT)),
        (
            "max_connections_per_source",
            opt(&d.max_connections_per_source, shown, DEFAULT),
        ),
        (
            "max_queued_output",
            opt(&d.max_queued_output, |n| size(*n as u64), DEFAULT),
        ),
        ("api_header_timeout", dur(&d.api_header_timeout)),
        ("api_body_timeout", dur(&d.api_body_timeout)),
        ("auth_fail_delay", dur(&d.auth_fail_delay)),
        ("auth_fail_delay_max", dur(&d.auth_fail_delay_max)),
        ("api_listen", opt(&d.api_listen, shown, UNSET)),
        ("api_token_file", opt(&d.api_token_file, path, UNSET)),
        (
            "api_read_only_token_file",
            opt(&d.api_read_only_token_file, path, UNSET),
        ),
    ]
}

/// `~ AT FIELD: OLD → NEW` for every field whose value differs.
/// One `~` line per setting that differs; a setting only one side has
/// (devices of two kinds) is unset on the other.
pub fn changed_fields(out: &mut Vec<String>, at: &str, old: &[Field], new: &[Field]) {
    let value = |fields: &[Field], name: &str| {
        fields
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(UNSET.to_string(), |(_, v)| v.clone())
    };
    let mut names: Vec<&str> = old.iter().map(|(n, _)| *n).collect();
    for (n, _) in new {
        if !names.contains(n) {
            names.push(n);
        }
    }
    for name in names {
        let (a, b) = (value(old, name), value(new, name));
        if a != b {
            out.push(format!("~ {at} {name}: {a} → {b}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_read_as_written() {
        assert_eq!(size(128 << 20), "128M");
        assert_eq!(size(1 << 30), "1G");
        assert_eq!(size(1536 << 10), "1536K");
        assert_eq!(size(4097), "4097");
        assert_eq!(size(0), "0");
        assert_eq!(duration(Duration::from_secs(15)), "15s");
        assert_eq!(duration(Duration::from_secs(120)), "2m");
        assert_eq!(duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(overcommit(300), "3.0");
        assert_eq!(overcommit(250), "2.5");
        assert_eq!(overcommit(125), "1.25");
        assert_eq!(soft_threshold(pool::SoftThreshold::Percent(80)), "80%");
        assert_eq!(soft_threshold(pool::SoftThreshold::Bytes(1 << 30)), "1G");
    }

    #[test]
    fn a_rate_reads_rounded() {
        assert_eq!(approx_size(208_486_149), "198.8M");
        assert_eq!(approx_size(64 << 20), "64M");
        assert_eq!(approx_size(1500), "1.5K");
        assert_eq!(approx_size(999), "999");
    }
}
