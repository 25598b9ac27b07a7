//! Configuration sections owned by other crates: a transport or service
//! (`[nvmf]`, `[ha]`) registers its section here once at start, and the
//! configuration reads, checks and compares it without naming the crate.
//!
//! The owner gives the section's serde type, its checks and the devices
//! it serves (which are then opened like the devices of LUNs); this
//! module reads the section out of the whole document, so serde's
//! errors keep their line and column, and places the owner's problems at
//! the field they name.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, RwLock};

use serde::de::{DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::{Deserializer, Serialize};

use crate::error::{Issue, Location};
use crate::locate;

/// One problem the owner found: the field as a path from the top of the
/// document (`nvmf.subsystem[0].nqn`) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub field: String,
    pub reason: String,
}

/// What a crate says of the section it owns.
pub trait SectionOwner: Send + Sync + 'static {
    type Config: DeserializeOwned + Serialize + fmt::Debug + PartialEq + Send + Sync + 'static;
    /// The top-level table: `nvmf` for `[nvmf]`.
    const NAME: &'static str;
    /// The section's part of the built-in default configuration.
    const DEFAULT_TEXT: &'static str = "";

    /// Every problem of the section, given the configured devices' names.
    fn check(&self, config: &Self::Config, devices: &BTreeSet<String>) -> Vec<Problem>;

    /// The devices the section serves: opened with the configuration.
    fn served_devices(&self, config: &Self::Config) -> BTreeSet<String>;
}

/// A read and checked section, kept in [`crate::Config::sections`].
#[derive(Clone)]
pub struct SectionValue {
    value: Arc<dyn Any + Send + Sync>,
    /// The section as TOML, for equality and change reports.
    toml: toml::Value,
    devices: BTreeSet<String>,
    pub at: Option<Location>,
}

impl SectionValue {
    pub fn get<T: 'static>(&self) -> Option<&T> {
        self.value.downcast_ref()
    }

    pub fn devices(&self) -> &BTreeSet<String> {
        &self.devices
    }

    pub fn as_toml(&self) -> &toml::Value {
        &self.toml
    }
}

impl PartialEq for SectionValue {
    fn eq(&self, other: &Self) -> bool {
        self.toml == other.toml
    }
}

impl Eq for SectionValue {}

impl fmt::Debug for SectionValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.toml)
    }
}

/// The sections of one configuration, by name.
pub type Sections = BTreeMap<&'static str, SectionValue>;

/// Sets section `S` of a configuration to `config`, e.g. for a listen
/// address given on the command line.
pub fn set<S: SectionOwner>(sections: &mut Sections, owner: &S, config: S::Config) {
    let at = sections.get(S::NAME).and_then(|s| s.at);
    let toml =
        toml::Value::try_from(&config).unwrap_or_else(|_| toml::Value::Table(Default::default()));
    let value = SectionValue {
        devices: owner.served_devices(&config),
        value: Arc::new(config),
        toml,
        at,
    };
    sections.insert(S::NAME, value);
}

/// The type-erased side of a [`SectionOwner`].
trait Registered: Send + Sync {
    fn name(&self) -> &'static str;
    fn default_text(&self) -> &'static str;
    fn read(
        &self,
        text: &str,
        devices: &BTreeSet<String>,
    ) -> Result<Option<SectionValue>, Vec<Issue>>;
}

struct Owned<S>(S);

impl<S: SectionOwner> Registered for Owned<S> {
    fn name(&self) -> &'static str {
        S::NAME
    }

    fn default_text(&self) -> &'static str {
        S::DEFAULT_TEXT
    }

    fn read(
        &self,
        text: &str,
        devices: &BTreeSet<String>,
    ) -> Result<Option<SectionValue>, Vec<Issue>> {
        let seed = OneKey::<S::Config> {
            name: S::NAME,
            _type: PhantomData,
        };
        let config = match seed.deserialize(toml::Deserializer::new(text)) {
            Ok(Some(c)) => c,
            Ok(None) => return Ok(None),
            Err(e) => {
                let span = e.span();
                let field = span
                    .as_ref()
                    .map(|s| locate::field_at(text, s.start))
                    .filter(|f| !f.is_empty())
                    .unwrap_or_else(|| S::NAME.to_string());
                return Err(vec![Issue {
                    location: span.map(|s| Location::of_span(text, &s)),
                    field,
                    reason: e.message().trim().replace('\n', "; "),
                }]);
            }
        };
        let problems = self.0.check(&config, devices);
        if !problems.is_empty() {
            return Err(problems
                .into_iter()
                .map(|p| Issue {
                    location: locate::span_of(text, &p.field).map(|s| Location::of_span(text, &s)),
                    field: p.field,
                    reason: p.reason,
                })
                .collect());
        }
        let toml = toml::Value::try_from(&config).map_err(|e| {
            vec![Issue {
                location: None,
                field: S::NAME.to_string(),
                reason: format!("cannot be written back as TOML: {e}"),
            }]
        })?;
        Ok(Some(SectionValue {
            devices: self.0.served_devices(&config),
            value: Arc::new(config),
            toml,
            at: locate::span_of(text, S::NAME).map(|s| Location::of_span(text, &s)),
        }))
    }
}

static REGISTRY: RwLock<Vec<Arc<dyn Registered>>> = RwLock::new(Vec::new());

/// Makes `[S::NAME]` part of the configuration language of this process.
/// Registering a name again replaces the owner.
pub fn register<S: SectionOwner>(owner: S) {
    let mut all = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
    all.retain(|r| r.name() != S::NAME);
    all.push(Arc::new(Owned(owner)));
}

fn registered() -> Vec<Arc<dyn Registered>> {
    REGISTRY.read().unwrap_or_else(|e| e.into_inner()).clone()
}

pub fn is_registered(name: &str) -> bool {
    registered().iter().any(|r| r.name() == name)
}

/// The names of the registered sections.
pub fn names() -> Vec<&'static str> {
    registered().iter().map(|r| r.name()).collect()
}

/// The registered sections' parts of the built-in default.
pub fn default_texts() -> String {
    registered()
        .iter()
        .map(|r| r.default_text())
        .filter(|t| !t.is_empty())
        .map(|t| format!("\n{t}"))
        .collect()
}

/// Reads every registered section present in `text`.
pub fn read_all(text: &str, devices: &BTreeSet<String>) -> Result<Sections, Vec<Issue>> {
    let mut sections = Sections::new();
    let mut issues = Vec::new();
    for r in registered() {
        match r.read(text, devices) {
            Ok(Some(v)) => {
                sections.insert(r.name(), v);
            }
            Ok(None) => {}
            Err(mut e) => issues.append(&mut e),
        }
    }
    if issues.is_empty() {
        Ok(sections)
    } else {
        Err(issues)
    }
}

/// Change lines between two configurations' sections, in the form of
/// [`crate::diff`]: `+ nvmf`, `- nvmf`, `~ nvmf subsystem[0].nqn: A → B`.
pub fn diff(old: &Sections, new: &Sections, out: &mut Vec<String>) {
    let names: BTreeSet<&str> = old.keys().chain(new.keys()).copied().collect();
    for name in names {
        match (old.get(name), new.get(name)) {
            (Some(_), None) => out.push(format!("- {name}")),
            (None, Some(_)) => out.push(format!("+ {name}")),
            (Some(a), Some(b)) if a != b => {
                let (mut was, mut now) = (BTreeMap::new(), BTreeMap::new());
                leaves(&a.toml, String::new(), &mut was);
                leaves(&b.toml, String::new(), &mut now);
                let paths: BTreeSet<&String> = was.keys().chain(now.keys()).collect();
                for path in paths {
                    let unset = crate::render::UNSET.to_string();
                    let (x, y) = (
                        was.get(path).unwrap_or(&unset),
                        now.get(path).unwrap_or(&unset),
                    );
                    if x != y {
                        out.push(format!("~ {name} {path}: {x} → {y}"));
                    }
                }
            }
            _ => {}
        }
    }
}

/// The settings of a section by path; arrays of tables are walked, other
/// arrays are one setting.
fn leaves(v: &toml::Value, path: String, out: &mut BTreeMap<String, String>) {
    let join = |k: &str| {
        if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}.{k}")
        }
    };
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                leaves(v, join(k), out);
            }
        }
        toml::Value::Array(a) if !a.is_empty() && a.iter().all(toml::Value::is_table) => {
            for (i, v) in a.iter().enumerate() {
                leaves(v, format!("{path}[{i}]"), out);
            }
        }
        other => {
            out.insert(path, other.to_string());
        }
    }
}

/// Reads the value of one top-level key of a document, skipping the rest.
struct OneKey<T> {
    name: &'static str,
    _type: PhantomData<T>,
}

impl<'de, T: DeserializeOwned> DeserializeSeed<'de> for OneKey<T> {
    type Value = Option<T>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<T>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, T: DeserializeOwned> Visitor<'de> for OneKey<T> {
    type Value = Option<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a document with a [{}] table", self.name)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<T>, A::Error> {
        let mut found = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == self.name {
                found = Some(map.next_value::<T>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Toy {
        listen: Vec<String>,
        #[serde(default)]
        device: Vec<String>,
    }

    struct ToyOwner;

    impl SectionOwner for ToyOwner {
        type Config = Toy;
        const NAME: &'static str = "toy";
        fn check(&self, c: &Toy, devices: &BTreeSet<String>) -> Vec<Problem> {
            c.device
                .iter()
                .enumerate()
                .filter(|(_, d)| !devices.contains(*d))
                .map(|(i, d)| Problem {
                    field: format!("toy.device[{i}]"),
                    reason: format!("no device is named {d:?}"),
                })
                .collect()
        }
        fn served_devices(&self, c: &Toy) -> BTreeSet<String> {
            c.device.iter().cloned().collect()
        }
    }

    fn read(text: &str) -> Result<Option<SectionValue>, Vec<Issue>> {
        let devices = ["d0".to_string()].into_iter().collect();
        Owned(ToyOwner).read(text, &devices)
    }

    #[test]
    fn reads_its_table_and_ignores_the_others() {
        let v = read("[daemon]\nx = 1\n[toy]\nlisten = [\"a\"]\ndevice = [\"d0\"]\n")
            .unwrap()
            .unwrap();
        assert_eq!(v.get::<Toy>().unwrap().listen, ["a"]);
        assert!(v.devices().contains("d0"));
        assert_eq!(v.at.unwrap().line, 3);
        assert!(read("[daemon]\nx = 1\n").unwrap().is_none());
    }

    #[test]
    fn serde_errors_keep_their_line_and_field() {
        let e = read("\n[toy]\nlisten = [\"a\"]\nspeed = 3\n").unwrap_err();
        assert_eq!(e[0].location.unwrap().line, 4, "{e:?}");
        assert!(e[0].reason.contains("unknown field `speed`"), "{e:?}");
        let e = read("[toy]\nlisten = 3\n").unwrap_err();
        assert_eq!(e[0].field, "toy.listen");
    }

    #[test]
    fn the_owners_problems_are_placed_at_their_field() {
        let e = read("[toy]\nlisten = []\ndevice = [\"d0\", \"nope\"]\n").unwrap_err();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].field, "toy.device[1]");
        assert_eq!(e[0].location.unwrap().line, 3);
        assert!(e[0].reason.contains("nope"));
    }

    #[test]
    fn changes_are_told_by_field() {
        let a = read("[toy]\nlisten = [\"a\"]\n").unwrap().unwrap();
        let b = read("[toy]\nlisten = [\"b\"]\ndevice = [\"d0\"]\n")
            .unwrap()
            .unwrap();
        let (none, old, new) = (
            Sections::new(),
            Sections::from([("toy", a)]),
            Sections::from([("toy", b)]),
        );
        let mut out = Vec::new();
        diff(&old, &new, &mut out);
        assert_eq!(
            out,
            [
                "~ toy device: [] → [\"d0\"]",
                "~ toy listen: [\"a\"] → [\"b\"]"
            ]
        );
        out.clear();
        diff(&none, &old, &mut out);
        diff(&old, &none, &mut out);
        assert_eq!(out, ["+ toy", "- toy"]);
    }

    #[test]
    fn equal_sections_compare_equal() {
        let a = read("[toy]\nlisten = [\"a\"]\n").unwrap().unwrap();
        let b = read("# moved\n\n[toy]\nlisten = [\"a\"]\n")
            .unwrap()
            .unwrap();
        let c = read("[toy]\nlisten = [\"b\"]\n").unwrap().unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
