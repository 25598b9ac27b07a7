//! Slowing down secret guessing (CHAP proofs, API tokens): every failed
//! attempt delays the next attempts of the same name and of the same
//! source address (IPv6 by its /64, which one host usually has whole), so
//! neither many connections nor many names get around it.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::auth_backoff::{KeyedBackoff, Settings};

/// Keys remembered: a few hundred kilobytes at most.
const CAPACITY: usize = 8192;
/// A key quiet for this long has its count halved.
const DECAY: Duration = Duration::from_secs(60);
/// Names are cut to this many bytes as keys (iSCSI names have at most
/// 223), so long names cannot inflate the table.
const MAX_NAME_KEY: usize = 255;

/// What an attempt is counted against.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    /// The name it claims (an iSCSI initiator name).
    Name(Box<str>),
    Source(IpAddr),
}

/// The keys an attempt by `name` from `source` is counted against.
pub fn keys(name: &str, source: IpAddr) -> [Key; 2] {
    let mut end = name.len().min(MAX_NAME_KEY);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    [
        Key::Name(name[..end].into()),
        Key::Source(source_key(source)),
    ]
}

/// The key of an attempt that claims no name (an API token): its source.
pub fn source_keys(source: IpAddr) -> [Key; 1] {
    [Key::Source(source_key(source))]
}

/// A source as limits count it: IPv6 by its /64.
pub(crate) fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(prefix.into())
            }
        },
    }
}

/// The back-off of failed attempts and their count.
pub struct AuthThrottle {
    backoff: Mutex<KeyedBackoff<Key>>,
    failures: Arc<AtomicU64>,
}

impl AuthThrottle {
    pub const DEFAULT_DELAY: Duration = Duration::from_millis(100);
    pub const DEFAULT_DELAY_MAX: Duration = Duration::from_secs(5);

    /// Delays from `delay` doubling up to `delay_max`; failures are counted
    /// into `failures` (shared with whoever reports them).
    pub fn new(delay: Duration, delay_max: Duration, failures: Arc<AtomicU64>) -> AuthThrottle {
        AuthThrottle {
            backoff: Mutex::new(KeyedBackoff::new(Settings {
                base: delay,
                max: delay_max.max(delay),
                decay: DECAY,
                capacity: CAPACITY,
            })),
            failures,
        }
    }

    /// The longest delay a key's failures can bring.
    pub fn delay_max(&self) -> Duration {
        self.lock().settings().max
    }

    /// Failed attempts since start.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, KeyedBackoff<Key>> {
        self.backoff.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When an attempt for `keys` may be checked (its slot taken), or
    /// `None` if not before `latest`.
    pub fn reserve(&self, keys: &[Key], latest: Instant) -> Option<Instant> {
        self.lock().reserve(keys, Instant::now(), latest)
    }

    /// Counts a wrong secret; the failures in a row now held against the
    /// attempt's keys and the delay the next attempt will wait.
    pub fn failed(&self, keys: &[Key]) -> (u32, Duration) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let mut backoff = self.lock();
        let count = backoff.failed(keys, Instant::now());
        (count, backoff.delay(count))
    }

    /// A right secret: its keys start over.
    pub fn succeeded(&self, keys: &[Key]) {
        self.lock().succeeded(keys);
    }
}

impl Default for AuthThrottle {
    fn default() -> Self {
        AuthThrottle::new(Self::DEFAULT_DELAY, Self::DEFAULT_DELAY_MAX, Arc::default())
    }
}

impl std::fmt::Debug for AuthThrottle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backoff = self.lock();
        f.debug_struct("AuthThrottle")
            .field("delay", &backoff.settings().base)
            .field("delay_max", &backoff.settings().max)
            .field("keys", &backoff.len())
            .field("failures", &self.failures())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_keyed_by_host_and_names_are_bounded() {
        let v6 = |s: &str| -> IpAddr { s.parse().unwrap() };
        assert_eq!(
            keys("iqn.a", v6("2001:db8:1:2:3:4:5:6"))[1],
            Key::Source(v6("2001:db8:1:2::"))
        );
        assert_eq!(
            keys("iqn.a", v6("::ffff:192.0.2.7"))[1],
            Key::Source(v6("192.0.2.7"))
        );
        let long = "é".repeat(400);
        let [Key::Name(name), _] = keys(&long, v6("192.0.2.7")) else {
            panic!("keys are a name and a source");
        };
        assert!(name.len() <= MAX_NAME_KEY && long.starts_with(&*name));
        assert_eq!(
            source_keys(v6("2001:db8:1:2:3:4:5:6")),
            [Key::Source(v6("2001:db8:1:2::"))]
        );
    }

    #[test]
    fn failures_are_counted_and_delay_both_keys() {
        let counter = Arc::new(AtomicU64::new(0));
        let t = AuthThrottle::new(
            Duration::from_millis(50),
            Duration::from_secs(1),
            counter.clone(),
        );
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let attempt = keys("iqn.a", ip);
        let far = Instant::now() + Duration::from_secs(60);
        let start = t.reserve(&attempt, far).unwrap();
        assert!(start <= Instant::now());
        assert_eq!(t.failed(&attempt), (1, Duration::from_millis(50)));
        assert_eq!(counter.load(Ordering::Relaxed), 1);
        // Another name from the same address waits, and so does the same
        // name from elsewhere.
        let now = Instant::now();
        for other in [
            keys("iqn.b", ip),
            keys("iqn.a", "192.0.2.2".parse().unwrap()),
        ] {
            assert!(t.reserve(&other, far).unwrap() > now);
        }
        t.succeeded(&attempt);
        assert_eq!(t.failures(), 1, "the count of failures stays");
    }
}
