//! The host's side of discovery, as `nvme discover` runs it: connect
//! to the discovery NQN, enable, Identify, read the log's header, the
//! whole log, and the header again to see it did not change meanwhile.

use std::io;
use std::net::SocketAddr;

use crate::config::DISCOVERY_NQN;
use crate::wire::{le16, le64};

use super::{expect_success, failed, Host, Options, Who};

/// One discovery log entry, its text fields with padding taken off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryEntry {
    pub trtype: u8,
    pub adrfam: u8,
    pub subtype: u8,
    pub treq: u8,
    pub portid: u16,
    pub cntlid: u16,
    pub asqsz: u16,
    pub trsvcid: String,
    pub subnqn: String,
    pub traddr: String,
    /// TSAS byte 0: the TCP security type.
    pub sectype: u8,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryLog {
    pub genctr: u64,
    pub entries: Vec<DiscoveryEntry>,
}

fn text(b: &[u8]) -> String {
    let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).trim_end().to_string()
}

impl DiscoveryLog {
    /// A whole log page: the header and its entries.
    pub fn parse(b: &[u8]) -> io::Result<DiscoveryLog> {
        if b.len() < 1024 {
            return Err(failed("a discovery log shorter than its header".into()));
        }
        let numrec = le64(b, 8) as usize;
        if b.len() < 1024 * (numrec + 1) {
            return Err(failed(format!("{numrec} entries in {} bytes", b.len())));
        }
        let entries = b[1024..1024 * (numrec + 1)]
            .chunks(1024)
            .map(|e| DiscoveryEntry {
                trtype: e[0],
                adrfam: e[1],
                subtype: e[2],
                treq: e[3],
                portid: le16(e, 4),
                cntlid: le16(e, 6),
                asqsz: le16(e, 8),
                trsvcid: text(&e[32..64]),
                subnqn: text(&e[256..512]),
                traddr: text(&e[512..768]),
                sectype: e[768],
            })
            .collect();
        Ok(DiscoveryLog {
            genctr: le64(b, 0),
            entries,
        })
    }
}

impl Host {
    /// A controller of the discovery subsystem, for `host_nqn`.
    pub async fn discovery(addr: SocketAddr, host_nqn: &str, opts: Options) -> io::Result<Host> {
        let who = Who {
            host_nqn: host_nqn.into(),
            host_id: [0x44; 16],
            subnqn: DISCOVERY_NQN.into(),
        };
        Host::connect(
            addr,
            who,
            Options {
                io_queues: 0,
                ..opts
            },
        )
        .await
    }

    /// Reads the discovery log as `nvme discover` does.
    pub async fn discovery_log(&mut self) -> io::Result<DiscoveryLog> {
        for _ in 0..4 {
            let head = self.get_log(0x70, 1024, false).await?;
            expect_success(&head, "discovery log header")?;
            let numrec = le64(&head.data, 8) as usize;
            let all = self.get_log(0x70, 1024 * (numrec + 1), false).await?;
            expect_success(&all, "discovery log")?;
            let again = self.get_log(0x70, 1024, false).await?;
            if le64(&again.data, 0) == le64(&all.data, 0) {
                return DiscoveryLog::parse(&all.data);
            }
        }
        Err(failed("the discovery log kept changing".into()))
    }

    /// Connects to the discovery controller at `addr` and reads its log.
    pub async fn discover(addr: SocketAddr, host_nqn: &str) -> io::Result<DiscoveryLog> {
        let mut h = Host::discovery(addr, host_nqn, Options::default()).await?;
        let id = h.identify(1, 0).await?;
        expect_success(&id, "Identify")?;
        if id.data.get(111) != Some(&2) {
            return Err(failed("not a discovery controller".into()));
        }
        h.discovery_log().await
    }
}
