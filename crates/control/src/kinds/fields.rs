//! A `[[device]]` table's settings, read one by one by the device's kind,
//! each problem reported against the value (file, line, field) that has it.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use toml::{Spanned, Value};

use crate::error::{Issue, Location};
use crate::size::parse_size;

/// The settings of `device[index]` not yet read.
pub struct Fields<'a> {
    text: &'a str,
    index: usize,
    /// Where the table is, for settings that are missing.
    table: Range<usize>,
    kind: &'static str,
    /// The device's logical block size: sizes must be whole blocks.
    block_size: u32,
    left: BTreeMap<String, Spanned<Value>>,
    /// The device's own name, the default name of what it stands for.
    name: &'a str,
    /// The pools the configuration declares.
    pools: &'a [String],
    /// Where each setting read was, for problems found after reading it.
    read_at: BTreeMap<String, Range<usize>>,
    refs: Vec<DeviceRef>,
    issues: Vec<Issue>,
}

/// A device that a setting names, for the checks of the device graph.
#[derive(Clone, Debug)]
pub(crate) struct DeviceRef {
    /// The setting, e.g. `members`.
    pub key: String,
    pub name: String,
    /// Where the setting's value is (on the setting's line).
    pub span: Range<usize>,
}

/// Where a `[[device]]` table is and what surrounds it.
pub(crate) struct TableContext<'a> {
    pub text: &'a str,
    pub index: usize,
    pub table: Range<usize>,
    pub name: &'a str,
    pub pools: &'a [String],
}

impl<'a> Fields<'a> {
    pub(crate) fn new(
        at: TableContext<'a>,
        kind: &'static str,
        block_size: u32,
        settings: BTreeMap<String, Spanned<Value>>,
    ) -> Self {
        Fields {
            text: at.text,
            index: at.index,
            table: at.table,
            name: at.name,
            pools: at.pools,
            kind,
            block_size,
            left: settings,
            read_at: BTreeMap::new(),
            refs: Vec::new(),
            issues: Vec::new(),
        }
    }

    /// Sizes read after this must be whole blocks of `block_size`.
    pub(crate) fn set_block_size(&mut self, block_size: u32) {
        self.block_size = block_size;
    }

    pub(crate) fn set_kind(&mut self, kind: &'static str) {
        self.kind = kind;
    }

    /// Whether problems were found so far.
    pub fn has_issues(&self) -> bool {
        !self.issues.is_empty()
    }

    /// The name of a declared `[[pool]]`.
    pub fn pool(&mut self, key: &str) -> Option<String> {
        let pools = self.pools;
        self.read(key, |v| match v {
            Value::String(s) if pools.contains(s) => Ok(s.clone()),
            Value::String(s) => Err(format!("no [[pool]] named `{s}`")),
            other => Err(format!("expected a pool name, found {}", other.type_str())),
        })
    }

    /// A volume's name in its pool; the device's name when not given.
    pub fn volume_name(&mut self, key: &str) -> Option<String> {
        let default = self.name.to_string();
        if !self.left.contains_key(key) {
            return Some(default);
        }
        self.read(key, |v| match v {
            Value::String(s) if !s.is_empty() && s.len() <= 200 => Ok(s.clone()),
            Value::String(_) => Err("a volume name has 1 to 200 bytes".into()),
            other => Err(format!(
                "expected a volume name, found {}",
                other.type_str()
            )),
        })
    }

    fn path_of(&self, key: &str) -> String {
        format!("device[{}].{key}", self.index)
    }

    /// Reports `reason` against `span`, else against the setting `key` when
    /// it was read, else against the table (a setting that is missing).
    pub fn fail(&mut self, key: &str, span: Option<Range<usize>>, reason: impl Into<String>) {
        let span = span
            .or_else(|| self.read_at.get(key).cloned())
            .unwrap_or_else(|| self.table.clone());
        self.issues.push(Issue {
            location: Some(Location::of_span(self.text, &span)),
            field: self.path_of(key),
            reason: reason.into(),
        });
    }

    /// Reports `key` missing unless it is there; `what` says what it holds.
    pub fn needs(&mut self, key: &str, what: &str) -> bool {
        if self.left.contains_key(key) {
            return true;
        }
        let reason = format!("a `{}` device needs `{key}` ({what})", self.kind);
        self.fail(key, None, reason);
        false
    }

    /// Reads `key` with `convert`, reporting its error against the value.
    pub fn read<T>(
        &mut self,
        key: &str,
        convert: impl FnOnce(&Value) -> Result<T, String>,
    ) -> Option<T> {
        let value = self.left.remove(key)?;
        self.read_at.insert(key.to_string(), value.span());
        match convert(value.get_ref()) {
            Ok(v) => Some(v),
            Err(reason) => {
                self.fail(key, Some(value.span()), reason);
                None
            }
        }
    }

    pub fn string(&mut self, key: &str) -> Option<String> {
        self.read(key, |v| match v {
            Value::String(s) if !s.is_empty() => Ok(s.clone()),
            Value::String(_) => Err("must not be empty".into()),
            other => Err(format!("expected a string, found {}", other.type_str())),
        })
    }

    pub fn path(&mut self, key: &str) -> Option<PathBuf> {
        self.string(key).map(PathBuf::from)
    }

    pub fn bool(&mut self, key: &str) -> Option<bool> {
        self.read(key, |v| {
            v.as_bool()
                .ok_or_else(|| format!("expected true or false, found {}", v.type_str()))
        })
    }

    /// A positive whole number.
    pub fn count(&mut self, key: &str) -> Option<u64> {
        self.read(key, |v| match v {
            Value::Integer(n) if *n > 0 => Ok(*n as u64),
            Value::Integer(_) => Err("must be more than zero".into()),
            other => Err(format!(
                "expected a whole number, found {}",
                other.type_str()
            )),
        })
    }

    /// Bytes as an integer or a string such as "1G", a whole number of
    /// the device's blocks.
    pub fn size(&mut self, key: &str) -> Option<u64> {
        let block = u64::from(self.block_size);
        self.read(key, |v| {
            let n = bytes(v)?;
            if n % block != 0 {
                return Err(format!(
                    "{n} bytes is not a whole number of {block}-byte blocks"
                ));
            }
            Ok(n)
        })
    }

    /// Bytes (or bytes a second) with no block rule, e.g. "150M".
    pub fn bytes(&mut self, key: &str) -> Option<u64> {
        self.read(key, bytes)
    }

    /// A time such as "8ms", "2s" or "1m".
    pub fn duration(&mut self, key: &str) -> Option<Duration> {
        self.read(key, |v| match v {
            Value::String(s) => crate::duration::parse_duration(s),
            other => Err(format!(
                "expected a time such as \"8ms\" or \"2s\", found {}",
                other.type_str()
            )),
        })
    }

    /// The name of another configured device.
    pub fn device(&mut self, key: &str) -> Option<String> {
        let name = self.read(key, |v| match v {
            Value::String(s) => crate::names::check_device_name(s).map(|_| s.clone()),
            other => Err(format!(
                "expected the name of a device, found {}",
                other.type_str()
            )),
        })?;
        self.refer(key, std::slice::from_ref(&name));
        Some(name)
    }

    /// Names of other configured devices, in order, none twice.
    pub fn devices(&mut self, key: &str) -> Option<Vec<String>> {
        let names = self.read(key, |v| {
            let Value::Array(items) = v else {
                return Err(format!(
                    "expected a list of device names, found {}",
                    v.type_str()
                ));
            };
            let mut names: Vec<String> = Vec::new();
            for item in items {
                let name = item
                    .as_str()
                    .ok_or_else(|| format!("expected device names, found {}", item.type_str()))?;
                crate::names::check_device_name(name)?;
                if names.iter().any(|n| n == name) {
                    return Err(format!("`{name}` is listed twice"));
                }
                names.push(name.to_string());
            }
            Ok(names)
        })?;
        self.refer(key, &names);
        Some(names)
    }

    /// Records that setting `key` (already read) names `names`.
    fn refer(&mut self, key: &str, names: &[String]) {
        let Some(span) = self.read_at.get(key) else {
            return;
        };
        for name in names {
            self.refs.push(DeviceRef {
                key: key.to_string(),
                name: name.clone(),
                span: span.clone(),
            });
        }
    }

    /// Reports every setting the kind did not read, and returns the
    /// problems found and the devices named.
    pub(crate) fn finish(mut self) -> (Vec<Issue>, Vec<DeviceRef>) {
        let left = std::mem::take(&mut self.left);
        for (key, value) in left {
            let others = super::kinds_with(&key);
            let reason = if others.is_empty() {
                format!("unknown field `{key}`")
            } else {
                let list = others
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ");
                format!("only {list} devices have `{key}`")
            };
            let span = crate::locate::key_span(self.text, "device", self.index, &key)
                .unwrap_or_else(|| value.span());
            self.fail(&key, Some(span), reason);
        }
        (self.issues, self.refs)
    }
}

pub(crate) fn bytes(v: &Value) -> Result<u64, String> {
    let n = match v {
        Value::Integer(n) if *n > 0 => *n as u64,
        Value::Integer(_) => return Err("must be more than zero".into()),
        Value::String(s) => parse_size(s)?,
        other => {
            return Err(format!(
                "expected bytes as an integer or a string such as \"1G\", found {}",
                other.type_str()
            ))
        }
    };
    if n == 0 {
        return Err("must be more than zero".into());
    }
    Ok(n)
}
