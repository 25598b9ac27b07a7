//! `[[device]]` tables: the settings every device has (name, kind, the
//! identity its LUN reports), then the kind's own, read by its module in
//! the registry.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use toml::{Spanned, Value};

use super::Checker;
use crate::error::{Issue, Location};
use crate::kinds::{self, Fields, Spec};
use crate::model::{Device, LuIdentity};
use crate::names::{check_ascii_field, check_device_name, parse_naa};
use crate::raw::RawDevice;

/// Largest physical block size a device may report (64 KiB).
const MAX_PHYSICAL_BLOCK: i64 = 64 << 10;

impl Checker<'_> {
    pub(super) fn devices(&mut self, raw: Vec<Spanned<RawDevice>>) -> (Vec<Device>, Vec<String>) {
        let declared = raw
            .iter()
            .filter_map(|d| {
                d.get_ref()
                    .get("name")?
                    .get_ref()
                    .as_str()
                    .map(String::from)
            })
            .collect();
        let mut out: Vec<Device> = Vec::new();
        let mut naa_seen: HashMap<[u8; 16], String> = HashMap::new();
        for (i, entry) in raw.into_iter().enumerate() {
            let table = entry.span();
            let Some(dev) = self.device(i, &table, entry.into_inner()) else {
                continue;
            };
            if let Some(first) = out.iter().find(|d| d.name == dev.name) {
                let line = first.at.map_or(0, |l| l.line);
                self.fail(
                    &table,
                    format!("device[{i}].name"),
                    format!("device `{}` is already defined (line {line})", dev.name),
                );
                continue;
            }
            if let Some(naa) = dev.identity.naa {
                if let Some(other) = naa_seen.insert(naa, dev.name.clone()) {
                    self.fail(
                        &table,
                        format!("device[{i}].naa"),
                        format!("device `{other}` has the same NAA designator"),
                    );
                    continue;
                }
            }
            out.push(dev);
        }
        (out, declared)
    }

    fn device(&mut self, i: usize, table: &Range<usize>, raw: RawDevice) -> Option<Device> {
        let mut settings: BTreeMap<String, Spanned<Value>> = raw;
        let field = |name: &str| format!("device[{i}].{name}");
        let name = self.required_string(&mut settings, i, table, "name")?;
        let kind_value = self.required_string(&mut settings, i, table, "kind")?;
        let kind = match kinds::kind(kind_value.get_ref()) {
            Some(k) => k,
            None => {
                self.fail(
                    &kind_value.span(),
                    field("kind"),
                    format!(
                        "unknown kind `{}`: one of {}",
                        kind_value.get_ref(),
                        kinds::kind_names()
                    ),
                );
                return None;
            }
        };
        self.check(
            &name.span(),
            || field("name"),
            check_device_name(name.get_ref()),
        );
        let pools = self.pools.clone();
        let at = crate::kinds::TableContext {
            text: self.text,
            index: i,
            table: table.clone(),
            name: name.get_ref(),
            pools: &pools,
        };
        let mut f = Fields::new(at, kind.name, 512, settings);
        let identity = identity(&mut f);
        f.set_block_size(identity.block_size);
        let read_only = f.bool("read_only").unwrap_or(false);
        let write_cache = f.bool("write_cache").unwrap_or(true);
        f.set_kind(kind.name);
        let spec = (kind.parse)(&mut f);
        let issues = f.finish();
        let ok = issues.is_empty() && self.issues.iter().all(|x| !x.field.starts_with(&field("")));
        self.issues.extend(issues);
        if !ok {
            return None;
        }
        Some(Device {
            name: name.into_inner(),
            spec: Spec(spec?),
            identity,
            read_only,
            write_cache,
            at: self.at(table),
        })
    }

    /// A string every device has; missing, it is reported at the table as
    /// serde would.
    fn required_string(
        &mut self,
        settings: &mut BTreeMap<String, Spanned<Value>>,
        i: usize,
        table: &Range<usize>,
        key: &str,
    ) -> Option<Spanned<String>> {
        let field = format!("device[{i}].{key}");
        let Some(value) = settings.remove(key) else {
            self.fail(table, field, format!("missing field `{key}`"));
            return None;
        };
        let span = value.span();
        match value.into_inner() {
            Value::String(s) => Some(Spanned::new(span, s)),
            other => {
                let reason = format!("expected a string, found {}", other.type_str());
                self.fail(&span, field, reason);
                None
            }
        }
    }
}

/// What the device's LUN reports of itself.
fn identity(f: &mut Fields<'_>) -> LuIdentity {
    let block_size = f
        .read("block_size", |v| match v.as_integer() {
            Some(n @ (512 | 4096)) => Ok(n as u32),
            _ => Err(format!(
                "{v} is not a supported block size: use 512 or 4096"
            )),
        })
        .unwrap_or(512);
    let physical_block_size = f
        .read("physical_block_size", |v| {
            let n = v.as_integer().unwrap_or(0);
            let b = i64::from(block_size);
            let fits = n >= b
                && n <= MAX_PHYSICAL_BLOCK
                && n % b == 0
                && (n / b).count_ones() == 1;
            if fits {
                Ok(n as u32)
            } else {
                Err(format!(
                    "{v} is not a power-of-two multiple of the {block_size}-byte block size up to {MAX_PHYSICAL_BLOCK}"
                ))
            }
        })
        .unwrap_or(block_size);
    let product_id = f.read("product_id", |v| ascii(v, 16));
    let serial = f.read("serial", |v| ascii(v, 64));
    let naa = f.read("naa", |v| {
        v.as_str()
            .ok_or_else(|| format!("expected a string, found {}", v.type_str()))
            .and_then(parse_naa)
    });
    LuIdentity {
        product_id,
        serial,
        naa,
        block_size,
        physical_block_size,
    }
}

fn ascii(v: &Value, max: usize) -> Result<String, String> {
    let s = v
        .as_str()
        .ok_or_else(|| format!("expected a string, found {}", v.type_str()))?;
    check_ascii_field(s, max).map(|_| s.to_string())
}

/// Problems of the device graph: a device named but not configured, one
/// with two users, a loop, a device under another also mapped as a LUN.
pub(super) fn graph_issues(
    text: &str,
    devices: &[Device],
    pools: &[crate::model::PoolConfig],
    mapped: &std::collections::BTreeSet<&str>,
) -> Vec<Issue> {
    let mut issues = Vec::new();
    let at = |d: &Device| d.at.or(Some(Location::of(text, 0)));
    // Every (child, user, where the user is, its field).
    let mut uses: Vec<(&str, String, Option<Location>, String)> = Vec::new();
    for (i, d) in devices.iter().enumerate() {
        for child in d.spec.children() {
            let field = format!("device[{i}]");
            if devices.iter().any(|c| c.name == child) {
                uses.push((child, format!("device `{}`", d.name), at(d), field));
            } else {
                issues.push(Issue {
                    location: at(d),
                    field,
                    reason: format!("no [[device]] is named `{child}`"),
                });
            }
        }
    }
    for (i, p) in pools.iter().enumerate() {
        for name in p.member_devices() {
            let field = format!("pool[{i}].devices");
            if devices.iter().any(|c| c.name == name) {
                uses.push((name, format!("pool `{}`", p.name), p.at, field));
            } else {
                issues.push(Issue {
                    location: p.at,
                    field,
                    reason: format!(
                        "no [[device]] is named `{name}` (give a data file as a path with a `/`)"
                    ),
                });
            }
        }
    }
    let mut user: HashMap<&str, String> = HashMap::new();
    for (child, by, location, field) in uses {
        if let Some(first) = user.get(child) {
            issues.push(Issue {
                location,
                field,
                reason: format!("`{child}` is already used by {first}; a device has one user"),
            });
        } else {
            user.insert(child, by);
        }
    }
    let mut graph_issues = cycles(devices);
    for (i, d) in devices.iter().enumerate() {
        if let (Some(by), true) = (user.get(d.name.as_str()), mapped.contains(d.name.as_str())) {
            graph_issues.push(Issue {
                location: at(d),
                field: format!("device[{i}]"),
                reason: format!(
                    "`{}` is under {by} and cannot also be a LUN: I/O to it would bypass {by}",
                    d.name
                ),
            });
        }
    }
    issues.extend(graph_issues);
    issues
}

/// A device reached again from itself through the devices it is built on.
fn cycles(devices: &[Device]) -> Vec<Issue> {
    let by_name: HashMap<&str, &Device> = devices.iter().map(|d| (d.name.as_str(), d)).collect();
    let mut issues = Vec::new();
    for (i, d) in devices.iter().enumerate() {
        // Depth-first from d; a path back to d is a loop.
        let mut stack: Vec<(&str, Vec<&str>)> = vec![(d.name.as_str(), vec![d.name.as_str()])];
        let mut seen = std::collections::HashSet::new();
        while let Some((name, path)) = stack.pop() {
            let Some(node) = by_name.get(name) else {
                continue;
            };
            for child in node.spec.children() {
                if child == d.name {
                    issues.push(Issue {
                        location: d.at,
                        field: format!("device[{i}]"),
                        reason: format!("devices form a loop: {} → {child}", path.join(" → ")),
                    });
                    stack.clear();
                    break;
                }
                if seen.insert(child) {
                    let mut next = path.clone();
                    next.push(child);
                    stack.push((child, next));
                }
            }
        }
    }
    issues
}
