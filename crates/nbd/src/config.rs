//! The `[nbd]` section of the configuration, as the daemon reads it, and
//! the listen addresses it names.
//!
//! ```toml
//! [nbd]
//! listen = ["127.0.0.1:10809", "unix:/run/openarray-nbd.sock"]
//! tls = { cert = "/etc/openarray/nbd-cert.pem", key = "/etc/openarray/nbd-key.pem", require = true }
//! [[nbd.export]]
//! name = "vm1"
//! device = "vm1"
//! read_only = false
//! allow = ["127.0.0.0/8"]
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use block::BlockDevice;
use serde::{Deserialize, Serialize};

use crate::access::Allow;
use crate::exports::Export;
use crate::tls::{Tls, TlsMode};

/// The port NBD clients use when none is given.
pub const DEFAULT_PORT: u16 = 10809;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NbdConfig {
    /// `host:port`, `host` (port 10809), `[v6]:port`, or `unix:/path`.
    #[serde(default)]
    pub listen: Vec<String>,
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    #[serde(default)]
    pub export: Vec<ExportConfig>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Refuse clients that do not start TLS.
    #[serde(default)]
    pub require: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportConfig {
    /// The name clients ask for.
    pub name: String,
    /// The configured device or volume served.
    pub device: String,
    #[serde(default)]
    pub read_only: bool,
    /// Addresses, CIDR networks or `unix`; empty admits every client.
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub description: String,
}

impl ExportConfig {
    /// The export over `device`, the device this entry names.
    pub fn to_export(&self, device: Arc<dyn BlockDevice>) -> Result<Export, String> {
        let allow =
            Allow::parse(&self.allow).map_err(|e| format!("export {:?}: {e}", self.name))?;
        Ok(Export {
            backing: export::Backing::new(device, true),
            read_only: self.read_only,
            allow,
            description: self.description.clone(),
        })
    }
}

impl NbdConfig {
    /// The export table, resolving device names with `device`. Duplicate
    /// names, unknown devices and bad allow entries are refused.
    pub fn exports(
        &self,
        mut device: impl FnMut(&str) -> Option<Arc<dyn BlockDevice>>,
    ) -> Result<BTreeMap<String, Export>, String> {
        let mut table = BTreeMap::new();
        for e in &self.export {
            if e.name.len() > crate::proto::MAX_STRING {
                return Err(format!(
                    "export name {:?} is longer than 4096 bytes",
                    e.name
                ));
            }
            let dev = device(&e.device)
                .ok_or_else(|| format!("export {:?}: no device named {:?}", e.name, e.device))?;
            if table.insert(e.name.clone(), e.to_export(dev)?).is_some() {
                return Err(format!("export {:?} is configured twice", e.name));
            }
        }
        Ok(table)
    }

    pub fn listen_addrs(&self) -> Result<Vec<ListenAddr>, String> {
        self.listen.iter().map(|l| l.parse()).collect()
    }

    pub fn load_tls(&self) -> io::Result<Option<Tls>> {
        let Some(t) = &self.tls else { return Ok(None) };
        let mode = if t.require {
            TlsMode::Require
        } else {
            TlsMode::Allow
        };
        Tls::from_pem_files(&t.cert, &t.key, mode).map(Some)
    }
}

/// Where a server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<ListenAddr, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a socket path".into());
            }
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
        let bad = |e: &dyn fmt::Display| format!("listen address {s:?}: {e}");
        // A bare host or IPv6 address gets the default port.
        let with_port = match s.parse::<std::net::IpAddr>() {
            Ok(ip) => SocketAddr::new(ip, DEFAULT_PORT).to_string(),
            Err(_) if !s.contains(':') => format!("{s}:{DEFAULT_PORT}"),
            Err(_) if s.starts_with('[') && s.ends_with(']') => format!("{s}:{DEFAULT_PORT}"),
            Err(_) => s.to_string(),
        };
        let mut addrs = with_port.to_socket_addrs().map_err(|e| bad(&e))?;
        addrs
            .next()
            .map(ListenAddr::Tcp)
            .ok_or_else(|| bad(&"resolves to no address"))
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Tcp(a) => write!(f, "{a}"),
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use block::MemDevice;

    #[test]
    fn listen_addresses_parse_with_the_default_port() {
        let p = |s: &str| s.parse::<ListenAddr>().unwrap().to_string();
        assert_eq!(p("127.0.0.1:10900"), "127.0.0.1:10900");
        assert_eq!(p("127.0.0.1"), "127.0.0.1:10809");
        assert_eq!(p("::1"), "[::1]:10809");
        assert_eq!(p("[::1]"), "[::1]:10809");
        assert_eq!(p("[::1]:7"), "[::1]:7");
        assert_eq!(p("unix:/run/x.sock"), "unix:/run/x.sock");
        assert!("unix:".parse::<ListenAddr>().is_err());
        assert!("127.0.0.1:notaport".parse::<ListenAddr>().is_err());
    }

    #[test]
    fn the_section_reads_and_resolves_devices() {
        let text = r#"
            listen = ["127.0.0.1:10809", "unix:/tmp/nbd.sock"]
            [[export]]
            name = "vm1"
            device = "disk1"
            allow = ["127.0.0.0/8", "unix"]
            [[export]]
            name = "ro"
            device = "disk1"
            read_only = true
        "#;
        let cfg: NbdConfig = toml::from_str(text).unwrap();
        assert_eq!(cfg.listen_addrs().unwrap().len(), 2);
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(1 << 20));
        let table = cfg
            .exports(|n| (n == "disk1").then(|| dev.clone()))
            .unwrap();
        assert!(table["ro"].read_only);
        assert_eq!(table["vm1"].allow.0.len(), 2);
        assert!(cfg
            .exports(|_| None)
            .unwrap_err()
            .contains("no device named"));
        let mut twice = cfg.clone();
        twice.export[1].name = "vm1".into();
        assert!(twice
            .exports(|_| Some(dev.clone()))
            .unwrap_err()
            .contains("twice"));
        let mut bad = cfg;
        bad.export[0].allow = vec!["300.1.1.1".into()];
        assert!(bad.exports(|_| Some(dev.clone())).is_err());
    }
}
