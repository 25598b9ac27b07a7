//! Console sessions: a random id in an HttpOnly cookie, mapped here to the
//! role of the token that logged in, until it expires or logs out.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hyper::header::{HeaderMap, COOKIE};
use parking_lot::Mutex;
use rand::RngCore;

use crate::Role;

/// The cookie's name.
pub const COOKIE_NAME: &str = "openarray_console";
/// How long a login lasts, idle or not.
pub const LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Sessions held at once; logging in past this forgets the oldest, so
/// repeated logins cannot grow the daemon's memory.
const MAX_SESSIONS: usize = 256;
/// Random bytes in an id (shown as twice as many hex digits).
const ID_BYTES: usize = 32;

struct Session {
    role: Role,
    expires: Instant,
}

#[derive(Default)]
pub struct Sessions {
    by_id: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    /// A new session for `role`; its id, to be set as the cookie.
    pub fn open(&self, role: Role) -> String {
        let mut bytes = [0u8; ID_BYTES];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let now = Instant::now();
        let mut by_id = self.by_id.lock();
        by_id.retain(|_, s| s.expires > now);
        if by_id.len() >= MAX_SESSIONS {
            let oldest = by_id
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(id, _)| id.clone());
            if let Some(oldest) = oldest {
                by_id.remove(&oldest);
            }
        }
        let expires = now + LIFETIME;
        by_id.insert(id.clone(), Session { role, expires });
        id
    }

    /// The role of the session the request's cookie names, if it is live.
    pub fn role(&self, headers: &HeaderMap) -> Option<Role> {
        let id = cookie_id(headers)?;
        let mut by_id = self.by_id.lock();
        let session = by_id.get(id)?;
        if session.expires <= Instant::now() {
            by_id.remove(id);
            return None;
        }
        Some(session.role)
    }

    /// Ends the session the request's cookie names.
    pub fn close(&self, headers: &HeaderMap) {
        if let Some(id) = cookie_id(headers) {
            self.by_id.lock().remove(id);
        }
    }
}

/// The session id among the request's cookies: exactly [`ID_BYTES`] in
/// lower-case hex, anything else is no session.
fn cookie_id(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE_NAME)
        .map(|(_, id)| id)
        .filter(|id| {
            id.len() == 2 * ID_BYTES && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
}

/// The `Set-Cookie` value of a new session.
pub fn set_cookie(id: &str) -> String {
    format!(
        "{COOKIE_NAME}={id}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}",
        LIFETIME.as_secs()
    )
}

/// The `Set-Cookie` value that makes the browser forget the session.
pub fn clear_cookie() -> String {
    format!("{COOKIE_NAME}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0")
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn with_cookie(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(COOKIE, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn a_session_keeps_its_role_until_closed() {
        let sessions = Sessions::default();
        let full = sessions.open(Role::Full);
        let read_only = sessions.open(Role::ReadOnly);
        assert_ne!(full, read_only);
        let cookie = |id: &str| with_cookie(&format!("theme=dark; {COOKIE_NAME}={id}"));
        assert_eq!(sessions.role(&cookie(&full)), Some(Role::Full));
        assert_eq!(sessions.role(&cookie(&read_only)), Some(Role::ReadOnly));
        sessions.close(&cookie(&full));
        assert_eq!(sessions.role(&cookie(&full)), None);
        assert_eq!(sessions.role(&cookie(&read_only)), Some(Role::ReadOnly));
    }

    #[test]
    fn bad_cookies_are_no_session() {
        let sessions = Sessions::default();
        let id = sessions.open(Role::Full);
        for bad in [
            String::new(),
            format!("{COOKIE_NAME}="),
            format!("{COOKIE_NAME}={}", &id[1..]),
            format!("{COOKIE_NAME}={}", id.to_uppercase()),
            format!("{COOKIE_NAME}={}x", &id[1..]),
            format!("other={id}"),
            "\u{7f}garbage;;==".to_string(),
        ] {
            let headers = HeaderValue::from_str(&bad)
                .map(|v| {
                    let mut h = HeaderMap::new();
                    h.insert(COOKIE, v);
                    h
                })
                .unwrap_or_default();
            assert_eq!(sessions.role(&headers), None, "{bad:?}");
        }
    }

    #[test]
    fn sessions_are_bounded() {
        let sessions = Sessions::default();
        let first = sessions.open(Role::Full);
        for _ in 0..MAX_SESSIONS {
            sessions.open(Role::Full);
        }
        let cookie = with_cookie(&format!("{COOKIE_NAME}={first}"));
        assert_eq!(sessions.role(&cookie), None);
        assert!(sessions.by_id.lock().len() <= MAX_SESSIONS);
    }

    #[test]
    fn the_cookie_is_confined_to_the_console() {
        let c = set_cookie("ab");
        for part in [
            "HttpOnly",
            "SameSite=Strict",
            "Path=/console",
            "Max-Age=43200",
        ] {
            assert!(c.contains(part), "{c}");
        }
    }
}
