//! Attacker threads: many connections carrying random and mutated PDUs.
//! This file holds the connection helpers, the scenario loop and the attacks
//! before and during login; `session_attacks.rs` has those on logged-in
//! sessions.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use crate::common::iscsi::{self, op, Digests, Pdu};
use crate::common::rng::Rng;
use crate::{FUZZ_IQN, PARKED_PER_ATTACKER};

#[derive(Default)]
/// What the attackers did, shared by all of them.
pub(crate) struct Counters {
    pub(crate) pdus: AtomicU64,
    pub(crate) connections: AtomicU64,
    pub(crate) logins: AtomicU64,
    pub(crate) login_failures: AtomicU64,
    pub(crate) closed_by_target: AtomicU64,
    /// R2Ts received for writes whose Data-Out was then mangled.
    pub(crate) r2ts: AtomicU64,
    pub(crate) r2t_waits: AtomicU64,
}

pub(super) fn connect(addr: SocketAddr, counters: &Counters) -> Option<TcpStream> {
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream
        .set_write_timeout(Some(Duration::from_secs(1)))
        .ok()?;
    let _ = stream.set_nodelay(true);
    counters.connections.fetch_add(1, Relaxed);
    Some(stream)
}

/// Send one PDU's bytes; false once the connection is unusable.
pub(super) fn send(stream: &mut TcpStream, bytes: &[u8], counters: &Counters) -> bool {
    match stream.write_all(bytes) {
        Ok(()) => {
            counters.pdus.fetch_add(1, Relaxed);
            true
        }
        Err(_) => {
            counters.closed_by_target.fetch_add(1, Relaxed);
            false
        }
    }
}

/// Read whatever the target has sent without waiting; false if it closed.
pub(super) fn drain(stream: &mut TcpStream, counters: &Counters) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let mut buf = [0u8; 16384];
    let open = loop {
        match stream.read(&mut buf) {
            Ok(0) => break false,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break true,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => break false,
        }
    };
    if !open {
        counters.closed_by_target.fetch_add(1, Relaxed);
    }
    open && stream.set_nonblocking(false).is_ok()
}

pub(crate) struct Attacker {
    pub(super) id: u64,
    pub(super) addr: SocketAddr,
    pub(super) rng: Rng,
    pub(super) counters: Arc<Counters>,
    /// Connections left open and idle, oldest first.
    pub(super) parked: VecDeque<TcpStream>,
}

impl Attacker {
    pub(crate) fn new(id: u64, addr: SocketAddr, rng: Rng, counters: Arc<Counters>) -> Attacker {
        Attacker {
            id,
            addr,
            rng,
            counters,
            parked: VecDeque::new(),
        }
    }

    pub(super) fn initiator(&self) -> String {
        format!("iqn.2024-01.org.openarray.test:attacker-{}", self.id)
    }

    pub(super) fn isid(&mut self) -> [u8; 6] {
        let mut isid = [0u8; 6];
        self.rng.fill(&mut isid);
        isid[0] = 0x80 | (isid[0] & 0x3f);
        isid
    }

    /// Keep a connection open (idle, maybe mid-PDU) for a while.
    pub(super) fn park(&mut self, stream: TcpStream) {
        self.parked.push_back(stream);
        if self.parked.len() > PARKED_PER_ATTACKER {
            self.parked.pop_front();
        }
    }

    pub(super) fn run(&mut self, stop: &AtomicBool) {
        while !stop.load(Relaxed) {
            match self.rng.below(11) {
                0 => self.noise_before_login(),
                1 => self.truncated_header(),
                2 => self.huge_data_segment(),
                3 => self.garbage_ahs(),
                4 | 5 => self.login_garbage(),
                6 => self.discovery_garbage(),
                7 => self.session_takeover(),
                _ => self.full_feature_garbage(),
            }
        }
    }

    pub(super) fn valid_login_pdu(&mut self) -> Pdu {
        let keys = iscsi::text(&[
            ("InitiatorName", &self.initiator()),
            ("SessionType", "Normal"),
            ("TargetName", FUZZ_IQN),
            ("AuthMethod", "None"),
        ]);
        let isid = self.isid();
        let mut pdu = iscsi::login_request(isid, 0, 1, true, keys);
        pdu.set_u32(16, self.rng.next_u32());
        pdu.set_u32(24, 1);
        pdu
    }

    /// Random bytes and PDUs of every kind on a connection that never logged in.
    pub(super) fn noise_before_login(&mut self) {
        let Some(mut stream) = connect(self.addr, &self.counters) else {
            return;
        };
        for _ in 0..self.rng.range(1, 20) {
            let bytes = match self.rng.below(4) {
                0 => {
                    let len = self.rng.range(1, 300) as usize;
                    self.rng.bytes(len)
                }
                1 => {
                    let mut pdu = Pdu::new(self.rng.byte() & 0x7f);
                    self.rng.fill(&mut pdu.bhs[1..]);
                    let len = self.rng.below(64) as usize;
                    pdu.data = self.rng.bytes(len);
                    pdu.encode(Digests::default())
                }
                _ => {
                    // Full-feature PDUs with no session.
                    let mut pdu = self.mutable_pdu(None);
                    pdu.set_u32(24, self.rng.next_u32());
                    pdu.encode(Digests::default())
                }
            };
            if !send(&mut stream, &bytes, &self.counters) || !drain(&mut stream, &self.counters) {
                return;
            }
        }
    }

    /// A basic header cut short, then silence or a close.
    pub(super) fn truncated_header(&mut self) {
        let Some(mut stream) = connect(self.addr, &self.counters) else {
            return;
        };
        let wire = self.valid_login_pdu().encode(Digests::default());
        let cut = self.rng.range(1, iscsi::BHS_LEN as u64 - 1) as usize;
        if send(&mut stream, &wire[..cut], &self.counters) && self.rng.one_in(2) {
            self.park(stream);
        }
    }

    /// A login PDU claiming a data segment of up to 16 MiB, followed by far
    /// less; the connection is then left hanging.
    pub(super) fn huge_data_segment(&mut self) {
        let Some(mut stream) = connect(self.addr, &self.counters) else {
            return;
        };
        let mut wire = self.valid_login_pdu().encode(Digests::default());
        let claimed = self.rng.range(1 << 16, 0xff_ffff) as u32;
        wire[5..8].copy_from_slice(&claimed.to_be_bytes()[1..]);
        let extra = self.rng.below(16384) as usize;
        wire.extend(self.rng.bytes(extra));
        if send(&mut stream, &wire, &self.counters) {
            let _ = drain(&mut stream, &self.counters);
            self.park(stream);
        }
    }

    /// TotalAHSLength that does not match what follows, with garbage AHS.
    pub(super) fn garbage_ahs(&mut self) {
        let Some(mut stream) = connect(self.addr, &self.counters) else {
            return;
        };
        let mut pdu = if self.rng.one_in(2) {
            self.valid_login_pdu()
        } else {
            self.mutable_pdu(None)
        };
        let words = self.rng.range(1, 255) as usize;
        pdu.ahs = self.rng.bytes(words * 4);
        let mut wire = pdu.encode(Digests::default());
        if self.rng.one_in(2) {
            wire[4] = self.rng.byte();
        }
        let keep = self.rng.range(iscsi::BHS_LEN as u64, wire.len() as u64) as usize;
        wire.truncate(keep);
        if send(&mut stream, &wire, &self.counters)
            && drain(&mut stream, &self.counters)
            && self.rng.one_in(3)
        {
            self.park(stream);
        }
    }

    /// Login requests with mangled keys and header fields, several per
    /// connection, sometimes an endless run of continuation PDUs.
    pub(super) fn login_garbage(&mut self) {
        let Some(mut stream) = connect(self.addr, &self.counters) else {
            return;
        };
        if self.rng.one_in(8) {
            // Continuation flood: C bit set, text never completes.
            let mut pdu = self.valid_login_pdu();
            pdu.bhs[1] = 0x40 | (pdu.bhs[1] & 0x0f); // C set, T clear
            for _ in 0..self.rng.range(10, 200) {
                let len = self.rng.range(1, 8192) as usize;
                pdu.data = (0..len).map(|_| b'A' + self.rng.byte() % 26).collect();
                if !send(&mut stream, &pdu.encode(Digests::default()), &self.counters)
                    || !drain(&mut stream, &self.counters)
                {
                    return;
                }
            }
            return;
        }
        for _ in 0..self.rng.range(1, 6) {
            let mut pdu = self.valid_login_pdu();
            if self.rng.one_in(2) {
                pdu.data = self.garbage_text();
            } else {
                pdu.data.extend(self.garbage_text());
            }
            self.mutate_login_header(&mut pdu);
            let mut wire = pdu.encode(Digests::default());
            if self.rng.one_in(6) {
                flip_bits(&mut self.rng, &mut wire, 3);
            }
            if !send(&mut stream, &wire, &self.counters) || !drain(&mut stream, &self.counters) {
                return;
            }
        }
    }

    pub(super) fn mutate_login_header(&mut self, pdu: &mut Pdu) {
        match self.rng.below(8) {
            0 => pdu.bhs[1] = self.rng.byte(), // any T/C/CSG/NSG
            1 => pdu.bhs[2..4].copy_from_slice(&[self.rng.byte(), self.rng.byte()]), // versions
            2 => pdu.bhs[14..16].copy_from_slice(&self.rng.next_u32().to_be_bytes()[..2]), // TSIH
            3 => pdu.set_u32(20, self.rng.next_u32()), // CID
            4 => pdu.set_u32(24, self.rng.next_u32()), // CmdSN
            5 => pdu.bhs[0] = op::LOGIN,       // I bit missing
            _ => {}
        }
    }

    /// Key/value text that is wrong in as many ways as we can think of.
    pub(super) fn garbage_text(&mut self) -> Vec<u8> {
        const KEYS: &[&str] = &[
            "InitiatorName",
            "TargetName",
            "SessionType",
            "AuthMethod",
            "HeaderDigest",
            "DataDigest",
            "MaxRecvDataSegmentLength",
            "MaxBurstLength",
            "FirstBurstLength",
            "MaxConnections",
            "ErrorRecoveryLevel",
            "DefaultTime2Wait",
            "InitialR2T",
            "ImmediateData",
            "TargetPortalGroupTag",
            "SendTargets",
            "CHAP_A",
            "CHAP_N",
            "CHAP_R",
            "X-com.example.unknown",
            "TaskReporting",
        ];
        const VALUES: &[&str] = &[
            "",
            "0",
            "-1",
            "99999999999999999999999",
            "0x",
            "0xffffffffffffffff",
            "Yes",
            "No",
            "Maybe",
            "None",
            "CRC32C",
            "CRC32C,None,Bogus",
            "Discovery",
            "Normal",
            "All",
            "CHAP,None",
            "5",
            "Reject",
            "NotUnderstood",
            "Irrelevant",
        ];
        let mut out = Vec::new();
        for _ in 0..self.rng.range(0, 12) {
            match self.rng.below(9) {
                0..=2 => {
                    let key = *self.rng.pick(KEYS);
                    let value = *self.rng.pick(VALUES);
                    out.extend(format!("{key}={value}\0").into_bytes());
                }
                3 => {
                    // Overlong value.
                    let key = *self.rng.pick(KEYS);
                    let len = self.rng.range(256, 9000) as usize;
                    out.extend(format!("{key}=").into_bytes());
                    out.extend((0..len).map(|_| b'a' + self.rng.byte() % 26));
                    out.push(0);
                }
                4 => {
                    // Random key and value, printable.
                    let k = self.rng.range(1, 300) as usize;
                    out.extend(
                        (0..k)
                            .map(|_| b'!' + self.rng.byte() % 90)
                            .filter(|&b| b != b'='),
                    );
                    out.push(b'=');
                    let v = self.rng.range(0, 64) as usize;
                    out.extend((0..v).map(|_| b'!' + self.rng.byte() % 90));
                    out.push(0);
                }
                5 => out.extend(b"KeyWithoutEquals\0"),
                6 => out.extend(b"MaxRecv\0DataSegmentLength=512\0=NoKey\0EmptyValue=\0"),
                7 => {
                    let len = self.rng.range(1, 200) as usize;
                    out.extend(self.rng.bytes(len)); // binary, not UTF-8
                }
                _ => out.extend(b"InitiatorName=iqn.x\0InitiatorName=iqn.y\0"), // duplicate
            }
        }
        if self.rng.one_in(4) {
            out.pop(); // no terminating NUL
        }
        out
    }
}

pub(super) fn flip_bits(rng: &mut Rng, bytes: &mut [u8], max_flips: u64) {
    if bytes.is_empty() {
        return;
    }
    for _ in 0..rng.range(1, max_flips) {
        let at = rng.below(bytes.len() as u64) as usize;
        bytes[at] ^= 1 << rng.below(8);
    }
}
