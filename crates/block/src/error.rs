//! What a failed device call means for the client that asked for it.
//!
//! Devices fail with `io::Error`s of many origins: errnos of system calls
//! and librbd, kinds chosen by the pool or a RAID member, and errors that
//! name their class outright ([`DeviceError`]). [`classify`] reduces them
//! to one [`ErrorClass`], and each transport translates the class to its
//! own codes, so a full pool is "out of space" over iSCSI and NBD alike.

use std::error::Error;
use std::fmt;
use std::io;

/// The kinds of device failure a transport answers differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// The medium failed the transfer (EIO); also every error no other
    /// class claims, as nothing better is known of it.
    Medium,
    /// No space for a write that needs some: a full thin pool, or the file
    /// system under a sparse file.
    SpaceExhausted,
    /// The device refuses changes: a read-only volume or snapshot, an RBD
    /// image whose exclusive lock is another client's.
    ReadOnly,
    /// This node may no longer serve the device because another one does:
    /// a Ceph client blocklisted, an HA node that lost its role.
    Fenced,
    /// The device is there but cannot serve until an operator acts: an
    /// array whose members refused to assemble.
    NotReady,
    /// The storage did not answer in time and may still complete the
    /// request: a slow RAID member or RBD cluster, a full cache.
    TimedOut,
    /// The request reaches past the device's end.
    OutOfRange,
    /// The device refused the request's arguments (EINVAL).
    Invalid,
    /// The device cannot do this operation at all.
    Unsupported,
}

impl ErrorClass {
    pub const ALL: [ErrorClass; 9] = [
        ErrorClass::Medium,
        ErrorClass::SpaceExhausted,
        ErrorClass::ReadOnly,
        ErrorClass::Fenced,
        ErrorClass::NotReady,
        ErrorClass::TimedOut,
        ErrorClass::OutOfRange,
        ErrorClass::Invalid,
        ErrorClass::Unsupported,
    ];

    /// The `ErrorKind` of a [`DeviceError`] of this class, so that code
    /// that only looks at kinds (retries, the admin API) still reads it
    /// as before.
    fn kind(self) -> io::ErrorKind {
        match self {
            ErrorClass::SpaceExhausted => io::ErrorKind::StorageFull,
            ErrorClass::ReadOnly => io::ErrorKind::ReadOnlyFilesystem,
            ErrorClass::TimedOut => io::ErrorKind::TimedOut,
            ErrorClass::OutOfRange | ErrorClass::Invalid => io::ErrorKind::InvalidInput,
            ErrorClass::Unsupported => io::ErrorKind::Unsupported,
            ErrorClass::Medium | ErrorClass::Fenced | ErrorClass::NotReady => io::ErrorKind::Other,
        }
    }
}

/// A device error that names its class, carried inside an `io::Error`
/// (`DeviceError::new(..).into()`) so it passes every layer's
/// `io::Result` unchanged.
#[derive(Debug)]
pub struct DeviceError {
    class: ErrorClass,
    message: String,
}

impl DeviceError {
    pub fn new(class: ErrorClass, message: impl Into<String>) -> DeviceError {
        DeviceError {
            class,
            message: message.into(),
        }
    }

    pub fn class(&self) -> ErrorClass {
        self.class
    }
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error for DeviceError {}

impl From<DeviceError> for io::Error {
    fn from(e: DeviceError) -> io::Error {
        io::Error::new(e.class.kind(), e)
    }
}

/// The class of a device error: the class a [`DeviceError`] inside it
/// (or behind it, as a source) names, else the one its kind says, else
/// the one its errno says.
pub fn classify(e: &io::Error) -> ErrorClass {
    let mut inner: Option<&(dyn Error + 'static)> = e.get_ref().map(|i| i as _);
    while let Some(i) = inner {
        if let Some(d) = i.downcast_ref::<DeviceError>() {
            return d.class;
        }
        inner = i.source();
    }
    // Errnos read as kinds too: ENOSPC is StorageFull, EROFS
    // ReadOnlyFilesystem, EOPNOTSUPP Unsupported, EINVAL InvalidInput.
    match e.kind() {
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded | io::ErrorKind::FileTooLarge => {
            ErrorClass::SpaceExhausted
        }
        io::ErrorKind::ReadOnlyFilesystem | io::ErrorKind::PermissionDenied => ErrorClass::ReadOnly,
        io::ErrorKind::TimedOut => ErrorClass::TimedOut,
        io::ErrorKind::Unsupported => ErrorClass::Unsupported,
        io::ErrorKind::InvalidInput => ErrorClass::Invalid,
        _ => match e.raw_os_error() {
            Some(libc::ENXIO) => ErrorClass::NotReady,
            // Ceph's EBLOCKLISTED: another client took the image over.
            Some(libc::ESHUTDOWN) => ErrorClass::Fenced,
            _ => ErrorClass::Medium,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno(n: i32) -> ErrorClass {
        classify(&io::Error::from_raw_os_error(n))
    }

    #[test]
    fn errnos_devices_return_have_their_classes() {
        assert_eq!(errno(libc::EIO), ErrorClass::Medium);
        for n in [libc::ENOSPC, libc::EDQUOT, libc::EFBIG] {
            assert_eq!(errno(n), ErrorClass::SpaceExhausted, "errno {n}");
        }
        for n in [libc::EROFS, libc::EPERM, libc::EACCES] {
            assert_eq!(errno(n), ErrorClass::ReadOnly, "errno {n}");
        }
        assert_eq!(errno(libc::ESHUTDOWN), ErrorClass::Fenced);
        assert_eq!(errno(libc::ENXIO), ErrorClass::NotReady);
        assert_eq!(errno(libc::ETIMEDOUT), ErrorClass::TimedOut);
        assert_eq!(errno(libc::EINVAL), ErrorClass::Invalid);
        assert_eq!(errno(libc::EOPNOTSUPP), ErrorClass::Unsupported);
        // Nothing better is known of these than that the I/O failed.
        for n in [libc::ENOMEM, libc::EOVERFLOW, libc::EBUSY, libc::ENODEV] {
            assert_eq!(errno(n), ErrorClass::Medium, "errno {n}");
        }
    }

    #[test]
    fn kinds_without_an_errno_have_their_classes() {
        let kind = |k: io::ErrorKind| classify(&io::Error::new(k, "from a device"));
        // The thin pool's and the RAID members' own errors.
        assert_eq!(kind(io::ErrorKind::StorageFull), ErrorClass::SpaceExhausted);
        assert_eq!(kind(io::ErrorKind::TimedOut), ErrorClass::TimedOut);
        assert_eq!(kind(io::ErrorKind::Unsupported), ErrorClass::Unsupported);
        assert_eq!(kind(io::ErrorKind::InvalidInput), ErrorClass::Invalid);
        assert_eq!(kind(io::ErrorKind::InvalidData), ErrorClass::Medium);
        assert_eq!(kind(io::ErrorKind::Other), ErrorClass::Medium);
    }

    #[test]
    fn a_device_error_names_its_class_whatever_its_kind() {
        for class in ErrorClass::ALL {
            let e: io::Error = DeviceError::new(class, "why").into();
            assert_eq!(classify(&e), class);
            assert_eq!(e.to_string(), "why");
        }
        // Code that reads only kinds still sees a full pool, a timeout.
        let full: io::Error = DeviceError::new(ErrorClass::SpaceExhausted, "full").into();
        assert_eq!(full.kind(), io::ErrorKind::StorageFull);
        let slow: io::Error = DeviceError::new(ErrorClass::TimedOut, "slow").into();
        assert_eq!(slow.kind(), io::ErrorKind::TimedOut);
        // The carried class wins over the kind: range checks are
        // InvalidInput like any refused argument.
        let past: io::Error = DeviceError::new(ErrorClass::OutOfRange, "past the end").into();
        assert_eq!(past.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(classify(&past), ErrorClass::OutOfRange);
    }

    #[test]
    fn a_request_past_a_devices_end_is_out_of_range() {
        use crate::BlockDevice;
        let dev = crate::MemDevice::new(4096);
        let e = dev.read_at(&mut [0; 512], 4096).unwrap_err();
        assert_eq!(classify(&e), ErrorClass::OutOfRange);
        let e = dev.write_at(&[0; 512], 3840, false).unwrap_err();
        assert_eq!(classify(&e), ErrorClass::OutOfRange);
        // As the pool's volumes and the RAID arrays check their ranges.
        let e = crate::check_range_of("volume", 4096, u64::MAX, 2).unwrap_err();
        assert_eq!(classify(&e), ErrorClass::OutOfRange);
        assert!(e.to_string().contains("beyond the volume size 4096"), "{e}");
        crate::check_range_of("volume", 4096, 0, 4096).unwrap();
    }

    #[test]
    fn a_device_error_is_found_behind_a_wrapping_error() {
        #[derive(Debug)]
        struct Context(DeviceError);
        impl fmt::Display for Context {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "member 2: {}", self.0)
            }
        }
        impl Error for Context {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                Some(&self.0)
            }
        }
        let fenced = DeviceError::new(ErrorClass::Fenced, "lost the role");
        let e = io::Error::other(Context(fenced));
        assert_eq!(classify(&e), ErrorClass::Fenced);
    }
}
