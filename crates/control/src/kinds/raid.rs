//! `kind = "raid"`: RAID 0, 1, 10, 5 or 6 over configured member devices,
//! with hot spares. Opening assembles the array when its members carry
//! superblocks and creates it when they are all blank; a member that
//! missed events while away is put back after assembly and catches up.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use block::BlockDevice;
use raid::superblock::Superblock;
use raid::{Level, RaidArray, RaidOptions};
use toml::Value;

use super::raid_pending::PendingArray;
use super::{Change, DeviceSpec, Fields, Kind, OpenContext};
use crate::render;

pub const KIND: Kind = Kind {
    name: "raid",
    fields: &[
        "level",
        "members",
        "spares",
        "chunk",
        "bitmap_region",
        "sync_speed_min",
        "sync_speed_max",
        "member_timeout",
        "log_slots",
        "scrub_every",
        "assemble",
    ],
    parse,
    api: Some(&super::raid_api::API),
    files: &[],
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaidSpec {
    pub level: u32,
    /// Configured devices, in slot order.
    pub members: Vec<String>,
    /// Configured devices kept as hot spares.
    pub spares: Vec<String>,
    pub chunk: u64,
    pub bitmap_region: Option<u64>,
    pub sync_speed_min: Option<u64>,
    pub sync_speed_max: Option<u64>,
    pub member_timeout: Option<Duration>,
    pub log_slots: Option<u32>,
    /// A check scrub this long after the array opens or its last scrub.
    pub scrub_every: Option<Duration>,
    pub assemble: Assembly,
}

/// How the array is put together from members that carry superblocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Assembly {
    /// Only from members at the newest events; refused if too few.
    #[default]
    Normal,
    /// Like `Normal`, and when too few members are current, the freshest
    /// stale ones are taken as in sync (md's `--force`): writes they
    /// missed are lost.
    Force,
}

fn parse(f: &mut Fields<'_>) -> Option<Arc<dyn DeviceSpec>> {
    f.needs("level", "0, 1, 10, 5 or 6");
    f.needs("members", "the configured devices it is made of, in order");
    let level = f.read("level", |v| match v {
        Value::Integer(n) if Level::from_number(*n as u32).is_some() && *n >= 0 => Ok(*n as u32),
        other => Err(format!("expected 0, 1, 10, 5 or 6, found {other}")),
    });
    let members = f.devices("members");
    let spares = f.devices("spares").unwrap_or_default();
    let chunk = f.read("chunk", |v| {
        let n = match v {
            Value::Integer(n) if *n > 0 => *n as u64,
            Value::String(s) => crate::size::parse_size(s)?,
            other => return Err(format!("expected bytes such as \"64K\", found {other}")),
        };
        if n == 0 || n % 4096 != 0 || n > 1 << 20 {
            return Err(format!(
                "{n} bytes: a chunk is a multiple of 4K, at most 1M"
            ));
        }
        Ok(n)
    });
    let bitmap_region = f.bytes("bitmap_region");
    let sync_speed_min = f.bytes("sync_speed_min");
    let sync_speed_max = f.bytes("sync_speed_max");
    let member_timeout = f.duration("member_timeout");
    let scrub_every = f.duration("scrub_every");
    let assemble = f.read("assemble", |v| match v.as_str() {
        Some("normal") => Ok(Assembly::Normal),
        Some("force") => Ok(Assembly::Force),
        _ => Err(format!(
            "expected \"normal\" or \"force\" (take the freshest stale members \
             when too few are current), found {v}"
        )),
    });
    let log_slots = f.read("log_slots", |v| match v {
        Value::Integer(n) if (0..=4096).contains(n) => Ok(*n as u32),
        other => Err(format!("expected 0 to 4096 slots, found {other}")),
    });
    let (level, members) = (level?, members?);
    let needed = Level::from_number(level)?.min_members();
    if members.len() < needed {
        f.fail(
            "members",
            None,
            format!(
                "RAID{level} needs at least {needed} members, {} listed",
                members.len()
            ),
        );
        return None;
    }
    if let Some(both) = spares.iter().find(|s| members.contains(s)) {
        f.fail(
            "spares",
            None,
            format!("`{both}` is listed as a member and a spare"),
        );
        return None;
    }
    if let (Some(lo), Some(hi)) = (sync_speed_min, sync_speed_max) {
        if lo > hi {
            f.fail("sync_speed_min", None, "is above sync_speed_max");
            return None;
        }
    }
    Some(Arc::new(RaidSpec {
        level,
        members,
        spares,
        chunk: chunk.unwrap_or(64 << 10),
        bitmap_region,
        sync_speed_min,
        sync_speed_max,
        member_timeout,
        log_slots,
        scrub_every,
        assemble: assemble.unwrap_or_default(),
    }))
}

/// The open device as a RAID array, when it is one (assembled).
pub fn as_raid(device: &dyn BlockDevice) -> Option<&RaidArray> {
    let any = device.as_any()?;
    match any.downcast_ref::<RaidArray>() {
        Some(a) => Some(a),
        None => any.downcast_ref::<PendingArray>()?.array(),
    }
}

/// The open device as an array that has not assembled (yet).
pub fn as_pending(device: &dyn BlockDevice) -> Option<&PendingArray> {
    device.as_any()?.downcast_ref::<PendingArray>()
}

impl RaidSpec {
    fn options(&self) -> RaidOptions {
        let d = RaidOptions::default();
        RaidOptions {
            chunk: self.chunk,
            bitmap_region: self.bitmap_region.unwrap_or(d.bitmap_region),
            sync_speed_min: self.sync_speed_min.unwrap_or(d.sync_speed_min),
            sync_speed_max: self
                .sync_speed_max
                .unwrap_or(d.sync_speed_max)
                .max(self.sync_speed_min.unwrap_or(0)),
            assume_clean: false,
            member_timeout: self.member_timeout,
            log_slots: self.log_slots.unwrap_or(d.log_slots),
            scrub_every: self.scrub_every,
        }
    }

    /// Members then spares, as `children` lists them.
    fn names(&self) -> impl Iterator<Item = &String> {
        self.members.iter().chain(&self.spares)
    }

    /// Creates the array over blank members, or assembles it from those
    /// carrying its superblock (stale ones put back, superseded ones left
    /// out or made spares as listed): what opening the device does.
    /// `named`: the open members then spares, as the spec lists them.
    pub fn open_array(&self, named: &[(Arc<dyn BlockDevice>, String)]) -> io::Result<RaidArray> {
        let mut found = Vec::new();
        for (dev, name) in named {
            let sb = Superblock::read_from(&**dev)?
                .map_err(|e| invalid(format!("`{name}`: unreadable RAID superblock: {e}")))?;
            found.push((dev.clone(), name.clone(), sb));
        }
        let members = &found[..self.members.len()];
        let carrying: Vec<&str> = members
            .iter()
            .filter(|f| f.2.is_some())
            .map(|f| f.1.as_str())
            .collect();
        if carrying.is_empty() {
            let level = Level::from_number(self.level).ok_or_else(|| invalid("bad level"))?;
            let devs = |list: &[(Arc<dyn BlockDevice>, String, Option<Superblock>)]| {
                list.iter().map(|f| f.0.clone()).collect::<Vec<_>>()
            };
            let spares = &found[self.members.len()..];
            tracing::info!(
                level = self.level,
                members = members.len(),
                "creating a RAID array"
            );
            return RaidArray::create(level, devs(members), devs(spares), self.options())
                .map_err(refused);
        }
        if let Some(blank) = members.iter().find(|f| f.2.is_none()) {
            return Err(invalid(format!(
                "member `{}` carries no RAID superblock while {} do: add it as a spare \
                 with `openarray raid add` instead, or blank every member to create anew",
                blank.1,
                carrying
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        // Members that missed events (away while the array went on) are
        // put back after assembly to catch up, as md's re-add does.
        let events = found
            .iter()
            .filter_map(|f| f.2.as_ref())
            .filter(|sb| !sb.is_spare())
            .map(|sb| sb.events)
            .max()
            .unwrap_or(0);
        let mut assemble = Vec::new();
        let mut stale = Vec::new();
        let mut blank_spares = Vec::new();
        for (dev, name, sb) in &found {
            match sb {
                None => blank_spares.push(dev.clone()),
                // Listed as a spare: what the operator asked it to be.
                Some(sb) if sb.released && self.spares.contains(name) => {
                    blank_spares.push(dev.clone())
                }
                Some(sb) if sb.released => tracing::warn!(
                    member = %name,
                    "a replacement took this RAID member's place: it is left out \
                     (take it out of the configuration, or blank it to reuse it)"
                ),
                // A copy that fell behind the others: a spare again.
                Some(sb) if sb.replacement && sb.events < events => blank_spares.push(dev.clone()),
                Some(sb) if !sb.is_spare() && sb.events < events => {
                    stale.push((dev.clone(), name.clone()))
                }
                Some(_) => assemble.push(dev.clone()),
            }
        }
        let (array, stale) = match RaidArray::assemble(assemble.clone(), self.options()) {
            Ok(array) => (array, stale),
            Err(raid::AssembleError::TooFew(_))
                if self.assemble == Assembly::Force && !stale.is_empty() =>
            {
                self.assemble_forced(assemble, stale)?
            }
            Err(e) => return Err(refused(e)),
        };
        for (dev, name) in stale {
            match array.re_add(dev.clone()) {
                Ok(()) => tracing::warn!(member = %name, "stale RAID member re-added"),
                // Listed as a spare: what the operator asked it to be.
                Err(raid::AssembleError::Superseded(..)) if self.spares.contains(&name) => {
                    array.add(dev)?;
                    tracing::warn!(member = %name,
                        "a superseded RAID member listed as a spare is a spare again (rebuilt in full when used)");
                }
                Err(e) => tracing::warn!(member = %name, error = %e, "stale RAID member left out"),
            }
        }
        for dev in blank_spares {
            array.add(dev)?;
        }
        Ok(array)
    }
}

type Named = (Arc<dyn BlockDevice>, String);

impl RaidSpec {
    /// `assemble = "force"` after a normal assembly found too few current
    /// members: the freshest stale ones are forced in; returns the array
    /// and the stale members left out, to re-add.
    fn assemble_forced(
        &self,
        current: Vec<Arc<dyn BlockDevice>>,
        stale: Vec<Named>,
    ) -> io::Result<(RaidArray, Vec<Named>)> {
        let mut devices = current;
        devices.extend(stale.iter().map(|s| s.0.clone()));
        let forced = RaidArray::assemble_forced(devices, self.options()).map_err(refused)?;
        let status = forced.array.status();
        let name_of = |slot: usize| self.members.get(slot).cloned().unwrap_or_default();
        let named: Vec<String> = status
            .forced
            .iter()
            .map(|f| format!("`{}` ({} events behind)", name_of(f.slot), f.gap))
            .collect();
        tracing::warn!(
            forced = %named.join(", "),
            "too few RAID members were current: assembled by force from the freshest \
             stale ones; writes they missed are lost"
        );
        let left_out = stale
            .into_iter()
            .filter(|s| forced.left_out.iter().any(|d| Arc::ptr_eq(d, &s.0)))
            .collect();
        Ok((forced.array, left_out))
    }
}

/// An assembly the array's members refused, as an open error.
fn refused(e: raid::AssembleError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

fn invalid(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

impl DeviceSpec for RaidSpec {
    fn kind(&self) -> &'static str {
        KIND.name
    }

    fn children(&self) -> Vec<&str> {
        self.names().map(String::as_str).collect()
    }

    fn open(&self, ctx: &OpenContext<'_>) -> io::Result<Arc<dyn BlockDevice>> {
        let named: Vec<(Arc<dyn BlockDevice>, String)> = ctx
            .children()
            .iter()
            .cloned()
            .zip(self.names().cloned())
            .collect();
        if named.len() != self.members.len() + self.spares.len() {
            return Err(invalid("a member or spare is not open"));
        }
        let array = match self.open_array(&named) {
            Ok(array) => Arc::new(array),
            // Members that carry the array but refuse to make it: the
            // array stands failed, and everything else is served.
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                let reason = e.to_string();
                let Some(pending) = PendingArray::new(self, &named, reason.clone()) else {
                    return Err(e);
                };
                tracing::error!(device = %ctx.name, error = %reason,
                    "RAID array not assembled: its LUNs and exports answer NOT READY until \
                     `openarray raid assemble` puts it together");
                return Ok(Arc::new(pending));
            }
            Err(e) => return Err(e),
        };
        array.name_members(&named);
        Ok(array)
    }

    fn settings(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![
            ("level", self.level.to_string()),
            ("members", self.members.join(", ")),
        ];
        if !self.spares.is_empty() {
            out.push(("spares", self.spares.join(", ")));
        }
        out.push(("chunk", render::size(self.chunk)));
        if let Some(every) = self.scrub_every {
            out.push(("scrub_every", render::duration(every)));
        }
        if self.assemble == Assembly::Force {
            out.push(("assemble", "force".into()));
        }
        out
    }

    fn replaces_data(&self, change: &Change<'_>) -> Option<(&'static str, String)> {
        let new = change.new_as::<RaidSpec>()?;
        let geometry = if new.level != self.level {
            Some("level")
        } else if new.chunk != self.chunk {
            Some("chunk")
        } else if new.members != self.members {
            Some("members")
        } else {
            None
        };
        if let Some(what) = geometry {
            return Some((
                what,
                format!(
                    "`{}` would be another array: its members' superblocks keep the old \
                     {what}; blank them to create it anew",
                    change.name
                ),
            ));
        }
        if self.applies_live(change.new) {
            return None;
        }
        // Any other change opens the array anew over the same members
        // while the running one still serves them: the two would not
        // know of each other's writes and failures.
        // How it is assembled matters only at the next assembly.
        let same = RaidSpec {
            assemble: self.assemble,
            ..new.clone()
        };
        (same != *self).then(|| {
            (
                "spares",
                format!(
                    "`{}` would be assembled anew over its members while it serves them: \
                     change it while no LUN or pool uses it, and manage spares live with \
                     `openarray raid add|remove`",
                    change.name
                ),
            )
        })
    }

    /// Spares added (`openarray raid add` records them so): the running
    /// array takes them as it would live.
    fn applies_live(&self, new: &dyn DeviceSpec) -> bool {
        let Some(new) = new.as_any().downcast_ref::<RaidSpec>() else {
            return false;
        };
        let same_but_spares = RaidSpec {
            spares: self.spares.clone(),
            assemble: self.assemble,
            ..new.clone()
        };
        same_but_spares == *self
            && new.spares != self.spares
            && self.spares.iter().all(|s| new.spares.contains(s))
    }

    fn apply_live(&self, device: &dyn BlockDevice, gained: &[super::Named]) -> io::Result<()> {
        let Some(array) = as_raid(device) else {
            return Ok(());
        };
        for (dev, name) in gained.iter().filter(|(_, n)| self.spares.contains(n)) {
            take_device(array, dev, name)?;
        }
        Ok(())
    }

    fn holds(&self) -> String {
        format!(
            "what initiators wrote to the RAID{} array over {} is no longer served (it stays there)",
            self.level,
            self.members.join(", ")
        )
    }

    fn samples(&self, name: &str, device: &dyn BlockDevice) -> Vec<stats::Sample> {
        as_raid(device).map_or_else(Vec::new, |a| super::raid_metrics::raid_samples(name, a))
    }

    fn health(&self, device: &dyn BlockDevice) -> super::Verdict {
        if let Some(p) = as_pending(device).filter(|p| p.array().is_none()) {
            return super::Verdict::Failed(format!(
                "RAID{} not assembled: {}; its LUNs answer NOT READY until \
                 `openarray raid assemble` (`--force`: take the freshest stale members)",
                self.level,
                p.reason()
            ));
        }
        let Some(array) = as_raid(device) else {
            return super::Verdict::Ok;
        };
        array_health(&array.status())
    }

    fn state(&self, device: &dyn BlockDevice) -> Vec<(&'static str, String)> {
        if let Some(p) = as_pending(device).filter(|p| p.array().is_none()) {
            return vec![("array", format!("not assembled: {}", p.reason()))];
        }
        let Some(array) = as_raid(device) else {
            return Vec::new();
        };
        let s = array.status();
        let mut out = vec![("array", format!("{:?}", s.state).to_lowercase())];
        // Every configured device with its part in the array, as md's
        // `--detail` lists each device's role and state.
        let parts: Vec<String> = self
            .member_parts(&s)
            .into_iter()
            .map(|(name, part)| format!("{name} {part}"))
            .collect();
        out.push(("members_state", parts.join(", ")));
        if let Some(p) = &s.sync {
            let pct = sync_percent(p);
            out.push((
                "sync",
                format!(
                    "{} {pct:.1}% at {}/s",
                    p.kind,
                    render::approx_size(p.bytes_per_sec)
                ),
            ));
        }
        if let Some(w) = &s.weakest_link {
            out.push(("weakest_link", w.finding.clone()));
        }
        if !s.forced.is_empty() {
            let forced: Vec<String> = s
                .forced
                .iter()
                .map(|f| {
                    let name = s.members.get(f.slot).and_then(|m| m.name.clone());
                    let name = name.unwrap_or_else(|| f.name.clone());
                    format!("{name} ({} events behind)", f.gap)
                })
                .collect();
            out.push(("assembled_by_force", forced.join(", ")));
        }
        out
    }
}

/// Puts `dev` (named `name`) into the running array as mdadm's `--add`
/// does: a former member that still owns its slot is re-added (caught up
/// from the bitmap when it covers the absence, else rebuilt in full);
/// anything else becomes a hot spare. Returns what was done.
pub fn take_device(
    array: &RaidArray,
    dev: &Arc<dyn BlockDevice>,
    name: &str,
) -> io::Result<String> {
    let ours = matches!(Superblock::read_from(&**dev)?,
        Ok(Some(sb)) if sb.array_id == array.array_id() && !sb.is_spare() && !sb.released);
    let done = if ours {
        match array.re_add(dev.clone()) {
            Ok(()) => format!("{name} re-added into its slot; it catches up"),
            Err(e) => {
                tracing::info!(member = %name, reason = %e, "not re-added: added as a spare");
                array.add(dev.clone())?;
                format!("{name} added as a spare ({e})")
            }
        }
    } else {
        array.add(dev.clone())?;
        format!("{name} added as a spare")
    };
    array.name_members(&[(dev.clone(), name.to_string())]);
    Ok(done)
}

/// How far a resync, rebuild or scrub has come, in percent.
fn sync_percent(p: &raid::SyncProgress) -> f64 {
    if p.total_bytes == 0 {
        100.0
    } else {
        p.done_bytes as f64 * 100.0 / p.total_bytes as f64
    }
}

/// An array's status as a verdict: which members are down, what sync
/// runs, what it means for the data.
pub fn array_health(s: &raid::RaidStatus) -> super::Verdict {
    let down: Vec<String> = s
        .members
        .iter()
        .filter_map(|m| {
            let slot = m.slot?;
            let name = m.name.clone().unwrap_or_else(|| format!("slot {slot}"));
            match m.state {
                raid::MemberState::InSync => None,
                state => Some(format!("{name} {}", member_state(state))),
            }
        })
        .collect();
    let down = if down.is_empty() {
        String::new()
    } else {
        format!(" ({})", down.join(", "))
    };
    let sync = s.sync.as_ref().map(|p| {
        let pct = sync_percent(p);
        format!("; {} {pct:.1}% done", p.kind)
    });
    let sync = sync.unwrap_or_default();
    let level = s.level;
    match s.state {
        raid::ArrayState::Failed => super::Verdict::Failed(format!(
            "RAID{level} failed: more members lost than its redundancy{down}; its data is \
             unreadable until they are back (`raid assemble`, `assemble = \"force\"`)"
        )),
        raid::ArrayState::Degraded => super::Verdict::Degraded(format!(
            "RAID{level} degraded: running without full redundancy{down}{sync}"
        )),
        raid::ArrayState::Rebuilding => {
            super::Verdict::Degraded(format!("RAID{level} rebuilding{down}{sync}"))
        }
        raid::ArrayState::Clean => match &s.sync {
            Some(p) if p.kind == "resync" => {
                super::Verdict::Degraded(format!("RAID{level} resyncing{sync}"))
            }
            _ => super::Verdict::Ok,
        },
    }
}

impl RaidSpec {
    /// Each configured member and spare with its part in the running
    /// array: `slot N in-sync`, `spare`, ..., or `out` for one the array
    /// does not hold (failed and replaced, removed, or left out at
    /// assembly: the log says why), then devices the array holds that
    /// the configuration does not name.
    pub fn member_parts(&self, s: &raid::RaidStatus) -> Vec<(String, String)> {
        let part = |m: &raid::MemberStatus| match (m.slot, m.replacing) {
            (Some(slot), _) => format!("slot {slot} {}", member_state(m.state)),
            (None, Some(slot)) => format!("replacing slot {slot}"),
            (None, None) => member_state(m.state).to_string(),
        };
        let mut out: Vec<(String, String)> = self
            .names()
            .map(|n| {
                let held = s.members.iter().find(|m| m.name.as_deref() == Some(n));
                (n.clone(), held.map_or_else(|| "out".to_string(), part))
            })
            .collect();
        for m in &s.members {
            let name = m
                .name
                .clone()
                .unwrap_or_else(|| format!("slot {}", m.slot.unwrap_or(0)));
            if !out.iter().any(|(n, _)| *n == name) {
                out.push((name, part(m)));
            }
        }
        out
    }
}

/// A member's state as `raid status` words it.
pub fn member_state(state: raid::MemberState) -> &'static str {
    match state {
        raid::MemberState::InSync => "in-sync",
        raid::MemberState::Recovering => "recovering",
        raid::MemberState::Failed => "failed",
        raid::MemberState::Missing => "missing",
        raid::MemberState::Spare => "spare",
        raid::MemberState::Replacement => "replacement",
    }
}

#[cfg(test)]
#[path = "raid_tests.rs"]
mod tests;
