//! Durations of `[daemon]`, written as a number and a unit: `500ms`,
//! `2s`, `5m`, `1h`.

use std::time::Duration;

/// Parses `text`; a bare number is refused so the unit is never guessed.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("`{text}` needs a unit: ms, s, m or h (e.g. \"15s\")"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a number followed by ms, s, m or h"))?;
    let millis_per = match unit.trim() {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        other => return Err(format!("unknown unit `{other}` (use ms, s, m or h)")),
    };
    n.checked_mul(millis_per)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("`{text}` is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_required_and_understood() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration(" 5 m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("15").unwrap_err().contains("needs a unit"));
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("2d").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("-2s").is_err());
        assert!(parse_duration("99999999999999999999h").is_err());
        assert!(parse_duration("18446744073709551615h").is_err());
    }
}
