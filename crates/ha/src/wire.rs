//! Frames on the link and the bounded reading of their payloads.
//!
//! A frame is a kind byte, the payload's length (u32, little-endian), a
//! CRC32C of the kind and the payload, then the payload. The reader
//! refuses a length above the bound it was given before reading any of
//! the payload, so a peer can make it hold at most one bounded frame.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt};

pub const HEADER: usize = 9;

/// A frame read from the link.
#[derive(Debug, PartialEq, Eq)]
pub struct Frame {
    pub kind: u8,
    pub payload: Vec<u8>,
}

fn checksum(kind: u8, payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&[kind]), payload)
}

/// The bytes of a frame of `kind` carrying `payload`.
pub fn encode(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(HEADER + payload.len());
    b.push(kind);
    b.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    b.extend_from_slice(&checksum(kind, payload).to_le_bytes());
    b.extend_from_slice(payload);
    b
}

pub fn malformed(why: impl Into<String>) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("malformed frame: {}", why.into()),
    )
}

/// Reads one frame whose payload is at most `max` bytes.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, max: usize) -> io::Result<Frame> {
    let mut head = [0u8; HEADER];
    r.read_exact(&mut head).await?;
    let kind = head[0];
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let crc = u32::from_le_bytes([head[5], head[6], head[7], head[8]]);
    if len > max {
        return Err(malformed(format!(
            "a payload of {len} bytes (at most {max} here)"
        )));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    if checksum(kind, &payload) != crc {
        return Err(malformed("checksum mismatch"));
    }
    Ok(Frame { kind, payload })
}

/// Reads the fields of a payload; every read past its end is an error.
pub struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8]) -> Self {
        Reader { b }
    }

    pub fn bytes(&mut self, n: usize) -> io::Result<&'a [u8]> {
        if self.b.len() < n {
            return Err(malformed("payload cut short"));
        }
        let (head, tail) = self.b.split_at(n);
        self.b = tail;
        Ok(head)
    }

    pub fn array<const N: usize>(&mut self) -> io::Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    pub fn u8(&mut self) -> io::Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    pub fn u16(&mut self) -> io::Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub fn u32(&mut self) -> io::Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> io::Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A string with a u16 length before it.
    pub fn str(&mut self) -> io::Result<&'a str> {
        let n = self.u16()? as usize;
        std::str::from_utf8(self.bytes(n)?).map_err(|_| malformed("a name that is not UTF-8"))
    }

    /// Bytes with a u32 length before them.
    pub fn blob(&mut self) -> io::Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.bytes(n)
    }

    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.b)
    }

    /// Fails when bytes are left over: a payload longer than its fields.
    pub fn end(&self) -> io::Result<()> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(malformed("bytes after the last field"))
        }
    }
}

pub fn put_str(b: &mut Vec<u8>, s: &str) {
    let s = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
    b.extend_from_slice(&(s.len() as u16).to_le_bytes());
    b.extend_from_slice(s);
}

pub fn put_blob(b: &mut Vec<u8>, data: &[u8]) {
    b.extend_from_slice(&(data.len() as u32).to_le_bytes());
    b.extend_from_slice(data);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_damage_is_refused() {
        let f = encode(7, b"hello");
        let got = read_frame(&mut &f[..], 100).await.unwrap();
        assert_eq!(
            got,
            Frame {
                kind: 7,
                payload: b"hello".to_vec()
            }
        );
        let mut bad = f.clone();
        bad[HEADER] ^= 1;
        let e = read_frame(&mut &bad[..], 100).await.unwrap_err();
        assert!(e.to_string().contains("checksum"), "{e}");
        let mut kind = f.clone();
        kind[0] = 8;
        assert!(read_frame(&mut &kind[..], 100).await.is_err());
        let e = read_frame(&mut &f[..], 4).await.unwrap_err();
        assert!(e.to_string().contains("at most 4"), "{e}");
        assert!(read_frame(&mut &f[..6], 100).await.is_err());
    }

    #[test]
    fn reading_past_a_payload_is_an_error_not_a_panic() {
        let mut b = Vec::new();
        put_str(&mut b, "node-a");
        put_blob(&mut b, &[1, 2, 3]);
        let mut r = Reader::new(&b);
        assert_eq!(r.str().unwrap(), "node-a");
        assert_eq!(r.blob().unwrap(), &[1, 2, 3]);
        r.end().unwrap();
        assert!(r.u64().is_err());
        let mut r = Reader::new(&[200, 0, b'x']);
        assert!(r.str().is_err());
        let mut r = Reader::new(&[2, 0, 0xff, 0xfe]);
        assert!(r.str().is_err());
        let mut r = Reader::new(&[1, 2]);
        r.u8().unwrap();
        assert!(r.end().is_err());
    }
}
