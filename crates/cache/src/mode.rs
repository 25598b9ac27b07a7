//! What the cache does with reads and writes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Reads are cached; writes go to the backing and update the cache.
    WriteThrough,
    /// Writes land on the cache only and are written back later.
    WriteBack,
    /// Reads are cached; writes go to the backing and invalidate the cache.
    WriteAround,
    /// Nothing new is cached; lines already cached still answer reads
    /// until a write invalidates them.
    None,
}

impl Mode {
    pub const ALL: [Mode; 4] = [
        Mode::WriteThrough,
        Mode::WriteBack,
        Mode::WriteAround,
        Mode::None,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::WriteThrough => "writethrough",
            Mode::WriteBack => "writeback",
            Mode::WriteAround => "writearound",
            Mode::None => "none",
        }
    }

    /// Whether reads that miss bring their data into the cache.
    pub fn admits_reads(self) -> bool {
        self != Mode::None
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Mode, String> {
        Mode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                format!("unknown cache mode {s:?}: writethrough, writeback, writearound or none")
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        for m in Mode::ALL {
            assert_eq!(m.name().parse::<Mode>().unwrap(), m);
            assert_eq!(serde_json::to_string(&m).unwrap(), format!("\"{m}\""));
        }
        assert!("write-back".parse::<Mode>().is_err());
    }
}
