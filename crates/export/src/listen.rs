//! Where a transport listens (a TCP address or a unix socket) and its TLS
//! files, as the configuration names them.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsConfig {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Refuse clients that do not start TLS.
    pub require: bool,
}

/// Where a server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl ListenAddr {
    /// Parses `unix:PATH`, `host:port`, or a bare host or address, which
    /// gets the transport's `default_port`.
    pub fn parse(s: &str, default_port: u16) -> Result<ListenAddr, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a socket path".into());
            }
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
        let bad = |e: &dyn fmt::Display| format!("listen address {s:?}: {e}");
        // A bare host or IPv6 address gets the default port.
        let with_port = match s.parse::<std::net::IpAddr>() {
            Ok(ip) => SocketAddr::new(ip, default_port).to_string(),
            Err(_) if !s.contains(':') => format!("{s}:{default_port}"),
            Err(_) if s.starts_with('[') && s.ends_with(']') => format!("{s}:{default_port}"),
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

    #[test]
    fn listen_addresses_parse_with_the_default_port() {
        let p = |s: &str| ListenAddr::parse(s, 10809).unwrap().to_string();
        assert_eq!(p("127.0.0.1:10900"), "127.0.0.1:10900");
        assert_eq!(p("127.0.0.1"), "127.0.0.1:10809");
        assert_eq!(p("::1"), "[::1]:10809");
        assert_eq!(p("[::1]"), "[::1]:10809");
        assert_eq!(p("[::1]:7"), "[::1]:7");
        assert_eq!(p("unix:/run/x.sock"), "unix:/run/x.sock");
        assert!(ListenAddr::parse("unix:", 10809).is_err());
        assert!(ListenAddr::parse("127.0.0.1:notaport", 10809).is_err());
    }
}
