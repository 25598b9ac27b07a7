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

    pub fn block_size(self) -> u64 {
        match self {
            Pattern::RandRead | Pattern::RandWrite => 4096,
            Pattern::SeqRead | Pattern::SeqWrite => 1 << 20,
        }
    }

    pub fn is_write(self) -> bool {
        matches!(self, Pattern::RandWrite | Pattern::SeqWrite)
    }

    pub fn is_random(self) -> bool {
        matches!(self, Pattern::RandRead | Pattern::RandWrite)
    }

    /// As the report's rows name it.
    pub fn label(self) -> &'static str {
        match self {
            Pattern::RandRead => "4K randread",
            Pattern::RandWrite => "4K randwrite",
            Pattern::SeqRead => "1M seqread",
            Pattern::SeqWrite => "1M seqwrite",
        }
    }
}

/// One cell of the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Point {
    pub pattern: Pattern,
    pub depth: u32,
    pub jobs: u32,
}

/// What one point measured. Latencies are completion latencies.
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

/// The points of patterns × depths, depth varying fastest.
pub fn points(patterns: &[Pattern], depths: &[u32], jobs: u32) -> Vec<Point> {
    patterns
        .iter()
        .flat_map(|&pattern| {
            depths.iter().map(move |&depth| Point {
                pattern,
                depth,
                jobs,
            })
        })
        .collect()
}
