//! One imperative change to the configuration text (`openarray device add`,
//! `lun add`, `chap set`, ...). The TOML document is edited in place,
//! keeping the administrator's comments and layout; the caller then runs
//! the result through the same validation, atomic write and live apply as
//! `config apply`, so an edit is checked as a whole like any file.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use toml_edit::{value, ArrayOfTables, DocumentMut, Item, Table, Value};

/// Keys `device modify` and `target modify` may not change: a name is
/// what other parts of the file refer to.
const FIXED_KEYS: &[&str] = &["name"];

/// One change, as the CLI sends it to `POST /v1/edit`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Edit {
    DeviceAdd {
        name: String,
        /// Keys of `[[device]]` and their values as typed (`kind=file`,
        /// `size=1G`, `read_only=true`).
        #[serde(default)]
        settings: BTreeMap<String, String>,
    },
    /// Sets keys; an empty value removes the key.
    DeviceModify {
        name: String,
        settings: BTreeMap<String, String>,
    },
    DeviceRemove {
        name: String,
    },
    TargetAdd {
        name: String,
        #[serde(default)]
        settings: BTreeMap<String, String>,
    },
    TargetModify {
        name: String,
        settings: BTreeMap<String, String>,
    },
    TargetRemove {
        name: String,
    },
    PortalAdd {
        listen: String,
    },
    PortalRemove {
        listen: String,
    },
    GroupAdd {
        target: String,
        group: String,
        /// Members from the start: a group other than `default` needs one.
        #[serde(default)]
        initiators: Vec<String>,
    },
    GroupRemove {
        target: String,
        group: String,
    },
    InitiatorAdd {
        target: String,
        group: String,
        initiator: String,
    },
    InitiatorRemove {
        target: String,
        group: String,
        initiator: String,
    },
    LunAdd {
        target: String,
        /// `None`: the target's own map (seen by every initiator).
        group: Option<String>,
        lun: u64,
        device: String,
        #[serde(default)]
        read_only: bool,
    },
    LunModify {
        target: String,
        group: Option<String>,
        lun: u64,
        read_only: bool,
    },
    LunRemove {
        target: String,
        group: Option<String>,
        lun: u64,
    },
    ChapSet {
        scope: ChapScope,
        user: String,
        secret: String,
        mutual_user: Option<String>,
        mutual_secret: Option<String>,
    },
    ChapClear {
        scope: ChapScope,
    },
    /// A device offered to NBD clients under `name`.
    NbdExportAdd {
        name: String,
        device: String,
        #[serde(default)]
        read_only: bool,
        /// Client addresses, CIDR networks or `unix`; empty admits all.
        #[serde(default)]
        allow: Vec<String>,
        #[serde(default)]
        description: Option<String>,
    },
    NbdExportRemove {
        name: String,
    },
}

/// Whose CHAP credentials a `chap set|clear` changes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ChapScope {
    Discovery,
    Target { target: String },
    Group { target: String, group: String },
}

/// `text` with `edit` made; an error says what is missing or in the way.
/// The result is not validated here: that is the caller's whole-file check.
pub fn apply_edit(text: &str, edit: &Edit) -> Result<String, String> {
    let mut doc: DocumentMut = text
        .parse()
        .map_err(|e| format!("the running configuration does not parse: {e}"))?;
    let root = doc.as_table_mut();
    match edit {
        Edit::DeviceAdd { .. } | Edit::DeviceModify { .. } | Edit::DeviceRemove { .. } => {
            edit_device(root, text, edit)?
        }
        Edit::TargetAdd { .. }
        | Edit::TargetModify { .. }
        | Edit::TargetRemove { .. }
        | Edit::PortalAdd { .. }
        | Edit::PortalRemove { .. } => edit_target_or_portal(root, edit)?,
        Edit::GroupAdd { .. }
        | Edit::GroupRemove { .. }
        | Edit::InitiatorAdd { .. }
        | Edit::InitiatorRemove { .. } => edit_group(root, edit)?,
        Edit::LunAdd { .. } | Edit::LunModify { .. } | Edit::LunRemove { .. } => {
            edit_lun(root, edit)?
        }
        Edit::ChapSet { .. } | Edit::ChapClear { .. } => edit_chap(root, edit)?,
        Edit::NbdExportAdd { .. } | Edit::NbdExportRemove { .. } => edit_nbd_export(root, edit)?,
    }
    Ok(doc.to_string())
}

/// `[[device]]` tables. A device still mapped, exported or built upon
/// stays: removing it would leave its users pointing at nothing.
fn edit_device(root: &mut Table, text: &str, edit: &Edit) -> Result<(), String> {
    match edit {
        Edit::DeviceAdd { name, settings } => {
            let devices = tables(root, "device")?;
            if find(devices, name).is_some() {
                return Err(format!("device `{name}` already exists"));
            }
            devices.push(named(name, settings)?);
        }
        Edit::DeviceModify { name, settings } => {
            let device = find_mut(tables(root, "device")?, name)
                .ok_or_else(|| format!("no device `{name}`"))?;
            modify(device, settings)?;
        }
        Edit::DeviceRemove { name } => {
            let mut users = users_of(root, name);
            users.extend(nbd_exports_of(root, name));
            if !users.is_empty() {
                return Err(format!(
                    "device `{name}` is still mapped as {}; remove the mapping first",
                    users.join(", ")
                ));
            }
            let parents = parents_of(text, name);
            if !parents.is_empty() {
                return Err(format!(
                    "device `{name}` is used by {}; change or remove that first",
                    parents.join(", ")
                ));
            }
            let devices = tables(root, "device")?;
            let i = find(devices, name).ok_or_else(|| format!("no device `{name}`"))?;
            devices.remove(i);
        }
        _ => unreachable!("not a device edit"),
    }
    Ok(())
}

/// `[[target]]` and `[[portal]]` tables.
fn edit_target_or_portal(root: &mut Table, edit: &Edit) -> Result<(), String> {
    match edit {
        Edit::TargetAdd { name, settings } => {
            let targets = tables(root, "target")?;
            if find(targets, name).is_some() {
                return Err(format!("target `{name}` already exists"));
            }
            targets.push(named(name, settings)?);
        }
        Edit::TargetModify { name, settings } => modify(target(root, name)?, settings)?,
        Edit::TargetRemove { name } => {
            let targets = tables(root, "target")?;
            let i = find(targets, name).ok_or_else(|| format!("no target `{name}`"))?;
            targets.remove(i);
        }
        Edit::PortalAdd { listen } => {
            let portals = tables(root, "portal")?;
            if position(portals, "listen", listen).is_some() {
                return Err(format!("portal {listen} already exists"));
            }
            let mut t = fresh();
            t.insert("listen", value(listen.as_str()));
            portals.push(t);
        }
        Edit::PortalRemove { listen } => {
            let portals = tables(root, "portal")?;
            let i =
                position(portals, "listen", listen).ok_or_else(|| format!("no portal {listen}"))?;
            portals.remove(i);
        }
        _ => unreachable!("not a target or portal edit"),
    }
    Ok(())
}

/// A target's `[[target.group]]` tables and their `initiators` lists.
fn edit_group(root: &mut Table, edit: &Edit) -> Result<(), String> {
    match edit {
        Edit::GroupAdd {
            target: t,
            group,
            initiators,
        } => {
            let groups = tables(target(root, t)?, "group")?;
            if find(groups, group).is_some() {
                return Err(format!("target `{t}` already has a group `{group}`"));
            }
            let mut g = fresh();
            g.insert("name", value(group.as_str()));
            // The `default` group lists nobody; any other lists its members.
            if !initiators.is_empty() || !group.eq_ignore_ascii_case(crate::DEFAULT_GROUP) {
                g.insert(
                    "initiators",
                    value(initiators.iter().collect::<toml_edit::Array>()),
                );
            }
            groups.push(g);
        }
        Edit::GroupRemove { target: t, group } => {
            let groups = tables(target(root, t)?, "group")?;
            let i = find(groups, group).ok_or_else(|| no_group(t, group))?;
            groups.remove(i);
        }
        Edit::InitiatorAdd {
            target: t,
            group,
            initiator,
        } => {
            let members = initiators(group_of(root, t, group)?)?;
            if members.iter().any(|m| m.as_str() == Some(initiator)) {
                return Err(format!("`{initiator}` is already in group `{group}`"));
            }
            members.push(initiator.as_str());
        }
        Edit::InitiatorRemove {
            target: t,
            group,
            initiator,
        } => {
            let members = initiators(group_of(root, t, group)?)?;
            let i = members
                .iter()
                .position(|m| m.as_str() == Some(initiator))
                .ok_or_else(|| format!("`{initiator}` is not in group `{group}`"))?;
            members.remove(i);
        }
        _ => unreachable!("not a group or initiator edit"),
    }
    Ok(())
}

/// The LUN map of a target or of one of its groups.
fn edit_lun(root: &mut Table, edit: &Edit) -> Result<(), String> {
    match edit {
        Edit::LunAdd {
            target: t,
            group,
            lun,
            device,
            read_only,
        } => {
            let map = lun_map(root, t, group.as_deref())?;
            if lun_position(map, *lun).is_some() {
                return Err(format!("LUN {lun} is already mapped there"));
            }
            let mut entry = fresh();
            entry.insert("lun", value(lun_value(*lun)?));
            entry.insert("device", value(device.as_str()));
            if *read_only {
                entry.insert("read_only", value(true));
            }
            map.push(entry);
        }
        Edit::LunModify {
            target: t,
            group,
            lun,
            read_only,
        } => {
            let map = lun_map(root, t, group.as_deref())?;
            let i = lun_position(map, *lun).ok_or_else(|| format!("no LUN {lun} there"))?;
            let entry = map
                .get_mut(i)
                .ok_or_else(|| format!("no LUN {lun} there"))?;
            if *read_only {
                entry.insert("read_only", value(true));
            } else {
                entry.remove("read_only");
            }
        }
        Edit::LunRemove {
            target: t,
            group,
            lun,
        } => {
            let map = lun_map(root, t, group.as_deref())?;
            let i = lun_position(map, *lun).ok_or_else(|| format!("no LUN {lun} there"))?;
            map.remove(i);
        }
        _ => unreachable!("not a LUN edit"),
    }
    Ok(())
}

/// The `chap` table of discovery, a target or a group.
fn edit_chap(root: &mut Table, edit: &Edit) -> Result<(), String> {
    match edit {
        Edit::ChapSet {
            scope,
            user,
            secret,
            mutual_user,
            mutual_secret,
        } => {
            let mut chap = Table::new();
            chap.insert("user", value(user.as_str()));
            chap.insert("secret", value(secret.as_str()));
            if let Some(u) = mutual_user {
                chap.insert("mutual_user", value(u.as_str()));
            }
            if let Some(s) = mutual_secret {
                chap.insert("mutual_secret", value(s.as_str()));
            }
            chap_owner(root, scope)?.insert("chap", Item::Table(chap));
        }
        Edit::ChapClear { scope } => {
            if chap_owner(root, scope)?.remove("chap").is_none() {
                return Err("no CHAP is set there".into());
            }
        }
        _ => unreachable!("not a CHAP edit"),
    }
    Ok(())
}

/// `[[nbd.export]]` tables.
fn edit_nbd_export(root: &mut Table, edit: &Edit) -> Result<(), String> {
    match edit {
        Edit::NbdExportAdd {
            name,
            device,
            read_only,
            allow,
            description,
        } => {
            let exports = tables(nbd_section(root)?, "export")?;
            if position(exports, "name", name).is_some() {
                return Err(format!("NBD export `{name}` already exists"));
            }
            let mut entry = fresh();
            entry.insert("name", value(name.as_str()));
            entry.insert("device", value(device.as_str()));
            if *read_only {
                entry.insert("read_only", value(true));
            }
            if !allow.is_empty() {
                entry.insert("allow", value(allow.iter().collect::<toml_edit::Array>()));
            }
            if let Some(d) = description {
                entry.insert("description", value(d.as_str()));
            }
            exports.push(entry);
        }
        Edit::NbdExportRemove { name } => {
            let exports = tables(nbd_section(root)?, "export")?;
            let i =
                position(exports, "name", name).ok_or_else(|| format!("no NBD export `{name}`"))?;
            exports.remove(i);
        }
        _ => unreachable!("not an NBD export edit"),
    }
    Ok(())
}

/// A value as typed on the command line: `true`/`false`, an integer, a
/// TOML list, a string in double quotes, or else the text itself as a
/// string.
pub fn typed_value(text: &str) -> Value {
    match text {
        "true" => return Value::from(true),
        "false" => return Value::from(false),
        _ => {}
    }
    if let Ok(n) = text.parse::<i64>() {
        return Value::from(n);
    }
    // A list, as TOML writes it: `["a", "b"]`.
    if text.starts_with('[') {
        if let Ok(list @ Value::Array(_)) = text.parse::<Value>() {
            return list;
        }
    }
    let quoted = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text);
    Value::from(quoted)
}

/// The array of tables `key` of `table`, created when absent.
fn tables<'a>(table: &'a mut Table, key: &str) -> Result<&'a mut ArrayOfTables, String> {
    table
        .entry(key)
        .or_insert(Item::ArrayOfTables(ArrayOfTables::new()))
        .as_array_of_tables_mut()
        .ok_or_else(|| format!("`{key}` must be written as [[{key}]] tables to be edited"))
}

fn name_of(t: &Table) -> Option<&str> {
    t.get("name").and_then(Item::as_str)
}

/// Where the table named `name` is; IQNs and names compare without case,
/// as the validation does.
fn find(list: &ArrayOfTables, name: &str) -> Option<usize> {
    list.iter()
        .position(|t| name_of(t).is_some_and(|n| n.eq_ignore_ascii_case(name)))
}

fn find_mut<'a>(list: &'a mut ArrayOfTables, name: &str) -> Option<&'a mut Table> {
    let i = find(list, name)?;
    list.get_mut(i)
}

fn position(list: &ArrayOfTables, key: &str, wanted: &str) -> Option<usize> {
    list.iter()
        .position(|t| t.get(key).and_then(Item::as_str) == Some(wanted))
}

fn lun_position(list: &ArrayOfTables, lun: u64) -> Option<usize> {
    list.iter().position(|t| {
        t.get("lun")
            .and_then(Item::as_integer)
            .is_some_and(|n| u64::try_from(n) == Ok(lun))
    })
}

fn lun_value(lun: u64) -> Result<i64, String> {
    i64::try_from(lun).map_err(|_| format!("LUN {lun} is too large"))
}

fn no_group(target: &str, group: &str) -> String {
    format!("target `{target}` has no group `{group}`")
}

fn target<'a>(root: &'a mut Table, name: &str) -> Result<&'a mut Table, String> {
    find_mut(tables(root, "target")?, name).ok_or_else(|| format!("no target `{name}`"))
}

fn group_of<'a>(root: &'a mut Table, t: &str, group: &str) -> Result<&'a mut Table, String> {
    find_mut(tables(target(root, t)?, "group")?, group).ok_or_else(|| no_group(t, group))
}

/// The `[[...lun]]` list of a target, or of one of its groups.
fn lun_map<'a>(
    root: &'a mut Table,
    t: &str,
    group: Option<&str>,
) -> Result<&'a mut ArrayOfTables, String> {
    match group {
        None => tables(target(root, t)?, "lun"),
        Some(g) => tables(group_of(root, t, g)?, "lun"),
    }
}

fn initiators(group: &mut Table) -> Result<&mut toml_edit::Array, String> {
    group
        .entry("initiators")
        .or_insert(value(toml_edit::Array::new()))
        .as_array_mut()
        .ok_or_else(|| "`initiators` must be an array to be edited".to_string())
}

/// The table that holds the `chap` of `scope`.
fn chap_owner<'a>(root: &'a mut Table, scope: &ChapScope) -> Result<&'a mut Table, String> {
    match scope {
        ChapScope::Discovery => root
            .entry("discovery")
            .or_insert(Item::Table(Table::new()))
            .as_table_mut()
            .ok_or_else(|| "`discovery` must be a table to be edited".to_string()),
        ChapScope::Target { target: t } => target(root, t),
        ChapScope::Group { target: t, group } => group_of(root, t, group),
    }
}

/// A new table, set off from the one before by a blank line.
fn fresh() -> Table {
    let mut t = Table::new();
    t.decor_mut().set_prefix("\n");
    t
}

/// A new `[[device]]` or `[[target]]`: its name, then the settings.
fn named(name: &str, settings: &BTreeMap<String, String>) -> Result<Table, String> {
    let mut t = fresh();
    t.insert("name", value(name));
    for (key, text) in settings {
        if FIXED_KEYS.contains(&key.as_str()) {
            return Err(format!("`{key}` is given as the object's name"));
        }
        if !text.is_empty() {
            t.insert(key, value(typed_value(text)));
        }
    }
    Ok(t)
}

fn modify(t: &mut Table, settings: &BTreeMap<String, String>) -> Result<(), String> {
    if settings.is_empty() {
        return Err("nothing to change: give KEY=VALUE settings".into());
    }
    for (key, text) in settings {
        if FIXED_KEYS.contains(&key.as_str()) {
            return Err(format!(
                "`{key}` cannot change: remove the object and add it anew"
            ));
        }
        match t.get(key) {
            Some(item) if !item.is_value() => {
                return Err(format!("`{key}` is a table; use its own command"))
            }
            _ => {}
        }
        if text.is_empty() {
            t.remove(key);
        } else {
            t.insert(key, value(typed_value(text)));
        }
    }
    Ok(())
}

/// Every mapping of device `name`, as `target T [group G] LUN n`.
fn users_of(root: &Table, name: &str) -> Vec<String> {
    let mut out = Vec::new();
    let Some(targets) = root.get("target").and_then(Item::as_array_of_tables) else {
        return out;
    };
    let mapped = |owner: &Table, label: &str, out: &mut Vec<String>| {
        let Some(luns) = owner.get("lun").and_then(Item::as_array_of_tables) else {
            return;
        };
        for l in luns {
            if l.get("device").and_then(Item::as_str) == Some(name) {
                let n = l.get("lun").and_then(Item::as_integer).unwrap_or(-1);
                out.push(format!("{label} LUN {n}"));
            }
        }
    };
    for t in targets {
        let tname = name_of(t).unwrap_or("?");
        mapped(t, &format!("target {tname}"), &mut out);
        if let Some(groups) = t.get("group").and_then(Item::as_array_of_tables) {
            for g in groups {
                let label = format!("target {tname} group {}", name_of(g).unwrap_or("?"));
                mapped(g, &label, &mut out);
            }
        }
    }
    out
}

/// The devices and pools built on device `name`, each as its kind and
/// name (cache `hybrid`, pool `tank`); none when `text` does not validate.
fn parents_of(text: &str, name: &str) -> Vec<String> {
    let Ok(config) = crate::parse_config(text, "") else {
        return Vec::new();
    };
    let devices = config
        .devices
        .iter()
        .filter(|d| d.spec.children().contains(&name))
        .map(|d| format!("{} `{}`", d.kind(), d.name));
    let pools = config
        .pools
        .iter()
        .filter(|p| p.member_devices().any(|m| m == name))
        .map(|p| format!("pool `{}`", p.name));
    devices.chain(pools).collect()
}

/// The `[nbd]` table, created (listening on its default address) when
/// absent.
fn nbd_section(root: &mut Table) -> Result<&mut Table, String> {
    root.entry("nbd")
        .or_insert(Item::Table(Table::new()))
        .as_table_mut()
        .ok_or_else(|| "`nbd` must be a table to be edited".to_string())
}

/// Every NBD export of device `name`, as `NBD export E`.
fn nbd_exports_of(root: &Table, name: &str) -> Vec<String> {
    let exports = root
        .get("nbd")
        .and_then(Item::as_table)
        .and_then(|n| n.get("export"))
        .and_then(Item::as_array_of_tables);
    exports
        .into_iter()
        .flatten()
        .filter(|e| e.get("device").and_then(Item::as_str) == Some(name))
        .map(|e| format!("NBD export {}", name_of(e).unwrap_or("?")))
        .collect()
}

#[cfg(test)]
#[path = "edit_tests.rs"]
mod tests;
