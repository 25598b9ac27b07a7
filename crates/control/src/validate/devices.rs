//! `[[device]]` tables: the settings every device has (name, kind, the
//! identity its LUN reports), then the kind's own, read by its module in
//! the registry.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use toml::{Spanned, Value};

use super::graph::Edge;
use super::Checker;
use crate::error::Location;
use crate::kinds::{self, Fields, Spec};
use crate::model::{Device, LuIdentity};
use crate::names::{check_ascii_field, check_device_name, parse_naa};
use crate::raw::RawDevice;

/// Largest physical block size a device may report (64 KiB).
const MAX_PHYSICAL_BLOCK: i64 = 64 << 10;

impl Checker<'_> {
    /// The valid devices, and the name of every device declared (valid or
    /// not) so a bad device doesn't also make each LUN using it an error.
    pub(super) fn devices(&mut self, raw: Vec<Spanned<RawDevice>>) -> (Vec<Device>, Vec<String>) {
        let mut out: Vec<Device> = Vec::new();
        // The line of the first table of each name.
        let mut first_line: HashMap<String, usize> = HashMap::new();
        let mut naa_seen: HashMap<[u8; 16], String> = HashMap::new();
        for (i, entry) in raw.into_iter().enumerate() {
            let table = entry.span();
            let name = entry.get_ref().get("name");
            let name = name.and_then(|v| Some((v.get_ref().as_str()?.to_string(), v.span())));
            let naa_span = entry.get_ref().get("naa").map(Spanned::span);
            let mut twice = false;
            if let Some((name, span)) = name {
                if let Some(line) = first_line.get(&name) {
                    let reason = format!("device `{name}` is already defined (line {line})");
                    self.fail(&span, format!("device[{i}].name"), reason);
                    twice = true;
                } else {
                    let line = Location::of_span(self.text, &table).line;
                    first_line.insert(name.clone(), line);
                    self.graph.declared.push(name);
                }
            }
            let Some(dev) = self.device(i, &table, entry.into_inner()) else {
                continue;
            };
            if twice {
                continue;
            }
            if let Some(naa) = dev.identity.naa {
                if let Some(other) = naa_seen.insert(naa, dev.name.clone()) {
                    self.fail(
                        &naa_span.unwrap_or(table),
                        format!("device[{i}].naa"),
                        format!("device `{other}` has the same NAA designator"),
                    );
                    continue;
                }
            }
            out.push(dev);
        }
        (out, self.graph.declared.clone())
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
        let (issues, refs) = f.finish();
        for r in refs {
            self.graph.edges.push(Edge {
                from: Some(name.get_ref().clone()),
                user: format!("device `{}`", name.get_ref()),
                child: r.name,
                at: Location::of_span(self.text, &r.span),
                field: field(&r.key),
            });
        }
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
