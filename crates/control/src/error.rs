//! Configuration errors that say where: file, line:column, field, reason.

use std::fmt;
use std::ops::Range;

/// A position in the configuration text, 1-based.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    pub line: usize,
    pub column: usize,
}

impl Location {
    /// The line and column (in characters) of byte `offset` in `text`.
    pub fn of(text: &str, offset: usize) -> Location {
        let mut offset = offset.min(text.len());
        while !text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before[line_start..].chars().count() + 1;
        Location { line, column }
    }

    pub fn of_span(text: &str, span: &Range<usize>) -> Location {
        Location::of(text, span.start)
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// One thing wrong with a configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issue {
    pub location: Option<Location>,
    /// Field path such as `device[1].size`; empty when the problem is not
    /// about one field (a syntax error, an unreadable file).
    pub field: String,
    pub reason: String,
}

/// Everything wrong with one configuration file; never empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The file name, or a description such as `<built-in default>`.
    pub origin: String,
    pub issues: Vec<Issue>,
}

impl ConfigError {
    pub fn new(origin: &str, issues: Vec<Issue>) -> ConfigError {
        ConfigError {
            origin: origin.to_string(),
            issues,
        }
    }

    pub fn single(
        origin: &str,
        location: Option<Location>,
        field: &str,
        reason: impl Into<String>,
    ) -> ConfigError {
        ConfigError::new(
            origin,
            vec![Issue {
                location,
                field: field.to_string(),
                reason: reason.into(),
            }],
        )
    }
}

impl fmt::Display for ConfigError {
    /// One line per issue: `file:line:col: field: reason`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, issue) in self.issues.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}", self.origin)?;
            if let Some(at) = issue.location {
                write!(f, ":{at}")?;
            }
            if !issue.field.is_empty() {
                write!(f, ": {}", issue.field)?;
            }
            write!(f, ": {}", issue.reason)?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_count_lines_and_characters() {
        let text = "a = 1\nbé = 2\n";
        assert_eq!(Location::of(text, 0), Location { line: 1, column: 1 });
        assert_eq!(Location::of(text, 6), Location { line: 2, column: 1 });
        // 'é' is two bytes but one column.
        assert_eq!(Location::of(text, 9), Location { line: 2, column: 3 });
        assert_eq!(Location::of(text, 1000), Location { line: 3, column: 1 });
    }

    #[test]
    fn display_names_file_position_field_and_reason() {
        let err = ConfigError::new(
            "a.toml",
            vec![
                Issue {
                    location: Some(Location { line: 3, column: 8 }),
                    field: "device[0].size".into(),
                    reason: "bad".into(),
                },
                Issue {
                    location: None,
                    field: String::new(),
                    reason: "unreadable".into(),
                },
            ],
        );
        assert_eq!(
            err.to_string(),
            "a.toml:3:8: device[0].size: bad\na.toml: unreadable"
        );
    }
}
