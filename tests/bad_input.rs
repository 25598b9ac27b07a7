//! Hostile and malformed input against the real daemon while a verified
//! session keeps doing real I/O.
//!
//! One thread logs in to the "verified" target with our own initiator and
//! loops WRITE(10) of random data / READ(10) compared against a shadow copy.
//! Several attacker threads meanwhile throw at least `MIN_PDUS` random and
//! mutated PDUs over many TCP connections at a second target (a null LUN, so
//! stray writes commit no memory): noise before login, truncated headers,
//! huge DataSegmentLength, garbage AHS, mangled login keys, out-of-window
//! CmdSN, unknown opcodes, Data-Out for unknown tasks, bad digests on
//! connections that negotiated CRC32C, and bit-flipped valid PDUs. Mutations
//! start from the valid PDUs our initiator builds.
//!
//! Asserted: the verified session never sees an error or a miscompare and
//! its whole LUN reads back right at the end; the daemon stays alive, never
//! logs "panicked", still serves discovery and new sessions; its RSS stays
//! under a fixed cap and does not keep growing in the second half of the run.
//!
//! OPENARRAY_FUZZ_SEED=<n> replays a seed (the run prints the one it used).

mod common;

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use common::iscsi::{self, op, Digests, LoginParams, Pdu, Session, FINAL, IMMEDIATE};
use common::rng::Rng;
use common::Daemon;

const VERIFIED_IQN: &str = "iqn.2024-01.org.openarray.test:verified";
const VERIFIED_LUN: u64 = 0;
const FUZZ_IQN: &str = "iqn.2024-01.org.openarray.test:fuzz";
const MIN_PDUS: u64 = 100_000;
const MIN_RUN: Duration = Duration::from_secs(30);
const MAX_RUN: Duration = Duration::from_secs(90);
const ATTACKERS: u64 = 3;
/// Idle connections each attacker keeps open at a time.
const PARKED_PER_ATTACKER: usize = 48;
const RSS_CAP_KIB: u64 = 1536 * 1024;
/// Allowed rise of the peak RSS from the first to the second half.
const RSS_GROWTH_SLACK_KIB: u64 = 64 * 1024;
/// Largest verified transfer, in blocks.
const MAX_VERIFIED_BLOCKS: u64 = 128;

fn config() -> String {
    format!(
        r#"
[[device]]
name = "verified"
kind = "mem"
size = "32M"

[[device]]
name = "scratch"
kind = "null"
size = "1G"

[[target]]
name = "{VERIFIED_IQN}"

[[target.lun]]
lun = 0
device = "verified"

[[target]]
name = "{FUZZ_IQN}"

[[target.lun]]
lun = 0
device = "scratch"
"#
    )
}

#[derive(Default)]
struct Counters {
    pdus: AtomicU64,
    connections: AtomicU64,
    logins: AtomicU64,
    login_failures: AtomicU64,
    closed_by_target: AtomicU64,
    /// R2Ts received for writes whose Data-Out was then mangled.
    r2ts: AtomicU64,
    r2t_waits: AtomicU64,
}

// ---------------------------------------------------------------- verified I/O

/// What the verified session did; `error` is the first thing that went wrong.
struct Verified {
    ios: u64,
    error: Option<String>,
    shadow: Vec<u8>,
    block_size: u32,
}

fn verified_params() -> LoginParams {
    LoginParams::normal("iqn.2024-01.org.openarray.test:verifier", VERIFIED_IQN)
}

/// Fill the LUN, report readiness, then write/read-compare random extents
/// until `stop`.
fn verified_io(
    addr: SocketAddr,
    seed: u64,
    stop: &AtomicBool,
    ready: mpsc::Sender<()>,
) -> Verified {
    let mut v = Verified {
        ios: 0,
        error: None,
        shadow: Vec::new(),
        block_size: 512,
    };
    if let Err(e) = verified_loop(addr, seed, stop, ready, &mut v) {
        v.error = Some(e);
    }
    v
}

fn verified_loop(
    addr: SocketAddr,
    seed: u64,
    stop: &AtomicBool,
    ready: mpsc::Sender<()>,
    v: &mut Verified,
) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let mut s = Session::login(addr, &verified_params(), Duration::from_secs(30))
        .map_err(|e| format!("login: {e}"))?;
    let (blocks, bs) = s
        .read_capacity(VERIFIED_LUN)
        .map_err(|e| format!("READ CAPACITY: {e}"))?;
    v.block_size = bs;
    let bsz = bs as usize;
    v.shadow = vec![0; blocks as usize * bsz];

    // Commit the whole RAM disk before the attack so RSS has its baseline.
    for lba in (0..blocks).step_by(MAX_VERIFIED_BLOCKS as usize) {
        let n = MAX_VERIFIED_BLOCKS.min(blocks - lba) as usize;
        let at = lba as usize * bsz;
        rng.fill(&mut v.shadow[at..at + n * bsz]);
        s.write10(VERIFIED_LUN, lba as u32, &v.shadow[at..at + n * bsz], bs)
            .map_err(|e| format!("prefill at LBA {lba}: {e}"))?;
        v.ios += 1;
    }
    let _ = ready.send(());

    while !stop.load(Relaxed) {
        let n = rng.range(1, MAX_VERIFIED_BLOCKS);
        let lba = rng.below(blocks - n + 1);
        let (at, len) = (lba as usize * bsz, n as usize * bsz);
        if rng.one_in(2) {
            rng.fill(&mut v.shadow[at..at + len]);
            s.write10(VERIFIED_LUN, lba as u32, &v.shadow[at..at + len], bs)
                .map_err(|e| format!("WRITE(10) LBA {lba}+{n}: {e}"))?;
            v.ios += 1;
        }
        let n = rng.range(1, MAX_VERIFIED_BLOCKS);
        let lba = rng.below(blocks - n + 1);
        let (at, len) = (lba as usize * bsz, n as usize * bsz);
        let got = s
            .read10(VERIFIED_LUN, lba as u32, n as u16, bs)
            .map_err(|e| format!("READ(10) LBA {lba}+{n}: {e}"))?;
        v.ios += 1;
        if got != v.shadow[at..at + len] {
            let first = got
                .iter()
                .zip(&v.shadow[at..at + len])
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Err(format!(
                "miscompare reading LBA {lba}+{n}: first wrong byte at offset {first}"
            ));
        }
    }
    s.logout().map_err(|e| format!("logout: {e}"))
}

// ---------------------------------------------------------------- attackers

fn connect(addr: SocketAddr, counters: &Counters) -> Option<TcpStream> {
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
fn send(stream: &mut TcpStream, bytes: &[u8], counters: &Counters) -> bool {
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
fn drain(stream: &mut TcpStream, counters: &Counters) -> bool {
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

struct Attacker {
    id: u64,
    addr: SocketAddr,
    rng: Rng,
    counters: Arc<Counters>,
    parked: VecDeque<TcpStream>,
}

impl Attacker {
    fn initiator(&self) -> String {
        format!("iqn.2024-01.org.openarray.test:attacker-{}", self.id)
    }

    fn isid(&mut self) -> [u8; 6] {
        let mut isid = [0u8; 6];
        self.rng.fill(&mut isid);
        isid[0] = 0x80 | (isid[0] & 0x3f);
        isid
    }

    /// Keep a connection open (idle, maybe mid-PDU) for a while.
    fn park(&mut self, stream: TcpStream) {
        self.parked.push_back(stream);
        if self.parked.len() > PARKED_PER_ATTACKER {
            self.parked.pop_front();
        }
    }

    fn run(&mut self, stop: &AtomicBool) {
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

    fn valid_login_pdu(&mut self) -> Pdu {
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
    fn noise_before_login(&mut self) {
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
    fn truncated_header(&mut self) {
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
    fn huge_data_segment(&mut self) {
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
    fn garbage_ahs(&mut self) {
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
    fn login_garbage(&mut self) {
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

    fn mutate_login_header(&mut self, pdu: &mut Pdu) {
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
    fn garbage_text(&mut self) -> Vec<u8> {
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

    /// A Discovery session fed garbage Text requests and SCSI commands.
    fn discovery_garbage(&mut self) {
        let Some(stream) = connect(self.addr, &self.counters) else {
            return;
        };
        let params = LoginParams {
            initiator: self.initiator(),
            target: None,
            isid: self.isid(),
            tsih: 0,
            digests: Digests::default(),
        };
        let Some(mut s) = self.login(stream, &params) else {
            return;
        };
        for _ in 0..self.rng.range(1, 30) {
            let mut pdu = if self.rng.one_in(3) {
                self.mutable_pdu(Some(&s))
            } else {
                self.text_request(&mut s)
            };
            if self.rng.one_in(4) {
                self.mutate_header(&mut pdu);
            }
            let wire = pdu.encode(s.digests);
            if !send(&mut s.stream, &wire, &self.counters) || !drain(&mut s.stream, &self.counters)
            {
                return;
            }
        }
    }

    fn login(&mut self, stream: TcpStream, params: &LoginParams) -> Option<Session> {
        match Session::login_on(stream, params) {
            Ok(s) => {
                self.counters.logins.fetch_add(1, Relaxed);
                self.counters.pdus.fetch_add(2, Relaxed);
                Some(s)
            }
            Err(_) => {
                self.counters.login_failures.fetch_add(1, Relaxed);
                None
            }
        }
    }

    fn text_request(&mut self, s: &mut Session) -> Pdu {
        let mut pdu = Pdu::new(op::TEXT | IMMEDIATE);
        pdu.bhs[1] = if self.rng.one_in(4) { 0x40 } else { FINAL }; // sometimes Continue
        pdu.set_u32(16, self.rng.next_u32());
        pdu.set_u32(
            20,
            if self.rng.one_in(2) {
                0xffff_ffff
            } else {
                self.rng.next_u32()
            },
        );
        pdu.set_u32(24, s.cmd_sn);
        pdu.set_u32(28, s.exp_stat_sn);
        pdu.data = if self.rng.one_in(2) {
            b"SendTargets=All\0".to_vec()
        } else {
            self.garbage_text()
        };
        pdu
    }

    /// Log in to the null-LUN target (digests on half the time) and send
    /// a stream of broken, odd and valid PDUs.
    fn full_feature_garbage(&mut self) {
        let Some(stream) = connect(self.addr, &self.counters) else {
            return;
        };
        let digests = Digests {
            header: self.rng.one_in(2),
            data: self.rng.one_in(2),
        };
        let params = LoginParams {
            initiator: self.initiator(),
            target: Some(FUZZ_IQN.into()),
            isid: self.isid(),
            tsih: 0,
            digests,
        };
        let Some(mut s) = self.login(stream, &params) else {
            return;
        };
        // Sometimes pipeline a burst without reading, to meet back-pressure.
        let pipelined = self.rng.one_in(5);
        // Solicited writes first, while the session is still in step (a
        // mangled PDU later may leave the target waiting for data).
        for _ in 0..self.rng.below(3) {
            if !self.r2t_abuse(&mut s) {
                return;
            }
        }
        for _ in 0..self.rng.range(20, 200) {
            let wire = self.attack_pdu(&mut s);
            if !send(&mut s.stream, &wire, &self.counters) {
                return;
            }
            if !pipelined && !drain(&mut s.stream, &self.counters) {
                return;
            }
        }
        if self.rng.one_in(4) {
            self.park(s.stream);
        }
    }

    /// A WRITE larger than the first burst, so that the target solicits the
    /// rest with an R2T, answered by Data-Out that lies about offset,
    /// length, DataSN or tags; sometimes the task is aborted first and its
    /// data sent anyway. False once the connection is gone.
    fn r2t_abuse(&mut self, s: &mut Session) -> bool {
        let blocks = self.rng.range(136, 1024) as u16; // beyond 64 KiB
        let len = blocks as usize * 512;
        let lba = self.rng.below(1 << 20) as u32;
        let mut cmd = s.command_pdu(0, &iscsi::rw10_cdb(0x2a, lba, blocks), len, 0);
        s.cmd_sn = s.cmd_sn.wrapping_add(1);
        let itt = cmd.itt();
        if s.immediate_data && self.rng.one_in(2) {
            let n = len.min(s.first_burst).min(s.target_max_recv);
            cmd.data = self.rng.bytes(n);
        }
        if !send(&mut s.stream, &cmd.encode(s.digests), &self.counters) {
            return false;
        }
        let r2t = self.await_r2t(s, itt);
        self.counters.r2t_waits.fetch_add(1, Relaxed);
        if r2t.is_some() {
            self.counters.r2ts.fetch_add(1, Relaxed);
        }
        let (ttt, offset, desired) = match &r2t {
            Some(p) => (p.u32_at(20), p.u32_at(40), p.u32_at(44)),
            None => (self.rng.next_u32(), 65536, 65536),
        };
        if self.rng.one_in(4) {
            let mut tmf = Pdu::new(op::TASK_MGMT | IMMEDIATE);
            tmf.bhs[1] = FINAL | 1; // ABORT TASK
            tmf.bhs[8..16].copy_from_slice(&iscsi::lun_field(0));
            tmf.set_u32(16, self.rng.next_u32());
            tmf.set_u32(20, itt);
            tmf.set_u32(24, s.cmd_sn);
            tmf.set_u32(28, s.exp_stat_sn);
            tmf.set_u32(32, s.cmd_sn.wrapping_sub(1));
            if !send(&mut s.stream, &tmf.encode(s.digests), &self.counters) {
                return false;
            }
        }
        let mut at = offset;
        for data_sn in 0..self.rng.range(1, 8) as u32 {
            let mut n = (desired as usize).min(s.target_max_recv);
            let mut d = Pdu::new(op::DATA_OUT);
            d.bhs[1] = if self.rng.one_in(3) { FINAL } else { 0 };
            d.bhs[8..16].copy_from_slice(&iscsi::lun_field(0));
            d.set_u32(
                16,
                if self.rng.one_in(8) {
                    self.rng.next_u32()
                } else {
                    itt
                },
            );
            d.set_u32(
                20,
                if self.rng.one_in(8) {
                    self.rng.next_u32()
                } else {
                    ttt
                },
            );
            d.set_u32(28, s.exp_stat_sn);
            d.set_u32(36, data_sn);
            match self.rng.below(6) {
                0 => at = self.rng.next_u32(),                // anywhere
                1 => n = self.rng.range(1, 300_000) as usize, // more than asked or allowed
                2 => at = at.saturating_sub(self.rng.range(1, 4096) as u32), // overlap
                3 => d.set_u32(36, self.rng.next_u32()),      // DataSN out of order
                4 => n = 0,
                _ => {}
            }
            d.set_u32(40, at);
            d.data = self.rng.bytes(n);
            if !send(&mut s.stream, &d.encode(s.digests), &self.counters) {
                return false;
            }
            at = at.wrapping_add(n as u32);
        }
        drain(&mut s.stream, &self.counters)
    }

    /// Read responses for a short while until the R2T for `itt` shows up.
    fn await_r2t(&mut self, s: &mut Session, itt: u32) -> Option<Pdu> {
        let _ = s.stream.set_read_timeout(Some(Duration::from_millis(150)));
        let mut found = None;
        for _ in 0..32 {
            match s.recv() {
                Ok(p) if p.opcode() == op::R2T && p.itt() == itt => {
                    found = Some(p);
                    break;
                }
                Ok(_) => continue,
                Err(_) => break,
            }
        }
        let _ = s.stream.set_read_timeout(Some(Duration::from_secs(2)));
        found
    }

    /// Log in twice with one initiator name and ISID (session
    /// reinstatement) while the first session has a write waiting for its
    /// data, or join the first session by its TSIH (connection
    /// reinstatement or a second connection), then use both.
    fn session_takeover(&mut self) {
        let Some(stream) = connect(self.addr, &self.counters) else {
            return;
        };
        let params = LoginParams {
            initiator: self.initiator(),
            target: Some(FUZZ_IQN.into()),
            isid: self.isid(),
            tsih: 0,
            digests: Digests::default(),
        };
        let Some(mut first) = self.login(stream, &params) else {
            return;
        };
        let write = first.command_pdu(0, &iscsi::rw10_cdb(0x2a, 0, 1024), 1024 * 512, 0);
        first.cmd_sn = first.cmd_sn.wrapping_add(1);
        if !send(
            &mut first.stream,
            &write.encode(first.digests),
            &self.counters,
        ) {
            return;
        }
        let mut again = params.clone();
        match self.rng.below(4) {
            0 | 1 => {}                                       // same ISID, new session
            2 => again.tsih = first.tsih,                     // same session, same CID
            _ => again.tsih = self.rng.next_u32() as u16 | 1, // a session that may not exist
        }
        let Some(stream) = connect(self.addr, &self.counters) else {
            return;
        };
        let second = self.login(stream, &again);
        for mut s in [Some(first), second].into_iter().flatten() {
            for _ in 0..self.rng.range(1, 10) {
                let wire = self.attack_pdu(&mut s);
                if !send(&mut s.stream, &wire, &self.counters)
                    || !drain(&mut s.stream, &self.counters)
                {
                    break;
                }
            }
        }
    }

    /// A valid PDU of a random full-feature kind for session `s` (or none).
    fn mutable_pdu(&mut self, s: Option<&Session>) -> Pdu {
        let (cmd_sn, exp_stat_sn) = s.map(|s| (s.cmd_sn, s.exp_stat_sn)).unwrap_or((1, 0));
        match self.rng.below(6) {
            0 => {
                let mut pdu = Pdu::new(op::NOP_OUT | IMMEDIATE);
                pdu.bhs[1] = FINAL;
                pdu.set_u32(16, self.rng.next_u32());
                pdu.set_u32(20, 0xffff_ffff);
                pdu.set_u32(24, cmd_sn);
                pdu.set_u32(28, exp_stat_sn);
                let len = self.rng.below(512) as usize;
                pdu.data = self.rng.bytes(len);
                pdu
            }
            1 => {
                let mut pdu = Pdu::new(op::DATA_OUT);
                pdu.bhs[1] = if self.rng.one_in(2) { FINAL } else { 0 };
                pdu.set_u32(16, self.rng.next_u32());
                pdu.set_u32(20, self.rng.next_u32());
                pdu.set_u32(28, exp_stat_sn);
                pdu.set_u32(36, self.rng.below(4) as u32);
                pdu.set_u32(40, self.rng.next_u32() % (1 << 20));
                let len = self.rng.range(1, 8192) as usize;
                pdu.data = self.rng.bytes(len);
                pdu
            }
            2 => {
                let mut pdu = Pdu::new(op::TASK_MGMT | IMMEDIATE);
                pdu.bhs[1] = FINAL | self.rng.range(1, 15) as u8;
                pdu.set_u32(16, self.rng.next_u32());
                pdu.set_u32(20, self.rng.next_u32());
                pdu.set_u32(24, cmd_sn);
                pdu.set_u32(28, exp_stat_sn);
                pdu.set_u32(32, self.rng.next_u32());
                pdu.set_u32(36, self.rng.next_u32());
                pdu
            }
            3 => {
                let mut pdu = Pdu::new(op::SNACK);
                pdu.bhs[1] = FINAL | self.rng.below(4) as u8;
                pdu.set_u32(16, self.rng.next_u32());
                pdu.set_u32(28, exp_stat_sn);
                pdu.set_u32(40, self.rng.next_u32());
                pdu.set_u32(44, self.rng.next_u32());
                pdu
            }
            _ => {
                let mut pdu = Pdu::new(op::SCSI_CMD);
                pdu.bhs[1] = FINAL | 0x40 | 1;
                pdu.set_u32(16, self.rng.next_u32());
                pdu.set_u32(20, 4096);
                pdu.set_u32(24, cmd_sn);
                pdu.set_u32(28, exp_stat_sn);
                pdu.bhs[32..42].copy_from_slice(&iscsi::rw10_cdb(
                    0x28,
                    self.rng.below(1 << 20) as u32,
                    8,
                ));
                pdu
            }
        }
    }

    /// Flip, rewrite or mangle one header field.
    fn mutate_header(&mut self, pdu: &mut Pdu) {
        match self.rng.below(4) {
            0 => {
                let at = self.rng.below(iscsi::BHS_LEN as u64) as usize;
                pdu.bhs[at] = self.rng.byte();
            }
            1 => pdu.bhs[1] ^= 1 << self.rng.below(8),
            2 => pdu.set_u32(24, self.rng.next_u32()),
            _ => {
                let at = 4 * self.rng.range(2, 11) as usize;
                pdu.set_u32(at, self.rng.next_u32());
            }
        }
    }

    /// One wire PDU for a logged-in session; valid ones advance its CmdSN.
    fn attack_pdu(&mut self, s: &mut Session) -> Vec<u8> {
        let lun = if self.rng.one_in(8) {
            self.rng.below(1 << 14)
        } else {
            0
        };
        match self.rng.below(14) {
            0 => {
                // A valid command (keeps the session moving).
                let cdb: &[u8] = match self.rng.below(5) {
                    0 => &[0x00, 0, 0, 0, 0, 0],                   // TEST UNIT READY
                    1 => &[0x12, 0, 0, 0, 96, 0],                  // INQUIRY
                    2 => &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0],       // READ CAPACITY(10)
                    3 => &[0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], // REPORT LUNS
                    _ => &[0x28, 0, 0, 0, 0x10, 0, 0, 0, 8, 0],    // READ(10)
                };
                let read_len = match cdb[0] {
                    0x12 => 96,
                    0x25 => 8,
                    0xa0 => 256,
                    0x28 => 4096,
                    _ => 0,
                };
                let pdu = s.command_pdu(lun, cdb, 0, read_len);
                s.cmd_sn = s.cmd_sn.wrapping_add(1);
                pdu.encode(s.digests)
            }
            1 => {
                // WRITE(10) whose immediate data disagrees with the header.
                let blocks = self.rng.range(1, 64) as u16;
                let edtl = match self.rng.below(3) {
                    0 => blocks as usize * 512,
                    1 => self.rng.below(1 << 20) as usize,
                    _ => 0,
                };
                let mut pdu = s.command_pdu(
                    lun,
                    &iscsi::rw10_cdb(0x2a, self.rng.below(1 << 20) as u32, blocks),
                    edtl,
                    0,
                );
                s.cmd_sn = s.cmd_sn.wrapping_add(1);
                let len = self.rng.range(0, 70_000) as usize;
                pdu.data = self.rng.bytes(len);
                if self.rng.one_in(2) {
                    pdu.bhs[1] &= !FINAL;
                }
                if self.rng.one_in(3) {
                    pdu.bhs[1] &= !0x20; // data without the W bit
                }
                pdu.encode(s.digests)
            }
            2 => {
                // CmdSN far outside the window, ahead or behind.
                let mut pdu = s.command_pdu(lun, &[0x00, 0, 0, 0, 0, 0], 0, 0);
                let off = self.rng.range(64, 1 << 31) as u32;
                let sn = if self.rng.one_in(2) {
                    s.cmd_sn.wrapping_add(off)
                } else {
                    s.cmd_sn.wrapping_sub(off)
                };
                pdu.set_u32(24, sn);
                pdu.encode(s.digests)
            }
            3 => {
                // Reserved and vendor-specific opcodes.
                const UNKNOWN: &[u8] = &[
                    0x07, 0x08, 0x0b, 0x0f, 0x11, 0x15, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, 0x3e, 0x3f,
                ];
                let mut pdu = Pdu::new(
                    *self.rng.pick(UNKNOWN) | if self.rng.one_in(2) { IMMEDIATE } else { 0 },
                );
                self.rng.fill(&mut pdu.bhs[1..4]);
                self.rng.fill(&mut pdu.bhs[8..]);
                let len = self.rng.below(600) as usize;
                pdu.data = self.rng.bytes(len);
                pdu.encode(s.digests)
            }
            4 | 5 => self.mutable_pdu(Some(&*s)).encode(s.digests),
            6 => self.text_request(s).encode(s.digests),
            7 => {
                // Logout (any reason) and carry on talking afterwards.
                let mut pdu = Pdu::new(op::LOGOUT | IMMEDIATE);
                pdu.bhs[1] = FINAL | self.rng.below(4) as u8;
                pdu.set_u32(16, self.rng.next_u32());
                pdu.set_u32(20, self.rng.below(3) as u32);
                pdu.set_u32(24, s.cmd_sn);
                pdu.set_u32(28, s.exp_stat_sn);
                pdu.encode(s.digests)
            }
            8 => {
                // Random CDB, direction bits and expected length (up to 4 GiB).
                let mut pdu = s.command_pdu(lun, &self.rng.bytes(16), 0, 0);
                pdu.bhs[1] = FINAL | (self.rng.byte() & 0x67);
                pdu.set_u32(20, self.rng.next_u32());
                s.cmd_sn = s.cmd_sn.wrapping_add(1);
                pdu.encode(s.digests)
            }
            9 => {
                // READ(16) of a huge extent with a huge expected length.
                let mut cdb = [0u8; 16];
                cdb[0] = 0x88;
                cdb[2..10].copy_from_slice(&self.rng.below(1 << 21).to_be_bytes());
                cdb[10..14]
                    .copy_from_slice(&self.rng.range(1 << 16, u32::MAX as u64).to_be_bytes()[4..]);
                let mut pdu = s.command_pdu(lun, &cdb, 0, 1);
                pdu.set_u32(20, u32::MAX - self.rng.below(1 << 20) as u32);
                s.cmd_sn = s.cmd_sn.wrapping_add(1);
                pdu.encode(s.digests)
            }
            10 => {
                // Valid command with a few flipped bits anywhere in the header.
                let pdu = s.command_pdu(lun, &[0x12, 0, 0, 0, 96, 0], 0, 96);
                s.cmd_sn = s.cmd_sn.wrapping_add(1);
                let mut wire = pdu.encode(s.digests);
                let header = iscsi::BHS_LEN;
                flip_bits(&mut self.rng, &mut wire[..header], 4);
                wire
            }
            11 => {
                // Command with garbage additional header segments.
                let mut pdu = s.command_pdu(lun, &[0x00, 0, 0, 0, 0, 0], 0, 0);
                s.cmd_sn = s.cmd_sn.wrapping_add(1);
                let words = self.rng.range(1, 16) as usize;
                pdu.ahs = self.rng.bytes(words * 4);
                if self.rng.one_in(2) {
                    // AHSLength bigger than the AHS area, type = extended CDB.
                    pdu.ahs[0..2]
                        .copy_from_slice(&(self.rng.range(1, 0xffff) as u16).to_be_bytes());
                    pdu.ahs[2] = 1;
                }
                pdu.encode(s.digests)
            }
            12 => {
                // Corrupted digest (or, without digests, a lying length).
                let mut pdu = s.command_pdu(lun, &[0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0], 512, 0);
                s.cmd_sn = s.cmd_sn.wrapping_add(1);
                pdu.data = self.rng.bytes(512);
                let mut wire = pdu.encode(s.digests);
                if s.digests.header && self.rng.one_in(2) {
                    wire[iscsi::BHS_LEN] ^= 1 << self.rng.below(8);
                } else if s.digests.data {
                    let last = wire.len() - 1;
                    wire[last] ^= 1 << self.rng.below(8);
                } else {
                    wire[5..8].copy_from_slice(
                        &(self.rng.range(513, 0xff_ffff) as u32).to_be_bytes()[1..],
                    );
                }
                wire
            }
            _ => {
                // Any valid PDU with one mangled header field.
                let mut pdu = self.mutable_pdu(Some(&*s));
                self.mutate_header(&mut pdu);
                pdu.encode(s.digests)
            }
        }
    }
}

fn flip_bits(rng: &mut Rng, bytes: &mut [u8], max_flips: u64) {
    if bytes.is_empty() {
        return;
    }
    for _ in 0..rng.range(1, max_flips) {
        let at = rng.below(bytes.len() as u64) as usize;
        bytes[at] ^= 1 << rng.below(8);
    }
}

// ---------------------------------------------------------------- the test

fn seed() -> u64 {
    std::env::var("OPENARRAY_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
}

#[test]
fn survives_hostile_pdus_while_verified_io_runs() {
    let seed = seed();
    println!("bad_input: seed {seed} (replay with OPENARRAY_FUZZ_SEED={seed})");
    let mut daemon = Daemon::start_with_config(&config());
    let addr = daemon.addr();
    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(Counters::default());

    let (ready_tx, ready_rx) = mpsc::channel();
    let verifier = {
        let stop = stop.clone();
        thread::spawn(move || verified_io(addr, seed, &stop, ready_tx))
    };
    if ready_rx.recv_timeout(Duration::from_secs(120)).is_err() {
        stop.store(true, Relaxed);
        let v = verifier.join().expect("verifier thread");
        panic!(
            "verified session never got going: {:?}\n{}",
            v.error,
            daemon.log()
        );
    }

    let attackers: Vec<_> = (0..ATTACKERS)
        .map(|id| {
            let (stop, counters) = (stop.clone(), counters.clone());
            let rng = Rng::new(seed ^ (id + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            thread::spawn(move || {
                let mut a = Attacker {
                    id,
                    addr,
                    rng,
                    counters,
                    parked: VecDeque::new(),
                };
                a.run(&stop);
            })
        })
        .collect();

    let start = Instant::now();
    let mut rss: Vec<(Duration, u64)> = Vec::new();
    let mut died = false;
    loop {
        thread::sleep(Duration::from_millis(250));
        if !daemon.alive() {
            died = true;
            break;
        }
        if let Some(kib) = daemon.rss_kib() {
            rss.push((start.elapsed(), kib));
        }
        let pdus = counters.pdus.load(Relaxed);
        let elapsed = start.elapsed();
        if verifier.is_finished() || (pdus >= MIN_PDUS && elapsed >= MIN_RUN) || elapsed >= MAX_RUN
        {
            break;
        }
    }
    let run_time = start.elapsed();
    stop.store(true, Relaxed);
    for a in attackers {
        a.join().expect("attacker thread panicked");
    }
    let verified = verifier.join().expect("verifier thread panicked");

    let c = &counters;
    println!(
        "bad_input: {:.1} s, {} PDUs sent over {} connections ({} logins, {} refused, {} dropped by the target), \
         {} verified I/Os, {} of {} solicited writes got their R2T",
        run_time.as_secs_f64(),
        c.pdus.load(Relaxed),
        c.connections.load(Relaxed),
        c.logins.load(Relaxed),
        c.login_failures.load(Relaxed),
        c.closed_by_target.load(Relaxed),
        verified.ios,
        c.r2ts.load(Relaxed),
        c.r2t_waits.load(Relaxed)
    );
    let peak = rss.iter().map(|r| r.1).max().unwrap_or(0);
    println!(
        "bad_input: daemon RSS {} KiB at start of attack, peak {peak} KiB, {} KiB at end",
        rss.first().map(|r| r.1).unwrap_or(0),
        rss.last().map(|r| r.1).unwrap_or(0)
    );

    let log = daemon.log();
    assert!(!died, "daemon died during the attack:\n{}", tail(&log));
    assert!(
        !log.contains("panicked"),
        "daemon panicked:\n{}",
        tail(&log)
    );
    assert_eq!(verified.error, None, "verified session failed");
    assert!(
        c.pdus.load(Relaxed) >= MIN_PDUS,
        "only {} PDUs sent in {run_time:?}",
        c.pdus.load(Relaxed)
    );
    assert!(
        c.logins.load(Relaxed) > 0,
        "no attacker login succeeded: full-feature attacks never ran"
    );

    assert!(
        peak < RSS_CAP_KIB,
        "daemon RSS peaked at {peak} KiB (cap {RSS_CAP_KIB} KiB)"
    );
    let half = run_time / 2;
    let first_peak = rss
        .iter()
        .filter(|r| r.0 < half)
        .map(|r| r.1)
        .max()
        .unwrap_or(0);
    let second_peak = rss
        .iter()
        .filter(|r| r.0 >= half)
        .map(|r| r.1)
        .max()
        .unwrap_or(0);
    assert!(
        second_peak <= first_peak + RSS_GROWTH_SLACK_KIB,
        "daemon RSS kept growing: peak {first_peak} KiB in the first half, {second_peak} KiB in the second"
    );

    // Still serving: discovery lists both targets, and the verified LUN
    // holds exactly what the verified session last wrote.
    let targets = daemon.targets();
    assert!(
        targets.iter().any(|t| t == VERIFIED_IQN) && targets.iter().any(|t| t == FUZZ_IQN),
        "discovery after the attack: {targets:?}"
    );
    let mut s = Session::login(addr, &verified_params(), Duration::from_secs(30))
        .expect("log in after the attack");
    let bs = verified.block_size;
    let chunk = MAX_VERIFIED_BLOCKS as usize * bs as usize;
    for (i, want) in verified.shadow.chunks(chunk).enumerate() {
        let lba = (i * MAX_VERIFIED_BLOCKS as usize) as u32;
        let got = s
            .read10(VERIFIED_LUN, lba, (want.len() / bs as usize) as u16, bs)
            .expect("final read");
        assert!(got == want, "final contents differ at LBA {lba}");
    }
    s.logout().expect("logout after the attack");
    assert!(
        daemon.alive(),
        "daemon died at the end:\n{}",
        tail(&daemon.log())
    );
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}
