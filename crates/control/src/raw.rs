//! The file format as serde reads it, with the span of every value so that
//! validation can point at the line of a bad one.

use serde::Deserialize;
use toml::Spanned;

/// The top-level tables read here; other names belong to a registered
/// section ([`crate::sections`]) or are refused.
pub const TABLES: [&str; 8] = [
    "daemon",
    "discovery",
    "portal",
    "pool",
    "schedule",
    "device",
    "target",
    "nbd",
];

#[derive(Deserialize)]
pub struct RawConfig {
    pub daemon: Option<RawDaemon>,
    pub discovery: Option<RawDiscovery>,
    #[serde(default)]
    pub portal: Vec<Spanned<RawPortal>>,
    #[serde(default)]
    pub pool: Vec<Spanned<RawPool>>,
    #[serde(default)]
    pub schedule: Vec<Spanned<RawSchedule>>,
    #[serde(default)]
    pub device: Vec<Spanned<RawDevice>>,
    #[serde(default)]
    pub target: Vec<Spanned<RawTarget>>,
    pub nbd: Option<Spanned<RawNbd>>,
}

/// The NBD transport: where it listens and the devices it exports.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNbd {
    /// `host:port`, `host`, `[v6]:port` or `unix:/path`.
    pub listen: Option<Spanned<Vec<Spanned<String>>>>,
    pub tls: Option<Spanned<RawNbdTls>>,
    #[serde(default)]
    pub export: Vec<Spanned<RawNbdExport>>,
}

/// An x509 certificate and key for NBD_OPT_STARTTLS.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNbdTls {
    pub cert: Spanned<String>,
    pub key: Spanned<String>,
    pub require: Option<bool>,
}

/// A device offered to NBD clients under a name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNbdExport {
    pub name: Spanned<String>,
    pub device: Spanned<String>,
    pub read_only: Option<bool>,
    pub allow: Option<Spanned<Vec<Spanned<String>>>>,
    pub description: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDaemon {
    pub state_dir: Option<Spanned<String>>,
    pub max_sessions_per_initiator: Option<Spanned<i64>>,
    pub max_connections_per_portal: Option<Spanned<i64>>,
    pub login_timeout: Option<Spanned<String>>,
    pub nop_interval: Option<Spanned<String>>,
    pub nop_timeout: Option<Spanned<String>>,
    pub write_timeout: Option<Spanned<String>>,
    pub max_logins_per_source: Option<Spanned<i64>>,
    pub max_logins: Option<Spanned<i64>>,
    pub max_connections_per_source: Option<Spanned<i64>>,
    pub max_queued_output: Option<Spanned<String>>,
    pub api_listen: Option<Spanned<String>>,
    pub api_token_file: Option<Spanned<String>>,
    pub api_read_only_token_file: Option<Spanned<String>>,
    pub api_header_timeout: Option<Spanned<String>>,
    pub api_body_timeout: Option<Spanned<String>>,
    pub auth_fail_delay: Option<Spanned<String>>,
    pub auth_fail_delay_max: Option<Spanned<String>>,
}

/// Settings of discovery (SendTargets) sessions.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDiscovery {
    pub chap: Option<Spanned<RawChap>>,
}

/// CHAP credentials: what initiators must know, and for mutual CHAP what
/// the target answers with.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawChap {
    pub user: Spanned<String>,
    pub secret: Spanned<String>,
    pub mutual_user: Option<Spanned<String>>,
    pub mutual_secret: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPortal {
    pub listen: Spanned<String>,
}

/// A storage pool over data files, holding thin volumes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPool {
    pub name: Spanned<String>,
    /// Data files, block devices or configured devices, in pool order.
    pub devices: Spanned<Vec<Spanned<String>>>,
    /// Create or extend each data file to this size (like `size`).
    pub device_size: Option<Spanned<toml::Value>>,
    /// The metadata store file; defaults to the first device's path + `.meta`.
    pub metadata: Option<Spanned<String>>,
    /// Allocation unit when the pool is created, e.g. "64K".
    pub unit_size: Option<Spanned<toml::Value>>,
    /// Space in use that initiators are warned of: "80%" or a size.
    pub soft_threshold: Option<Spanned<toml::Value>>,
    /// Most the volumes' sizes may add up to per byte of pool, e.g. 3.0.
    pub max_overcommit: Option<Spanned<toml::Value>>,
}

/// A `[[device]]` table: its settings depend on its kind, so each is
/// kept with its position until the kind's module reads it.
pub type RawDevice = std::collections::BTreeMap<String, Spanned<toml::Value>>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTarget {
    pub name: Spanned<String>,
    pub alias: Option<Spanned<String>>,
    pub portals: Option<Spanned<Vec<Spanned<String>>>>,
    pub chap: Option<Spanned<RawChap>>,
    #[serde(default)]
    pub lun: Vec<Spanned<RawLun>>,
    #[serde(default)]
    pub group: Vec<Spanned<RawGroup>>,
}

/// An initiator group of a target with its own LUN map.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGroup {
    pub name: Spanned<String>,
    #[serde(default)]
    pub initiators: Vec<Spanned<String>>,
    pub chap: Option<Spanned<RawChap>>,
    #[serde(default)]
    pub lun: Vec<Spanned<RawLun>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLun {
    pub lun: Spanned<i64>,
    pub device: Spanned<String>,
    pub read_only: Option<bool>,
}

/// A periodic snapshot of one volume.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSchedule {
    pub volume: Spanned<String>,
    pub pool: Option<Spanned<String>>,
    pub every: Spanned<String>,
    pub at: Option<Spanned<String>>,
    pub keep: Option<Spanned<i64>>,
    #[serde(default)]
    pub refresh: Vec<Spanned<String>>,
}
