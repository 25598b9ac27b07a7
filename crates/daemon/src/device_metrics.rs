//! The running configuration's devices and pools in `/metrics`: the
//! control plane asks each open device's kind for its figures.

use std::sync::Weak;

use stats::{Sample, SampleSource};

use crate::admin::Admin;

/// Reads the running configuration at every scrape (weakly: the daemon's
/// state holds the registry that holds this source).
pub struct DeviceSamples(pub Weak<Admin>);

impl std::fmt::Debug for DeviceSamples {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceSamples")
    }
}

impl SampleSource for DeviceSamples {
    fn samples(&self) -> Vec<Sample> {
        let Some(admin) = self.0.upgrade() else {
            return Vec::new();
        };
        let current = admin.current.lock().unwrap_or_else(|p| p.into_inner());
        current.runtime.samples()
    }
}
