//! The transports the daemon serves beside its iSCSI portals, registered
//! once at start: each brings its configuration section, starts over the
//! first configuration, and from then on is reached only through what it
//! hands back (a [`export::Frontend`] for exports, sessions and status, a
//! [`crate::LiveListeners`] for changes, samples for `/metrics`, and its
//! shutdown). Adding one is its crate plus one [`register`] line.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use control::sections::SectionOwner;

/// What a transport starts from.
pub struct Start<'a> {
    pub config: &'a control::Config,
    pub exports: &'a export::Exports,
    /// The configuration came from a file or the command line names the
    /// transport's addresses: an address that cannot be bound fails the
    /// start. Otherwise (the built-in default, whose addresses another
    /// daemon may hold) it is left with a warning.
    pub required: bool,
}

/// Ends a transport's sessions and stops its listeners.
pub type Shutdown = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// A transport, started.
pub struct Running {
    pub frontend: Arc<dyn export::Frontend>,
    pub listeners: Arc<dyn crate::LiveListeners>,
    /// Its counters in `/metrics`.
    pub samples: Option<Arc<dyn stats::SampleSource>>,
    pub shutdown: Shutdown,
}

/// A transport the daemon can serve.
pub trait Transport: Send + Sync {
    /// "nvme-tcp": for logs.
    fn name(&self) -> &'static str;

    /// Whether the command line replaced this transport's addresses in
    /// `current`: then they must be served.
    fn listen_overridden(&self, current: &crate::Current) -> bool {
        let _ = current;
        false
    }

    /// Serves `start.config` over `start.exports`. Needs the I/O
    /// runtime's context.
    fn start(&self, start: &Start<'_>) -> anyhow::Result<Running>;
}

static REGISTERED: Mutex<Vec<Arc<dyn Transport>>> = Mutex::new(Vec::new());

/// Makes `transport` and its section part of the daemon; called once at
/// start, before the configuration is read.
pub fn register<T>(transport: T)
where
    T: Transport + SectionOwner + Clone + 'static,
{
    control::sections::register(transport.clone());
    let mut all = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
    if !all.iter().any(|t| t.name() == transport.name()) {
        all.push(Arc::new(transport));
    }
}

/// The registered transports, in registration order.
pub fn registered() -> Vec<Arc<dyn Transport>> {
    REGISTERED.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Starts every registered transport over `current`'s configuration.
pub fn start_all(current: &crate::Current) -> anyhow::Result<Vec<Running>> {
    registered()
        .iter()
        .map(|t| {
            let start = Start {
                config: &current.config,
                exports: &current.runtime.exports,
                required: current.path.is_some() || t.listen_overridden(current),
            };
            anyhow::Context::with_context(t.start(&start), || t.name().to_string())
        })
        .collect()
}
