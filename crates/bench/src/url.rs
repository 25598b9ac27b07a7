//! The targets a benchmark runs against, as the URLs libiscsi, libnbd and
//! qemu spell them, and nvme+tcp://HOST[:PORT]/SUBNQN/NSID for NVMe/TCP.

use std::fmt;

use anyhow::{bail, Context, Result};

/// Where the load goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Iscsi {
        host: String,
        port: u16,
        iqn: String,
        lun: u64,
    },
    Nbd {
        host: String,
        port: u16,
        export: String,
    },
    NbdUnix {
        socket: String,
        export: String,
    },
    Nvmf {
        host: String,
        port: u16,
        subnqn: String,
        nsid: u32,
    },
}

impl Target {
    pub fn parse(url: &str) -> Result<Target> {
        if let Some(rest) = url.strip_prefix("iscsi://") {
            let mut parts = rest.splitn(3, '/');
            let (host, port) = host_port(parts.next().unwrap_or(""), 3260)?;
            let iqn = parts.next().filter(|s| !s.is_empty());
            let lun = parts.next().filter(|s| !s.is_empty());
            let (Some(iqn), Some(lun)) = (iqn, lun) else {
                bail!("`{url}`: an iSCSI URL is iscsi://HOST[:PORT]/IQN/LUN");
            };
            let lun = lun
                .parse()
                .with_context(|| format!("`{url}`: LUN `{lun}` is not a number"))?;
            return Ok(Target::Iscsi {
                host,
                port,
                iqn: iqn.to_string(),
                lun,
            });
        }
        if let Some(rest) = url.strip_prefix("nvme+tcp://") {
            let mut parts = rest.splitn(3, '/');
            let (host, port) = host_port(parts.next().unwrap_or(""), 4420)?;
            let subnqn = parts.next().filter(|s| !s.is_empty());
            let nsid = parts.next().filter(|s| !s.is_empty());
            let (Some(subnqn), Some(nsid)) = (subnqn, nsid) else {
                bail!("`{url}`: an NVMe/TCP URL is nvme+tcp://HOST[:PORT]/SUBNQN/NSID");
            };
            let nsid = nsid
                .parse()
                .ok()
                .filter(|n| *n != 0 && *n != u32::MAX)
                .with_context(|| format!("`{url}`: NSID `{nsid}` is not a namespace number"))?;
            return Ok(Target::Nvmf {
                host,
                port,
                subnqn: subnqn.to_string(),
                nsid,
            });
        }
        if let Some(rest) = url.strip_prefix("nbd+unix:///") {
            // nbd+unix:///EXPORT?socket=PATH, as libnbd spells it.
            let (export, query) = rest.split_once('?').unwrap_or((rest, ""));
            let socket = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("socket="))
                .filter(|s| !s.is_empty())
                .with_context(|| format!("`{url}`: nbd+unix URLs need ?socket=PATH"))?;
            return Ok(Target::NbdUnix {
                socket: socket.to_string(),
                export: export.to_string(),
            });
        }
        if let Some(rest) = url.strip_prefix("nbd://") {
            let (authority, export) = rest.split_once('/').unwrap_or((rest, ""));
            let (host, port) = host_port(authority, 10809)?;
            return Ok(Target::Nbd {
                host,
                port,
                export: export.to_string(),
            });
        }
        bail!(
            "`{url}`: expected iscsi://HOST[:PORT]/IQN/LUN, nvme+tcp://HOST[:PORT]/SUBNQN/NSID, \
             nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH"
        )
    }

    pub fn is_iscsi(&self) -> bool {
        matches!(self, Target::Iscsi { .. })
    }

    /// HOST:PORT to connect to, with IPv6 hosts bracketed.
    pub fn addr(&self) -> Option<String> {
        match self {
            Target::Iscsi { host, port, .. }
            | Target::Nbd { host, port, .. }
            | Target::Nvmf { host, port, .. } => Some(if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            }),
            Target::NbdUnix { .. } => None,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Iscsi { iqn, lun, .. } => {
                write!(f, "iscsi://{}/{iqn}/{lun}", self.addr().unwrap_or_default())
            }
            Target::Nbd { export, .. } => {
                write!(f, "nbd://{}/{export}", self.addr().unwrap_or_default())
            }
            Target::NbdUnix { socket, export } => write!(f, "nbd+unix:///{export}?socket={socket}"),
            Target::Nvmf { subnqn, nsid, .. } => {
                write!(
                    f,
                    "nvme+tcp://{}/{subnqn}/{nsid}",
                    self.addr().unwrap_or_default()
                )
            }
        }
    }
}

fn host_port(authority: &str, default_port: u16) -> Result<(String, u16)> {
    if authority.is_empty() {
        bail!("no host in the URL");
    }
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .with_context(|| format!("`{authority}`: unclosed ["))?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().with_context(|| format!("bad port `{p}`"))?,
            None => default_port,
        };
        return Ok((host.to_string(), port));
    }
    match authority.rsplit_once(':') {
        Some((host, p)) => Ok((
            host.to_string(),
            p.parse().with_context(|| format!("bad port `{p}`"))?,
        )),
        None => Ok((authority.to_string(), default_port)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_kind() {
        assert_eq!(
            Target::parse("iscsi://10.0.0.1/iqn.x:y/3").unwrap(),
            Target::Iscsi {
                host: "10.0.0.1".into(),
                port: 3260,
                iqn: "iqn.x:y".into(),
                lun: 3
            }
        );
        let t = Target::parse("nbd://[::1]:10810/vm").unwrap();
        assert_eq!(t.addr().unwrap(), "[::1]:10810");
        assert_eq!(t.to_string(), "nbd://[::1]:10810/vm");
        assert_eq!(
            Target::parse("nbd+unix:///e?socket=/run/n.sock").unwrap(),
            Target::NbdUnix {
                socket: "/run/n.sock".into(),
                export: "e".into()
            }
        );
        assert!(Target::parse("iscsi://h/iqn").is_err());
        assert!(Target::parse("http://h/").is_err());
    }

    #[test]
    fn parses_nvme_tcp() {
        let t = Target::parse("nvme+tcp://10.0.0.2/nqn.2026-11.org.openarray:vm/1").unwrap();
        assert_eq!(
            t,
            Target::Nvmf {
                host: "10.0.0.2".into(),
                port: 4420,
                subnqn: "nqn.2026-11.org.openarray:vm".into(),
                nsid: 1
            }
        );
        assert_eq!(t.addr().unwrap(), "10.0.0.2:4420");
        let t = Target::parse("nvme+tcp://[::1]:4421/nqn.x:y/7").unwrap();
        assert_eq!(t.addr().unwrap(), "[::1]:4421");
        assert_eq!(t.to_string(), "nvme+tcp://[::1]:4421/nqn.x:y/7");
        assert_eq!(Target::parse(&t.to_string()).unwrap(), t);
        for bad in [
            "nvme+tcp://h/nqn.x:y",
            "nvme+tcp://h/nqn.x:y/",
            "nvme+tcp://h//1",
            "nvme+tcp:///nqn.x:y/1",
            "nvme+tcp://h/nqn.x:y/0",
            "nvme+tcp://h/nqn.x:y/4294967295",
            "nvme+tcp://h/nqn.x:y/one",
            "nvme+tcp://h:port/nqn.x:y/1",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
        assert!(Target::parse("http://h/").is_err());
    }
}
