//! Connections in transmission: listed for status, and ended when their
//! export is removed or changed.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::exports::Export;

/// A connection in transmission, as status shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub id: u64,
    /// The client's address, or "unix socket".
    pub peer: String,
    pub export: String,
    pub tls: bool,
    pub structured_replies: bool,
    pub extended_headers: bool,
    pub since: SystemTime,
}

struct Entry {
    session: Session,
    /// The export as the session negotiated it.
    export: Export,
    end: Arc<Notify>,
}

#[derive(Default)]
pub(crate) struct Sessions {
    next: AtomicU64,
    table: Mutex<HashMap<u64, Entry>>,
}

/// A session's place in the table; dropping it removes the session.
pub(crate) struct Registered<'a> {
    sessions: &'a Sessions,
    id: u64,
    /// Notified when the session is to end.
    pub end: Arc<Notify>,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.sessions.table.lock().remove(&self.id);
    }
}

/// Whether `b` is still the export `a` was: the same device, access and
/// mode (a new description alone ends nothing).
fn same_export(a: &Export, b: &Export) -> bool {
    let device = |e: &Export| Arc::as_ptr(e.device()) as *const u8;
    device(a) == device(b) && a.read_only == b.read_only && a.allow == b.allow
}

impl Sessions {
    pub fn register(&self, mut session: Session, export: Export) -> Registered<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        session.id = id;
        let end = Arc::new(Notify::new());
        let entry = Entry {
            session,
            export,
            end: end.clone(),
        };
        self.table.lock().insert(id, entry);
        Registered {
            sessions: self,
            id,
            end,
        }
    }

    pub fn list(&self) -> Vec<Session> {
        let mut all: Vec<Session> = self
            .table
            .lock()
            .values()
            .map(|e| e.session.clone())
            .collect();
        all.sort_by_key(|s| s.id);
        all
    }

    /// Tells session `id` to end (its connection closes, the client sees
    /// the server go away); false when there is none.
    pub fn end(&self, id: u64) -> bool {
        match self.table.lock().get(&id) {
            Some(e) => {
                e.end.notify_one();
                true
            }
            None => false,
        }
    }

    /// Tells every session whose export is gone from `exports`, or is no
    /// longer the same, to end; returns how many.
    pub fn end_changed(&self, exports: &BTreeMap<String, Export>) -> usize {
        let table = self.table.lock();
        let mut ended = 0;
        for e in table.values() {
            let current = exports.get(&e.session.export);
            if !current.is_some_and(|c| same_export(&e.export, c)) {
                e.end.notify_one();
                ended += 1;
            }
        }
        ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use block::{BlockDevice, MemDevice};

    fn session(export: &str) -> Session {
        Session {
            id: 0,
            peer: "127.0.0.1".into(),
            export: export.into(),
            tls: false,
            structured_replies: true,
            extended_headers: false,
            since: SystemTime::now(),
        }
    }

    #[test]
    fn one_session_is_ended_by_its_id() {
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(4096));
        let sessions = Sessions::default();
        let a = sessions.register(session("a"), Export::new(dev));
        assert!(sessions.end(a.id));
        assert!(!sessions.end(a.id + 1));
        // The wait the connection does returns at once.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(a.end.notified());
    }

    #[test]
    fn only_sessions_of_removed_or_changed_exports_end() {
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(4096));
        let e = Export::new(dev.clone());
        let sessions = Sessions::default();
        let a = sessions.register(session("a"), e.clone());
        let _b = sessions.register(session("b"), e.clone());
        let mut described = e.clone();
        described.description = "new".into();
        let table = BTreeMap::from([("a".to_string(), e.clone()), ("b".to_string(), described)]);
        assert_eq!(sessions.end_changed(&table), 0);
        let mut read_only = e.clone();
        read_only.read_only = true;
        let table = BTreeMap::from([("a".to_string(), read_only)]);
        assert_eq!(sessions.end_changed(&table), 2);
        assert_eq!(sessions.list().len(), 2);
        drop(a);
        assert_eq!(sessions.list().len(), 1);
    }
}
