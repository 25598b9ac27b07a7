//! SendTargets (RFC 7143 appendix C): which targets exist and where.

use std::net::{IpAddr, SocketAddr};

/// One target as SendTargets reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing {
    pub name: String,
    pub portal_group: u16,
    pub portals: Vec<SocketAddr>,
}

/// `addr:port,tpgt`, IPv6 in brackets. A wildcard portal address is
/// replaced by the address the initiator reached us on.
pub fn target_address(portal: SocketAddr, portal_group: u16, local: SocketAddr) -> String {
    let ip = if portal.ip().is_unspecified() {
        local.ip()
    } else {
        portal.ip()
    };
    match ip {
        IpAddr::V4(v4) => format!("{v4}:{},{portal_group}", portal.port()),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => format!("{v4}:{},{portal_group}", portal.port()),
            None => format!("[{v6}]:{},{portal_group}", portal.port()),
        },
    }
}

/// Answer a `SendTargets=<value>` request.
///
/// `All` lists every target in a discovery session; in a normal session it
/// (and the empty value) report only the session's own target. A target
/// name reports that target if it exists.
pub fn send_targets(
    value: &str,
    targets: &[Listing],
    local: SocketAddr,
    session_target: Option<&str>,
) -> Vec<(String, String)> {
    let selected: Vec<&Listing> = match (value, session_target) {
        ("All", None) => targets.iter().collect(),
        ("All" | "", Some(own)) => targets.iter().filter(|t| t.name == own).collect(),
        ("", None) => Vec::new(),
        (name, _) => targets.iter().filter(|t| t.name == name).collect(),
    };
    let mut out = Vec::new();
    for t in selected {
        out.push(("TargetName".to_string(), t.name.clone()));
        if t.portals.is_empty() {
            out.push((
                "TargetAddress".to_string(),
                target_address(local, t.portal_group, local),
            ));
        }
        for p in &t.portals {
            out.push((
                "TargetAddress".to_string(),
                target_address(*p, t.portal_group, local),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local() -> SocketAddr {
        "192.168.1.10:3260".parse().unwrap()
    }

    fn listings() -> Vec<Listing> {
        vec![
            Listing {
                name: "iqn.a".into(),
                portal_group: 1,
                portals: vec![
                    "10.0.0.1:3260".parse().unwrap(),
                    "[fe80::1]:3261".parse().unwrap(),
                ],
            },
            Listing {
                name: "iqn.b".into(),
                portal_group: 2,
                portals: vec!["0.0.0.0:3260".parse().unwrap()],
            },
            Listing {
                name: "iqn.c".into(),
                portal_group: 3,
                portals: vec![],
            },
        ]
    }

    #[test]
    fn all_lists_every_portal() {
        let out = send_targets("All", &listings(), local(), None);
        let want: Vec<(String, String)> = [
            ("TargetName", "iqn.a"),
            ("TargetAddress", "10.0.0.1:3260,1"),
            ("TargetAddress", "[fe80::1]:3261,1"),
            ("TargetName", "iqn.b"),
            ("TargetAddress", "192.168.1.10:3260,2"),
            ("TargetName", "iqn.c"),
            ("TargetAddress", "192.168.1.10:3260,3"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(out, want);
    }

    #[test]
    fn by_name_and_in_normal_sessions() {
        let out = send_targets("iqn.b", &listings(), local(), None);
        assert_eq!(out.len(), 2);
        assert!(send_targets("iqn.nope", &listings(), local(), None).is_empty());
        let own = send_targets("", &listings(), local(), Some("iqn.c"));
        assert_eq!(own[0], ("TargetName".to_string(), "iqn.c".to_string()));
        assert_eq!(
            send_targets("All", &listings(), local(), Some("iqn.a")).len(),
            3
        );
    }

    #[test]
    fn mapped_ipv4_is_plain() {
        let p: SocketAddr = "[::ffff:10.1.2.3]:3260".parse().unwrap();
        assert_eq!(target_address(p, 1, local()), "10.1.2.3:3260,1");
    }
}
