//! One authenticated connection to the peer: a writer task draining a
//! byte-bounded queue with a deadline per write, a reader task that
//! dispatches frames and declares the peer gone when nothing arrives
//! within the heartbeat timeout, and the requests waiting for replies.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use peer_limits::{write_deadline, OutgoingBudget, Stalled};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

use crate::wire::{self, put_str, read_frame, Reader};

pub(crate) const PING: u8 = 10;
pub(crate) const PONG: u8 = 11;
pub(crate) const REQUEST: u8 = 20;
pub(crate) const REPLY: u8 = 21;
pub(crate) const NOTICE: u8 = 22;

/// The first byte of the reply to a request for a device the peer does
/// not have; the name follows.
pub const NO_SUCH_DEVICE: u8 = 0xff;

/// The largest payload after authentication: a write of up to
/// [`MAX_DATA`] and its header, or a bitmap image.
pub const MAX_FRAME: usize = MAX_DATA + 4096;
/// The most data one request carries; larger writes are split.
pub const MAX_DATA: usize = 1 << 20;
/// Bytes queued toward the peer before senders wait.
const OUTGOING_BYTES: usize = 16 << 20;
/// Bytes of the peer's requests being carried out at once; past it the
/// reader stops reading and TCP pushes back.
const INCOMING_BYTES: usize = 32 << 20;

/// What the link carries for one device: its end of the pair.
pub trait Endpoint: Send + Sync {
    /// A session to the peer is up (a later one may replace it).
    fn connected(&self, session: &Arc<Session>);
    /// Session `id` ended; ignore it unless it is the one in use.
    fn disconnected(&self, id: u64);
    /// A one-way message from the peer's device of the same name.
    fn notice(&self, session: &Arc<Session>, payload: Vec<u8>);
    /// A request to answer with [`Incoming::reply`]; must not block.
    fn request(&self, request: Incoming);
}

/// A request from the peer, holding its share of the incoming budget
/// until it is answered.
pub struct Incoming {
    pub session: Arc<Session>,
    pub payload: Vec<u8>,
    id: u64,
    _permit: OwnedSemaphorePermit,
}

impl Incoming {
    pub fn reply(self, body: &[u8]) {
        let mut p = self.id.to_le_bytes().to_vec();
        p.extend_from_slice(body);
        // A lost session fails the peer's request on its side.
        let _ = self.session.send(wire::encode(REPLY, &p));
    }
}

struct Queued {
    bytes: Vec<u8>,
    taken: u32,
}

type ReplySender = std_mpsc::SyncSender<Vec<u8>>;

pub struct Session {
    pub id: u64,
    pub peer: String,
    out: mpsc::UnboundedSender<Queued>,
    budget: OutgoingBudget,
    pending: Mutex<HashMap<u64, ReplySender>>,
    next: AtomicU64,
    closed: AtomicBool,
    close_tx: watch::Sender<bool>,
    rtt_us: AtomicU64,
    deadline: Duration,
    handle: tokio::runtime::Handle,
    me: Weak<Session>,
}

/// A reply the caller waits for.
pub struct Pending {
    rx: std_mpsc::Receiver<Vec<u8>>,
    id: u64,
    session: Arc<Session>,
}

impl Pending {
    /// The reply's body; an error when the session ends first or the
    /// reply takes longer than `timeout`.
    pub fn wait(self, timeout: Duration) -> io::Result<Vec<u8>> {
        match self.rx.recv_timeout(timeout) {
            Ok(body) => Ok(body),
            Err(std_mpsc::RecvTimeoutError::Timeout) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{} did not answer within {} ms",
                    self.session.peer,
                    timeout.as_millis()
                ),
            )),
            Err(std_mpsc::RecvTimeoutError::Disconnected) => Err(lost(&self.session.peer)),
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.session.pending.lock().remove(&self.id);
    }
}

pub fn lost(peer: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        format!("the link to {peer} is down"),
    )
}

impl Session {
    /// Sends a request for `device` and returns what to wait on.
    pub fn request(&self, device: &str, body: &[u8]) -> io::Result<Pending> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = std_mpsc::sync_channel(1);
        self.pending.lock().insert(id, tx);
        let session = self.me.upgrade().ok_or_else(|| lost(&self.peer))?;
        let pending = Pending { rx, id, session };
        let mut p = id.to_le_bytes().to_vec();
        put_str(&mut p, device);
        p.extend_from_slice(body);
        self.send(wire::encode(REQUEST, &p))?;
        Ok(pending)
    }

    /// Sends a one-way message for `device`. Notices are small and few
    /// (a state change), and must not be overtaken by the requests sent
    /// after them, so they are queued in order even when the queue is
    /// over its budget.
    pub fn notice(&self, device: &str, body: &[u8]) -> io::Result<()> {
        let mut p = Vec::with_capacity(body.len() + device.len() + 2);
        put_str(&mut p, device);
        p.extend_from_slice(body);
        let bytes = wire::encode(NOTICE, &p);
        if self.is_closed() {
            return Err(lost(&self.peer));
        }
        let taken = self.budget.try_take(bytes.len()).unwrap_or(0);
        self.out
            .send(Queued { bytes, taken })
            .map_err(|_| lost(&self.peer))
    }

    /// Queues a frame, waiting in the background (up to the write
    /// deadline) when the queue is full.
    fn send(&self, bytes: Vec<u8>) -> io::Result<()> {
        if self.is_closed() {
            return Err(lost(&self.peer));
        }
        match self.budget.try_take(bytes.len()) {
            Ok(taken) => self
                .out
                .send(Queued { bytes, taken })
                .map_err(|_| lost(&self.peer)),
            Err(Stalled::Closed) => Err(lost(&self.peer)),
            Err(Stalled::Deadline) => {
                let Some(me) = self.me.upgrade() else {
                    return Err(lost(&self.peer));
                };
                self.handle.spawn(async move {
                    match me.budget.take(bytes.len(), me.deadline).await {
                        Ok(taken) => {
                            let _ = me.out.send(Queued { bytes, taken });
                        }
                        Err(_) => me.close("the peer did not drain the link's queue"),
                    }
                });
                Ok(())
            }
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Ends the session: queued frames are dropped and every waiting
    /// request fails.
    pub fn close(&self, why: &str) {
        if !self.closed.swap(true, Ordering::SeqCst) {
            tracing::info!(peer = %self.peer, session = self.id, "link session ends: {why}");
            self.budget.close();
            self.pending.lock().clear();
            let _ = self.close_tx.send(true);
        }
    }

    /// Round-trip time of the last heartbeat.
    pub fn rtt(&self) -> Option<Duration> {
        match self.rtt_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }
}

/// How a session runs.
#[derive(Clone, Debug)]
pub struct Timing {
    pub heartbeat_interval: Duration,
    pub heartbeat_timeout: Duration,
}

/// Looks up the device a frame is for.
pub type Router = Arc<dyn Fn(&str) -> Option<Arc<dyn Endpoint>> + Send + Sync>;

/// Starts a session over an authenticated stream. `begin` runs before
/// anything from the peer is read (so every device knows of the session
/// before its first frame), `ended` once both of its tasks stopped.
pub(crate) fn start(
    id: u64,
    peer: String,
    stream: tokio::net::TcpStream,
    timing: Timing,
    route: Router,
    begin: impl FnOnce(&Arc<Session>),
    ended: impl FnOnce(Arc<Session>) + Send + 'static,
) -> Arc<Session> {
    let _ = stream.set_nodelay(true);
    let (read, write) = stream.into_split();
    let (out, rx) = mpsc::unbounded_channel();
    let (close_tx, close_rx) = watch::channel(false);
    let session = Arc::new_cyclic(|me| Session {
        id,
        peer,
        out,
        budget: OutgoingBudget::new(OUTGOING_BYTES),
        pending: Mutex::new(HashMap::new()),
        next: AtomicU64::new(1),
        closed: AtomicBool::new(false),
        close_tx,
        rtt_us: AtomicU64::new(0),
        deadline: timing.heartbeat_timeout,
        handle: tokio::runtime::Handle::current(),
        me: me.clone(),
    });
    let writer = tokio::spawn(write_loop(
        session.clone(),
        write,
        rx,
        close_rx.clone(),
        timing.clone(),
    ));
    begin(&session);
    let s = session.clone();
    tokio::spawn(async move {
        let why = read_loop(&s, read, close_rx, &timing, &route).await;
        s.close(&why);
        let _ = writer.await;
        ended(s);
    });
    session
}

async fn write_loop(
    s: Arc<Session>,
    mut w: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Queued>,
    mut closed: watch::Receiver<bool>,
    timing: Timing,
) {
    let started = Instant::now();
    let mut tick = tokio::time::interval(timing.heartbeat_interval);
    let mut seq = 0u64;
    loop {
        let (bytes, taken) = tokio::select! {
            _ = closed.changed() => break,
            q = rx.recv() => match q {
                Some(q) => (q.bytes, q.taken),
                None => break,
            },
            _ = tick.tick() => {
                seq += 1;
                let mut p = seq.to_le_bytes().to_vec();
                p.extend_from_slice(&(started.elapsed().as_micros() as u64).to_le_bytes());
                (wire::encode(PING, &p), 0)
            }
        };
        let r = write_deadline(timing.heartbeat_timeout, w.write_all(&bytes)).await;
        s.budget.give_back(taken);
        if let Err(e) = r {
            s.close(&format!("writing to the peer failed: {e}"));
            break;
        }
    }
    let _ = w.shutdown().await;
}

async fn read_loop(
    s: &Arc<Session>,
    mut r: OwnedReadHalf,
    mut closed: watch::Receiver<bool>,
    timing: &Timing,
    route: &Router,
) -> String {
    let incoming = Arc::new(Semaphore::new(INCOMING_BYTES));
    let epoch = Instant::now();
    loop {
        let frame = tokio::select! {
            _ = closed.changed() => return "closed".into(),
            f = tokio::time::timeout(timing.heartbeat_timeout, read_frame(&mut r, MAX_FRAME)) => f,
        };
        let frame = match frame {
            Err(_) => {
                return format!(
                    "the peer is gone: nothing heard for {} ms",
                    timing.heartbeat_timeout.as_millis()
                )
            }
            Ok(Err(e)) => return format!("reading from the peer failed: {e}"),
            Ok(Ok(f)) => f,
        };
        if let Err(e) = dispatch(s, frame, &incoming, epoch, route).await {
            return format!("{e}");
        }
    }
}

async fn dispatch(
    s: &Arc<Session>,
    frame: wire::Frame,
    incoming: &Arc<Semaphore>,
    epoch: Instant,
    route: &Router,
) -> io::Result<()> {
    let mut p = Reader::new(&frame.payload);
    match frame.kind {
        PING => {
            let echo = p.bytes(16)?.to_vec();
            p.end()?;
            s.send(wire::encode(PONG, &echo))?;
        }
        PONG => {
            let _seq = p.u64()?;
            let sent = p.u64()?;
            p.end()?;
            let now = epoch.elapsed().as_micros() as u64;
            // The writer's clock started a moment before this reader's.
            s.rtt_us
                .store(now.saturating_sub(sent).max(1), Ordering::Relaxed);
        }
        REPLY => {
            let id = p.u64()?;
            let body = p.rest().to_vec();
            if let Some(tx) = s.pending.lock().remove(&id) {
                let _ = tx.try_send(body);
            }
        }
        REQUEST => {
            let id = p.u64()?;
            let device = p.str()?.to_string();
            let body = p.rest().to_vec();
            // What a request pins besides its data (a task, a reply).
            let cost = (body.len() + 512).min(INCOMING_BYTES) as u32;
            let permit = incoming
                .clone()
                .acquire_many_owned(cost)
                .await
                .map_err(|_| lost(&s.peer))?;
            let request = Incoming {
                session: s.clone(),
                payload: body,
                id,
                _permit: permit,
            };
            match route(&device) {
                Some(ep) => ep.request(request),
                None => {
                    let mut b = vec![NO_SUCH_DEVICE];
                    put_str(&mut b, &device);
                    request.reply(&b)
                }
            }
        }
        NOTICE => {
            let device = p.str()?.to_string();
            let body = p.rest().to_vec();
            if let Some(ep) = route(&device) {
                ep.notice(s, body);
            }
        }
        k => return Err(wire::malformed(format!("unknown frame kind {k}"))),
    }
    Ok(())
}
