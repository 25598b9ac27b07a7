//! A controller: what one host association holds across its queues
//! (Fabrics 2.0, 3.3). Its registers as properties, its features, the
//! asynchronous events waiting for a request, its logs and counters.

use std::collections::{BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::{Mutex, RwLock};
use tokio::sync::watch;

use crate::outbox::Completer;
use crate::status::Status;
use crate::subsystem::Subsystem;

/// Property offsets (Base 2.0, 3.1.4).
pub const PROP_CAP: u32 = 0x00;
pub const PROP_VS: u32 = 0x08;
pub const PROP_CC: u32 = 0x14;
pub const PROP_CSTS: u32 = 0x1C;

/// NVMe 2.0.
pub const VERSION: u32 = 0x0002_0000;

const CC_EN: u32 = 1;
const CC_SHN: u32 = 3 << 14;
const CSTS_RDY: u32 = 1;
const CSTS_SHST_COMPLETE: u32 = 2 << 2;

/// Asynchronous event configuration bits (Base 2.0, 5.27.1.7).
pub const AEC_NS_ATTRIBUTE: u32 = 1 << 8;
pub const AEC_ANA_CHANGE: u32 = 1 << 11;
pub const AEC_DISCOVERY_CHANGE: u32 = 1 << 31;

/// Log pages (Base 2.0, figure 202).
pub const LOG_ERROR: u8 = 0x01;
pub const LOG_SMART: u8 = 0x02;
pub const LOG_CHANGED_NS: u8 = 0x04;
pub const LOG_ANA: u8 = 0x0C;
pub const LOG_DISCOVERY: u8 = 0x70;

/// Entries the error log keeps.
pub const ERROR_LOG_ENTRIES: usize = 64;
/// Most Asynchronous Event Requests outstanding.
pub const AER_LIMIT: usize = 4;

/// An event to report (the completion's dword 0: type, information, log).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event(pub u32);

impl Event {
    /// A notice (2), information 0: namespace attribute changed.
    pub const NS_ATTRIBUTE_CHANGED: Event = Event(2 | (LOG_CHANGED_NS as u32) << 16);
    pub const ANA_CHANGED: Event = Event(2 | 0x03 << 8 | (LOG_ANA as u32) << 16);
    pub const DISCOVERY_CHANGED: Event = Event(2 | 0xF0 << 8 | (LOG_DISCOVERY as u32) << 16);
}

/// One error log entry (Base 2.0, figure 205).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorEntry {
    pub count: u64,
    pub sqid: u16,
    pub cid: u16,
    pub status: Status,
    pub lba: u64,
    pub nsid: u32,
}

/// Counters for the SMART / health log.
#[derive(Default)]
pub struct Counters {
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub media_errors: AtomicU64,
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct State {
    cc: u32,
    csts: u32,
    aec: u32,
    /// Number of I/O queues granted (Set Features), 0-based both ways.
    queues_granted: Option<u32>,
    /// Request ids of Asynchronous Event Requests waiting.
    aers: Vec<u16>,
    events: VecDeque<Event>,
    /// Events of a log page not read since reported are not reported
    /// again (Base 2.0, 5.2).
    masked: BTreeSet<u8>,
    changed: BTreeSet<u32>,
    ana_changes: u64,
    errors: VecDeque<ErrorEntry>,
    error_count: u64,
}

pub struct Controller {
    pub cntlid: u16,
    pub host_nqn: String,
    pub host_id: [u8; 16],
    pub peer: String,
    pub since: SystemTime,
    /// The queues it may have: I/O queues asked for at most this many.
    pub max_io_queues: u16,
    subsystem: RwLock<Arc<Subsystem>>,
    state: Mutex<State>,
    /// Raised to end every queue of the association.
    end: watch::Sender<bool>,
    pub queues: AtomicUsize,
    kato: Mutex<(Duration, Instant)>,
    admin: Mutex<Option<Arc<Completer>>>,
    /// I/O queues connected.
    qids: Mutex<BTreeSet<u16>>,
    pub counters: Counters,
    /// The target address the admin queue's host reached.
    local: Mutex<Option<SocketAddr>>,
}

impl Controller {
    pub fn new(
        cntlid: u16,
        subsystem: Arc<Subsystem>,
        host_nqn: String,
        host_id: [u8; 16],
        peer: String,
        kato: Duration,
        max_io_queues: u16,
    ) -> Controller {
        Controller {
            cntlid,
            host_nqn,
            host_id,
            peer,
            since: SystemTime::now(),
            max_io_queues,
            subsystem: RwLock::new(subsystem),
            state: Mutex::new(State::default()),
            end: watch::channel(false).0,
            queues: AtomicUsize::new(0),
            kato: Mutex::new((kato, Instant::now())),
            admin: Mutex::new(None),
            qids: Mutex::new(BTreeSet::new()),
            counters: Counters::default(),
            local: Mutex::new(None),
        }
    }

    /// A controller of the discovery subsystem.
    pub fn is_discovery(&self) -> bool {
        self.subsystem().nqn == crate::config::DISCOVERY_NQN
    }

    pub fn set_local(&self, local: SocketAddr) {
        *self.local.lock() = Some(local);
    }

    pub fn local(&self) -> Option<SocketAddr> {
        *self.local.lock()
    }

    /// The discovery log changed: a host that asked is told.
    pub fn discovery_changed(&self) {
        if self.aec() & AEC_DISCOVERY_CHANGE != 0 {
            self.raise(Event::DISCOVERY_CHANGED, LOG_DISCOVERY);
        }
    }

    pub fn subsystem(&self) -> Arc<Subsystem> {
        self.subsystem.read().clone()
    }

    /// Serves `s` from now on; the host is told of the namespaces that
    /// changed.
    pub fn replace_subsystem(&self, s: Arc<Subsystem>, changed: &[u32]) {
        *self.subsystem.write() = s;
        if changed.is_empty() {
            return;
        }
        let mut st = self.state.lock();
        for id in changed {
            st.changed.insert(*id);
        }
        let enabled = st.aec & AEC_NS_ATTRIBUTE != 0;
        drop(st);
        if enabled {
            self.raise(Event::NS_ATTRIBUTE_CHANGED, LOG_CHANGED_NS);
        }
        // The ANA log lists a group's namespaces: it changed too.
        self.ana_changed();
    }

    /// Ends the association: every queue's connection closes.
    pub fn tear_down(&self) {
        self.end.send_replace(true);
        *self.admin.lock() = None;
    }

    pub fn ended(&self) -> watch::Receiver<bool> {
        self.end.subscribe()
    }

    pub fn is_ended(&self) -> bool {
        *self.end.borrow()
    }

    /// The admin queue's completions, where events are reported.
    pub fn set_admin(&self, c: Arc<Completer>) {
        *self.admin.lock() = Some(c);
    }

    /// Claims I/O queue `qid`; false when it is connected already.
    pub fn claim_qid(&self, qid: u16) -> bool {
        self.qids.lock().insert(qid)
    }

    pub fn release_qid(&self, qid: u16) {
        self.qids.lock().remove(&qid);
    }

    pub fn admin(&self) -> Option<Arc<Completer>> {
        self.admin.lock().clone()
    }

    pub fn ready(&self) -> bool {
        self.state.lock().csts & CSTS_RDY != 0
    }

    pub fn property(&self, offset: u32, cap: u64) -> Option<u64> {
        let st = self.state.lock();
        Some(match offset {
            PROP_CAP => cap,
            PROP_VS => u64::from(VERSION),
            PROP_CC => u64::from(st.cc),
            PROP_CSTS => u64::from(st.csts),
            _ => return None,
        })
    }

    /// Property Set of CC: enabling makes the controller ready, a
    /// shutdown notification completes at once (nothing is cached here
    /// that the devices do not keep), clearing EN resets it.
    pub fn set_cc(&self, cc: u32) -> Result<(), Status> {
        let mut st = self.state.lock();
        let was = st.cc;
        if cc & CC_EN != 0 && (cc >> 16 & 0xF != 6 || cc >> 20 & 0xF != 4) {
            return Err(Status::INVALID_FIELD); // entry sizes other than 64 and 16 bytes
        }
        st.cc = cc;
        if cc & CC_SHN != 0 {
            st.csts |= CSTS_SHST_COMPLETE;
        } else {
            st.csts &= !CSTS_SHST_COMPLETE;
        }
        if cc & CC_EN != 0 {
            st.csts |= CSTS_RDY;
        } else if was & CC_EN != 0 {
            let errors = std::mem::take(&mut st.errors);
            *st = State {
                errors,
                ..State::default()
            };
        }
        Ok(())
    }

    pub fn kato(&self) -> Duration {
        self.kato.lock().0
    }

    pub fn set_kato(&self, kato: Duration) {
        *self.kato.lock() = (kato, Instant::now());
    }

    pub fn keep_alive(&self) {
        self.kato.lock().1 = Instant::now();
    }

    /// Whether the keep alive timer ran out (Base 2.0, 3.9).
    pub fn keep_alive_expired(&self) -> bool {
        let (kato, last) = *self.kato.lock();
        !kato.is_zero() && last.elapsed() > kato
    }

    pub fn aec(&self) -> u32 {
        self.state.lock().aec
    }

    pub fn set_aec(&self, aec: u32) {
        self.state.lock().aec = aec;
    }

    /// Set Features, Number of Queues: granted once, as asked up to the
    /// most this target gives; the answer is what was granted.
    pub fn grant_queues(&self, asked: u32) -> u32 {
        let mut st = self.state.lock();
        let most = u32::from(self.max_io_queues.max(1) - 1);
        let granted = *st.queues_granted.get_or_insert_with(|| {
            let sq = (asked & 0xFFFF).min(most);
            let cq = (asked >> 16).min(most);
            sq.min(cq)
        });
        granted | granted << 16
    }

    pub fn queues_granted(&self) -> u32 {
        let st = self.state.lock();
        let g = st
            .queues_granted
            .unwrap_or(u32::from(self.max_io_queues.max(1) - 1));
        g | g << 16
    }

    /// An Asynchronous Event Request arrives: held, or completed with an
    /// event waiting. `Err` when too many are outstanding.
    pub fn add_aer(&self, cid: u16) -> Result<Option<Event>, Status> {
        let mut st = self.state.lock();
        if let Some(e) = st.events.pop_front() {
            return Ok(Some(e));
        }
        if st.aers.len() >= AER_LIMIT {
            return Err(Status::AER_LIMIT);
        }
        st.aers.push(cid);
        Ok(None)
    }

    /// Abort of a held Asynchronous Event Request: true when it was one.
    pub fn abort_aer(&self, cid: u16) -> bool {
        let mut st = self.state.lock();
        let before = st.aers.len();
        st.aers.retain(|c| *c != cid);
        before != st.aers.len()
    }

    /// Reports `e` on a waiting request, or keeps it for the next one,
    /// unless an event of the same log page is still unread.
    fn raise(&self, e: Event, log: u8) {
        let mut st = self.state.lock();
        if !st.masked.insert(log) {
            return;
        }
        let Some(cid) = st.aers.pop() else {
            st.events.push_back(e);
            return;
        };
        drop(st);
        if let Some(admin) = self.admin.lock().clone() {
            admin.complete_now(cid, Status::SUCCESS, u64::from(e.0));
        }
    }

    /// The host read log page `log` without asking to retain the event.
    pub fn log_read(&self, log: u8) {
        self.state.lock().masked.remove(&log);
    }

    /// The changed namespace list, cleared unless `retain`.
    pub fn changed_namespaces(&self, retain: bool) -> Vec<u32> {
        let mut st = self.state.lock();
        let list: Vec<u32> = if st.changed.len() > 1024 {
            vec![0xFFFF_FFFF] // more than the page holds
        } else {
            st.changed.iter().copied().collect()
        };
        if !retain {
            st.changed.clear();
        }
        list
    }

    pub fn ana_changes(&self) -> u64 {
        self.state.lock().ana_changes
    }

    /// The ANA state of a group changed.
    fn ana_changed(&self) {
        let mut st = self.state.lock();
        st.ana_changes += 1;
        let enabled = st.aec & AEC_ANA_CHANGE != 0;
        drop(st);
        if enabled {
            self.raise(Event::ANA_CHANGED, LOG_ANA);
        }
    }

    /// Records a failed command in the error log.
    pub fn log_error(&self, sqid: u16, cid: u16, status: Status, nsid: u32, lba: u64) {
        let mut st = self.state.lock();
        st.error_count += 1;
        let entry = ErrorEntry {
            count: st.error_count,
            sqid,
            cid,
            status,
            lba,
            nsid,
        };
        if st.errors.len() == ERROR_LOG_ENTRIES {
            st.errors.pop_back();
        }
        st.errors.push_front(entry);
    }

    /// Error log entries, newest first.
    pub fn errors(&self) -> Vec<ErrorEntry> {
        self.state.lock().errors.iter().copied().collect()
    }
}

#[cfg(test)]
#[path = "controller_tests.rs"]
pub(crate) mod tests;
