//! Which changes the running objects can take. A formatted pool's layout
//! is fixed (the pool code has no way to grow, shrink or move its data
//! devices), so such a change is refused; a change that would replace the
//! data a LUN serves needs the administrator's `--force`, and then says
//! what is lost.

use crate::error::{ConfigError, Issue};
use crate::kinds::Change;
use crate::model::{Config, Device, PoolConfig};
use crate::render::{self, pool_fields};

#[cfg(test)]
use crate::runtime::keeps_device as keeps_backing;

/// Refuses what the running objects cannot take, and what would replace
/// a LUN's data unless `force`; with `force`, one `!` line per device
/// whose data goes, saying what is lost.
pub fn check_live_change(
    old: &Config,
    new: &Config,
    force: bool,
) -> Result<Vec<String>, ConfigError> {
    let mut issues = Vec::new();
    for (i, p) in new.pools.iter().enumerate() {
        if let Some(o) = old.pools.iter().find(|o| o.name == p.name) {
            pool_refusals(&mut issues, i, o, p);
        }
    }
    device_refusals(&mut issues, old, new);
    let losses = data_losses(old, new);
    let notes = losses.iter().map(Loss::to_string).collect();
    if !force {
        issues.extend(losses.into_iter().map(|l| Issue {
            reason: format!("{}; pass --force to accept that", l.issue.reason),
            ..l.issue
        }));
    }
    if issues.is_empty() {
        Ok(notes)
    } else {
        Err(ConfigError::new(&new.origin, issues))
    }
}

/// Settings of open devices that no re-open can take (a cache's line
/// size): refused even with `--force`.
fn device_refusals(issues: &mut Vec<Issue>, old: &Config, new: &Config) {
    // The devices open now: those served, and what they are built on.
    let mut open: Vec<&str> = old.mapped_devices().into_iter().collect();
    let mut i = 0;
    while i < open.len() {
        if let Some(d) = old.device(open[i]) {
            for child in d.spec.children() {
                if !open.contains(&child) {
                    open.push(child);
                }
            }
        }
        i += 1;
    }
    for (i, n) in new.devices.iter().enumerate() {
        let Some(o) = old
            .device(&n.name)
            .filter(|o| open.contains(&o.name.as_str()))
        else {
            continue;
        };
        if o.kind() != n.kind() {
            continue;
        }
        if let Some((key, reason)) = o.spec.refuses_change(&n.name, &*n.spec) {
            issues.push(Issue {
                location: n.at,
                field: format!("device[{i}].{key}"),
                reason,
            });
        }
    }
}

/// What applying `new` would lose, one `!` line per device, for a diff.
pub fn loss_notes(old: &Config, new: &Config) -> Vec<String> {
    data_losses(old, new).iter().map(Loss::to_string).collect()
}

/// Data a LUN served that a change replaces: where, and what is lost.
struct Loss {
    device: String,
    issue: Issue,
}

impl std::fmt::Display for Loss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "! device {}: {}", self.device, self.issue.reason)
    }
}

fn data_losses(old: &Config, new: &Config) -> Vec<Loss> {
    let mut out = Vec::new();
    let (was_used, used) = (old.mapped_devices(), new.mapped_devices());
    for o in old
        .devices
        .iter()
        .filter(|d| was_used.contains(d.name.as_str()))
    {
        let found = new
            .devices
            .iter()
            .enumerate()
            .find(|(_, d)| d.name == o.name);
        let (field, location, reason) = match found {
            Some((i, n)) if used.contains(n.name.as_str()) => {
                let Some((key, what)) = replaced(old, o, new, n) else {
                    continue;
                };
                (format!("device[{i}].{key}"), n.at, what)
            }
            Some((i, n)) if o.spec.lost_when_closed() => (
                format!("device[{i}]"),
                n.at,
                format!(
                    "no LUN or NBD export serves RAM device `{}` any more: it is closed and {}",
                    o.name,
                    o.spec.holds()
                ),
            ),
            None if o.spec.lost_when_closed() => (
                format!("device `{}`", o.name),
                None,
                format!(
                    "removing RAM device `{}`, which LUNs served until now, closes it: {}",
                    o.name,
                    o.spec.holds()
                ),
            ),
            _ => continue,
        };
        out.push(Loss {
            device: o.name.clone(),
            issue: Issue {
                location,
                field,
                reason,
            },
        });
    }
    out
}

/// A formatted pool keeps the settings it was formatted with; one that
/// does not exist yet takes the new ones when it is created.
fn pool_refusals(issues: &mut Vec<Issue>, i: usize, old: &PoolConfig, new: &PoolConfig) {
    if !old.metadata.exists() {
        return;
    }
    let name = &old.name;
    for ((field, was), (_, now)) in pool_fields(old).into_iter().zip(pool_fields(new)) {
        if was == now || render::LIVE_POOL_FIELDS.contains(&field) {
            continue;
        }
        let why = match field {
            "devices" => "its data devices are fixed when it is formatted (the pool code cannot add, remove or move them)",
            "device_size" => "its data devices cannot grow or shrink (each device's unit count is recorded when the pool is formatted, and the pool code has no resize)",
            "metadata" => "its metadata cannot move while it serves (move the file with the daemon stopped)",
            _ => "its allocation unit is fixed when it is formatted",
        };
        issues.push(Issue {
            location: new.at,
            field: format!("pool[{i}].{field}"),
            reason: format!(
                "pool `{name}` exists ({}): {why}; it stays {was} (asked: {now})",
                old.metadata.display()
            ),
        });
    }
}

/// The key whose change replaces the data the LUN serves, and what that
/// loses; `None` when the data stays.
fn replaced(
    old_config: &Config,
    old: &Device,
    new_config: &Config,
    new: &Device,
) -> Option<(&'static str, String)> {
    let name = &old.name;
    if !old.spec.holds_data() {
        return None;
    }
    if old.kind() != new.kind() {
        let what = format!(
            "changing the kind of `{name}` ({} → {}) serves other data: {}",
            old.kind(),
            new.kind(),
            old.spec.holds()
        );
        return Some(("kind", what));
    }
    old.spec.replaces_data(&Change {
        name,
        new: &*new.spec,
        old_block_size: old.identity.block_size,
        new_block_size: new.identity.block_size,
        same_pool: pool_file(old_config, old) == pool_file(new_config, new),
    })
}

/// The metadata file of the pool a device is carved from: a pool renamed
/// in the file is the same pool.
fn pool_file<'a>(config: &'a Config, dev: &Device) -> Option<&'a std::path::Path> {
    let name = dev.spec.pool()?;
    config
        .pools
        .iter()
        .find(|p| p.name == name)
        .map(|p| p.metadata.as_path())
}

#[cfg(test)]
#[path = "live_change_tests.rs"]
mod tests;
