//! The login page and what logging in and out answer.

use hyper::header::{HeaderMap, HeaderValue, SET_COOKIE};
use hyper::Response;

use crate::responses::{full, redirect};
use crate::sessions::{clear_cookie, set_cookie, Sessions};
use crate::{Body, Role};

const PAGE: &str = include_str!("../assets/login.html");
/// Where the page says why the last attempt failed.
const MESSAGE_SLOT: &str = "<!--message-->";

/// The login page, with `message` (why the last attempt failed) if any.
pub fn page(message: Option<&str>, status: u16) -> Response<Body> {
    let shown = message
        .map(|m| {
            format!(
                r#"<p class="error" role="alert" id="login-error">{}</p>"#,
                escape(m)
            )
        })
        .unwrap_or_default();
    full(
        status,
        "text/html; charset=utf-8",
        PAGE.replacen(MESSAGE_SLOT, &shown, 1),
    )
}

/// A session for `role` and the way into the console.
pub fn logged_in(sessions: &Sessions, role: Role) -> Response<Body> {
    let id = sessions.open(role);
    let mut answer = redirect("/console/");
    if let Ok(cookie) = HeaderValue::from_str(&set_cookie(&id)) {
        answer.headers_mut().insert(SET_COOKIE, cookie);
    }
    answer
}

/// The session ended, the cookie cleared, back to the login page.
pub fn logged_out(sessions: &Sessions, headers: &HeaderMap) -> Response<Body> {
    sessions.close(headers);
    let mut answer = redirect("/console/login");
    if let Ok(cookie) = HeaderValue::from_str(&clear_cookie()) {
        answer.headers_mut().insert(SET_COOKIE, cookie);
    }
    answer
}

/// The `token` field of a form body (`application/x-www-form-urlencoded`).
pub fn token_of(body: &[u8]) -> Result<String, String> {
    let text = std::str::from_utf8(body).map_err(|_| "the form is not UTF-8".to_string())?;
    let value = text
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, _)| *name == "token")
        .map(|(_, value)| value)
        .ok_or("the form has no `token` field")?;
    let token = percent_decode(value).ok_or("the token field is not well encoded")?;
    let token = token.trim().to_string();
    if token.is_empty() {
        return Err("enter the API token".into());
    }
    Ok(token)
}

/// `+` as space and `%XX` as its byte; `None` for a malformed escape or
/// bytes that are not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = [bytes.next()?, bytes.next()?];
                let hex = std::str::from_utf8(&hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
            }
            b => out.push(b),
        }
    }
    String::from_utf8(out).ok()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_read_from_the_form() {
        assert_eq!(token_of(b"token=abc%2Bdef+&x=1").unwrap(), "abc+def");
        assert_eq!(token_of(b"x=1&token=k3y-0f").unwrap(), "k3y-0f");
        assert!(token_of(b"x=1").unwrap_err().contains("no `token`"));
        assert!(token_of(b"token=%zz")
            .unwrap_err()
            .contains("not well encoded"));
        assert!(token_of(b"token=%4")
            .unwrap_err()
            .contains("not well encoded"));
        assert!(token_of(b"token=")
            .unwrap_err()
            .contains("enter the API token"));
        assert!(token_of(&[0xff, 0xfe]).unwrap_err().contains("UTF-8"));
    }

    #[test]
    fn the_message_is_escaped() {
        let page = page(Some("<script>x</script>"), 401);
        assert_eq!(page.status(), 401);
        let message = escape("<script>x</script>");
        assert_eq!(message, "&lt;script&gt;x&lt;/script&gt;");
    }
}
