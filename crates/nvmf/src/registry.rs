//! The subsystems served now and the controllers hosts have created on
//! them; a controller id names one controller of the target.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::controller::Controller;
use crate::subsystem::{changed_namespaces, Subsystem, Table};

#[derive(Default)]
pub struct Registry {
    table: RwLock<Arc<Table>>,
    controllers: Mutex<BTreeMap<u16, Arc<Controller>>>,
    last_cntlid: Mutex<u16>,
}

/// Controller ids above this are reserved (Fabrics 2.0, 3.3).
const MAX_CNTLID: u16 = 0xFFEF;

impl Registry {
    pub fn subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        self.table.read().get(nqn).cloned()
    }

    pub fn table(&self) -> Arc<Table> {
        self.table.read().clone()
    }

    /// Serves `table` from now on: controllers of a subsystem that stays
    /// see its new namespaces (and are told of the changed ones); those
    /// of a subsystem removed end.
    pub fn replace(&self, table: Table) {
        *self.table.write() = Arc::new(table);
        let table = self.table();
        for ctrl in self.controllers() {
            if ctrl.is_discovery() {
                continue;
            }
            let old = ctrl.subsystem();
            match table.get(&old.nqn) {
                Some(new) => {
                    let changed = changed_namespaces(&old, new);
                    ctrl.replace_subsystem(new.clone(), &changed);
                }
                None => ctrl.tear_down(),
            }
        }
    }

    /// Adds a controller built with a free id; `None` when every id is
    /// taken.
    pub fn create(&self, build: impl FnOnce(u16) -> Controller) -> Option<Arc<Controller>> {
        let mut map = self.controllers.lock();
        let mut last = self.last_cntlid.lock();
        let mut id = *last;
        for _ in 0..MAX_CNTLID {
            id = if id >= MAX_CNTLID { 1 } else { id + 1 };
            if let std::collections::btree_map::Entry::Vacant(slot) = map.entry(id) {
                *last = id;
                let ctrl = Arc::new(build(id));
                slot.insert(ctrl.clone());
                return Some(ctrl);
            }
        }
        None
    }

    pub fn get(&self, cntlid: u16) -> Option<Arc<Controller>> {
        self.controllers.lock().get(&cntlid).cloned()
    }

    pub fn remove(&self, cntlid: u16) {
        if let Some(c) = self.controllers.lock().remove(&cntlid) {
            c.tear_down();
        }
    }

    pub fn controllers(&self) -> Vec<Arc<Controller>> {
        self.controllers.lock().values().cloned().collect()
    }

    /// Tells the discovery controllers' hosts the log changed.
    pub fn discovery_changed(&self) {
        for c in self.controllers().iter().filter(|c| c.is_discovery()) {
            c.discovery_changed();
        }
    }

    /// Ends the controllers whose subsystem is gone or no longer admits
    /// their host; returns how many.
    pub fn end_refused(&self) -> usize {
        let table = self.table();
        let mut ended = 0;
        for c in self.controllers() {
            if c.is_discovery() {
                continue;
            }
            let admitted = table
                .get(&c.subsystem().nqn)
                .is_some_and(|s| s.admits(&c.host_nqn));
            if !admitted && !c.is_ended() {
                c.tear_down();
                ended += 1;
            }
        }
        ended
    }
}
