//! The NVMe/TCP transport: the devices of the array served as namespaces
//! of NVMe over Fabrics subsystems (NVMe/TCP Transport 1.0, NVMe over
//! Fabrics 2.0, NVMe Base 2.0, NVM Command Set 1.0), as the Linux
//! kernel's host and SPDK speak it.
//!
//! - [`wire`]: PDUs as pure functions on bytes (ICReq/ICResp, capsules,
//!   H2CData/C2HData, R2T, termination requests, CRC32C header and data
//!   digests); input that breaks the framing is a [`wire::Fatal`], which
//!   ends that connection with a C2HTermReq and nothing else;
//! - [`capsule`]: submission and completion entries, the SGL descriptor;
//! - [`status`]: completion statuses, and the one translation of a
//!   device's `block::ErrorClass`;
//! - `connection` and `queue`: one TCP connection is one queue:
//!   initialization, Connect, commands with in-capsule data or data asked
//!   for with R2T, fused Compare and Write kept together, device work on
//!   blocking threads, replies written under a deadline with the bytes
//!   queued bounded (`peer-limits`);
//! - `fabrics`: Connect (the admin queue creates a controller, I/O
//!   queues name it; host NQNs checked against the subsystem's allow
//!   list) and Property Get/Set (CAP, VS, CC, CSTS);
//! - `controller`, `admin`, `identify`, `logs`: a controller's state,
//!   Identify (controller, namespace, active list, identification
//!   descriptors), Get Log Page (errors, SMART / health, changed
//!   namespaces, ANA), features (number of queues, volatile write cache,
//!   asynchronous event configuration, keep alive timer), Asynchronous
//!   Event Requests, Keep Alive with its timeout, Abort;
//! - `discovery`: the discovery controller and its log page, one entry
//!   per subsystem and listen address a host may reach;
//! - [`auth`]: DH-HMAC-CHAP in-band authentication (AUTH_Send and
//!   AUTH_Receive), per-host `DHHC-1` secrets in files;
//! - `io`: Read, Write (FUA), Flush, Write Zeroes, Dataset Management
//!   deallocate, Compare, Compare and Write, each medium access holding
//!   its bytes in the shared [`export::Backing`]'s range locks;
//! - [`Config`]: the `[nvmf]` section (listen and discovery addresses,
//!   subsystems, allowed hosts and their secrets, namespaces) and its
//!   validation;
//! - [`Server`]: listeners whose set changes live, the subsystem table,
//!   and `impl export::Frontend`; sessions are controllers (`nvme-N`);
//! - `initiator` (feature `initiator`): a small NVMe/TCP host for tests.
//!
//! Namespace identifiers (NGUID, EUI-64, UUID) come from the NAA
//! designator the SCSI logical unit of the same device reports
//! ([`export::NamespaceIds`]), so both transports name a device alike.

mod admin;
pub mod auth;
pub mod capsule;
mod config;
mod connection;
mod controller;
mod discovery;
mod fabrics;
mod frontend;
mod identify;
#[cfg(feature = "initiator")]
pub mod initiator;
mod io;
mod limits;
mod logs;
mod outbox;
mod queue;
mod registry;
mod server;
pub mod status;
mod subsystem;
pub mod wire;

pub use config::{
    glob, nqn_problem, parse_discovery_listen, parse_listen, Config, ConfigError, HostConfig,
    NamespaceConfig, SubsystemConfig, DEFAULT_PORT, DISCOVERY_NQN, DISCOVERY_PORT, MAX_NSID,
};
pub use frontend::Session;
pub use limits::Limits;
pub use server::{ListenerStats, Prepared, Server};
