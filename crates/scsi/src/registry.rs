//! Every logical unit of the daemon by NAA designator, so EXTENDED COPY can
//! reach LUs behind other targets.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::lu::LogicalUnit;

#[derive(Default)]
pub struct LuRegistry {
    // Weak: the registry must not keep a removed LU (and its device) alive.
    lus: Mutex<HashMap<[u8; 16], Weak<LogicalUnit>>>,
}

impl LuRegistry {
    pub fn new() -> Arc<LuRegistry> {
        Arc::new(LuRegistry::default())
    }

    /// Makes `lu` reachable by its designator.
    pub fn add(&self, lu: Arc<LogicalUnit>) {
        let mut lus = self.lus.lock();
        lus.retain(|_, w| w.strong_count() > 0);
        lus.insert(lu.naa(), Arc::downgrade(&lu));
    }

    /// The LU with NAA designator `naa`, if it still exists.
    pub fn find(&self, naa: &[u8]) -> Option<Arc<LogicalUnit>> {
        let key: [u8; 16] = naa.try_into().ok()?;
        self.lus.lock().get(&key).and_then(Weak::upgrade)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lu::test_support::lu;

    #[test]
    fn finds_live_lus_only() {
        let r = LuRegistry::new();
        let a = lu();
        let naa = a.naa();
        r.add(a.clone());
        assert!(r.find(&naa).is_some());
        assert!(r.find(&naa[..8]).is_none());
        drop(a);
        assert!(r.find(&naa).is_none());
    }
}
