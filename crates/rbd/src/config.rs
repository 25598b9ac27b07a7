//! What opening an RBD image needs to know.

use std::path::PathBuf;
use std::time::Duration;

/// How long a cluster connection or one I/O may take before it fails,
/// unless the configuration says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// One image of one Ceph cluster, as the device configuration names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RbdConfig {
    /// The Ceph pool holding the image.
    pub pool: String,
    /// The image's name within the pool.
    pub image: String,
    /// Size in bytes to create the image with when it is missing.
    pub size: Option<u64>,
    /// Create the image (with `size`) when it does not exist.
    pub create: bool,
    /// The cluster's configuration file (monitor addresses, keyrings).
    pub ceph_conf: PathBuf,
    /// The cephx user, `client.NAME` or just `NAME`.
    pub client: String,
    /// The user's keyring, when ceph.conf does not say where it is.
    pub keyring: Option<PathBuf>,
    /// Bound on connecting and on every I/O: past it the call fails
    /// instead of waiting for a cluster that does not answer.
    pub timeout: Duration,
}

impl RbdConfig {
    /// An image with the defaults for everything but where it is.
    pub fn new(pool: &str, image: &str, ceph_conf: impl Into<PathBuf>) -> Self {
        RbdConfig {
            pool: pool.to_owned(),
            image: image.to_owned(),
            size: None,
            create: false,
            ceph_conf: ceph_conf.into(),
            client: "client.admin".to_owned(),
            keyring: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The user's full name, as librados wants it (`client.NAME`).
    pub fn client_name(&self) -> String {
        if self.client.starts_with("client.") {
            self.client.clone()
        } else {
            format!("client.{}", self.client)
        }
    }

    /// `pool/image`, as `rbd` prints it.
    pub fn spec(&self) -> String {
        format!("{}/{}", self.pool, self.image)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_name_gets_its_type_prefix_once() {
        let mut config = RbdConfig::new("rbd", "vm42", "/etc/ceph/ceph.conf");
        config.client = "openarray".into();
        assert_eq!(config.client_name(), "client.openarray");
        config.client = "client.openarray".into();
        assert_eq!(config.client_name(), "client.openarray");
    }

    #[test]
    fn spec_is_pool_slash_image() {
        let config = RbdConfig::new("rbd", "vm42", "/etc/ceph/ceph.conf");
        assert_eq!(config.spec(), "rbd/vm42");
        assert_eq!(config.timeout, DEFAULT_TIMEOUT);
        assert!(!config.create);
    }
}
