//! Turns the file as read into the validated [`Config`], collecting every
//! problem with its position rather than stopping at the first.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;

use export::{ChapCredentials, Secret};
use toml::Spanned;

use crate::error::{ConfigError, Issue, Location};
use crate::model::{Chap, Config, Group, Lun, Portal, Target, DEFAULT_GROUP, DEFAULT_ISCSI_PORT};
use crate::names::{check_device_name, check_iscsi_name};
use crate::raw::{RawChap, RawConfig, RawGroup, RawLun, RawTarget, TABLES};
use crate::sections;
use crate::size::parse_size;

mod daemon;
mod devices;
mod graph;
mod nbd;
mod pools;
mod schedules;

/// Highest LUN the flat addressing of SAM can carry.
pub const MAX_LUN: u64 = 16383;

/// Parses a portal address: `ip:port`, `[ipv6]:port`, or an address
/// alone for the default port.
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    let addr = text
        .parse::<SocketAddr>()
        .ok()
        .or_else(|| {
            let bare = text
                .strip_prefix('[')
                .and_then(|t| t.strip_suffix(']'))
                .unwrap_or(text);
            bare.parse::<IpAddr>()
                .ok()
                .map(|ip| SocketAddr::new(ip, DEFAULT_ISCSI_PORT))
        })
        .ok_or_else(|| {
            format!("`{text}` is not an address with port, e.g. 0.0.0.0:3260 or [::1]:3260")
        })?;
    if addr.port() == 0 {
        return Err("port 0 is not a listening port".into());
    }
    Ok(addr)
}

struct Checker<'a> {
    text: &'a str,
    issues: Vec<Issue>,
    /// Names of the pools declared, for `volume` devices.
    pools: Vec<String>,
    /// What names which device, checked once everything is read.
    graph: graph::Graph,
}

impl Checker<'_> {
    fn at(&self, span: &Range<usize>) -> Option<Location> {
        Some(Location::of_span(self.text, span))
    }

    fn fail(&mut self, span: &Range<usize>, field: String, reason: impl Into<String>) {
        let location = self.at(span);
        self.issues.push(Issue {
            location,
            field,
            reason: reason.into(),
        });
    }

    /// Reports `Err` against the spanned value and turns it into `None`.
    fn check<T>(
        &mut self,
        span: &Range<usize>,
        field: impl FnOnce() -> String,
        r: Result<T, String>,
    ) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(reason) => {
                self.fail(span, field(), reason);
                None
            }
        }
    }

    fn portals(&mut self, raw: Vec<Spanned<crate::raw::RawPortal>>) -> Vec<Portal> {
        let mut out: Vec<Portal> = Vec::new();
        for (i, entry) in raw.into_iter().enumerate() {
            let at = self.at(&entry.span());
            let listen = entry.into_inner().listen;
            let field = || format!("portal[{i}].listen");
            let Some(addr) = self.check(&listen.span(), field, parse_listen(listen.get_ref()))
            else {
                continue;
            };
            if let Some(first) = out.iter().find(|p| p.listen == addr) {
                let line = first.at.map_or(0, |l| l.line);
                self.fail(
                    &listen.span(),
                    field(),
                    format!("{addr} is already a portal (line {line})"),
                );
                continue;
            }
            out.push(Portal { listen: addr, at });
        }
        out
    }

    /// Top-level tables neither read here nor owned by a registered
    /// section: a typo, or a section of a transport this build lacks.
    fn unknown_tables(&mut self) {
        let Ok(doc) = toml_edit::Document::parse(self.text) else {
            return;
        };
        for (key, _) in doc.as_table().iter() {
            if TABLES.contains(&key) || sections::is_registered(key) {
                continue;
            }
            let mut known = TABLES.to_vec();
            known.extend(sections::names());
            let known = known.iter().map(|t| format!("`{t}`")).collect::<Vec<_>>();
            let span = doc.as_table().key(key).and_then(|k| k.span());
            let reason = format!(
                "unknown field `{key}`, expected one of {}",
                known.join(", ")
            );
            match span {
                Some(span) => self.fail(&span, key.to_string(), reason),
                None => self.issues.push(Issue {
                    location: None,
                    field: key.to_string(),
                    reason,
                }),
            }
        }
    }

    /// A size given as bytes or a string such as "64K".
    fn size_value(&mut self, v: &Spanned<toml::Value>, field: String) -> Option<u64> {
        let parsed = match v.get_ref() {
            toml::Value::Integer(n) if *n > 0 => Ok(*n as u64),
            toml::Value::String(s) => parse_size(s).and_then(|n| {
                if n == 0 {
                    Err("must be more than zero".to_string())
                } else {
                    Ok(n)
                }
            }),
            _ => Err("expected a positive size such as 65536 or \"64K\"".to_string()),
        };
        self.check(&v.span(), || field, parsed)
    }

    fn targets(
        &mut self,
        raw: Vec<Spanned<RawTarget>>,
        devices: &[String],
        portals: &[Portal],
    ) -> Vec<Target> {
        let mut out: Vec<Target> = Vec::new();
        // Each name (lower case) with the line of its first table.
        let mut seen: Vec<(String, usize)> = Vec::new();
        for (i, entry) in raw.into_iter().enumerate() {
            let table = entry.span();
            let name = &entry.get_ref().name;
            let key = name.get_ref().to_ascii_lowercase();
            let twice = match seen.iter().find(|(n, _)| *n == key) {
                Some((_, line)) => {
                    let reason = format!(
                        "target `{}` is already defined (line {line})",
                        name.get_ref()
                    );
                    self.fail(&name.span(), format!("target[{i}].name"), reason);
                    true
                }
                None => {
                    seen.push((key, Location::of_span(self.text, &table).line));
                    false
                }
            };
            let target = self.target(i, &table, entry.into_inner(), devices, portals);
            if let Some(target) = target.filter(|_| !twice) {
                out.push(target);
            }
        }
        out
    }

    /// A LUN map: `[[...lun]]` entries under `prefix`.
    fn lun_map(&mut self, prefix: &str, raw: Vec<Spanned<RawLun>>, devices: &[String]) -> Vec<Lun> {
        let mut luns: Vec<Lun> = Vec::new();
        // Every valid number given, mapped or not.
        let mut numbers: Vec<u64> = Vec::new();
        for (j, entry) in raw.into_iter().enumerate() {
            let at = self.at(&entry.span());
            let lun = entry.into_inner();
            let lfield = |name: &str| format!("{prefix}.lun[{j}].{name}");
            let given = *lun.lun.get_ref();
            let number = u64::try_from(given).ok().filter(|n| *n <= MAX_LUN);
            let number = match number {
                None => {
                    let reason = format!("LUN {given} is outside 0..={MAX_LUN}");
                    self.fail(&lun.lun.span(), lfield("lun"), reason);
                    None
                }
                Some(n) if numbers.contains(&n) => {
                    let reason = format!("LUN {n} is already mapped here");
                    self.fail(&lun.lun.span(), lfield("lun"), reason);
                    None
                }
                Some(n) => {
                    numbers.push(n);
                    Some(n)
                }
            };
            let device = lun.device.get_ref();
            if !devices.contains(device) {
                self.fail(
                    &lun.device.span(),
                    lfield("device"),
                    format!("no [[device]] is named `{device}`"),
                );
                continue;
            }
            self.served(device, "a LUN", &lun.device.span(), lfield("device"));
            let Some(number) = number else {
                continue;
            };
            luns.push(Lun {
                lun: number,
                device: device.clone(),
                read_only: lun.read_only.unwrap_or(false),
                at,
            });
        }
        luns.sort_by_key(|l| l.lun);
        luns
    }

    /// Records that `device` is served, as `what`, by the setting at
    /// `span`.
    fn served(&mut self, device: &str, what: &'static str, span: &Range<usize>, field: String) {
        self.graph.served.push(graph::Served {
            device: device.to_string(),
            what,
            at: Location::of_span(self.text, span),
            field,
        });
    }

    /// CHAP credentials under `prefix`.
    fn chap(&mut self, prefix: &str, raw: Spanned<RawChap>) -> Option<Chap> {
        let before = self.issues.len();
        let table = raw.span();
        let raw = raw.into_inner();
        let user = self.chap_user(prefix, "user", &raw.user);
        let secret = self.chap_secret(prefix, "secret", &raw.secret);
        let mutual = match (&raw.mutual_user, &raw.mutual_secret) {
            (None, None) => None,
            (Some(u), Some(s)) => {
                let user = self.chap_user(prefix, "mutual_user", u);
                let secret = self.chap_secret(prefix, "mutual_secret", s);
                if s.get_ref() == raw.secret.get_ref() {
                    self.fail(
                        &s.span(),
                        format!("{prefix}.mutual_secret"),
                        "must differ from `secret`: each direction has its own secret",
                    );
                }
                user.zip(secret)
            }
            _ => {
                self.fail(
                    &table,
                    format!("{prefix}.mutual_user"),
                    "mutual CHAP needs both `mutual_user` and `mutual_secret`",
                );
                None
            }
        };
        if self.issues.len() != before {
            return None;
        }
        Some(Chap {
            initiator: ChapCredentials {
                user: user?,
                secret: secret?,
            },
            mutual: mutual.map(|(user, secret)| ChapCredentials { user, secret }),
        })
    }

    fn chap_user(&mut self, prefix: &str, name: &str, raw: &Spanned<String>) -> Option<String> {
        let text = raw.get_ref();
        let ok = if text.is_empty() {
            Err("must not be empty".to_string())
        } else if text.len() > 255 {
            Err("a CHAP name has at most 255 bytes".to_string())
        } else if text.chars().any(char::is_control) {
            Err("a CHAP name has no control characters".to_string())
        } else {
            Ok(text.clone())
        };
        self.check(&raw.span(), || format!("{prefix}.{name}"), ok)
    }

    /// The reason never quotes the secret.
    fn chap_secret(&mut self, prefix: &str, name: &str, raw: &Spanned<String>) -> Option<Secret> {
        self.check(
            &raw.span(),
            || format!("{prefix}.{name}"),
            Secret::new(raw.get_ref()),
        )
    }

    fn groups(&mut self, i: usize, raw: Vec<Spanned<RawGroup>>, devices: &[String]) -> Vec<Group> {
        let mut out: Vec<Group> = Vec::new();
        let mut names: Vec<String> = Vec::new();
        // Exact initiator names already placed in a group, with the group.
        let mut placed: HashMap<String, String> = HashMap::new();
        for (j, entry) in raw.into_iter().enumerate() {
            let before = self.issues.len();
            let table = entry.span();
            let raw = entry.into_inner();
            let prefix = format!("target[{i}].group[{j}]");
            let name = raw.name.get_ref().clone();
            self.check(
                &raw.name.span(),
                || format!("{prefix}.name"),
                check_device_name(&name),
            );
            if names.contains(&name) {
                self.fail(
                    &raw.name.span(),
                    format!("{prefix}.name"),
                    format!("group `{name}` is already defined in this target"),
                );
            }
            names.push(name.clone());
            let is_default = name == DEFAULT_GROUP;
            if is_default && !raw.initiators.is_empty() {
                self.fail(
                    &raw.initiators[0].span(),
                    format!("{prefix}.initiators"),
                    format!("the `{DEFAULT_GROUP}` group serves initiators no other group names; it lists none"),
                );
            }
            if !is_default && raw.initiators.is_empty() {
                self.fail(
                    &table,
                    format!("{prefix}.initiators"),
                    "lists no initiator (names, or patterns with `*` and `?`)",
                );
            }
            let mut initiators = Vec::new();
            for (k, entry) in raw.initiators.iter().enumerate() {
                let text = entry.get_ref();
                let ifield = || format!("{prefix}.initiators[{k}]");
                let ok = check_initiator(text);
                if self.check(&entry.span(), ifield, ok).is_none() {
                    continue;
                }
                if !text.contains(['*', '?']) {
                    let key = text.to_ascii_lowercase();
                    if let Some(other) = placed.get(&key) {
                        self.fail(
                            &entry.span(),
                            ifield(),
                            format!("`{text}` is already a member of group `{other}`"),
                        );
                        continue;
                    }
                    placed.insert(key, name.clone());
                }
                initiators.push(text.clone());
            }
            let chap = raw
                .chap
                .and_then(|c| self.chap(&format!("{prefix}.chap"), c));
            let luns = self.lun_map(&prefix, raw.lun, devices);
            if self.issues.len() != before {
                continue;
            }
            out.push(Group {
                name,
                initiators,
                chap,
                luns,
                at: self.at(&table),
            });
        }
        out
    }

    fn target(
        &mut self,
        i: usize,
        table: &Range<usize>,
        raw: RawTarget,
        devices: &[String],
        portals: &[Portal],
    ) -> Option<Target> {
        let before = self.issues.len();
        let field = |name: &str| format!("target[{i}].{name}");
        self.check(
            &raw.name.span(),
            || field("name"),
            check_iscsi_name(raw.name.get_ref()),
        );

        let alias = raw.alias.as_ref().and_then(|a| {
            let text = a.get_ref();
            let ok = if text.len() > 255 {
                Err("an alias has at most 255 bytes".to_string())
            } else if text.chars().any(char::is_control) {
                Err("an alias has no control characters".to_string())
            } else {
                Ok(text.clone())
            };
            self.check(&a.span(), || field("alias"), ok)
        });

        let target_portals = raw.portals.as_ref().map(|list| {
            if list.get_ref().is_empty() {
                self.fail(
                    &list.span(),
                    field("portals"),
                    "lists no portal; leave `portals` out to use every portal",
                );
            }
            let mut addrs = Vec::new();
            for (j, entry) in list.get_ref().iter().enumerate() {
                let pfield = || format!("target[{i}].portals[{j}]");
                let Some(addr) = self.check(&entry.span(), pfield, parse_listen(entry.get_ref()))
                else {
                    continue;
                };
                if !portals.iter().any(|p| p.listen == addr) {
                    self.fail(
                        &entry.span(),
                        pfield(),
                        format!("{addr} is not the `listen` of any [[portal]]"),
                    );
                } else if addrs.contains(&addr) {
                    self.fail(&entry.span(), pfield(), format!("{addr} is listed twice"));
                } else {
                    addrs.push(addr);
                }
            }
            addrs
        });

        let has_groups = !raw.group.is_empty();
        if has_groups {
            if let Some(first) = raw.lun.first() {
                self.fail(
                    &first.span(),
                    field("lun"),
                    format!(
                        "a target with groups maps LUNs in its groups; \
                         a group named `{DEFAULT_GROUP}` serves initiators no group names"
                    ),
                );
            }
        }
        let luns = self.lun_map(&format!("target[{i}]"), raw.lun, devices);
        let chap = raw
            .chap
            .and_then(|c| self.chap(&format!("target[{i}].chap"), c));
        let groups = self.groups(i, raw.group, devices);

        if self.issues.len() != before {
            return None;
        }
        Some(Target {
            name: raw.name.into_inner(),
            alias,
            portals: target_portals,
            luns,
            chap,
            groups,
            at: self.at(table),
        })
    }
}

pub fn validate(raw: RawConfig, text: &str, origin: &str) -> Result<Config, ConfigError> {
    let mut c = Checker {
        text,
        issues: Vec::new(),
        pools: Vec::new(),
        graph: graph::Graph::default(),
    };
    let daemon = c.daemon(raw.daemon);
    let discovery_chap = raw
        .discovery
        .and_then(|d| d.chap)
        .and_then(|chap| c.chap("discovery.chap", chap));
    let portals = c.portals(raw.portal);
    let pools = c.pools(raw.pool);
    let schedules = c.schedules(raw.schedule, &pools);
    let (devices, declared) = c.devices(raw.device);
    let targets = c.targets(raw.target, &declared, &portals);
    let nbd = c.nbd(raw.nbd, &declared, &portals);
    c.unknown_tables();
    let names = declared.iter().cloned().collect();
    let sections = sections::read_all(text, &names).unwrap_or_else(|issues| {
        c.issues.extend(issues);
        Default::default()
    });
    let graph = c.graph.issues();
    c.issues.extend(graph);
    if !c.issues.is_empty() {
        // Report in file order.
        c.issues
            .sort_by_key(|i| i.location.map(|l| (l.line, l.column)));
        return Err(ConfigError::new(origin, c.issues));
    }
    Ok(Config {
        origin: origin.to_string(),
        daemon,
        portals,
        pools,
        schedules,
        devices,
        targets,
        discovery_chap,
        nbd,
        sections,
    })
}

/// An initiator in a group: an iSCSI name, or a pattern with `*` and `?`.
fn check_initiator(text: &str) -> Result<(), String> {
    if text.contains(['*', '?']) {
        if text.len() > 223 {
            return Err("an initiator pattern has at most 223 bytes".into());
        }
        if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err("an initiator pattern has no spaces or control characters".into());
        }
        Ok(())
    } else {
        check_iscsi_name(text)
    }
}

#[cfg(test)]
mod tests;
