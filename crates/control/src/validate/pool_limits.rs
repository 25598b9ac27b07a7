//! The limits of a `[[pool]]` table: its soft threshold and how far its
//! volumes may over-commit it. Both apply to a running pool.

use pool::SoftThreshold;
use toml::Spanned;

use super::Checker;
use crate::size::parse_size;

/// Largest `max_overcommit`: beyond it a limit means nothing.
const MAX_OVERCOMMIT: f64 = 1000.0;

impl Checker<'_> {
    /// `soft_threshold`: a percentage of the pool ("80%") or the bytes in
    /// use ("800G", or an integer).
    pub(super) fn soft_threshold(
        &mut self,
        v: Option<&Spanned<toml::Value>>,
        field: String,
    ) -> Option<SoftThreshold> {
        let v = v?;
        let parsed = match v.get_ref() {
            toml::Value::String(s) if s.trim().ends_with('%') => {
                let number = s.trim().trim_end_matches('%').trim();
                match number.parse::<u8>() {
                    Ok(p) if (1..=100).contains(&p) => Ok(SoftThreshold::Percent(p)),
                    _ => Err(format!(
                        "{s:?} is not a whole percentage from 1% to 100%"
                    )),
                }
            }
            toml::Value::String(s) => match parse_size(s) {
                Ok(0) => Err("must be more than zero".to_string()),
                Ok(n) => Ok(SoftThreshold::Bytes(n)),
                Err(e) => Err(e),
            },
            toml::Value::Integer(n) if *n > 0 => Ok(SoftThreshold::Bytes(*n as u64)),
            _ => Err(
                "expected a percentage of the pool such as \"80%\", or the space in use such as \"800G\""
                    .to_string(),
            ),
        };
        self.check(&v.span(), || field, parsed)
    }

    /// `max_overcommit`: the most the volumes' sizes may add up to per
    /// byte of pool, kept in hundredths.
    pub(super) fn max_overcommit(
        &mut self,
        v: Option<&Spanned<toml::Value>>,
        field: String,
    ) -> Option<u32> {
        let v = v?;
        let ratio = match v.get_ref() {
            toml::Value::Float(f) => Some(*f),
            toml::Value::Integer(n) => Some(*n as f64),
            _ => None,
        };
        let parsed = match ratio {
            Some(r) if (1.0..=MAX_OVERCOMMIT).contains(&r) => Ok((r * 100.0).round() as u32),
            Some(r) => Err(format!(
                "{r} is outside 1.0..={MAX_OVERCOMMIT} (1.0 allows no over-commitment)"
            )),
            None => {
                Err("expected a number such as 3.0 (volume sizes per byte of pool)".to_string())
            }
        };
        self.check(&v.span(), || field, parsed)
    }
}
