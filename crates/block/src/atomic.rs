//! Writes that are all or nothing across a crash.
//!
//! A device that can write a range so that after a power cut the range
//! reads either entirely as before or entirely as written says so with
//! [`BlockDevice::atomic_writes`] and does it in
//! [`BlockDevice::write_atomic`]. Against concurrent commands the caller
//! keeps other I/O off the range (the SCSI layer's range lock); the device
//! answers for crashes only.

use std::io;

/// The atomic writes a device takes: `max_bytes` at most, starting at a
/// multiple of `alignment` and a multiple of `granularity` long (0: any
/// offset, any length). All three are in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtomicWrites {
    pub max_bytes: u64,
    pub alignment: u64,
    pub granularity: u64,
}

impl AtomicWrites {
    /// Any offset and any length up to `max_bytes`.
    pub const fn up_to(max_bytes: u64) -> AtomicWrites {
        AtomicWrites {
            max_bytes,
            alignment: 0,
            granularity: 0,
        }
    }

    /// Whether `len` bytes at `offset` are an atomic write these limits
    /// allow.
    pub fn allows(&self, offset: u64, len: u64) -> bool {
        len <= self.max_bytes
            && (self.alignment == 0 || offset.is_multiple_of(self.alignment))
            && (self.granularity == 0 || len.is_multiple_of(self.granularity))
    }

    /// The error for a write these limits do not allow.
    pub fn refusal(&self, offset: u64, len: u64) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "an atomic write of {len} bytes at {offset} is outside the device's limits \
                 (at most {} bytes, aligned to {}, a multiple of {})",
                self.max_bytes, self.alignment, self.granularity
            ),
        )
    }
}

/// What [`BlockDevice::write_atomic`] returns on a device without them.
///
/// [`BlockDevice::write_atomic`]: crate::BlockDevice::write_atomic
pub fn atomic_unsupported() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "this device does not write atomically across a crash",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_check_length_alignment_and_granularity() {
        let any = AtomicWrites::up_to(8192);
        assert!(any.allows(3, 8192));
        assert!(!any.allows(0, 8193));
        let strict = AtomicWrites {
            max_bytes: 1 << 20,
            alignment: 4096,
            granularity: 8192,
        };
        assert!(strict.allows(4096, 8192));
        assert!(!strict.allows(512, 8192), "misaligned");
        assert!(!strict.allows(0, 4096), "not a multiple of the granularity");
        assert!(strict
            .refusal(512, 8192)
            .to_string()
            .contains("aligned to 4096"));
    }
}
