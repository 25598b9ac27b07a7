//! `[[pool]]` tables: the data devices and allocation unit, fixed when a
//! pool is formatted, and the limits a running pool takes at once (its
//! soft threshold, how far its volumes may over-commit it).

use std::path::PathBuf;

use pool::SoftThreshold;
use toml::Spanned;

use super::graph::Edge;
use super::Checker;
use crate::error::Location;
use crate::model::{PoolConfig, PoolMember};
use crate::names::check_device_name;
use crate::raw::RawPool;
use crate::size::parse_size;

/// Largest `max_overcommit`: beyond it a limit means nothing.
const MAX_OVERCOMMIT: f64 = 1000.0;

/// A name without `/` is a configured device; anything else a path.
fn member(text: &str) -> PoolMember {
    if text.contains('/') || text.is_empty() {
        PoolMember::Path(PathBuf::from(text))
    } else {
        PoolMember::Device(text.to_string())
    }
}

impl Checker<'_> {
    pub(super) fn pools(&mut self, raw: Vec<Spanned<RawPool>>) -> Vec<PoolConfig> {
        let mut out: Vec<PoolConfig> = Vec::new();
        for (i, entry) in raw.into_iter().enumerate() {
            let table = entry.span();
            let raw = entry.into_inner();
            let before = self.issues.len();
            let field = |name: &str| format!("pool[{i}].{name}");
            let name = raw.name.get_ref().clone();
            self.check(&raw.name.span(), || field("name"), check_device_name(&name));
            if self.pools.contains(&name) {
                self.fail(
                    &raw.name.span(),
                    field("name"),
                    format!("pool `{name}` is already defined"),
                );
            }
            for (j, entry) in raw.devices.get_ref().iter().enumerate() {
                if let PoolMember::Device(child) = member(entry.get_ref()) {
                    self.graph.edges.push(Edge {
                        from: None,
                        user: format!("pool `{name}`"),
                        child,
                        at: Location::of_span(self.text, &entry.span()),
                        field: format!("pool[{i}].devices[{j}]"),
                    });
                }
            }
            let devices: Vec<PoolMember> = raw
                .devices
                .get_ref()
                .iter()
                .map(|d| member(d.get_ref()))
                .collect();
            if devices.is_empty() || raw.devices.get_ref().iter().any(|d| d.get_ref().is_empty()) {
                self.fail(
                    &raw.devices.span(),
                    field("devices"),
                    "list one or more data files or configured devices",
                );
            }
            let device_size = raw
                .device_size
                .as_ref()
                .and_then(|v| self.size_value(v, field("device_size")));
            let unit_size = match &raw.unit_size {
                None => pool::DEFAULT_UNIT_SIZE,
                Some(v) => match self.size_value(v, field("unit_size")) {
                    Some(n) if n.is_power_of_two() && (4096..=64 << 20).contains(&n) => n,
                    Some(_) => {
                        self.fail(
                            &v.span(),
                            field("unit_size"),
                            "a power of two from 4K to 64M",
                        );
                        0
                    }
                    None => 0,
                },
            };
            let metadata = match &raw.metadata {
                Some(m) if m.get_ref().is_empty() => {
                    self.fail(&m.span(), field("metadata"), "must not be empty");
                    PathBuf::new()
                }
                Some(m) => PathBuf::from(m.get_ref()),
                None => match devices.first() {
                    Some(PoolMember::Path(first)) => {
                        let mut meta = first.clone().into_os_string();
                        meta.push(".meta");
                        PathBuf::from(meta)
                    }
                    Some(PoolMember::Device(name)) => {
                        let reason = format!(
                            "the first data device `{name}` is a configured device, not a file: \
                             give `metadata`, the file that holds the pool's metadata"
                        );
                        self.fail(&table, field("metadata"), reason);
                        PathBuf::new()
                    }
                    None => PathBuf::new(),
                },
            };
            let soft_threshold =
                self.soft_threshold(raw.soft_threshold.as_ref(), field("soft_threshold"));
            let max_overcommit =
                self.max_overcommit(raw.max_overcommit.as_ref(), field("max_overcommit"));
            self.pools.push(name.clone());
            if self.issues.len() != before {
                continue;
            }
            out.push(PoolConfig {
                name,
                devices,
                device_size,
                metadata,
                unit_size,
                soft_threshold,
                max_overcommit,
                at: self.at(&table),
            });
        }
        out
    }

    /// `soft_threshold`: a percentage of the pool ("80%") or the bytes in
    /// use ("800G", or an integer).
    pub(super) fn soft_threshold(
        &mut self,
        v: Option<&Spanned<toml::Value>>,
        field: String,
    ) -> Option<SoftThreshold> {
        let v = v?;
        let parsed = match v.get_ref() {
            toml::Value::String(s) if s.trim().ends_with('%') => {
                let number = s.trim().trim_end_matches('%').trim();
                match number.parse::<u8>() {
                    Ok(p) if (1..=100).contains(&p) => Ok(SoftThreshold::Percent(p)),
                    _ => Err(format!(
                        "{s:?} is not a whole percentage from 1% to 100%"
                    )),
                }
            }
            toml::Value::String(s) => match parse_size(s) {
                Ok(0) => Err("must be more than zero".to_string()),
                Ok(n) => Ok(SoftThreshold::Bytes(n)),
                Err(e) => Err(e),
            },
            toml::Value::Integer(n) if *n > 0 => Ok(SoftThreshold::Bytes(*n as u64)),
            _ => Err(
                "expected a percentage of the pool such as \"80%\", or the space in use such as \"800G\""
                    .to_string(),
            ),
        };
        self.check(&v.span(), || field, parsed)
    }

    /// `max_overcommit`: the most the volumes' sizes may add up to per
    /// byte of pool, kept in hundredths.
    pub(super) fn max_overcommit(
        &mut self,
        v: Option<&Spanned<toml::Value>>,
        field: String,
    ) -> Option<u32> {
        let v = v?;
        let ratio = match v.get_ref() {
            toml::Value::Float(f) => Some(*f),
            toml::Value::Integer(n) => Some(*n as f64),
            _ => None,
        };
        let parsed = match ratio {
            Some(r) if (1.0..=MAX_OVERCOMMIT).contains(&r) => Ok((r * 100.0).round() as u32),
            Some(r) => Err(format!(
                "{r} is outside 1.0..={MAX_OVERCOMMIT} (1.0 allows no over-commitment)"
            )),
            None => {
                Err("expected a number such as 3.0 (volume sizes per byte of pool)".to_string())
            }
        };
        self.check(&v.span(), || field, parsed)
    }
}
