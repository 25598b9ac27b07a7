//! The `[daemon]` table: limits and timers of the whole daemon.

use std::path::PathBuf;
use std::time::Duration;

use toml::Spanned;

use super::{parse_listen, Checker};
use crate::duration::parse_duration;
use crate::model::Daemon;
use crate::size::parse_size;

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
            max_queued_output,
            api_listen,
            api_token_file,
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
}
