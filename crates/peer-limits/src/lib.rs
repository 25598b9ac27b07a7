//! Limits that keep one network peer from hurting the others.
//!
//! Every listener of the daemon (iSCSI portals, and the transports and
//! links that come after them) faces the same peers: ones that stop
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
//! - [`EventLog`]: one log line per interval for an event that repeats,
//!   with the count of those it held back, and a total for metrics.

mod event_log;
mod outgoing;
mod prelogin;

pub use event_log::EventLog;
pub use outgoing::{write_deadline, OutgoingBudget, Stalled};
pub use prelogin::{PreLoginBudget, PreLoginTicket, Refusal};
