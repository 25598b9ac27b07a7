//! The `[daemon]` table: limits and timers of the whole daemon.

use std::path::PathBuf;
use std::time::Duration;

use toml::Spanned;

use super::{parse_listen, Checker};
use crate::duration::parse_duration;
use crate::model::Daemon;
use crate::size::parse_size;

/// The longest `auth_fail_delay_max`: a login waiting longer than this
/// would outlast any sensible `login_timeout`.
const AUTH_FAIL_DELAY_LIMIT: Duration = Duration::from_secs(60);

impl Checker<'_> {
    pub(super) fn daemon(&mut self, raw: Option<crate::raw::RawDaemon>) -> Daemon {
        let Some(d) = raw else {
            return Daemon::default();
        };
        let max_sessions_per_initiator =
            self.limit(d.max_sessions_per_initiator, "max_sessions_per_initiator");
        let max_connections_per_portal =
            self.limit(d.max_connections_per_portal, "max_connections_per_portal");
        let state_dir = self.path(d.state_dir, "state_dir");
        let login_timeout = self.duration(d.login_timeout, "login_timeout");
        let nop_interval = d.nop_interval.and_then(|v| {
            if v.get_ref().trim() == "off" {
                Some(None)
            } else {
                self.duration(Some(v), "nop_interval").map(Some)
            }
        });
        let nop_timeout = self.duration(d.nop_timeout, "nop_timeout");
        let write_timeout = self.duration(d.write_timeout, "write_timeout");
        let max_logins_per_source = self.limit(d.max_logins_per_source, "max_logins_per_source");
        let max_logins = self.limit(d.max_logins, "max_logins");
        let max_connections_per_source =
            self.limit(d.max_connections_per_source, "max_connections_per_source");
        let max_queued_output = d.max_queued_output.and_then(|v| {
            let ok = parse_size(v.get_ref()).and_then(|n| {
                if (64 << 10..=1 << 30).contains(&n) {
                    Ok(n as usize)
                } else {
                    Err(format!("{:?} is outside 64K..=1G", v.get_ref()))
                }
            });
            self.check(&v.span(), || "daemon.max_queued_output".into(), ok)
        });
        let api_header_timeout = self.duration(d.api_header_timeout, "api_header_timeout");
        let api_body_timeout = self.duration(d.api_body_timeout, "api_body_timeout");
        let (auth_fail_delay, auth_fail_delay_max) =
            self.auth_delays(d.auth_fail_delay, d.auth_fail_delay_max);
        let api_listen = d.api_listen.as_ref().and_then(|v| {
            self.check(
                &v.span(),
                || "daemon.api_listen".into(),
                parse_listen(v.get_ref()),
            )
        });
        let token_span = d.api_token_file.as_ref().map(|t| t.span());
        let api_token_file = self.path(d.api_token_file, "api_token_file");
        match (&d.api_listen, &token_span) {
            (Some(listen), None) => self.fail(
                &listen.span(),
                "daemon.api_token_file".into(),
                "required with api_listen: the TCP API only answers callers with the token",
            ),
            (None, Some(span)) => self.fail(
                span,
                "daemon.api_listen".into(),
                "api_token_file is set but api_listen is not",
            ),
            _ => {}
        }
        if let (None, Some(read_only)) = (&d.api_listen, &d.api_read_only_token_file) {
            self.fail(
                &read_only.span(),
                "daemon.api_listen".into(),
                "api_read_only_token_file is set but api_listen is not",
            );
        }
        let api_read_only_token_file =
            self.path(d.api_read_only_token_file, "api_read_only_token_file");
        Daemon {
            state_dir,
            max_sessions_per_initiator,
            max_connections_per_portal,
            login_timeout,
            nop_interval,
            nop_timeout,
            write_timeout,
            max_logins_per_source,
            max_logins,
            max_connections_per_source,
            max_queued_output,
            api_listen,
            api_token_file,
            api_read_only_token_file,
            api_header_timeout,
            api_body_timeout,
            auth_fail_delay,
            auth_fail_delay_max,
        }
    }

    /// A non-empty path of `[daemon]`.
    fn path(&mut self, raw: Option<Spanned<String>>, field: &str) -> Option<PathBuf> {
        let value = raw?;
        if value.get_ref().trim().is_empty() {
            self.fail(
                &value.span(),
                format!("daemon.{field}"),
                "must not be empty",
            );
            return None;
        }
        Some(PathBuf::from(value.into_inner()))
    }

    /// A positive duration of `[daemon]`, at most a day.
    fn duration(&mut self, raw: Option<Spanned<String>>, field: &str) -> Option<Duration> {
        let value = raw?;
        let ok = parse_duration(value.get_ref()).and_then(|d| {
            if d.is_zero() || d > Duration::from_secs(86_400) {
                Err(format!("{:?} is outside 1ms..=24h", value.get_ref()))
            } else {
                Ok(d)
            }
        });
        self.check(&value.span(), || format!("daemon.{field}"), ok)
    }

    /// A count limit of `[daemon]`.
    fn limit(&mut self, raw: Option<Spanned<i64>>, field: &str) -> Option<usize> {
        let n = raw?;
        let ok = match usize::try_from(*n.get_ref()) {
            Ok(v) if (1..=65535).contains(&v) => Ok(v),
            _ => Err(format!("{} is outside 1..=65535", n.get_ref())),
        };
        self.check(&n.span(), || format!("daemon.{field}"), ok)
    }

    /// `auth_fail_delay` and `auth_fail_delay_max`: the first at most the
    /// second (given or defaulted), the second at most a minute.
    fn auth_delays(
        &mut self,
        base: Option<Spanned<String>>,
        max: Option<Spanned<String>>,
    ) -> (Option<Duration>, Option<Duration>) {
        let max_span = max.as_ref().map(|m| m.span());
        let base_span = base.as_ref().map(|b| b.span());
        let base = self.duration(base, "auth_fail_delay");
        let mut max = self.duration(max, "auth_fail_delay_max");
        if let (Some(m), Some(span)) = (max, &max_span) {
            if m > AUTH_FAIL_DELAY_LIMIT {
                self.fail(
                    span,
                    "daemon.auth_fail_delay_max".into(),
                    format!("{m:?} is over {AUTH_FAIL_DELAY_LIMIT:?}"),
                );
                max = None;
            }
        }
        let effective_max = max.unwrap_or(peer_limits::AuthThrottle::DEFAULT_DELAY_MAX);
        if let (Some(b), Some(span)) = (base, &base_span) {
            if b > effective_max {
                self.fail(
                    span,
                    "daemon.auth_fail_delay".into(),
                    format!("{b:?} is more than auth_fail_delay_max ({effective_max:?})"),
                );
                return (None, max);
            }
        }
        (base, max)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    fn error(text: &str) -> String {
        crate::parse_config(text, "t.toml").unwrap_err().to_string()
    }

    #[test]
    fn api_deadlines_and_auth_delays_parse() {
        let config = crate::parse_config(
            "[daemon]\napi_header_timeout = \"3s\"\napi_body_timeout = \"250ms\"\n\
             auth_fail_delay = \"2ms\"\nauth_fail_delay_max = \"20ms\"\n\
             max_connections_per_source = 8\n",
            "t.toml",
        )
        .unwrap();
        let d = &config.daemon;
        assert_eq!(d.api_header_timeout, Some(Duration::from_secs(3)));
        assert_eq!(d.api_body_timeout, Some(Duration::from_millis(250)));
        assert_eq!(d.auth_fail_delay, Some(Duration::from_millis(2)));
        assert_eq!(d.auth_fail_delay_max, Some(Duration::from_millis(20)));
        assert_eq!(d.max_connections_per_source, Some(8));
        assert_eq!(
            crate::parse_config("[daemon]\n", "t.toml").unwrap().daemon,
            crate::Daemon::default()
        );
    }

    #[test]
    fn bad_values_name_file_line_and_field() {
        let err = error("[daemon]\napi_body_timeout = \"soon\"\n");
        assert!(
            err.contains("t.toml:2:20: daemon.api_body_timeout"),
            "{err}"
        );
        let err = error("[daemon]\n\nauth_fail_delay = \"0s\"\n");
        assert!(err.contains("t.toml:3:19: daemon.auth_fail_delay"), "{err}");
        let err = error("[daemon]\nauth_fail_delay_max = \"2m\"\n");
        assert!(
            err.contains("t.toml:2:23: daemon.auth_fail_delay_max"),
            "{err}"
        );
        assert!(err.contains("over 60s"), "{err}");
        let err = error("[daemon]\nauth_fail_delay = \"1s\"\nauth_fail_delay_max = \"500ms\"\n");
        assert!(
            err.contains("t.toml:2:19: daemon.auth_fail_delay:"),
            "{err}"
        );
        assert!(err.contains("more than auth_fail_delay_max"), "{err}");
        // Against the default maximum when none is given.
        let err = error("[daemon]\nauth_fail_delay = \"6s\"\n");
        assert!(err.contains("daemon.auth_fail_delay"), "{err}");
        let err = error("[daemon]\nmax_connections_per_source = 0\n");
        assert!(
            err.contains("t.toml:2:30: daemon.max_connections_per_source"),
            "{err}"
        );
        assert!(err.contains("outside 1..=65535"), "{err}");
    }
}
