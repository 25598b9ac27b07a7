//! The iSCSI server's options as `[daemon]` sets them: session and
//! connection caps, login budgets, timeouts and the CHAP back-off, each
//! the transport's default where the configuration gives none. Access
//! rules and CHAP come with the exports.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use control::Daemon;
use iscsi::{AuthThrottle, ServerOptions};

/// The options of the server that serves a configuration with `[daemon]`
/// `daemon`; wrong CHAP proofs count in `auth_failures`.
pub fn iscsi_options(daemon: &Daemon, auth_failures: Arc<AtomicU64>) -> ServerOptions {
    let defaults = ServerOptions::default().with_exported_access();
    let mut options = ServerOptions {
        max_sessions_per_initiator: daemon
            .max_sessions_per_initiator
            .unwrap_or(defaults.max_sessions_per_initiator),
        max_connections_per_portal: daemon
            .max_connections_per_portal
            .unwrap_or(defaults.max_connections_per_portal),
        max_logins_per_source: daemon
            .max_logins_per_source
            .unwrap_or(defaults.max_logins_per_source),
        max_logins: daemon.max_logins.unwrap_or(defaults.max_logins),
        max_connections_per_source: daemon
            .max_connections_per_source
            .unwrap_or(defaults.max_connections_per_source),
        max_queued_output: daemon
            .max_queued_output
            .unwrap_or(defaults.max_queued_output),
        auth_throttle: Arc::new(AuthThrottle::new(
            daemon
                .auth_fail_delay
                .unwrap_or(AuthThrottle::DEFAULT_DELAY),
            daemon
                .auth_fail_delay_max
                .unwrap_or(AuthThrottle::DEFAULT_DELAY_MAX),
            auth_failures,
        )),
        ..defaults
    };
    if let Some(t) = daemon.login_timeout {
        options.login_timeout = t;
    }
    if let Some(interval) = daemon.nop_interval {
        options.nop_interval = interval;
    }
    if let Some(t) = daemon.nop_timeout {
        options.nop_timeout = t;
    }
    if let Some(t) = daemon.write_timeout {
        options.write_timeout = t;
    }
    options
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn given_settings_replace_the_defaults() {
        let daemon = Daemon {
            max_sessions_per_initiator: Some(4),
            max_connections_per_portal: Some(9),
            write_timeout: Some(Duration::from_secs(3)),
            ..Daemon::default()
        };
        let options = iscsi_options(&daemon, Arc::default());
        assert_eq!(options.max_sessions_per_initiator, 4);
        assert_eq!(options.max_connections_per_portal, 9);
        assert_eq!(options.write_timeout, Duration::from_secs(3));
        let defaults = ServerOptions::default();
        assert_eq!(options.max_logins, defaults.max_logins);
        assert_eq!(options.login_timeout, defaults.login_timeout);
        assert!(options.exported_access.is_some());
    }
}
