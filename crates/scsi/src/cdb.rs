//! Bounds-checked big-endian field access for CDBs and parameter lists.
//!
//! Every byte we read comes from the network, so these helpers return zero
//! for bytes beyond the buffer instead of panicking; callers that need a
//! field to be present check the length first.

pub fn u8_at(b: &[u8], at: usize) -> u8 {
    b.get(at).copied().unwrap_or(0)
}

pub fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([u8_at(b, at), u8_at(b, at + 1)])
}

pub fn be24(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, u8_at(b, at), u8_at(b, at + 1), u8_at(b, at + 2)])
}

pub fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([
        u8_at(b, at),
        u8_at(b, at + 1),
        u8_at(b, at + 2),
        u8_at(b, at + 3),
    ])
}

pub fn be64(b: &[u8], at: usize) -> u64 {
    (u64::from(be32(b, at)) << 32) | u64::from(be32(b, at + 4))
}

pub fn put16(b: &mut [u8], at: usize, v: u16) {
    if let Some(dst) = b.get_mut(at..at + 2) {
        dst.copy_from_slice(&v.to_be_bytes());
    }
}

pub fn put32(b: &mut [u8], at: usize, v: u32) {
    if let Some(dst) = b.get_mut(at..at + 4) {
        dst.copy_from_slice(&v.to_be_bytes());
    }
}

pub fn put64(b: &mut [u8], at: usize, v: u64) {
    if let Some(dst) = b.get_mut(at..at + 8) {
        dst.copy_from_slice(&v.to_be_bytes());
    }
}

/// Truncates `data` to the allocation length of the CDB: the device server
/// transfers at most that many bytes (SPC-4 4.2.5.6).
pub fn truncate(mut data: Vec<u8>, alloc_len: usize) -> Vec<u8> {
    data.truncate(alloc_len);
    data
}

/// Copies `s` into a fixed-width, space-padded ASCII field.
pub fn put_ascii(dst: &mut [u8], s: &str) {
    dst.fill(b' ');
    for (d, c) in dst.iter_mut().zip(s.bytes()) {
        *d = if (0x20..=0x7E).contains(&c) { c } else { b' ' };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_past_the_end_are_zero() {
        let b = [0x12, 0x34];
        assert_eq!(be16(&b, 0), 0x1234);
        assert_eq!(be16(&b, 1), 0x3400);
        assert_eq!(be32(&b, 0), 0x1234_0000);
        assert_eq!(be64(&b, 10), 0);
        assert_eq!(u8_at(&b, usize::MAX), 0);
    }

    #[test]
    fn writes_past_the_end_are_ignored() {
        let mut b = [0u8; 3];
        put16(&mut b, 2, 0xFFFF);
        assert_eq!(b, [0, 0, 0]);
        put16(&mut b, 1, 0xABCD);
        assert_eq!(b, [0, 0xAB, 0xCD]);
    }

    #[test]
    fn ascii_fields_are_padded_and_sanitised() {
        let mut b = [0u8; 8];
        put_ascii(&mut b, "AB\u{7f}C");
        assert_eq!(&b, b"AB C    ");
    }
}
