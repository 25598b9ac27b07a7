//! Which changes the running objects can take. A formatted pool's layout
//! is fixed (the pool code has no way to grow, shrink or move its data
//! devices), so such a change is refused, naming the field.

use crate::error::{ConfigError, Issue};
use crate::model::{Config, PoolConfig};
use crate::render::pool_fields;

/// Refuses what the running objects cannot take.
pub fn check_live_change(old: &Config, new: &Config) -> Result<(), ConfigError> {
    let mut issues = Vec::new();
    for (i, p) in new.pools.iter().enumerate() {
        if let Some(o) = old.pools.iter().find(|o| o.name == p.name) {
            pool_refusals(&mut issues, i, o, p);
        }
    }
    if issues.is_empty() {
        Ok(())
    } else {
        Err(ConfigError::new(&new.origin, issues))
    }
}

/// A formatted pool keeps the settings it was formatted with; one that
/// does not exist yet takes the new ones when it is created.
fn pool_refusals(issues: &mut Vec<Issue>, i: usize, old: &PoolConfig, new: &PoolConfig) {
    if !old.metadata.exists() {
        return;
    }
    let name = &old.name;
    for ((field, was), (_, now)) in pool_fields(old).into_iter().zip(pool_fields(new)) {
        if was == now {
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

#[cfg(test)]
#[path = "live_change_tests.rs"]
mod tests;
