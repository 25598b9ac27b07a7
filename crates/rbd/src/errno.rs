//! librados and librbd return `-errno`; these turn it into `io::Error`.

use std::fmt;
use std::io;

/// An errno with what was being done, so that code can still tell which
/// errno an administrative call failed with ([`errno_of`]).
#[derive(Debug)]
struct Doing {
    errno: i32,
    message: String,
}

impl fmt::Display for Doing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}",
            self.message,
            io::Error::from_raw_os_error(self.errno)
        )
    }
}

impl std::error::Error for Doing {}

/// The errno of an error from this crate, with or without a message.
pub(crate) fn errno_of(e: &io::Error) -> Option<i32> {
    e.raw_os_error()
        .or_else(|| e.get_ref()?.downcast_ref::<Doing>().map(|d| d.errno))
}

/// The error of a negative return code, or the non-negative value.
pub(crate) fn check(ret: i64) -> io::Result<u64> {
    if ret < 0 {
        Err(io::Error::from_raw_os_error(-ret as i32))
    } else {
        Ok(ret as u64)
    }
}

/// Like [`check`], with what was being done in the message (for
/// administrative calls, where a person reads it; the I/O path keeps the
/// bare errno, which the SCSI layer maps to sense data).
pub(crate) fn check_doing(ret: i64, doing: impl FnOnce() -> String) -> io::Result<u64> {
    check(ret).map_err(|e| {
        let errno = e.raw_os_error().unwrap_or(libc::EIO);
        let message = doing();
        io::Error::new(e.kind(), Doing { errno, message })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_codes_are_errnos_and_the_rest_values() {
        assert_eq!(check(7).unwrap(), 7);
        let e = check(-(libc::ENOENT as i64)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        let e = check_doing(-(libc::EBUSY as i64), || "locking rbd/x".into()).unwrap_err();
        assert!(e.to_string().starts_with("locking rbd/x: "), "{e}");
        assert_eq!(errno_of(&e), Some(libc::EBUSY));
        assert_eq!(errno_of(&io::Error::other("plain")), None);
    }
}
