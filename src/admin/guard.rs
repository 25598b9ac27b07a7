//! What guards the TCP administration API: the bearer token, compared in
//! constant time; the back-off iSCSI applies to wrong CHAP secrets,
//! applied to wrong tokens per source address; and the pre-login budget
//! for its connections, so that one address cannot hold them all.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use peer_limits::{AuthThrottle, EventLog, PreLoginBudget, PreLoginTicket};
use subtle::ConstantTimeEq;

/// The secret a TCP caller must present as `Authorization: Bearer <token>`.
pub struct Token(Vec<u8>);

impl Token {
    pub fn new(token: &str) -> Token {
        Token(token.as_bytes().to_vec())
    }

    /// Whether the header carries the token. The comparison takes the same
    /// time wherever the first difference is, so timing tells nothing.
    fn admits(&self, header: Option<&HeaderValue>) -> bool {
        let Some(given) = header
            .map(HeaderValue::as_bytes)
            .and_then(|h| h.strip_prefix(b"Bearer "))
        else {
            return false;
        };
        bool::from(given.ct_eq(&self.0))
    }
}

/// Why a request was not let through.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// More than one `Authorization` header: which one counts would be a
    /// guess, so none does.
    Ambiguous,
    /// No token, or a wrong one.
    WrongToken,
    /// Earlier failures from this address delay its attempts past the
    /// longest wait; the token was not looked at.
    Delayed,
}

const EVENT_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The token and what limits its callers, for one TCP listener.
pub struct ApiGuard {
    token: Token,
    throttle: AuthThrottle,
    connections: Arc<PreLoginBudget>,
    wrong_token: EventLog,
    refused_connection: EventLog,
}

impl ApiGuard {
    /// `delay`, `delay_max`: the `[daemon]` auth_fail_delay settings;
    /// `per_source`, `total`: its max_logins_per_source and max_logins.
    pub fn new(
        token: Token,
        (delay, delay_max): (Duration, Duration),
        (per_source, total): (usize, usize),
    ) -> ApiGuard {
        ApiGuard {
            token,
            throttle: AuthThrottle::new(delay, delay_max, Arc::default()),
            connections: PreLoginBudget::new(per_source, total),
            wrong_token: EventLog::new(EVENT_LOG_INTERVAL),
            refused_connection: EventLog::new(EVENT_LOG_INTERVAL),
        }
    }

    /// A place for a new connection from `peer`, the oldest waiting one
    /// evicted when all are taken; `None` when its address holds its share.
    pub fn admit(&self, peer: IpAddr) -> Option<PreLoginTicket> {
        let admitted = self.connections.admit(peer).ok();
        if admitted.is_none() {
            self.refused_connection.record(|held_back| {
                tracing::warn!(%peer, held_back, "admin API: refused a connection: its address has its most open");
            });
        }
        admitted
    }

    /// Lets a request from `peer` through if it bears the token. Its
    /// address's earlier failures delay it first; a failure delays the
    /// next attempts further.
    pub async fn check(&self, peer: IpAddr, headers: &HeaderMap) -> Result<(), Refused> {
        let mut given = headers.get_all(AUTHORIZATION).iter();
        let header = given.next();
        if given.next().is_some() {
            return Err(Refused::Ambiguous);
        }
        let keys = peer_limits::auth_source_keys(peer);
        let latest = Instant::now() + self.throttle_max();
        let Some(start) = self.throttle.reserve(&keys, latest) else {
            self.log_failure(peer, "delayed past the longest wait; token not checked");
            return Err(Refused::Delayed);
        };
        tokio::time::sleep_until(start.into()).await;
        if self.token.admits(header) {
            self.throttle.succeeded(&keys);
            return Ok(());
        }
        let (failures, next_delay) = self.throttle.failed(&keys);
        let why =
            format!("no token or a wrong one; {failures} in a row, next waits {next_delay:?}");
        self.log_failure(peer, &why);
        Err(Refused::WrongToken)
    }

    fn throttle_max(&self) -> Duration {
        // The longest single wait: beyond it the caller is told to retry.
        self.throttle.delay_max()
    }

    fn log_failure(&self, peer: IpAddr, why: &str) {
        self.wrong_token.record(|held_back| {
            tracing::warn!(%peer, held_back, "admin API: request refused: {why}");
        });
    }

    /// Requests refused for their token since start.
    #[cfg(test)]
    fn failures(&self) -> u64 {
        self.throttle.failures()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_must_match_exactly() {
        let token = Token::new("s3cret-token");
        let header = |v: &str| HeaderValue::from_str(v).unwrap();
        assert!(token.admits(Some(&header("Bearer s3cret-token"))));
        assert!(!token.admits(None));
        assert!(!token.admits(Some(&header("Bearer s3cret-toke"))));
        assert!(!token.admits(Some(&header("Bearer s3cret-token2"))));
        assert!(!token.admits(Some(&header("Basic s3cret-token"))));
        assert!(!token.admits(Some(&header("s3cret-token"))));
        assert!(!token.admits(Some(&header("Bearer "))));
    }

    fn guard() -> ApiGuard {
        let delays = (Duration::from_millis(40), Duration::from_millis(200));
        ApiGuard::new(Token::new("s3cret-token"), delays, (2, 4))
    }

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[tokio::test]
    async fn wrong_tokens_slow_their_address_and_two_headers_are_refused() {
        let g = guard();
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let right = headers(&["Bearer s3cret-token"]);
        let wrong = headers(&["Bearer guess"]);
        let both = headers(&["Bearer s3cret-token", "Bearer guess"]);
        assert_eq!(g.check(ip, &both).await, Err(Refused::Ambiguous));
        assert_eq!(g.check(ip, &right).await, Ok(()));
        let started = Instant::now();
        for _ in 0..3 {
            assert_eq!(g.check(ip, &wrong).await, Err(Refused::WrongToken));
        }
        // Waits of 40 and 80 ms before the second and third guesses.
        assert!(started.elapsed() >= Duration::from_millis(120));
        assert_eq!(g.failures(), 3);
        // Another address is not slowed.
        let other = Instant::now();
        assert_eq!(g.check("192.0.2.2".parse().unwrap(), &right).await, Ok(()));
        assert!(other.elapsed() < Duration::from_millis(40));
        // The right token still gets through once its slot comes.
        assert_eq!(g.check(ip, &right).await, Ok(()));
    }

    #[test]
    fn one_address_holds_only_its_share_of_connections() {
        let g = guard();
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let held = [g.admit(ip), g.admit(ip)];
        assert!(held.iter().all(Option::is_some));
        assert!(g.admit(ip).is_none());
        assert!(g.admit("192.0.2.2".parse().unwrap()).is_some());
    }
}
