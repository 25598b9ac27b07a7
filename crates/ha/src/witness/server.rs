//! The witness's listener: authenticates each connection with the pair's
//! secret (the link's handshake, under the link's limits for strangers),
//! then answers claims and releases one frame at a time.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use peer_limits::{auth_keys, AuthThrottle, EventLog, PreLoginBudget};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use super::lease::{Key, Leases, Verdict};
use super::store::Store;
use super::wire::{self, Answer, Request, MAX_MESSAGE, WITNESS_NAME};
use crate::link::handshake::{self, MAX_NAME};

/// An authenticated node may keep a connection open this long between
/// requests.
const IDLE: Duration = Duration::from_secs(30);
const PRELOGIN_PER_SOURCE: usize = 8;
const PRELOGIN_TOTAL: usize = 64;

pub struct WitnessSettings {
    pub listen: SocketAddr,
    pub secret: Vec<u8>,
    /// Where the records are kept across restarts; in memory only
    /// without it.
    pub state_dir: Option<PathBuf>,
}

pub struct Witness {
    leases: Mutex<Leases>,
    store: Option<Store>,
    secret: Vec<u8>,
    local: SocketAddr,
    throttle: AuthThrottle,
    prelogin: Arc<PreLoginBudget>,
    wrong_secret: EventLog,
}

impl Witness {
    /// Reads the records back, binds and starts answering. Within a
    /// Tokio runtime.
    pub async fn start(settings: WitnessSettings) -> io::Result<Arc<Witness>> {
        let store = settings.state_dir.as_deref().map(Store::open).transpose()?;
        let records = match &store {
            Some(s) => s.load()?,
            None => Vec::new(),
        };
        let listener = TcpListener::bind(settings.listen).await.map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("witness listen address {}: {e}", settings.listen),
            )
        })?;
        let witness = Arc::new(Witness {
            leases: Mutex::new(Leases::restored(records, Instant::now())),
            store,
            secret: settings.secret,
            local: listener.local_addr()?,
            throttle: AuthThrottle::default(),
            prelogin: PreLoginBudget::new(PRELOGIN_PER_SOURCE, PRELOGIN_TOTAL),
            wrong_secret: EventLog::new(Duration::from_secs(10)),
        });
        tokio::spawn(witness.clone().accept_loop(listener));
        Ok(witness)
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Applies `node`'s request at `now`; a record that changed is on
    /// disk before the answer says so.
    pub fn decide(&self, node: &str, req: &Request, now: Instant) -> Answer {
        let mut leases = self.leases.lock();
        let (key, verdict, before) = match req {
            Request::Claim {
                peer,
                mirror,
                generations,
                lease,
            } => {
                let key = Key::new(node, peer, mirror);
                let before = leases.get(&key).cloned();
                let v = leases.claim(now, &key, node, *generations, *lease);
                (key, v, before)
            }
            Request::Release { peer, mirror } => {
                let key = Key::new(node, peer, mirror);
                let before = leases.get(&key).cloned();
                (key.clone(), leases.release(&key, node), before)
            }
        };
        let after = leases.get(&key).cloned();
        let durable = |r: &Option<super::lease::Record>| {
            r.as_ref()
                .map(|r| (r.holder.clone(), r.generations, r.lease))
        };
        if let (Some(store), true) = (&self.store, durable(&before) != durable(&after)) {
            if let Err(e) = store.save(leases.records()) {
                tracing::error!("witness: cannot record the lease of {key:?}: {e}");
                leases.put_back(&key, before);
                return Answer::Refused(format!("the witness cannot record the grant: {e}"));
            }
        }
        let new_holder = before.as_ref().is_none_or(|b| b.holder != node);
        if matches!(verdict, Verdict::Granted { .. }) && new_holder {
            tracing::info!(node, mirror = %key.mirror, "witness: lease granted to a new holder");
        }
        Answer::Verdict(verdict)
    }

    async fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        loop {
            match listener.accept().await {
                Ok((stream, from)) => {
                    tokio::spawn(self.clone().serve(stream, from));
                }
                Err(e) => {
                    tracing::warn!("witness listener: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    async fn serve(self: Arc<Self>, mut stream: TcpStream, from: SocketAddr) {
        let Ok(ticket) = self.prelogin.admit(from.ip()) else {
            return;
        };
        let deadline = Instant::now() + handshake::HANDSHAKE_TIMEOUT;
        let node = tokio::select! {
            _ = ticket.evicted() => return,
            r = tokio::time::timeout_at(deadline.into(), self.authenticate(&mut stream, from, deadline)) => r,
        };
        drop(ticket);
        let node = match node {
            Ok(Ok(Some(node))) => node,
            Ok(Ok(None)) => return,
            Ok(Err(e)) => return tracing::debug!(%from, "witness handshake failed: {e}"),
            Err(_) => return tracing::debug!(%from, "witness handshake timed out"),
        };
        if let Err(e) = self.answer_requests(&mut stream, &node).await {
            tracing::debug!(%from, node, "witness: connection ended: {e}");
        }
    }

    async fn answer_requests(&self, stream: &mut TcpStream, node: &str) -> io::Result<()> {
        loop {
            let frame = match tokio::time::timeout(
                IDLE,
                crate::wire::read_frame(stream, MAX_MESSAGE),
            )
            .await
            {
                Ok(Ok(f)) => f,
                Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Ok(Err(e)) => return Err(e),
                Err(_) => return Ok(()),
            };
            let answer = match Request::decode(frame.kind, &frame.payload) {
                Ok(req) => self.decide(node, &req, Instant::now()),
                Err(e) => Answer::Refused(e.to_string()),
            };
            let bytes = crate::wire::encode(wire::ANSWER, &wire::encode_answer(&answer));
            stream.write_all(&bytes).await?;
        }
    }

    /// The node's name once it proved the secret; `None` if it did not.
    async fn authenticate(
        &self,
        stream: &mut TcpStream,
        from: SocketAddr,
        deadline: Instant,
    ) -> io::Result<Option<String>> {
        let claim = handshake::listen(stream, WITNESS_NAME).await?;
        if !wire::name_ok(&claim.name, MAX_NAME) {
            return Ok(None);
        }
        let keys = auth_keys(&claim.name, from.ip());
        let Some(at) = self.throttle.reserve(&keys, deadline) else {
            return Ok(None);
        };
        tokio::time::sleep_until(at.into()).await;
        let name = claim.name.clone();
        if claim
            .check(stream, WITNESS_NAME, &name, &self.secret)
            .await?
        {
            self.throttle.succeeded(&keys);
            return Ok(Some(name));
        }
        let (count, delay) = self.throttle.failed(&keys);
        self.wrong_secret.record(|held_back| {
            tracing::warn!(
                %from,
                claimed = %name,
                "witness: a connection failed to prove the shared secret ({count} in a row from it; \
                 next attempt waits {} ms; {held_back} such lines held back)",
                delay.as_millis()
            )
        });
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::generations::Generations;
    use crate::witness::client::WitnessClient;

    const SECRET: &[u8] = b"0123456789abcdef-pair";

    fn client(w: &Witness, node: &str, secret: &[u8]) -> WitnessClient {
        WitnessClient {
            address: w.local_addr().to_string(),
            node: node.into(),
            secret: secret.to_vec(),
            timeout: Duration::from_secs(5),
        }
    }

    fn claim(peer: &str, current: u64) -> Request {
        Request::Claim {
            peer: peer.into(),
            mirror: "vm".into(),
            generations: Generations {
                current,
                bitmap: 0,
                history: [0; 2],
            },
            lease: Duration::from_secs(60),
        }
    }

    #[tokio::test]
    async fn only_a_node_with_the_secret_is_answered_and_grants_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let settings = || WitnessSettings {
            listen: "127.0.0.1:0".parse().unwrap(),
            secret: SECRET.to_vec(),
            state_dir: Some(dir.path().to_path_buf()),
        };
        let w = Witness::start(settings()).await.unwrap();
        let e = client(&w, "a", b"0123456789abcdef-nope")
            .ask(&claim("b", 10))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        let a = client(&w, "a", SECRET).ask(&claim("b", 10)).await.unwrap();
        assert!(
            matches!(a, Answer::Verdict(Verdict::Granted { .. })),
            "{a:?}"
        );
        let b = client(&w, "b", SECRET).ask(&claim("a", 10)).await.unwrap();
        assert!(
            matches!(b, Answer::Verdict(Verdict::Held { ref holder, .. }) if holder == "a"),
            "{b:?}"
        );
        // A restarted witness still knows a holds the lease.
        drop(w);
        let w = Witness::start(settings()).await.unwrap();
        let b = client(&w, "b", SECRET).ask(&claim("a", 10)).await.unwrap();
        assert!(
            matches!(b, Answer::Verdict(Verdict::Held { ref holder, .. }) if holder == "a"),
            "{b:?}"
        );
    }
}
