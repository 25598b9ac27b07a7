//! The service manager's notifications (`Type=notify` units): READY=1 once
//! every portal and API listens, WATCHDOG=1 at half the watchdog interval,
//! STOPPING=1 when shutdown begins. Without NOTIFY_SOCKET nothing is sent.

use std::future::Future;
use std::time::Duration;

use sd_notify::NotifyState;

fn send(states: &[NotifyState]) {
    // The daemon serves the same whether or not a manager hears this.
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!("cannot notify the service manager: {e}");
    }
}

pub fn ready() {
    send(&[NotifyState::Ready, NotifyState::Status("serving")]);
}

pub fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("shutting down")]);
}

/// How often to ping: half of WATCHDOG_USEC, as sd_watchdog_enabled(3)
/// advises, so one late ping does not get the daemon killed.
fn ping_interval(watchdog: Duration) -> Duration {
    (watchdog / 2).max(Duration::from_millis(1))
}

/// The pinging task when the manager asked for a watchdog. It runs on the
/// runtime that serves the API and accepts connections, so a wedged
/// runtime stops the pings.
pub fn watchdog() -> Option<impl Future<Output = ()>> {
    let interval = ping_interval(sd_notify::watchdog_enabled()?);
    tracing::info!(?interval, "pinging the service manager's watchdog");
    Some(async move {
        let mut tick = tokio::time::interval(interval);
        loop {
            tick.tick().await;
            send(&[NotifyState::Watchdog]);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pings_at_half_the_watchdog_interval() {
        assert_eq!(
            ping_interval(Duration::from_secs(30)),
            Duration::from_secs(15)
        );
        assert_eq!(
            ping_interval(Duration::from_micros(1)),
            Duration::from_millis(1)
        );
    }
}
