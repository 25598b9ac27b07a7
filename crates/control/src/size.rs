//! Byte sizes written as `1G`, `512M`, `1TiB`, `4096` or a plain integer.
//! Units are binary multiples: K = 1024.

pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    if number.is_empty() {
        return Err(format!(
            "`{text}` is not a size (examples: 1G, 512M, 1048576)"
        ));
    }
    let shift = match unit.trim_start() {
        "" | "B" => 0,
        "K" | "k" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        "T" | "TiB" => 40,
        "P" | "PiB" => 50,
        other => {
            return Err(format!(
                "unknown size unit `{other}` (use K, M, G, T, P or KiB, MiB, GiB, TiB, PiB; all binary multiples)"
            ))
        }
    };
    let value: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is too large"))?;
    value
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("`{text}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_units_and_plain_bytes() {
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("4 KiB"), Ok(4096));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size(" 10B "), Ok(10));
    }

    #[test]
    fn rejects_nonsense() {
        assert!(parse_size("").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("1GB").unwrap_err().contains("unit `GB`"));
        assert!(parse_size("1.5G").is_err());
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("99999999P").unwrap_err().contains("too large"));
        assert!(parse_size("99999999999999999999999")
            .unwrap_err()
            .contains("too large"));
    }
}
