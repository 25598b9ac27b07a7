//! Which changes the running objects can take. A formatted pool's layout
//! is fixed (the pool code has no way to grow, shrink or move its data
//! devices), so such a change is refused; a change that would replace the
//! data a LUN serves needs the administrator's `--force`, and then says
//! what is lost.

use crate::error::{ConfigError, Issue};
use crate::model::{Config, Device, DeviceKind, PoolConfig};
use crate::render::{self, pool_fields};

/// Whether the open backing device of `old` can serve `new` as it is:
/// only settings of the logical unit around it differ (identity strings,
/// read-only, write cache, and block sizes where the data lives
/// elsewhere than in the device object).
pub(crate) fn keeps_backing(old: &Device, new: &Device) -> bool {
    let backing = |d: &Device| Device {
        product_id: None,
        serial: None,
        naa: None,
        physical_block_size: 0,
        read_only: false,
        write_cache: false,
        // A RAM device's blocks are its data: another size re-creates it.
        block_size: if d.kind == DeviceKind::Mem {
            d.block_size
        } else {
            0
        },
        at: None,
        ..d.clone()
    };
    // A file opened read-only cannot take writes: it is opened again.
    let needs_write = old.kind == DeviceKind::File && old.read_only && !new.read_only;
    backing(old) == backing(new) && !needs_write
}

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
            Some((i, n)) if o.kind == DeviceKind::Mem => (
                format!("device[{i}]"),
                n.at,
                format!(
                    "no LUN maps RAM device `{}` any more: it is closed and {}",
                    o.name,
                    ram_loss(o)
                ),
            ),
            None if o.kind == DeviceKind::Mem => (
                format!("device `{}`", o.name),
                None,
                format!(
                    "removing RAM device `{}`, which LUNs served until now, closes it: {}",
                    o.name,
                    ram_loss(o)
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
    if old.kind == DeviceKind::Null {
        return None;
    }
    if old.kind != new.kind {
        let what = format!(
            "changing the kind of `{name}` ({} → {}) serves other data: {}",
            render::kind(old.kind),
            render::kind(new.kind),
            loss(old)
        );
        return Some(("kind", what));
    }
    match old.kind {
        DeviceKind::Mem if old.size != new.size => Some((
            "size",
            format!(
                "a RAM device cannot be resized in place: `{name}` is re-created empty with {} and {}",
                render::size(new.size.unwrap_or(crate::DEFAULT_DEVICE_SIZE)),
                ram_loss(old)
            ),
        )),
        DeviceKind::Mem if old.block_size != new.block_size => Some((
            "block_size",
            format!(
                "RAM device `{name}` is re-created empty for {}-byte blocks (was {}) and {}",
                new.block_size,
                old.block_size,
                ram_loss(old)
            ),
        )),
        DeviceKind::File if old.path != new.path => Some((
            "path",
            format!(
                "`{name}` would serve another file: {}",
                loss(old)
            ),
        )),
        DeviceKind::Volume if volume_of(old_config, old) != volume_of(new_config, new) => {
            let key = if old.pool != new.pool {
                "pool"
            } else {
                "volume"
            };
            let what = format!("`{name}` would serve another volume: {}", loss(old));
            Some((key, what))
        }
        _ => None,
    }
}

fn ram_loss(dev: &Device) -> String {
    let size = dev.size.unwrap_or(crate::DEFAULT_DEVICE_SIZE);
    format!("the {} of data it holds are lost", render::size(size))
}

/// What the LUN stops serving when `dev` is replaced.
fn loss(dev: &Device) -> String {
    match dev.kind {
        DeviceKind::Mem => ram_loss(dev),
        DeviceKind::File => format!(
            "what initiators wrote to {} is no longer served (the file is left as it is)",
            dev.path
                .as_deref()
                .unwrap_or(std::path::Path::new("?"))
                .display()
        ),
        DeviceKind::Volume => format!(
            "volume {} of pool {} is no longer served (it stays in the pool)",
            dev.volume.as_deref().unwrap_or(&dev.name),
            dev.pool.as_deref().unwrap_or("?")
        ),
        DeviceKind::Null => "nothing (a null device holds no data)".into(),
    }
}

/// The pool's metadata file and the volume name: a pool renamed in the
/// file is the same pool.
fn volume_of<'a>(config: &'a Config, dev: &'a Device) -> (Option<&'a std::path::Path>, &'a str) {
    let pool = dev.pool.as_deref().and_then(|name| {
        config
            .pools
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.metadata.as_path())
    });
    (pool, dev.volume.as_deref().unwrap_or(&dev.name))
}

#[cfg(test)]
#[path = "live_change_tests.rs"]
mod tests;
