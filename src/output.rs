//! What the listing commands print (`--json`, `--bytes`) and the exit
//! status every command shares: 0 done, 1 the thing checked is unhealthy,
//! differs or was refused, 2 a usage error or no daemon to ask.

use std::process::ExitCode;

use clap::Args;
use serde_json::Value;

/// Exit status of a check that found a problem, a diff that found drift,
/// or a request the daemon refused.
pub const EXIT_PROBLEM: u8 = 1;
/// Exit status of a bad command line or a daemon that cannot be reached
/// (clap exits with 2 on usage errors itself).
pub const EXIT_USAGE: u8 = 2;

/// Exit status 2 beyond clap's own usage errors: the daemon could not be
/// reached (or answered no HTTP), or a file argument cannot be read. Kept
/// apart from refusals, so scripts can tell "not running" from "said no".
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// A [`Usage`] error unless the file argument `path` is there to read.
pub fn require_file(path: &std::path::Path) -> anyhow::Result<()> {
    std::fs::metadata(path)
        .map(drop)
        .map_err(|e| Usage(format!("cannot read {}: {e}", path.display())).into())
}

/// The configuration file `path`; an unreadable file is [`Usage`],
/// a file with problems an error of its own (exit status 1).
pub fn load_config(path: &std::path::Path) -> anyhow::Result<control::Config> {
    require_file(path)?;
    control::load_config(path).map_err(|e| anyhow::anyhow!("{e}"))
}

/// The exit status an error ends a command with.
pub fn exit_code(err: &anyhow::Error) -> ExitCode {
    let usage = err.chain().any(|e| e.is::<Usage>());
    ExitCode::from(if usage { EXIT_USAGE } else { EXIT_PROBLEM })
}

/// Prints the error and ends with its exit status.
pub fn fail(err: &anyhow::Error) -> ExitCode {
    eprintln!("openarray: {err:#}");
    exit_code(err)
}

/// How list and show commands print.
#[derive(Args, Clone, Copy, Debug, Default)]
pub struct Format {
    /// Print JSON (one document) instead of text, for scripts.
    #[arg(long)]
    pub json: bool,
    /// Sizes as exact byte counts instead of 1.5G-style figures.
    #[arg(long)]
    pub bytes: bool,
}

impl Format {
    /// A size as this format writes it in text.
    pub fn size(&self, bytes: u64) -> String {
        if self.bytes {
            bytes.to_string()
        } else {
            human(bytes)
        }
    }

    /// A size field of a JSON answer; `-` when absent.
    pub fn size_of(&self, v: &Value) -> String {
        v.as_u64().map_or_else(|| "-".into(), |b| self.size(b))
    }
}

/// Prints `value` as indented JSON.
pub fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    );
}

/// Bytes in the units the configuration takes (1G = 2^30): exact where
/// whole (`16G`), else one decimal (`1.5G`); below 1K, `512B`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["K", "M", "G", "T", "P", "E"];
    if bytes < 1024 {
        return format!("{bytes}B");
    }
    let mut unit = 0;
    let mut scale = 1024u64;
    while unit + 1 < UNITS.len() && bytes / scale >= 1024 {
        unit += 1;
        scale *= 1024;
    }
    if bytes.is_multiple_of(scale) {
        format!("{}{}", bytes / scale, UNITS[unit])
    } else {
        format!("{:.1}{}", bytes as f64 / scale as f64, UNITS[unit])
    }
}

/// A TOML fragment (what `show` prints) as JSON.
pub fn toml_to_json(text: &str) -> anyhow::Result<Value> {
    let table: toml::Table = toml::from_str(text)?;
    Ok(serde_json::to_value(table)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes_use_binary_units() {
        assert_eq!(human(0), "0B");
        assert_eq!(human(512), "512B");
        assert_eq!(human(1024), "1K");
        assert_eq!(human(16 << 30), "16G");
        assert_eq!(human(3 << 29), "1.5G");
        assert_eq!(human((1 << 20) + 1), "1.0M");
        assert_eq!(human(u64::MAX), "16.0E");
    }

    #[test]
    fn bytes_flag_prints_exact_counts() {
        let f = Format {
            json: false,
            bytes: true,
        };
        assert_eq!(f.size(16 << 30), "17179869184");
        assert_eq!(f.size_of(&Value::Null), "-");
        assert_eq!(Format::default().size_of(&Value::from(4096u64)), "4K");
    }

    #[test]
    fn unreachable_anywhere_in_the_chain_is_a_usage_error() {
        let e = anyhow::Error::new(Usage("no daemon".into())).context("pool list");
        assert_eq!(exit_code(&e), ExitCode::from(EXIT_USAGE));
        let refused = anyhow::anyhow!("no such pool");
        assert_eq!(exit_code(&refused), ExitCode::from(EXIT_PROBLEM));
    }

    #[test]
    fn toml_fragments_become_objects() {
        let v = toml_to_json("[[device]]\nname = \"d\"\nsize = \"1G\"\n").unwrap();
        assert_eq!(v["device"][0]["name"], "d");
        assert_eq!(v["device"][0]["size"], "1G");
    }
}
