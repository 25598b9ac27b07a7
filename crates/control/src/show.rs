//! One object of the configuration text as TOML, for `openarray device
//! show` and `target show`: the object's tables as written, CHAP secrets
//! masked.

use toml_edit::{ArrayOfTables, DocumentMut, Item, Table};

/// What a masked secret reads as.
pub const MASK: &str = "********";

/// The `[[device]]` or `[[target]]` (`kind`) named `name` in `text`, with
/// every `secret` and `mutual_secret` replaced by [`MASK`].
pub fn show_object(text: &str, kind: &str, name: &str) -> Result<String, String> {
    let doc: DocumentMut = text
        .parse()
        .map_err(|e| format!("the running configuration does not parse: {e}"))?;
    let found = doc
        .get(kind)
        .and_then(Item::as_array_of_tables)
        .and_then(|list| {
            list.iter().find(|t| {
                t.get("name")
                    .and_then(Item::as_str)
                    .is_some_and(|n| n.eq_ignore_ascii_case(name))
            })
        })
        .ok_or_else(|| format!("no {kind} `{name}`"))?;
    let mut table = found.clone();
    mask_secrets(&mut table);
    table.decor_mut().set_prefix("");
    let mut list = ArrayOfTables::new();
    list.push(table);
    let mut out = DocumentMut::new();
    out.insert(kind, Item::ArrayOfTables(list));
    Ok(out.to_string())
}

fn mask_secrets(table: &mut Table) {
    for (key, item) in table.iter_mut() {
        if key == "secret" || key == "mutual_secret" {
            if item.is_value() {
                *item = toml_edit::value(MASK);
            }
        } else if let Some(t) = item.as_table_mut() {
            mask_secrets(t);
        } else if let Some(t) = item.as_inline_table_mut() {
            mask_inline(t);
        } else if let Some(list) = item.as_array_of_tables_mut() {
            list.iter_mut().for_each(mask_secrets);
        }
    }
}

/// The same for `chap = { user = ..., secret = ... }`.
fn mask_inline(table: &mut toml_edit::InlineTable) {
    for (key, v) in table.iter_mut() {
        if key == "secret" || key == "mutual_secret" {
            let decor = v.decor().clone();
            *v = toml_edit::Value::from(MASK);
            *v.decor_mut() = decor;
        } else if let Some(t) = v.as_inline_table_mut() {
            mask_inline(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"[[device]]
name = "a"
kind = "mem"

[[target]]
name = "iqn.2026-11.org.test:one"
[target.chap]
user = "u"
secret = "0123456789abcdef"
[[target.group]]
name = "g"
initiators = ["iqn.2026-11.org.test:h"]
chap = { user = "g", secret = "fedcba9876543210", mutual_user = "t", mutual_secret = "0123456789abcdef" }
[[target.group.lun]]
lun = 1
device = "a"

[[target]]
name = "iqn.2026-11.org.test:two"
"#;

    #[test]
    fn shows_one_object_without_its_secrets() {
        let shown = show_object(TEXT, "target", "IQN.2026-11.org.test:one").unwrap();
        assert!(
            shown.starts_with("[[target]]\nname = \"iqn.2026-11.org.test:one\""),
            "{shown}"
        );
        assert!(shown.contains("[[target.group.lun]]\nlun = 1"), "{shown}");
        assert!(!shown.contains("0123456789abcdef"), "{shown}");
        assert!(!shown.contains("fedcba9876543210"), "{shown}");
        assert!(!shown.contains(":two"), "{shown}");
        assert_eq!(
            show_object(TEXT, "device", "a").unwrap(),
            "[[device]]\nname = \"a\"\nkind = \"mem\"\n"
        );
        assert_eq!(
            show_object(TEXT, "device", "b").unwrap_err(),
            "no device `b`"
        );
    }
}
