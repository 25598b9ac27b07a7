//! The files `[[device]]` tables name, by what their kinds do with them,
//! for `check-config`: read from the text alone, so they are checked
//! even when validation fails elsewhere.

use std::ops::Range;

use toml_edit::Document;

use super::kind;

/// What a kind does with the file a setting names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileUse {
    /// Opened for writing (for reading when the device is read-only),
    /// created when missing.
    Data,
    /// Opened for reading; must exist.
    Reads,
}

/// One file a device names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceFile {
    /// `device[i].key`.
    pub field: String,
    pub path: String,
    pub how: FileUse,
    pub read_only: bool,
    /// Where the value is written.
    pub span: Range<usize>,
}

/// Every file the `[[device]]` tables of `text` name through their kinds'
/// file settings; none when the text does not parse.
pub fn device_files(text: &str) -> Vec<DeviceFile> {
    let Ok(doc) = Document::parse(text) else {
        return Vec::new();
    };
    let Some(devices) = doc.get("device").and_then(|d| d.as_array_of_tables()) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, table) in devices.iter().enumerate() {
        let Some(k) = table.get("kind").and_then(|k| k.as_str()).and_then(kind) else {
            continue;
        };
        let read_only = table.get("read_only").and_then(|r| r.as_bool()) == Some(true);
        for (key, how) in k.files {
            let Some(value) = table.get(key).and_then(|v| v.as_value()) else {
                continue;
            };
            let (Some(path), Some(span)) = (value.as_str(), value.span()) else {
                continue;
            };
            out.push(DeviceFile {
                field: format!("device[{i}].{key}"),
                path: path.to_string(),
                how: *how,
                read_only,
                span,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_come_from_the_kinds_file_settings() {
        let text =
            "[[device]]\nname = \"a\"\nkind = \"file\"\npath = \"/x/a.img\"\nread_only = true\n\
                    [[device]]\nname = \"m\"\nkind = \"mem\"\nsize = \"1M\"\n\
                    [[device]]\nname = \"b\"\nkind = \"file\"\npath = \"/x/b.img\"\n";
        let files = device_files(text);
        let got: Vec<(&str, &str, FileUse, bool)> = files
            .iter()
            .map(|f| (f.field.as_str(), f.path.as_str(), f.how, f.read_only))
            .collect();
        assert_eq!(
            got,
            [
                ("device[0].path", "/x/a.img", FileUse::Data, true),
                ("device[2].path", "/x/b.img", FileUse::Data, false),
            ]
        );
        assert_eq!(&text[files[0].span.clone()], "\"/x/a.img\"");
    }
}
