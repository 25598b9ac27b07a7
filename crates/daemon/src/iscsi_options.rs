//! The iSCSI server's options as `[daemon]` sets them: session and
//! connection caps, login budgets, timeouts and the CHAP back-off, each
//! the transport's default where the configuration gives none. Access
//! rules and CHAP come with the exports.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use control::Daemon;
use iscsi::{AuthThrottle, ServerOptions};

/// The options of the server that serves `config`: its `[iscsi]`, then
/// the `[daemon]` keys that were iSCSI's, then the shared limits of
/// `[daemon]`; wrong CHAP proofs count in `auth_failures`.
pub fn iscsi_options(config: &control::Config, auth_failures: Arc<AtomicU64>) -> ServerOptions {
    let mut daemon = config.daemon.clone();
    if let Some(s) = crate::iscsi_section::section(config) {
        daemon.max_sessions_per_initiator = s
            .max_sessions_per_initiator
            .or(daemon.max_sessions_per_initiator);
        daemon.max_connections_per_portal = s
            .max_connections_per_portal
            .or(daemon.max_connections_per_portal);
    }
    options_of(&daemon, auth_failures)
}

fn options_of(daemon: &Daemon, auth_failures: Arc<AtomicU64>) -> ServerOptions {
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
        let options = options_of(&daemon, Arc::default());
        assert_eq!(options.max_sessions_per_initiator, 4);
        assert_eq!(options.max_connections_per_portal, 9);
        assert_eq!(options.write_timeout, Duration::from_secs(3));
        let defaults = ServerOptions::default();
        assert_eq!(options.max_logins, defaults.max_logins);
        assert_eq!(options.login_timeout, defaults.login_timeout);
        assert!(options.exported_access.is_some());
    }

    #[test]
    fn the_iscsi_section_wins_over_the_old_daemon_keys() {
        control::sections::register(crate::iscsi_section::IscsiOwner);
        let config = control::parse_config(
            "[daemon]\nmax_sessions_per_initiator = 2\nmax_connections_per_portal = 9\n\n[iscsi]\nmax_sessions_per_initiator = 5\n",
            "t.toml",
        )
        .unwrap();
        let options = iscsi_options(&config, Arc::default());
        assert_eq!(options.max_sessions_per_initiator, 5);
        assert_eq!(options.max_connections_per_portal, 9);
    }
}
