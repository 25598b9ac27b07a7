//! The device graph as it runs: each device with its settings, its state
//! and the devices under it (`openarray device show`), and faults
//! injected into `faulty` devices.

use std::sync::Arc;

use block::BlockDevice;

use super::Runtime;
use crate::kinds::{inject_fault, Fault};
use crate::model::Config;

/// One device of the graph and what is under it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceNode {
    pub name: String,
    pub kind: &'static str,
    /// Whether the running configuration has it open.
    pub open: bool,
    /// Bytes, when open.
    pub size: Option<u64>,
    pub settings: Vec<(&'static str, String)>,
    /// What the open device says of itself (faults, limits).
    pub state: Vec<(&'static str, String)>,
    /// The devices it is built on; for a volume, the pool's data devices.
    pub children: Vec<DeviceNode>,
}

impl Runtime {
    /// The open device named `name`.
    pub fn open_device(&self, name: &str) -> Option<Arc<dyn BlockDevice>> {
        self.live.nodes.get(name).map(|n| n.device.clone())
    }

    /// Device `name` of `config` and everything under it.
    pub fn device_tree(&self, config: &Config, name: &str) -> Option<DeviceNode> {
        self.node(config, name, 0)
    }

    fn node(&self, config: &Config, name: &str, depth: usize) -> Option<DeviceNode> {
        let dev = config.device(name)?;
        let open = self.open_device(name);
        let mut under: Vec<&str> = dev.spec.children();
        if let Some(pool) = dev
            .spec
            .pool()
            .and_then(|p| config.pools.iter().find(|c| c.name == p))
        {
            under.extend(pool.member_devices());
        }
        // The graph has no loops (validation refuses them); the bound is
        // for safety only.
        let children = if depth < 64 {
            under
                .iter()
                .filter_map(|child| self.node(config, child, depth + 1))
                .collect()
        } else {
            Vec::new()
        };
        Some(DeviceNode {
            name: name.to_string(),
            kind: dev.kind(),
            open: open.is_some(),
            size: open.as_ref().map(|d| d.size()),
            settings: dev.spec.settings(),
            state: open
                .as_ref()
                .map(|d| dev.spec.state(&**d))
                .unwrap_or_default(),
            children,
        })
    }

    /// Injects `fault` into the open `faulty` device `name`.
    pub fn inject_fault(&self, name: &str, fault: Fault) -> Result<String, String> {
        let device = self
            .open_device(name)
            .ok_or_else(|| format!("device `{name}` is not open (no LUN or pool uses it)"))?;
        inject_fault(&*device, fault).map_err(|e| format!("device `{name}`: {e}"))
    }
}
