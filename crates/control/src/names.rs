//! Syntax checks for iSCSI names (RFC 3720 3.2.6, RFC 3980) and the other
//! identifiers a configuration carries.

/// iSCSI names are at most 223 bytes.
const MAX_ISCSI_NAME: usize = 223;

/// Checks an iSCSI name: `iqn.YYYY-MM.reversed.domain[:anything]`,
/// `eui.` + 16 hex digits or `naa.` + 16 or 32 hex digits.
pub fn check_iscsi_name(name: &str) -> Result<(), String> {
    if name.len() > MAX_ISCSI_NAME {
        return Err(format!(
            "iSCSI names are at most {MAX_ISCSI_NAME} bytes, this one has {}",
            name.len()
        ));
    }
    if let Some(rest) = name.strip_prefix("iqn.") {
        return check_iqn(rest);
    }
    if let Some(hex) = name.strip_prefix("eui.") {
        return check_hex(hex, &[16], "eui.");
    }
    if let Some(hex) = name.strip_prefix("naa.") {
        return check_hex(hex, &[16, 32], "naa.");
    }
    Err(
        "an iSCSI name starts with `iqn.`, `eui.` or `naa.` (e.g. iqn.2026-11.org.example:disk1)"
            .into(),
    )
}

fn check_hex(hex: &str, lengths: &[usize], prefix: &str) -> Result<(), String> {
    if lengths.contains(&hex.len()) && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(());
    }
    let want: Vec<String> = lengths.iter().map(|n| n.to_string()).collect();
    Err(format!(
        "`{prefix}` must be followed by {} hex digits",
        want.join(" or ")
    ))
}

fn check_iqn(rest: &str) -> Result<(), String> {
    const FORM: &str = "expected iqn.YYYY-MM.<reversed domain>[:<name>]";
    if let Some(c) = rest
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || "-.:".contains(*c)))
    {
        let hint = if c.is_ascii_uppercase() {
            " (iSCSI names are lowercase)"
        } else {
            ""
        };
        return Err(format!(
            "character `{c}` is not allowed in an iqn name{hint}"
        ));
    }
    let date = rest.get(..7).ok_or(FORM)?;
    let (year, month) = (&date[..4], &date[4..]);
    let month_ok = month.len() == 3
        && month.starts_with('-')
        && month[1..].bytes().all(|b| b.is_ascii_digit())
        && (1..=12).contains(&month[1..].parse::<u8>().unwrap_or(0));
    if !year.bytes().all(|b| b.is_ascii_digit()) || !month_ok {
        return Err(format!("`{date}` is not a YYYY-MM date; {FORM}"));
    }
    let after = rest[7..].strip_prefix('.').ok_or(FORM)?;
    let (domain, unique) = match after.split_once(':') {
        Some((d, u)) => (d, Some(u)),
        None => (after, None),
    };
    if domain.is_empty()
        || domain
            .split('.')
            .any(|label| label.is_empty() || label.contains(':'))
    {
        return Err(format!("`{domain}` is not a reversed domain name; {FORM}"));
    }
    if unique == Some("") {
        return Err("nothing follows the `:`".into());
    }
    Ok(())
}

/// Device names end up in file names (persistent reservation state), so
/// they stay to a portable set.
pub fn check_device_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err("a device name has 1 to 64 characters".into());
    }
    if name.starts_with('.')
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(
            "a device name uses letters, digits, `-`, `_` and `.` and does not start with `.`"
                .into(),
        );
    }
    Ok(())
}

/// Printable ASCII of at most `max` characters, as INQUIRY fields need.
pub fn check_ascii_field(value: &str, max: usize) -> Result<(), String> {
    if value.is_empty() || value.len() > max {
        return Err(format!("must have 1 to {max} characters"));
    }
    if !value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err("must be printable ASCII".into());
    }
    Ok(())
}

/// An NAA IEEE Registered Extended designator: 32 hex digits starting
/// with 6, optionally prefixed by `0x` or `naa.`.
pub fn parse_naa(text: &str) -> Result<[u8; 16], String> {
    let hex = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("naa."))
        .unwrap_or(text);
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("an NAA designator is 32 hex digits (NAA type 6), e.g. 6001405abcdef0123456789abcdef012".into());
    }
    if !hex.starts_with('6') {
        return Err(
            "only NAA type 6 (IEEE Registered Extended) is supported: the first digit must be 6"
                .into(),
        );
    }
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_iscsi_names() {
        for name in [
            "iqn.2026-11.org.openarray:default",
            "iqn.1992-01.com.example",
            "iqn.2001-04.com.example:storage:diskarrays-sn-a8675309",
            "iqn.2001-04.com.example:storage.tape1.sys1.xyz",
            "eui.02004567A425678D",
            "naa.52004567BA64678D",
            "naa.62004567BA64678D0123456789ABCDEF",
        ] {
            assert_eq!(check_iscsi_name(name), Ok(()), "{name}");
        }
    }

    #[test]
    fn invalid_iscsi_names() {
        for (name, why) in [
            ("target1", "starts with"),
            ("iqn.2026-13.org.example:x", "YYYY-MM"),
            ("iqn.26-11.org.example:x", "YYYY-MM"),
            ("iqn.2026-11", "expected iqn."),
            ("iqn.2026-11.:x", "reversed domain"),
            ("iqn.2026-11.org..example", "reversed domain"),
            ("iqn.2026-11.org.example:", "nothing follows"),
            ("iqn.2026-11.org.Example:x", "lowercase"),
            ("iqn.2026-11.org.example:a b", "not allowed"),
            ("iqn.2026-11.org.example:é", "not allowed"),
            ("eui.0200", "16 hex digits"),
            ("naa.xyz", "16 or 32 hex digits"),
        ] {
            let err = check_iscsi_name(name).unwrap_err();
            assert!(err.contains(why), "{name}: {err}");
        }
        let long = format!("iqn.2026-11.org.example:{}", "a".repeat(200));
        assert!(check_iscsi_name(&long).unwrap_err().contains("223"));
    }

    #[test]
    fn device_names() {
        assert!(check_device_name("lun0").is_ok());
        assert!(check_device_name("db-data_1.v2").is_ok());
        assert!(check_device_name("").is_err());
        assert!(check_device_name("../etc").is_err());
        assert!(check_device_name("a/b").is_err());
        assert!(check_device_name(".hidden").is_err());
    }

    #[test]
    fn naa_designators() {
        let naa = parse_naa("0x6001405abcdef0123456789abcdef012").unwrap();
        assert_eq!(naa[0], 0x60);
        assert_eq!(naa[15], 0x12);
        assert!(parse_naa("5001405abcdef0123456789abcdef012")
            .unwrap_err()
            .contains("type 6"));
        assert!(parse_naa("6001405abc").is_err());
        assert!(parse_naa("6001405abcdef0123456789abcdef01g").is_err());
    }

    #[test]
    fn ascii_fields() {
        assert!(check_ascii_field("VIRTUAL-DISK", 16).is_ok());
        assert!(check_ascii_field("A-VERY-LONG-PRODUCT-ID", 16).is_err());
        assert!(check_ascii_field("tab\there", 16).is_err());
        assert!(check_ascii_field("", 16).is_err());
    }
}
