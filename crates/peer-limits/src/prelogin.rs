//! Connections that have not logged in yet.
//!
//! Before login a connection has proved nothing, so it gets its own small
//! budget instead of a share of the logged-in one: a few per source
//! address, and a total for all sources. At the per-source cap a new
//! connection is refused; at the total the oldest unauthenticated one is
//! evicted to make room. A flood from one address thus only ever holds its
//! own few slots, and a flood from many addresses ages out instead of
//! locking the door: a real initiator's login, which takes milliseconds,
//! is not the oldest for long.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

/// Why a connection was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its source address already has as many connections (logging in,
    /// or open, as the budget counts them) as it may.
    SourceFull,
}

#[derive(Debug)]
struct Waiting {
    source: IpAddr,
    evict: Arc<Notify>,
}

#[derive(Debug, Default)]
struct Table {
    next: u64,
    /// By admission order, so the first entry is the oldest.
    by_age: BTreeMap<u64, Waiting>,
    per_source: HashMap<IpAddr, usize>,
    evicted: u64,
}

impl Table {
    fn remove(&mut self, id: u64) -> Option<Waiting> {
        let w = self.by_age.remove(&id)?;
        if let Some(n) = self.per_source.get_mut(&w.source) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&w.source);
            }
        }
        Some(w)
    }
}

/// The budget of connections logging in, shared by every listener of a
/// transport.
#[derive(Debug)]
pub struct PreLoginBudget {
    per_source: usize,
    total: usize,
    table: Mutex<Table>,
}

/// A connection's place in the budget while it logs in; dropping it (at
/// login or at close) frees the place.
#[derive(Debug)]
pub struct PreLoginTicket {
    budget: Arc<PreLoginBudget>,
    id: u64,
    evict: Arc<Notify>,
}

impl PreLoginTicket {
    /// Resolves when the budget evicted this connection to make room.
    pub async fn evicted(&self) {
        self.evict.notified().await
    }
}

impl Drop for PreLoginTicket {
    fn drop(&mut self) {
        self.budget.table.lock().remove(self.id);
    }
}

impl PreLoginBudget {
    pub fn new(per_source: usize, total: usize) -> Arc<PreLoginBudget> {
        Arc::new(PreLoginBudget {
            per_source: per_source.max(1),
            total: total.max(1),
            table: Mutex::new(Table::default()),
        })
    }

    /// Admit a new connection from `source`, evicting the oldest waiting
    /// connection when the total is reached.
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Result<PreLoginTicket, Refusal> {
        let mut t = self.table.lock();
        if t.per_source.get(&source).copied().unwrap_or(0) >= self.per_source {
            return Err(Refusal::SourceFull);
        }
        while t.by_age.len() >= self.total {
            let Some((&oldest, _)) = t.by_age.iter().next() else {
                break;
            };
            if let Some(w) = t.remove(oldest) {
                // A permit is stored if the connection is not waiting yet.
                w.evict.notify_one();
                t.evicted += 1;
            }
        }
        let id = t.next;
        t.next += 1;
        let evict = Arc::new(Notify::new());
        t.by_age.insert(
            id,
            Waiting {
                source,
                evict: evict.clone(),
            },
        );
        *t.per_source.entry(source).or_insert(0) += 1;
        Ok(PreLoginTicket {
            budget: self.clone(),
            id,
            evict,
        })
    }

    /// Connections logging in now.
    pub fn waiting(&self) -> usize {
        self.table.lock().by_age.len()
    }

    /// Connections evicted to make room, since start.
    pub fn evicted(&self) -> u64 {
        self.table.lock().evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn one_source_holds_only_its_own_places() {
        let b = PreLoginBudget::new(2, 10);
        let _a = b.admit(ip(1)).unwrap();
        let a2 = b.admit(ip(1)).unwrap();
        assert_eq!(b.admit(ip(1)).unwrap_err(), Refusal::SourceFull);
        // Another address is not affected.
        let _c = b.admit(ip(2)).unwrap();
        drop(a2);
        assert!(b.admit(ip(1)).is_ok());
    }

    #[tokio::test]
    async fn the_oldest_is_evicted_at_the_total() {
        let b = PreLoginBudget::new(10, 3);
        let oldest = b.admit(ip(1)).unwrap();
        let _second = b.admit(ip(2)).unwrap();
        let third = b.admit(ip(3)).unwrap();
        let _newcomer = b.admit(ip(4)).unwrap();
        assert_eq!(b.waiting(), 3);
        assert_eq!(b.evicted(), 1);
        // The eviction is stored for a connection not yet listening.
        tokio::time::timeout(Duration::from_secs(1), oldest.evicted())
            .await
            .expect("the oldest connection is told to go");
        assert!(
            tokio::time::timeout(Duration::from_millis(20), third.evicted())
                .await
                .is_err(),
            "younger connections stay"
        );
        // Dropping an evicted ticket does not free another's place.
        drop(oldest);
        assert_eq!(b.waiting(), 3);
    }

    #[test]
    fn a_flood_ages_out_behind_a_newcomer() {
        let b = PreLoginBudget::new(1, 100);
        let flood: Vec<_> = (0..100).map(|i| b.admit(ip(i)).unwrap()).collect();
        let real = b.admit(ip(200)).unwrap();
        assert_eq!(b.waiting(), 100);
        assert_eq!(b.evicted(), 1);
        drop(flood);
        assert_eq!(b.waiting(), 1);
        drop(real);
        assert_eq!(b.waiting(), 0);
        assert!(b.table.lock().per_source.is_empty());
    }
}
