//! Bounds that keep one host from hurting the others, and what the
//! target offers every controller.

use std::time::Duration;

use crate::fabrics::QueueLimits;
use crate::identify::Offer;

/// A connection's memory is bounded by the write data it asks for
/// (`r2t_bytes`), what waits for its host (`outgoing_bytes`, with a
/// deadline), and the commands on the device (`device_threads`
/// server-wide, each at most `max_transfer` bytes).
#[derive(Clone, Debug)]
pub struct Limits {
    /// Entries of the longest queue (CAP.MQES + 1).
    pub queue_entries: u32,
    /// Most I/O queues per controller.
    pub io_queues: u16,
    /// Longest transfer of one command: 4 KiB times a power of two.
    pub max_transfer: u32,
    /// In-capsule data an I/O command may carry.
    pub in_capsule: u32,
    /// Most data bytes in one H2CData PDU (MAXH2CDATA).
    pub max_h2c_data: u32,
    /// Write data one connection may have asked for with R2T and not
    /// yet received; later writes wait for their R2T.
    pub r2t_bytes: usize,
    /// Bytes one connection may have queued toward its host.
    pub outgoing_bytes: usize,
    /// How long one write to a host may make no progress.
    pub write_deadline: Duration,
    /// From accept to a queue connected (ICReq and Connect).
    pub connect_timeout: Duration,
    /// Connections not yet connected, per source address and in total.
    pub connecting_per_source: usize,
    pub connecting_total: usize,
    /// Connections one source address may have open.
    pub connections_per_source: usize,
    pub max_connections: usize,
    /// Device calls running at once, server-wide.
    pub device_threads: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            queue_entries: 128,
            io_queues: 64,
            max_transfer: 1 << 20,
            in_capsule: 16 << 10,
            max_h2c_data: 128 << 10,
            r2t_bytes: 8 << 20,
            outgoing_bytes: 4 << 20,
            write_deadline: Duration::from_secs(20),
            connect_timeout: Duration::from_secs(15),
            connecting_per_source: 16,
            connecting_total: 256,
            connections_per_source: 256,
            max_connections: 1024,
            device_threads: 64,
        }
    }
}

impl Limits {
    pub(crate) fn offer(&self) -> Offer {
        Offer {
            mdts: (self.max_transfer.max(4096) / 4096).ilog2() as u8,
            queue_entries: self.queue_entries,
            in_capsule: self.in_capsule,
        }
    }

    pub(crate) fn queues(&self) -> QueueLimits {
        QueueLimits {
            entries: self.queue_entries.clamp(32, 65536),
            io_queues: self.io_queues.max(1),
        }
    }

    /// The longest transfer as MDTS allows it.
    pub(crate) fn transfer(&self) -> usize {
        4096usize << self.offer().mdts
    }

    /// The longest PDU a host may send.
    pub(crate) fn max_pdu(&self) -> u32 {
        let data = self
            .in_capsule
            .max(self.max_h2c_data)
            .max(crate::fabrics::CONNECT_DATA_LEN as u32);
        crate::wire::CMD_LEN as u32 + 4 + 255 + data + 4
    }
}
