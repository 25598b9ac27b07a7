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
use web_console::Role;

/// The secrets a TCP caller must present as `Authorization: Bearer
/// <token>`: the full token, and optionally a read-only one.
pub struct Token {
    full: Vec<u8>,
    read_only: Option<Vec<u8>>,
}

impl Token {
    pub fn new(token: &str) -> Token {
        Token {
            full: token.as_bytes().to_vec(),
            read_only: None,
        }
    }

    /// With `read_only`, whose callers may read but not change.
    pub fn with_read_only(mut self, read_only: Option<&str>) -> Token {
        self.read_only = read_only.map(|t| t.as_bytes().to_vec());
        self
    }

    /// The role of the token the header carries, if it is one of ours.
    fn admits(&self, header: Option<&HeaderValue>) -> Option<Role> {
        let given = header
            .map(HeaderValue::as_bytes)
            .and_then(|h| h.strip_prefix(b"Bearer "))?;
        self.role_of(given)
    }

    /// Both comparisons take the same time wherever the first difference
    /// is, and both are always made, so timing tells nothing.
    fn role_of(&self, given: &[u8]) -> Option<Role> {
        let full = bool::from(given.ct_eq(&self.full));
        let read_only = self
            .read_only
            .as_ref()
            .is_some_and(|t| bool::from(given.ct_eq(t)));
        match (full, read_only) {
            (true, _) => Some(Role::Full),
            (false, true) => Some(Role::ReadOnly),
            _ => None,
        }
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
    pub async fn check(&self, peer: IpAddr, headers: &HeaderMap) -> Result<Role, Refused> {
        let mut given = headers.get_all(AUTHORIZATION).iter();
        let header = given.next();
        if given.next().is_some() {
            return Err(Refused::Ambiguous);
        }
        self.throttled(peer, || self.token.admits(header)).await
    }

    /// A token typed into the console's login page, checked like one in
    /// a header: the same back-off, the same log.
    pub async fn check_token(&self, peer: IpAddr, token: &[u8]) -> Result<Role, Refused> {
        self.throttled(peer, || self.token.role_of(token)).await
    }

    async fn throttled(
        &self,
        peer: IpAddr,
        admits: impl FnOnce() -> Option<Role>,
    ) -> Result<Role, Refused> {
        let keys = peer_limits::auth_source_keys(peer);
        let latest = Instant::now() + self.throttle_max();
        let Some(start) = self.throttle.reserve(&keys, latest) else {
            self.log_failure(peer, "delayed past the longest wait; token not checked");
            return Err(Refused::Delayed);
        };
        tokio::time::sleep_until(start.into()).await;
        if let Some(role) = admits() {
            self.throttle.succeeded(&keys);
            return Ok(role);
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
        assert_eq!(
            token.admits(Some(&header("Bearer s3cret-token"))),
            Some(Role::Full)
        );
        assert_eq!(token.admits(None), None);
        for wrong in [
            "Bearer s3cret-toke",
            "Bearer s3cret-token2",
            "Basic s3cret-token",
            "s3cret-token",
            "Bearer ",
        ] {
            assert_eq!(token.admits(Some(&header(wrong))), None, "{wrong}");
        }
        let both = Token::new("s3cret-token").with_read_only(Some("look-but-do-not-touch"));
        assert_eq!(both.role_of(b"s3cret-token"), Some(Role::Full));
        assert_eq!(both.role_of(b"look-but-do-not-touch"), Some(Role::ReadOnly));
        assert_eq!(both.role_of(b"look-but-do-not-touc"), None);
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
        assert_eq!(g.check(ip, &right).await, Ok(Role::Full));
        let started = Instant::now();
        for _ in 0..3 {
            assert_eq!(g.check(ip, &wrong).await, Err(Refused::WrongToken));
        }
        // Waits of 40 and 80 ms before the second and third guesses.
        assert!(started.elapsed() >= Duration::from_millis(120));
        assert_eq!(g.failures(), 3);
        // Another address is not slowed.
        let other = Instant::now();
        assert_eq!(
            g.check("192.0.2.2".parse().unwrap(), &right).await,
            Ok(Role::Full)
        );
        assert!(other.elapsed() < Duration::from_millis(40));
        // The right token still gets through once its slot comes, and a
        // wrong one typed into the console counts like one in a header.
        assert_eq!(g.check(ip, &right).await, Ok(Role::Full));
        assert_eq!(g.check_token(ip, b"guess").await, Err(Refused::WrongToken));
        assert_eq!(g.failures(), 4);
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
