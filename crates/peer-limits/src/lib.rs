//! Limits that keep one network peer from hurting the others.
//!
//! Every listener of the daemon (iSCSI portals, NBD, the TCP
//! administration API) faces the same peers: ones that stop
//! reading, ones that open connections and never log in, ones that repeat
//! a failing request as fast as they can. The answers live here once:
//!
//! - [`OutgoingBudget`]: the bytes a connection may have queued toward its
//!   peer, and [`write_deadline`], how long one write may make no progress;
//!   together they bound the memory a silent peer can pin and the time it
//!   can hold a connection.
//! - [`PreLoginBudget`]: connections that have not logged in yet, counted
//!   per source address and in total, the oldest evicted when the total
//!   is reached, so a flood cannot keep a real initiator out.
//! - [`SourceLimit`]: connections past login or negotiation, counted per
//!   source address, so one address cannot hold every slot by logging in
//!   and sitting idle.
//! - [`EventLog`]: one log line per interval for an event that repeats,
//!   with the count of those it held back, and a total for metrics.
//! - [`AuthThrottle`] (over [`auth_backoff`]): failed secrets (CHAP proofs,
//!   API tokens) delay the next attempts of the same name and address.
//! - [`keep_freed_memory`], [`release_freed_memory`]: freed buffers kept
//!   for reuse, except the ones a dropped peer pinned, which go back to
//!   the system.

pub mod auth_backoff;
mod auth_throttle;
mod event_log;
mod memory;
mod outgoing;
mod per_source;
mod prelogin;

pub use auth_throttle::{keys as auth_keys, source_keys as auth_source_keys};
pub use auth_throttle::{AuthThrottle, Key as AuthKey};
pub use event_log::EventLog;
pub use memory::{keep_freed_memory, release_freed_memory};
pub use outgoing::{write_deadline, OutgoingBudget, Stalled};
pub use per_source::{SourceLimit, SourceTicket};
pub use prelogin::{PreLoginBudget, PreLoginTicket, Refusal};
