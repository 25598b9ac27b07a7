//! Connections one source address holds once it is past negotiation or
//! login. The pre-login budget bounds connections that have proved
//! nothing yet; this bounds the ones that have, so that one address
//! cannot take every slot of a listener by completing the handshake and
//! then sitting idle.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::auth_throttle::source_key;
use crate::Refusal;

/// The open connections of each source address (IPv6 by its /64), shared
/// by every listener of a transport.
#[derive(Debug)]
pub struct SourceLimit {
    per_source: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

/// A connection's place among its source's; dropping it frees the place.
#[derive(Debug)]
pub struct SourceTicket {
    limit: Arc<SourceLimit>,
    source: IpAddr,
}

impl Drop for SourceTicket {
    fn drop(&mut self) {
        let mut held = self.limit.held.lock();
        if let Some(n) = held.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.source);
            }
        }
    }
}

impl SourceLimit {
    pub fn new(per_source: usize) -> Arc<SourceLimit> {
        Arc::new(SourceLimit {
            per_source: per_source.max(1),
            held: Mutex::new(HashMap::new()),
        })
    }

    /// A place for one more connection of `source`, unless it holds its
    /// whole share already.
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Result<SourceTicket, Refusal> {
        let source = source_key(source);
        let mut held = self.held.lock();
        let n = held.entry(source).or_insert(0);
        if *n >= self.per_source {
            return Err(Refusal::SourceFull);
        }
        *n += 1;
        Ok(SourceTicket {
            limit: self.clone(),
            source,
        })
    }

    /// Connections `source` holds now.
    pub fn held(&self, source: IpAddr) -> usize {
        self.held
            .lock()
            .get(&source_key(source))
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_holds_at_most_its_share_and_gets_places_back() {
        let limit = SourceLimit::new(2);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let first = limit.admit(a).unwrap();
        let _second = limit.admit(a).unwrap();
        assert_eq!(limit.admit(a).unwrap_err(), Refusal::SourceFull);
        assert!(limit.admit("192.0.2.2".parse().unwrap()).is_ok());
        drop(first);
        assert_eq!(limit.held(a), 1);
        assert!(limit.admit(a).is_ok());
    }

    #[test]
    fn ipv6_addresses_of_one_host_share_one_count() {
        let limit = SourceLimit::new(1);
        let _held = limit.admit("2001:db8::1".parse().unwrap()).unwrap();
        assert!(limit.admit("2001:db8::2".parse().unwrap()).is_err());
        assert!(limit.admit("2001:db8:0:1::1".parse().unwrap()).is_ok());
    }
}
