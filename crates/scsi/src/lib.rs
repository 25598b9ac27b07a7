//! SCSI command set (SPC-4 / SBC-3) for logical units backed by block devices.
//!
//! A [`Target`] maps LUNs to [`LogicalUnit`]s and implements
//! [`scsi_api::ScsiTarget`] for the transports. A logical unit executes
//! CDBs against its [`block::BlockDevice`]: byte offset = LBA × block size.
//! Sense data is built in one place ([`sense`]); the supported commands,
//! their CDB usage masks and reservation classes are one table
//! ([`commands`]).

mod alua;
mod atomic;
mod block_locks;
mod cdb;
pub mod command_stream;
mod commands;
mod config;
mod inquiry;
mod lu;
mod media;
mod mode;
mod nexus;
mod pr_file;
mod provisioning;
mod registry;
mod report;
mod reservations;
mod reserve_cmds;
mod rw;
mod sanitize;
mod sense;
mod started_async;
mod started_read;
mod started_write;
mod target;
mod thresholds;
mod transfer;
mod xcopy;

pub use config::{naa_from_seed, LuConfig};
pub use lu::{LogicalUnit, MAX_TRANSFER_BYTES};
pub use registry::LuRegistry;
pub use target::{encode_lun, Mapping, Target, MAX_LUN};
pub use transfer::data_out_wanted;
