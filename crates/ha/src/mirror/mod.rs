//! The synchronous mirror: a [`BlockDevice`] over a local device, paired
//! over the link with the peer's mirror of the same name (DRBD's
//! protocol C).
//!
//! On the primary a write goes to the local device and to the peer at
//! once and completes only when both hold it as durably as it asked: a
//! FUA write is stable on both, a flush flushes both. Reads are local.
//! Without a peer that takes its writes the primary goes on alone: the
//! regions it writes are marked in the bitmap ([`intent`]) and a new
//! generation ([`generations`]) is on disk before the write starts. On
//! reconnect the replicas compare generations; the newer one copies the
//! marked regions (or everything, when its bitmap does not reach back to
//! the peer's generation) to the older one while I/O goes on, and a
//! split brain is reported and left alone. The secondary takes the
//! link's writes only from a primary whose generation it agreed to.

mod decide;
pub mod generations;
mod intent;
mod locks;
mod meta;
mod peer;
mod planned;
mod resync;
mod roles;
pub mod wire;

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use block::{check_range_of, BlockDevice, Capabilities, DeviceError, ErrorClass};
use parking_lot::{Mutex, RwLock};
use serde::Serialize;

use crate::link::{Link, Pending, Session, MAX_DATA};
use generations::Generations;
use intent::Intent;
use locks::RegionLocks;
use meta::Header;
pub use meta::Layout;
pub use roles::{RoleWatcher, Roles};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum Role {
    Secondary = 0,
    Primary = 1,
}

/// Where the pair stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Connection {
    /// No session with the peer.
    Disconnected,
    /// A session, the peer's state not heard yet.
    Connecting,
    /// Writes reach both replicas.
    Connected,
    /// Copying to the peer what it lacks; writes reach both.
    SyncSource,
    /// Taking what this replica lacks from the peer.
    SyncTarget,
    /// Both wrote while apart: nothing is copied until an operator picks
    /// the survivor.
    SplitBrain,
    /// The peer is there but the pair cannot replicate (see `problem`).
    Refused,
}

#[derive(Clone, Debug)]
pub struct MirrorOptions {
    /// Bytes per second a resync copies at most (0: no limit).
    pub resync_rate: u64,
    /// How long a write or flush waits for the peer before the primary
    /// goes on alone.
    pub peer_timeout: Duration,
    /// The witness's lease, which writing without the peer needs; none:
    /// the primary goes on alone unasked (a pair without a witness).
    pub failover: Option<Arc<crate::failover::Failover>>,
}

impl Default for MirrorOptions {
    fn default() -> Self {
        MirrorOptions {
            resync_rate: 100 << 20,
            peer_timeout: Duration::from_secs(10),
            failover: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ResyncProgress {
    pub total_bytes: u64,
    pub done_bytes: u64,
}

/// What a mirror says of itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MirrorStatus {
    pub name: String,
    pub role: Role,
    pub peer_role: Option<Role>,
    pub connection: Connection,
    /// The primary is writing without its peer.
    pub degraded: bool,
    /// Bytes the peer is known to lack.
    pub out_of_sync_bytes: u64,
    pub generations: Generations,
    pub peer_generations: Option<Generations>,
    /// A resync into this replica began and did not end.
    pub inconsistent: bool,
    pub resync: Option<ResyncProgress>,
    /// Bytes resyncs copied to the peer since this mirror opened.
    pub resync_copied_bytes: u64,
    pub problem: Option<String>,
}

struct State {
    role: Role,
    header: Header,
    intent: Intent,
    session: Option<Arc<Session>>,
    peer: Option<wire::State>,
    connection: Connection,
    problem: Option<String>,
    /// The peer failed a request in this session: go on alone until the
    /// next one.
    peer_failed: bool,
    /// Counts the pairings of this mirror with the peer's: a new session,
    /// or the peer's mirror opened again on the same session. Work begun
    /// for one pairing (a resync, a failed write) does not touch the next.
    epoch: u64,
    /// When the last session ended, this replica was primary, or in
    /// sync with a primary peer: only such a replica may take over.
    current_at_loss: bool,
}

/// Where a mirror stands, for the failover's decisions.
pub(crate) struct Standing {
    pub role: Role,
    pub closed: bool,
    pub connected: bool,
    /// The peer takes this primary's writes.
    pub replicating: bool,
    pub current_at_loss: bool,
    pub inconsistent: bool,
    pub generations: Generations,
}

pub(crate) struct Inner {
    name: String,
    /// This opening of the mirror, so the peer can tell it was reopened.
    incarnation: u64,
    node: String,
    peer_name: String,
    local: Arc<dyn BlockDevice>,
    layout: Layout,
    link: Arc<Link>,
    options: MirrorOptions,
    state: Mutex<State>,
    locks: RegionLocks,
    /// One flush at a time, so that "written since the flush started"
    /// means one flush.
    flushing: Mutex<()>,
    /// Held shared by every write while it runs, alone by a demotion, so
    /// that a demoted node has no write of its own still in flight.
    writes: RwLock<()>,
    /// Bytes per second a resync copies at most (0: no limit).
    resync_rate: AtomicU64,
    closed: AtomicBool,
    resync_copied: AtomicU64,
    resync_total: AtomicU64,
    resync_done: AtomicU64,
    /// Who follows the roles, and what it was last told.
    told: Mutex<roles::Told>,
    me: Weak<Inner>,
}

pub struct Mirror {
    inner: Arc<Inner>,
}

/// Where a primary's write goes besides the local device.
struct Target {
    session: Arc<Session>,
    /// The generation the write belongs to.
    gen: u64,
    epoch: u64,
}

fn refuse(class: ErrorClass, why: String) -> io::Error {
    DeviceError::new(class, why).into()
}

enum Op<'a> {
    Write(&'a [u8], bool),
    Zeroes(u64),
}

impl Mirror {
    /// Opens the mirror `name` over `local` (formatting its metadata
    /// area if it has none) as secondary, and joins it to the link.
    pub fn open(
        name: &str,
        local: Arc<dyn BlockDevice>,
        link: Arc<Link>,
        options: MirrorOptions,
    ) -> io::Result<Mirror> {
        let layout = Layout::for_device(local.size())?;
        let (header, bits) = meta::load(&*local, &layout)?;
        let settings = link.settings();
        let inner = Arc::new_cyclic(|me| Inner {
            name: name.to_string(),
            incarnation: generations::new_id(),
            node: settings.node.clone(),
            peer_name: settings.peer.clone(),
            local,
            layout,
            link: link.clone(),
            options: options.clone(),
            state: Mutex::new(State {
                role: Role::Secondary,
                header,
                intent: Intent::new(layout.regions, bits),
                session: None,
                peer: None,
                connection: Connection::Disconnected,
                problem: None,
                peer_failed: false,
                epoch: 0,
                current_at_loss: false,
            }),
            locks: RegionLocks::default(),
            flushing: Mutex::new(()),
            writes: RwLock::new(()),
            resync_rate: AtomicU64::new(options.resync_rate),
            closed: AtomicBool::new(false),
            resync_copied: AtomicU64::new(0),
            resync_total: AtomicU64::new(0),
            resync_done: AtomicU64::new(0),
            told: Mutex::new(roles::Told::default()),
            me: me.clone(),
        });
        link.register(name, inner.clone());
        if let Some(f) = &options.failover {
            f.register(name, Arc::downgrade(&inner));
        }
        Ok(Mirror { inner })
    }

    pub fn layout(&self) -> Layout {
        self.inner.layout
    }

    pub fn local(&self) -> &Arc<dyn BlockDevice> {
        &self.inner.local
    }

    /// Makes this node the one that serves writes. Refused while the
    /// peer is primary, and for a replica that holds no whole generation
    /// (a resync into it has not ended).
    pub fn promote(&self) -> io::Result<()> {
        self.inner.promote()
    }

    /// Makes this node secondary: local writes are refused from now on,
    /// and what it wrote is flushed.
    pub fn demote(&self) -> io::Result<()> {
        self.inner.demote()
    }

    /// Changes how fast resyncs copy, the one under way included.
    pub fn set_resync_rate(&self, bytes_per_second: u64) {
        self.inner
            .resync_rate
            .store(bytes_per_second, Ordering::Relaxed);
    }

    pub fn status(&self) -> MirrorStatus {
        let inner = &self.inner;
        let st = inner.state.lock();
        let resync = matches!(
            st.connection,
            Connection::SyncSource | Connection::SyncTarget
        )
        .then(|| ResyncProgress {
            total_bytes: inner.resync_total.load(Ordering::Relaxed),
            done_bytes: inner.resync_done.load(Ordering::Relaxed),
        });
        MirrorStatus {
            name: inner.name.clone(),
            role: st.role,
            peer_role: st.peer.as_ref().map(|p| p.role),
            connection: st.connection,
            degraded: st.role == Role::Primary && inner.replicating(&st).is_none(),
            out_of_sync_bytes: inner.bytes_of(st.intent.out_of_sync()),
            generations: st.header.generations,
            peer_generations: st.peer.as_ref().map(|p| p.generations),
            inconsistent: st.header.inconsistent,
            resync,
            resync_copied_bytes: inner.resync_copied.load(Ordering::Relaxed),
            problem: st.problem.clone(),
        }
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        let me: Arc<dyn crate::link::Endpoint> = self.inner.clone();
        self.inner.link.unregister(&self.inner.name, &me);
    }
}

impl Inner {
    /// Makes this node the one that serves writes. Refused while the
    /// peer is primary, and for a replica that holds no whole generation
    /// (a resync into it has not ended).
    pub(crate) fn promote(&self) -> io::Result<()> {
        let inner = self;
        let mut st = inner.state.lock();
        if st.role == Role::Primary {
            return Ok(());
        }
        if st.header.inconsistent || st.connection == Connection::SyncTarget {
            return Err(refuse(
                ErrorClass::NotReady,
                format!(
                    "{}: this replica is not up to date (a resync into it has not ended)",
                    inner.name
                ),
            ));
        }
        if inner.connected(&st) && st.peer.as_ref().is_some_and(|p| p.role == Role::Primary) {
            return Err(refuse(
                ErrorClass::Fenced,
                format!(
                    "{}: {} is primary; demote it first",
                    inner.name, inner.peer_name
                ),
            ));
        }
        let mut header = st.header;
        header.generations.first_promotion();
        header.was_primary = true;
        st.header = meta::write_header(&*inner.local, &inner.layout, &header)?;
        st.role = Role::Primary;
        tracing::info!(mirror = %inner.name, "promoted to primary");
        inner.send_state(&st);
        inner.evaluate(&mut st);
        drop(st);
        inner.tell_roles();
        Ok(())
    }

    /// Makes this node secondary: local writes are refused from now on,
    /// and what it wrote is flushed.
    pub(crate) fn demote(&self) -> io::Result<()> {
        let inner = self;
        {
            let _drained = inner.writes.write();
            let mut st = inner.state.lock();
            if st.role == Role::Secondary {
                return Ok(());
            }
            st.role = Role::Secondary;
        }
        if let Some(f) = &inner.options.failover {
            f.demoted(&inner.name);
        }
        inner.local.flush()?;
        let mut st = inner.state.lock();
        let header = Header {
            was_primary: false,
            ..st.header
        };
        st.header = meta::write_header(&*inner.local, &inner.layout, &header)?;
        tracing::info!(mirror = %inner.name, "demoted to secondary");
        inner.send_state(&st);
        inner.evaluate(&mut st);
        drop(st);
        inner.tell_roles();
        Ok(())
    }

    pub(crate) fn standing(&self) -> Standing {
        let st = self.state.lock();
        Standing {
            role: st.role,
            closed: self.closed.load(Ordering::SeqCst),
            connected: self.connected(&st),
            replicating: self.replicating(&st).is_some(),
            current_at_loss: st.current_at_loss,
            inconsistent: st.header.inconsistent,
            generations: st.header.generations,
        }
    }

    fn bytes_of(&self, set: &regions::RegionSet) -> u64 {
        set.iter().map(|r| self.layout.region_range(r).1).sum()
    }

    fn connected(&self, st: &State) -> bool {
        st.session.as_ref().is_some_and(|s| !s.is_closed())
    }

    /// Whether `session` is still the one in use and healthy, and the
    /// pairing `epoch` the current one.
    fn session_ok(&self, st: &State, session: &Session, epoch: u64) -> bool {
        !self.closed.load(Ordering::SeqCst)
            && !st.peer_failed
            && st.epoch == epoch
            && st
                .session
                .as_ref()
                .is_some_and(|s| s.id == session.id && !s.is_closed())
    }

    /// The session that takes this primary's writes now.
    fn replicating(&self, st: &State) -> Option<Target> {
        let s = st.session.as_ref()?;
        let up = matches!(
            st.connection,
            Connection::Connected | Connection::SyncSource
        );
        (up && !st.peer_failed && !s.is_closed()).then(|| Target {
            session: s.clone(),
            gen: st.header.generations.current,
            epoch: st.epoch,
        })
    }

    fn persist_header(&self, st: &mut State) -> io::Result<()> {
        st.header = meta::write_header(&*self.local, &self.layout, &st.header)?;
        Ok(())
    }

    fn persist_bitmap(&self, st: &State) -> io::Result<()> {
        meta::write_bitmap(&*self.local, &self.layout, &st.intent.image())
    }

    fn state_message(&self, st: &State) -> wire::State {
        wire::State {
            role: st.role,
            data_size: self.layout.data_size,
            generations: st.header.generations,
            was_primary: st.header.was_primary,
            inconsistent: st.header.inconsistent,
            incarnation: self.incarnation,
            node: self.node.clone(),
        }
    }

    fn send_state(&self, st: &State) {
        if let Some(s) = &st.session {
            let _ = s.notice(&self.name, &self.state_message(st).encode());
        }
    }

    /// Marks regions written alone; the bits and a new generation are on
    /// disk before this returns. With a witness, nothing changes unless it granted this node the
    /// lease with the generation written alone recorded.
    fn go_alone(&self, st: &mut State, regions: impl Iterator<Item = u64>) -> io::Result<()> {
        let mut next = st.header.generations;
        let starts = next.start_tracking();
        if let Some(f) = &self.options.failover {
            f.alone(&self.name, &next)?;
        }
        let newly = st.intent.mark_out_of_sync(regions);
        if starts {
            st.header.generations = next;
            tracing::warn!(mirror = %self.name, "writing without {}: a new generation begins", self.peer_name);
            self.persist_header(st)?;
            self.send_state(st);
        }
        if newly {
            self.persist_bitmap(st)?;
        }
        Ok(())
    }

    /// The peer failed a request sent to `target`: everything it may not
    /// hold stably is out of sync, and writes go on alone (until the next
    /// pairing, if this one is still current).
    fn peer_failed(&self, st: &mut State, target: &Target, e: &io::Error) -> io::Result<()> {
        let current = st.epoch == target.epoch
            && st
                .session
                .as_ref()
                .is_some_and(|s| s.id == target.session.id);
        if current && !st.peer_failed {
            st.peer_failed = true;
            st.problem = Some(format!(
                "{} failed a request ({e}); writing alone until it reconnects",
                self.peer_name
            ));
            tracing::warn!(mirror = %self.name, "{} failed a request: {e}; going on alone", self.peer_name);
        }
        st.intent.active_to_out_of_sync();
        self.go_alone(st, std::iter::empty())
    }

    fn wait_all(&self, pending: Vec<io::Result<Pending>>) -> io::Result<()> {
        for p in pending {
            let body = p?.wait(self.options.peer_timeout)?;
            wire::reply(&body, &self.peer_name)?;
        }
        Ok(())
    }

    fn replicate(&self, op: Op<'_>, offset: u64) -> io::Result<()> {
        let len = match op {
            Op::Write(b, _) => b.len() as u64,
            Op::Zeroes(n) => n,
        };
        check_range_of("mirror", self.layout.data_size, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let _running = self.writes.read();
        let regions = self.layout.regions_of(offset, len);
        let _held = self.locks.foreground(regions.clone());
        let target = {
            let mut st = self.state.lock();
            if st.role != Role::Primary {
                return Err(refuse(
                    ErrorClass::Fenced,
                    format!("{}: this node is secondary", self.name),
                ));
            }
            match self.replicating(&st) {
                Some(t) => {
                    if st.intent.begin_active(regions.clone()) {
                        if let Err(e) = self.persist_bitmap(&st) {
                            st.intent.end_active(regions.clone());
                            return Err(e);
                        }
                    }
                    Some(t)
                }
                None => {
                    self.go_alone(&mut st, regions.clone())?;
                    None
                }
            }
        };
        let pending = match &target {
            Some(t) => self.send(&t.session, t.gen, &op, offset),
            None => Vec::new(),
        };
        let local = match op {
            Op::Write(buf, fua) => self.local.write_at(buf, offset, fua),
            Op::Zeroes(n) => self.local.write_zeroes(offset, n),
        };
        let alone = match target {
            Some(t) => {
                let remote = self.wait_all(pending);
                let mut st = self.state.lock();
                st.intent.end_active(regions);
                match remote {
                    Ok(()) => false,
                    Err(e) => {
                        self.peer_failed(&mut st, &t, &e)?;
                        true
                    }
                }
            }
            None => true,
        };
        local?;
        // A write the peer lacks is acknowledged only while the lease
        // holds: past it the other node may have taken over.
        match &self.options.failover {
            Some(f) if alone && !f.still_granted(&self.name) => Err(refuse(
                ErrorClass::Fenced,
                format!(
                    "{}: the witness's lease ran out before the write ended",
                    self.name
                ),
            )),
            _ => Ok(()),
        }
    }

    fn send(&self, s: &Session, gen: u64, op: &Op<'_>, offset: u64) -> Vec<io::Result<Pending>> {
        match *op {
            Op::Write(buf, fua) => buf
                .chunks(MAX_DATA)
                .enumerate()
                .map(|(i, data)| {
                    let req = wire::Request::Write {
                        gen,
                        offset: offset + (i * MAX_DATA) as u64,
                        fua,
                        resync: false,
                        data,
                    };
                    s.request(&self.name, &req.encode())
                })
                .collect(),
            Op::Zeroes(len) => {
                vec![s.request(
                    &self.name,
                    &wire::Request::Zeroes { gen, offset, len }.encode(),
                )]
            }
        }
    }

    fn flush(&self) -> io::Result<()> {
        let _one = self.flushing.lock();
        let target = {
            let mut st = self.state.lock();
            let t = if st.role == Role::Primary {
                self.replicating(&st)
            } else {
                None
            };
            if t.is_some() {
                st.intent.flush_started();
            }
            t
        };
        let pending = target.as_ref().map(|t| {
            t.session
                .request(&self.name, &wire::Request::Flush.encode())
        });
        let local = self.local.flush();
        if let (Some(t), Some(p)) = (target, pending) {
            let remote = self.wait_all(vec![p]);
            let mut st = self.state.lock();
            match remote {
                Ok(()) if local.is_ok() => {
                    if st.intent.flush_done() {
                        self.persist_bitmap(&st)?;
                    }
                }
                Ok(()) => {}
                Err(e) => self.peer_failed(&mut st, &t, &e)?,
            }
        }
        local
    }
}

impl BlockDevice for Mirror {
    fn size(&self) -> u64 {
        self.inner.layout.data_size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let inner = &self.inner;
        check_range_of("mirror", inner.layout.data_size, offset, buf.len() as u64)?;
        {
            let st = inner.state.lock();
            if st.role != Role::Primary {
                return Err(refuse(
                    ErrorClass::NotReady,
                    format!("{}: this node is secondary", inner.name),
                ));
            }
            // Alone past the lease, the other node may own the data now.
            let alone = inner.replicating(&st).is_none();
            if let Some(f) = inner.options.failover.as_ref().filter(|_| alone) {
                if !f.still_granted(&inner.name) {
                    return Err(refuse(
                        ErrorClass::Fenced,
                        format!("{}: without the peer and the witness's lease", inner.name),
                    ));
                }
            }
        }
        inner.local.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.inner.replicate(Op::Write(buf, fua), offset)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.replicate(Op::Zeroes(len), offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn capabilities(&self) -> Capabilities {
        // The peer's cache is volatile as far as this node knows, and
        // discards are not replicated (what they leave differs by device).
        Capabilities {
            thin: false,
            volatile_cache: true,
            may_block: true,
            discard_zeroes: false,
            discard: false,
            read_only: self.inner.local.capabilities().read_only,
        }
    }

    fn describe(&self) -> String {
        format!(
            "mirror:{} of {} with {}",
            self.inner.name,
            self.inner.local.describe(),
            self.inner.peer_name
        )
    }
}
