//! `key=value` text data of Login and Text PDUs (RFC 7143 section 6).

/// Key names are at most 63 bytes (RFC 7143 6.1).
pub const MAX_KEY_LEN: usize = 63;
/// Values are at most 255 bytes except a few (CHAP challenges, lists),
/// which may reach 8192.
pub const MAX_VALUE_LEN: usize = 8192;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    #[error("text is not UTF-8")]
    NotUtf8,
    #[error("text item without '='")]
    MissingEquals,
    #[error("empty key name")]
    EmptyKey,
    #[error("key name longer than 63 bytes")]
    KeyTooLong,
    #[error("value longer than 8192 bytes")]
    ValueTooLong,
    #[error("text longer than the {0} bytes allowed")]
    TooLarge(usize),
}

/// Parse NUL-separated `key=value` items. Empty items (padding, a double
/// NUL) are skipped; the last item may lack its terminating NUL.
pub fn parse(data: &[u8]) -> Result<Vec<(String, String)>, TextError> {
    let mut out = Vec::new();
    for item in data.split(|&b| b == 0) {
        if item.is_empty() {
            continue;
        }
        let item = std::str::from_utf8(item).map_err(|_| TextError::NotUtf8)?;
        let (key, value) = item.split_once('=').ok_or(TextError::MissingEquals)?;
        if key.is_empty() {
            return Err(TextError::EmptyKey);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(TextError::KeyTooLong);
        }
        if value.len() > MAX_VALUE_LEN {
            return Err(TextError::ValueTooLong);
        }
        out.push((key.to_string(), value.to_string()));
    }
    Ok(out)
}

/// Encode pairs as `key=value\0...`.
pub fn encode<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(k.as_ref().as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_ref().as_bytes());
        out.push(0);
    }
    out
}

/// Collects text spread over several PDUs (C bit) up to a fixed limit.
#[derive(Debug, Default)]
pub struct Accumulator {
    buf: Vec<u8>,
}

impl Accumulator {
    pub fn push(&mut self, data: &[u8], limit: usize) -> Result<(), TextError> {
        if self.buf.len() + data.len() > limit {
            return Err(TextError::TooLarge(limit));
        }
        self.buf.extend_from_slice(data);
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Take everything collected so far.
    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_encode() {
        let pairs = parse(b"InitiatorName=iqn.x\0SessionType=Normal\0\0\0").unwrap();
        assert_eq!(
            pairs,
            vec![
                ("InitiatorName".into(), "iqn.x".into()),
                ("SessionType".into(), "Normal".into())
            ]
        );
        assert_eq!(
            encode(&pairs),
            b"InitiatorName=iqn.x\0SessionType=Normal\0".to_vec()
        );
    }

    #[test]
    fn value_may_contain_equals_and_be_empty() {
        assert_eq!(
            parse(b"A=b=c\0B=\0").unwrap(),
            vec![("A".into(), "b=c".into()), ("B".into(), "".into())]
        );
    }

    #[test]
    fn last_item_without_nul() {
        assert_eq!(parse(b"A=1").unwrap(), vec![("A".into(), "1".into())]);
    }

    #[test]
    fn errors() {
        assert_eq!(parse(b"novalue\0"), Err(TextError::MissingEquals));
        assert_eq!(parse(b"=x\0"), Err(TextError::EmptyKey));
        assert_eq!(parse(&[0xff, b'=', b'1']), Err(TextError::NotUtf8));
        let long_key = format!("{}=1", "k".repeat(64));
        assert_eq!(parse(long_key.as_bytes()), Err(TextError::KeyTooLong));
    }

    #[test]
    fn accumulator_is_bounded() {
        let mut acc = Accumulator::default();
        acc.push(b"abc", 5).unwrap();
        assert_eq!(acc.push(b"def", 5), Err(TextError::TooLarge(5)));
        assert_eq!(acc.take(), b"abc".to_vec());
        assert!(acc.is_empty());
    }
}
