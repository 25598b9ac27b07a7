//! Maps a byte offset in a TOML document to the field path there, e.g.
//! `target[0].lun[2].device`, so that errors serde reports by position
//! also say which field they are about.

use std::ops::Range;

use toml_edit::{Document, Item, Table, Value};

#[derive(Default)]
struct Finder {
    offset: usize,
    /// Smallest span seen so far that contains `offset`, and its path.
    best: Option<(usize, String)>,
}

impl Finder {
    fn consider(&mut self, span: Option<Range<usize>>, path: &str) {
        let Some(span) = span else { return };
        let contains = span.start <= self.offset
            && (self.offset < span.end || span.is_empty() && self.offset == span.start);
        if !contains {
            return;
        }
        let len = span.len();
        if self.best.as_ref().is_none_or(|(best, _)| len <= *best) {
            self.best = Some((len, path.to_string()));
        }
    }

    fn table(&mut self, table: &Table, path: &str) {
        for (key, item) in table.iter() {
            let here = join(path, key);
            self.consider(table.key(key).and_then(|k| k.span()), &here);
            self.item(item, &here);
        }
    }

    fn item(&mut self, item: &Item, path: &str) {
        match item {
            Item::Table(t) => {
                self.consider(t.span(), path);
                self.table(t, path);
            }
            Item::ArrayOfTables(tables) => {
                for (i, t) in tables.iter().enumerate() {
                    let here = format!("{path}[{i}]");
                    self.consider(t.span(), &here);
                    self.table(t, &here);
                }
            }
            Item::Value(v) => self.value(v, path),
            Item::None => {}
        }
    }

    fn value(&mut self, value: &Value, path: &str) {
        self.consider(value.span(), path);
        match value {
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    self.value(v, &format!("{path}[{i}]"));
                }
            }
            Value::InlineTable(t) => {
                for (key, v) in t.iter() {
                    let here = join(path, key);
                    self.consider(t.key(key).and_then(|k| k.span()), &here);
                    self.value(v, &here);
                }
            }
            _ => {}
        }
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// The path of the innermost key, value or table at `offset`; empty when
/// the text does not parse or nothing is there.
pub fn field_at(text: &str, offset: usize) -> String {
    let Ok(doc) = Document::parse(text) else {
        return String::new();
    };
    let mut finder = Finder { offset, best: None };
    finder.table(doc.as_table(), "");
    finder.best.map(|(_, path)| path).unwrap_or_default()
}

/// Where the field at `path` (`nvmf.subsystem[0].nqn`) is written: its
/// key, or the table or value when it has no key of its own.
pub fn span_of(text: &str, path: &str) -> Option<Range<usize>> {
    let doc = Document::parse(text).ok()?;
    let mut node = Node::Table(doc.as_table());
    let mut span = None;
    for part in path.split('.') {
        let (key, indexes) = part.split_at(part.find('[').unwrap_or(part.len()));
        let (key_span, next) = node.child(key)?;
        span = key_span.or_else(|| next.span());
        node = next;
        for index in indexes.split(['[', ']']).filter(|s| !s.is_empty()) {
            node = node.index(index.parse().ok()?)?;
            span = node.span().or(span);
        }
    }
    span
}

/// A place in a parsed document, to walk a field path down.
#[derive(Clone, Copy)]
enum Node<'a> {
    Table(&'a Table),
    Item(&'a Item),
    Value(&'a Value),
}

impl<'a> Node<'a> {
    fn span(self) -> Option<Range<usize>> {
        match self {
            Node::Table(t) => t.span(),
            Node::Item(i) => i.span(),
            Node::Value(v) => v.span(),
        }
    }

    /// The key's span and the value of `key` in a table here.
    fn child(self, key: &str) -> Option<(Option<Range<usize>>, Node<'a>)> {
        let (k, item) = match self {
            Node::Table(t) => t.get_key_value(key)?,
            Node::Item(i) => i.as_table_like()?.get_key_value(key)?,
            Node::Value(v) => {
                let t = v.as_inline_table()?;
                return Some((t.key(key).and_then(|k| k.span()), Node::Value(t.get(key)?)));
            }
        };
        Some((k.span(), Node::Item(item)))
    }

    fn index(self, i: usize) -> Option<Node<'a>> {
        match self {
            Node::Item(Item::ArrayOfTables(a)) => a.get(i).map(Node::Table),
            Node::Item(Item::Value(Value::Array(a))) | Node::Value(Value::Array(a)) => {
                a.get(i).map(Node::Value)
            }
            _ => None,
        }
    }
}

/// Where key `key` of the `index`th `[[array]]` table is written.
pub fn key_span(text: &str, array: &str, index: usize, key: &str) -> Option<Range<usize>> {
    let doc = Document::parse(text).ok()?;
    let table = doc.get(array)?.as_array_of_tables()?.get(index)?;
    table.key(key)?.span()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "[daemon]\nstate_dir = \"/x\"\n\n[[device]]\nname = \"a\"\n[[device]]\nsize = 512\n\n[[target]]\nname = \"t\"\nlun = [{lun = 1, device = \"x\"}]\n";

    fn at(needle: &str) -> String {
        field_at(TEXT, TEXT.find(needle).unwrap())
    }

    #[test]
    fn finds_keys_values_and_tables() {
        assert_eq!(at("state_dir"), "daemon.state_dir");
        assert_eq!(at("\"/x\""), "daemon.state_dir");
        assert_eq!(at("size"), "device[1].size");
        assert_eq!(at("[[device]]\nsize"), "device[1]");
        assert_eq!(at("device = \"x\""), "target[0].lun[0].device");
        assert_eq!(at("1, device"), "target[0].lun[0].lun");
    }

    #[test]
    fn finds_the_span_of_a_path() {
        let text = "[toy]\nlisten = [\"a\", \"b\"]\n[[toy.sub]]\nnqn = \"x\"\n[[toy.sub]]\nnqn = \"y\"\nns = [{nsid = 1}]\n";
        let line =
            |path: &str| span_of(text, path).map(|s| crate::Location::of_span(text, &s).line);
        assert_eq!(line("toy"), Some(1));
        assert_eq!(line("toy.listen[1]"), Some(2));
        assert_eq!(line("toy.sub[0].nqn"), Some(4));
        assert_eq!(line("toy.sub[1].nqn"), Some(6));
        assert_eq!(line("toy.sub[1].ns[0].nsid"), Some(7));
        assert_eq!(line("toy.sub[2]"), None);
        assert_eq!(line("nothing"), None);
    }

    #[test]
    fn unparsable_text_has_no_path() {
        assert_eq!(field_at("[[device]\n", 3), "");
    }
}
