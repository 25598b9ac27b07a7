//! `kind = "cache"`: a small fast device (`cache`) in front of a large
//! slow one (`backing`), write-through, write-back, write-around or none
//! (docs/cache.md). The mode, the sequential cutoff and the write-back
//! settings change on the open device; the devices and the line size are
//! fixed while it is open.

use std::io;
use std::sync::Arc;

use block::BlockDevice;
use cache::{
    CacheDevice, CacheOptions, Health, Mode, WritebackSettings, DEFAULT_LINE,
    DEFAULT_SEQUENTIAL_CUTOFF, MAX_LINE, MIN_LINE,
};
use toml::Value;

use super::{Change, DeviceSpec, Fields, Kind, OpenContext};
use crate::render;

pub const KIND: Kind = Kind {
    name: "cache",
    fields: &[
        "cache",
        "backing",
        "mode",
        "block",
        "sequential_cutoff",
        "writeback_threshold",
        "writeback_rate",
        "accept_lost_writes",
    ],
    parse,
    api: Some(&super::cache_api::API),
    files: &[],
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheSpec {
    /// The fast device.
    pub cache: String,
    /// The slow device whose data the cache holds.
    pub backing: String,
    pub mode: Mode,
    /// The cache line.
    pub block: u64,
    /// Streams longer than this bypass the cache; 0 turns that off.
    pub sequential_cutoff: u64,
    /// Write back in the background while dirty data is above this
    /// percentage of the cache.
    pub writeback_threshold: u8,
    /// Most bytes a second written back in the background.
    pub writeback_rate: u64,
    /// Open even when the cache device that holds writes not yet written
    /// back is lost, giving those writes up (docs/cache.md).
    pub accept_lost_writes: bool,
}

fn parse(f: &mut Fields<'_>) -> Option<Arc<dyn DeviceSpec>> {
    f.needs("cache", "the fast device");
    f.needs("backing", "the slow device it caches");
    let cache = f.device("cache");
    let backing = f.device("backing");
    let mode = f
        .read("mode", |v| match v {
            Value::String(s) => s.parse::<Mode>(),
            other => Err(format!("expected a mode, found {}", other.type_str())),
        })
        .unwrap_or(Mode::WriteThrough);
    let block = f
        .read("block", |v| {
            let n = super::fields::bytes(v)?;
            if n.is_power_of_two() && (MIN_LINE..=MAX_LINE).contains(&n) {
                Ok(n)
            } else {
                Err(format!(
                    "the cache line must be a power of two from {} to {}",
                    render::size(MIN_LINE),
                    render::size(MAX_LINE)
                ))
            }
        })
        .unwrap_or(DEFAULT_LINE);
    // "0" turns stream detection off.
    let sequential_cutoff = f
        .read("sequential_cutoff", |v| match v {
            Value::Integer(0) => Ok(0),
            Value::String(s) if s.trim() == "0" => Ok(0),
            other => super::fields::bytes(other),
        })
        .unwrap_or(DEFAULT_SEQUENTIAL_CUTOFF);
    let defaults = WritebackSettings::default();
    let writeback_threshold = f
        .read("writeback_threshold", percent)
        .unwrap_or(defaults.dirty_threshold_percent);
    let writeback_rate = f.bytes("writeback_rate").unwrap_or(defaults.rate);
    let accept_lost_writes = f.bool("accept_lost_writes").unwrap_or(false);
    let (cache, backing) = (cache?, backing?);
    if cache == backing {
        f.fail(
            "backing",
            None,
            "the cache and the backing must be two devices",
        );
        return None;
    }
    Some(Arc::new(CacheSpec {
        cache,
        backing,
        mode,
        block,
        sequential_cutoff,
        writeback_threshold,
        writeback_rate,
        accept_lost_writes,
    }))
}

/// "10%" or 10: a share of the cache, 1 to 100.
fn percent(v: &Value) -> Result<u8, String> {
    let n = match v {
        Value::Integer(n) => *n,
        Value::String(s) => s
            .trim()
            .trim_end_matches('%')
            .trim()
            .parse::<i64>()
            .map_err(|_| format!("expected a percentage such as \"10%\", found {s:?}"))?,
        other => {
            return Err(format!(
                "expected a percentage such as \"10%\", found {}",
                other.type_str()
            ))
        }
    };
    u8::try_from(n)
        .ok()
        .filter(|p| (1..=100).contains(p))
        .ok_or_else(|| format!("{n}% is not from 1% to 100%"))
}

impl CacheSpec {
    fn writeback(&self) -> WritebackSettings {
        WritebackSettings {
            dirty_threshold_percent: self.writeback_threshold,
            rate: self.writeback_rate,
            ..WritebackSettings::default()
        }
    }

    /// These settings with what changes live taken from `other`.
    fn with_live_settings_of(&self, other: &CacheSpec) -> CacheSpec {
        CacheSpec {
            mode: other.mode,
            sequential_cutoff: other.sequential_cutoff,
            writeback_threshold: other.writeback_threshold,
            writeback_rate: other.writeback_rate,
            // Read by the next open only.
            accept_lost_writes: other.accept_lost_writes,
            ..self.clone()
        }
    }
}

impl DeviceSpec for CacheSpec {
    fn kind(&self) -> &'static str {
        KIND.name
    }

    fn children(&self) -> Vec<&str> {
        vec![&self.cache, &self.backing]
    }

    fn open(&self, ctx: &OpenContext<'_>) -> io::Result<Arc<dyn BlockDevice>> {
        let [cache, backing] = ctx.children() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a cache is built on two devices",
            ));
        };
        // The superblock records the backing's name: the cache device is
        // only ever opened again in front of the same backing.
        let options = CacheOptions {
            mode: self.mode,
            line_size: self.block,
            sequential_cutoff: self.sequential_cutoff,
            writeback: self.writeback(),
            accept_lost_writes: self.accept_lost_writes,
            ..CacheOptions::new(&self.backing)
        };
        let device = CacheDevice::open(cache.clone(), backing.clone(), options)
            .map_err(|e| io::Error::new(e.kind(), format!("cache `{}`: {e}", self.cache)))?;
        Ok(Arc::new(device))
    }

    fn settings(&self) -> Vec<(&'static str, String)> {
        vec![
            ("cache", self.cache.clone()),
            ("backing", self.backing.clone()),
            ("mode", self.mode.to_string()),
            ("block", render::size(self.block)),
            (
                "sequential_cutoff",
                if self.sequential_cutoff == 0 {
                    "0 (off)".into()
                } else {
                    render::size(self.sequential_cutoff)
                },
            ),
            (
                "writeback_threshold",
                format!("{}%", self.writeback_threshold),
            ),
            (
                "writeback_rate",
                format!("{}/s", render::size(self.writeback_rate)),
            ),
            ("accept_lost_writes", self.accept_lost_writes.to_string()),
        ]
    }

    fn replaces_data(&self, change: &Change<'_>) -> Option<(&'static str, String)> {
        let new = change.new_as::<CacheSpec>()?;
        let name = change.name;
        if new.backing != self.backing {
            return super::over_changed(name, &self.backing, &new.backing)
                .map(|(_, what)| ("backing", what));
        }
        if new.cache != self.cache && self.mode == Mode::WriteBack {
            return Some((
                "cache",
                format!(
                    "blocks written to `{name}` and not yet written back stay on `{}` and \
                     are no longer served (run `openarray cache detach {name}` first)",
                    self.cache
                ),
            ));
        }
        None
    }

    fn holds(&self) -> String {
        super::over_holds(&self.backing)
    }

    fn refuses_change(&self, name: &str, new: &dyn DeviceSpec) -> Option<(&'static str, String)> {
        let new = new.as_any().downcast_ref::<CacheSpec>()?;
        (new.block != self.block && new.cache == self.cache && new.backing == self.backing).then(
            || {
                (
                    "block",
                    format!(
                        "cache `{name}` serves with {} lines (asked: {}): its cache device `{}` \
                     holds the mapping and the cached data in lines of that size, so the line \
                     size cannot change while it serves. To change it, set mode = \
                     \"writethrough\" and apply (every block not yet written back is written \
                     back), stop the daemon, change `block`, and start it: a cache device with \
                     nothing left to write back is formatted anew for the new line size and \
                     warms up again",
                        render::size(self.block),
                        render::size(new.block),
                        self.cache
                    ),
                )
            },
        )
    }

    fn applies_live(&self, new: &dyn DeviceSpec) -> bool {
        new.as_any()
            .downcast_ref::<CacheSpec>()
            .is_some_and(|new| self.with_live_settings_of(new) == *new)
    }

    fn apply_live(&self, device: &dyn BlockDevice, _gained: &[super::Named]) -> io::Result<()> {
        let Some(cache) = as_cache(device) else {
            return Ok(());
        };
        cache.set_sequential_cutoff(self.sequential_cutoff);
        cache.set_writeback(self.writeback());
        if cache.mode() != self.mode {
            let mode = self.mode;
            cache.set_mode(mode, &mut |p| {
                tracing::info!(
                    mode = %mode,
                    left = p.dirty_bytes_left,
                    "writing back before the mode change"
                )
            })?;
        }
        Ok(())
    }

    fn close(&self, device: &dyn BlockDevice) -> io::Result<()> {
        match as_cache(device) {
            Some(cache) => cache.shut_down(),
            None => Ok(()),
        }
    }

    fn samples(&self, name: &str, device: &dyn BlockDevice) -> Vec<stats::Sample> {
        as_cache(device).map_or_else(Vec::new, |c| {
            super::cache_metrics::cache_samples(name, &c.status())
        })
    }

    fn health(&self, device: &dyn BlockDevice) -> super::Verdict {
        let Some(cache) = as_cache(device) else {
            return super::Verdict::Ok;
        };
        match cache.status().health {
            Health::Ok => super::Verdict::Ok,
            Health::Failed {
                stranded_bytes: 0,
                effect,
            } => super::Verdict::Degraded(format!("cache device failed: {effect}")),
            Health::Failed { effect, .. } => {
                super::Verdict::Failed(format!("cache device failed: {effect}"))
            }
        }
    }

    fn state(&self, device: &dyn BlockDevice) -> Vec<(&'static str, String)> {
        let Some(cache) = as_cache(device) else {
            return Vec::new();
        };
        let s = cache.status();
        let health = match &s.health {
            Health::Ok => "ok".to_string(),
            Health::Failed { effect, .. } => format!("failed: {effect}"),
        };
        vec![
            ("mode", s.mode.to_string()),
            ("attached", s.attached.to_string()),
            ("health", health),
            ("read_hits", ratio(s.reads.ratio)),
            ("write_hits", ratio(s.writes.ratio)),
            ("dirty", render::size(s.dirty_bytes)),
            ("occupancy", ratio(s.occupancy)),
            ("evictions", s.evictions.to_string()),
            ("bypassed_ios", s.bypassed_ios.to_string()),
        ]
    }
}

fn ratio(r: f64) -> String {
    format!("{:.1}%", r * 100.0)
}

/// The open cache behind a device handle.
pub fn as_cache(device: &dyn BlockDevice) -> Option<&CacheDevice> {
    device.as_any()?.downcast_ref::<CacheDevice>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> CacheSpec {
        CacheSpec {
            cache: "ssd".into(),
            backing: "hdd".into(),
            mode: Mode::WriteBack,
            block: DEFAULT_LINE,
            sequential_cutoff: DEFAULT_SEQUENTIAL_CUTOFF,
            writeback_threshold: 10,
            writeback_rate: 64 << 20,
            accept_lost_writes: false,
        }
    }

    #[test]
    fn mode_cutoff_and_write_back_settings_apply_live_and_the_rest_does_not() {
        let old = spec();
        let live = CacheSpec {
            mode: Mode::WriteAround,
            sequential_cutoff: 0,
            writeback_threshold: 50,
            writeback_rate: 1 << 20,
            ..spec()
        };
        assert!(old.applies_live(&live));
        for fixed in [
            CacheSpec {
                block: 16 << 10,
                ..spec()
            },
            CacheSpec {
                cache: "ssd2".into(),
                ..spec()
            },
            CacheSpec {
                backing: "hdd2".into(),
                ..spec()
            },
        ] {
            assert!(!old.applies_live(&fixed), "{fixed:?}");
        }
    }

    #[test]
    fn a_new_line_size_is_refused_with_what_to_do_instead() {
        let old = spec();
        let wider = CacheSpec {
            block: 128 << 10,
            ..spec()
        };
        let (field, why) = old.refuses_change("hybrid", &wider).unwrap();
        assert_eq!(field, "block");
        assert!(why.contains("64K lines (asked: 128K)"), "{why}");
        assert!(why.contains("mode = \"writethrough\""), "{why}");
        let live = CacheSpec {
            mode: Mode::WriteAround,
            ..spec()
        };
        assert_eq!(old.refuses_change("hybrid", &live), None);
    }

    #[test]
    fn percentages_read_as_numbers_or_with_a_sign() {
        assert_eq!(percent(&Value::Integer(20)), Ok(20));
        assert_eq!(percent(&Value::String("35%".into())), Ok(35));
        assert!(percent(&Value::Integer(0)).is_err());
        assert!(percent(&Value::String("101%".into())).is_err());
        assert!(percent(&Value::Boolean(true)).is_err());
    }
}
