//! `[daemon]` settings checked against each other.

use std::time::Duration;

use toml::Spanned;

use super::Checker;

/// The longest `auth_fail_delay_max`: a login waiting longer than this
/// would outlast any sensible `login_timeout`.
const AUTH_FAIL_DELAY_LIMIT: Duration = Duration::from_secs(60);

impl Checker<'_> {
    /// `auth_fail_delay` and `auth_fail_delay_max`: the first at most the
    /// second (given or defaulted), the second at most a minute.
    pub(super) fn auth_delays(
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
        let effective_max = max.unwrap_or(iscsi::AuthThrottle::DEFAULT_DELAY_MAX);
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
             auth_fail_delay = \"2ms\"\nauth_fail_delay_max = \"20ms\"\n",
            "t.toml",
        )
        .unwrap();
        let d = &config.daemon;
        assert_eq!(d.api_header_timeout, Some(Duration::from_secs(3)));
        assert_eq!(d.api_body_timeout, Some(Duration::from_millis(250)));
        assert_eq!(d.auth_fail_delay, Some(Duration::from_millis(2)));
        assert_eq!(d.auth_fail_delay_max, Some(Duration::from_millis(20)));
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
    }
}
