//! The NBD transport: the devices of the array served over the Network
//! Block Device protocol, as QEMU, libnbd tools, fio and the Linux kernel
//! client speak it.
//!
//! - [`wire`]: decoding what clients send and encoding replies, pure
//!   functions on bytes (the `nbd_decode` fuzz target drives them);
//! - `handshake`: fixed-newstyle negotiation (GO, INFO, LIST, ABORT,
//!   EXPORT_NAME, STARTTLS, structured replies, extended headers,
//!   metadata contexts with `base:allocation`, block size constraints);
//! - `transmission`: many requests in flight per connection, run on
//!   blocking threads where the device may block and answered as each
//!   finishes, with the bytes in flight bounded per connection and a
//!   deadline on every write to the client;
//! - `batched` (with `outbox`): where the device never blocks, every
//!   complete request of a socket read run on the spot and all their
//!   replies sent with one `writev`, reads from the file's pages;
//! - `placed`: large writes received straight into the file's pages;
//! - `placement`: connections spread over one-worker runtimes;
//! - `spin`: how a connection waits for its client, decided by trial:
//!   sleeping on the socket, polling it for a moment while a client turns
//!   replies into requests quickly and the CPU is free, or gathering;
//! - `alone`: a connection alone on its runtime's thread waiting in a
//!   blocking receive;
//! - `gather`: letting requests gather in the socket, for a client with
//!   many in flight that sends them one at a time;
//! - `socket`: receives that do not wait and socket options, on the
//!   descriptor beside the runtime;
//! - `ops`: the device work of each command: holes found through
//!   `allocation()` become hole chunks and block status extents; a flush
//!   flushes the device, so it covers writes of every connection
//!   (CAN_MULTI_CONN);
//! - [`Tls`]: NBD_OPT_STARTTLS with an x509 certificate and key;
//! - [`Server`]: TCP and unix-socket listeners, a live-replaceable table
//!   of [`Export`]s with allow lists, the [`Session`]s in transmission,
//!   and counters for metrics ([`ServerStats`]);
//! - [`ListenAddr`]: where the server listens, as `[nbd] listen` names it;
//! - [`exports_of`] and `impl export::Frontend for Server`: the daemon's
//!   device exports served over the [`export::Backing`] every transport
//!   of a device shares (one range lock, one write-cache policy).

mod alone;
mod batched;
mod exports;
mod frontend;
mod gather;
mod handshake;
mod ops;
mod outbox;
mod placed;
mod placement;
pub mod proto;
mod reply;
mod server;
mod sessions;
mod socket;
mod spin;
mod started_async;
mod tls;
mod transmission;
pub mod wire;

pub use export::{Allow, ListenAddr, Peer, Rule, TlsConfig};

/// The port NBD clients use when none is given.
pub const DEFAULT_PORT: u16 = 10809;

/// A listen address as `[nbd] listen` and `--nbd-listen` give it.
pub fn parse_listen(s: &str) -> Result<ListenAddr, String> {
    ListenAddr::parse(s, DEFAULT_PORT)
}
pub use exports::{Export, ExportStats, DEFAULT_EXPORT};
pub use frontend::exports_of;
pub use server::{Limits, Server, ServerStats};
pub use sessions::Session;
pub use tls::{Tls, TlsMode};
