//! librados and librbd return `-errno`; these turn it into `io::Error`.

use std::io;

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
    check(ret).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", doing())))
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
    }
}
