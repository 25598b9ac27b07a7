//! What a matrix measures: its patterns and points, and what one point
//! yields.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    RandRead,
    RandWrite,
    SeqRead,
    SeqWrite,
}

impl Pattern {
    pub const ALL: [Pattern; 4] = [
        Pattern::RandRead,
        Pattern::RandWrite,
        Pattern::SeqRead,
        Pattern::SeqWrite,
    ];

    pub fn parse(name: &str) -> Result<Pattern> {
        Ok(match name {
            "randread" => Pattern::RandRead,
            "randwrite" => Pattern::RandWrite,
            "read" | "seqread" => Pattern::SeqRead,
            "write" | "seqwrite" => Pattern::SeqWrite,
            _ => bail!("unknown pattern `{name}` (randread, randwrite, seqread, seqwrite)"),
        })
    }

    /// fio's `rw=` name.
    pub fn fio_rw(self) -> &'static str {
        match self {
            Pattern::RandRead => "randread",
            Pattern::RandWrite => "randwrite",
            Pattern::SeqRead => "read",
            Pattern::SeqWrite => "write",
        }
    }

    /// The block size of the pattern unless the matrix says otherwise.
    pub fn default_block_size(self) -> u64 {
        match self {
            Pattern::RandRead | Pattern::RandWrite => 4096,
            Pattern::SeqRead | Pattern::SeqWrite => DEFAULT_SEQ_BLOCK_SIZE,
        }
    }

    pub fn is_write(self) -> bool {
        matches!(self, Pattern::RandWrite | Pattern::SeqWrite)
    }

    pub fn is_random(self) -> bool {
        matches!(self, Pattern::RandRead | Pattern::RandWrite)
    }

    pub fn name(self) -> &'static str {
        match self {
            Pattern::RandRead => "randread",
            Pattern::RandWrite => "randwrite",
            Pattern::SeqRead => "seqread",
            Pattern::SeqWrite => "seqwrite",
        }
    }
}

/// 1 MiB: what `openarray bench` reads and writes sequentially by default.
pub const DEFAULT_SEQ_BLOCK_SIZE: u64 = 1 << 20;

/// One cell of the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Point {
    pub pattern: Pattern,
    pub depth: u32,
    pub jobs: u32,
    /// Bytes per I/O.
    pub block_size: u64,
}

impl Point {
    /// As the report's rows name it: `4K randread`, `1M seqread`.
    pub fn label(&self) -> String {
        format!("{} {}", size_label(self.block_size), self.pattern.name())
    }
}

/// `4K`, `1M`, `4M`: a block size as fio's users write it.
pub fn size_label(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")];
    UNITS
        .iter()
        .find(|(unit, _)| bytes >= *unit && bytes.is_multiple_of(*unit))
        .map_or_else(
            || bytes.to_string(),
            |(unit, s)| format!("{}{s}", bytes / unit),
        )
}

/// What one point measured. Latencies run from submission to completion.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    pub iops: f64,
    pub bytes_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    /// Client CPU time over wall time, in percent of one CPU.
    pub client_cpu_pct: f64,
    pub ios: u64,
}

impl Measured {
    pub fn mb_per_sec(&self) -> f64 {
        self.bytes_per_sec / 1e6
    }
}

/// The points of patterns × depths, depth varying fastest; sequential
/// ones move `seq_block_size` bytes per I/O.
pub fn points(patterns: &[Pattern], depths: &[u32], jobs: u32, seq_block_size: u64) -> Vec<Point> {
    patterns
        .iter()
        .flat_map(|&pattern| {
            let block_size = if pattern.is_random() {
                pattern.default_block_size()
            } else {
                seq_block_size
            };
            depths.iter().map(move |&depth| Point {
                pattern,
                depth,
                jobs,
                block_size,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_name_the_block_size() {
        let p = points(&[Pattern::RandRead, Pattern::SeqWrite], &[1], 1, 4 << 20);
        let labels: Vec<String> = p.iter().map(Point::label).collect();
        assert_eq!(labels, ["4K randread", "4M seqwrite"]);
        assert_eq!(size_label(1 << 20), "1M");
        assert_eq!(size_label(1536), "1536");
    }
}
