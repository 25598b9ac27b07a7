//! Test support: an in-memory SCSI target and a tiny hand-written iSCSI
//! initiator speaking to the server over loopback TCP.

#![allow(dead_code)]

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use iscsi::pdu::{self, Bhs, Decoded, Framing, Opcode, Pdu};
use iscsi::{Server, ServerOptions, Target};
use parking_lot::Mutex;
use scsi_api::{
    Nexus, ReadStart, ScsiCommand, ScsiResponse, ScsiTarget, StartedRead, TaskManagement, TmfResult,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub const BLOCK: usize = 512;

/// A RAM disk that understands just enough SCSI for the tests, and records
/// the nexus and task management calls it gets.
pub struct RamTarget {
    pub data: Mutex<Vec<u8>>,
    pub blocking: bool,
    pub delay: Mutex<Duration>,
    pub events: Mutex<Vec<String>>,
    /// When set, READ(10)s are started for the connection's ring
    /// (`start_read`) and read from this file, except those of LBA
    /// [`DECLINED_LBA`], which are declined and run by `execute`.
    pub ring_file: Mutex<Option<Arc<std::fs::File>>>,
    /// Reads finished after the connection's ring ran them.
    pub ring_finished: Arc<AtomicUsize>,
}

/// The LBA whose READs `start_read` declines.
pub const DECLINED_LBA: u32 = 1000;

/// A READ the connection's ring runs on [`RamTarget::ring_file`].
struct FileRead {
    file: Arc<std::fs::File>,
    offset: u64,
    buf: Vec<u8>,
    finished: Arc<AtomicUsize>,
}

impl StartedRead for FileRead {
    fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    fn offset(&self) -> u64 {
        self.offset
    }

    fn buf(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    fn finish(self: Box<Self>, read: io::Result<usize>) -> ScsiResponse {
        self.finished.fetch_add(1, Ordering::SeqCst);
        match read {
            Ok(n) if n == self.buf.len() => ScsiResponse::with_data(self.buf),
            _ => sense(0x03, 0x11),
        }
    }
}

impl RamTarget {
    /// A target of 4096 blocks of `pattern(_, seed)`, whose READ(10)s run
    /// on the connection's ring from a file of the same contents; and those
    /// contents.
    pub fn reading_through_ring(seed: u8) -> (Arc<RamTarget>, Vec<u8>) {
        let ram = RamTarget::new(4096, true);
        let content = pattern(4096 * BLOCK, seed);
        ram.data.lock().copy_from_slice(&content);
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &content).unwrap();
        ram.read_through_ring(file);
        (ram, content)
    }

    /// Serve READ(10)s from `file` through the connection's ring.
    pub fn read_through_ring(&self, file: std::fs::File) {
        *self.ring_file.lock() = Some(Arc::new(file));
    }

    fn ring_read(&self, cmd: &ScsiCommand<'_>) -> ReadStart {
        let Some(file) = self.ring_file.lock().clone() else {
            return ReadStart::Declined;
        };
        let cdb = cmd.cdb;
        let lba = u32::from_be_bytes([cdb[2], cdb[3], cdb[4], cdb[5]]);
        let len = u16::from_be_bytes([cdb[7], cdb[8]]) as usize * BLOCK;
        if lba == DECLINED_LBA {
            return ReadStart::Declined;
        }
        if lba as usize * BLOCK + len > self.data.lock().len() {
            return ReadStart::Answered(sense(0x05, 0x21));
        }
        ReadStart::Started(Box::new(FileRead {
            file,
            offset: u64::from(lba) * BLOCK as u64,
            buf: vec![0; len],
            finished: self.ring_finished.clone(),
        }))
    }
}

impl RamTarget {
    pub fn new(blocks: usize, blocking: bool) -> Arc<RamTarget> {
        Arc::new(RamTarget {
            data: Mutex::new(vec![0; blocks * BLOCK]),
            blocking,
            delay: Mutex::new(Duration::ZERO),
            events: Mutex::new(Vec::new()),
            ring_file: Mutex::new(None),
            ring_finished: Arc::default(),
        })
    }

    pub fn events(&self) -> Vec<String> {
        self.events.lock().clone()
    }

    /// Wait up to five seconds for an event starting with `prefix`.
    pub async fn wait_event(&self, prefix: &str) -> bool {
        for _ in 0..100 {
            if self.events().iter().any(|e| e.starts_with(prefix)) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }
}

fn sense(key: u8, asc: u8) -> ScsiResponse {
    let mut s = vec![0u8; 18];
    s[0] = 0x70;
    s[2] = key;
    s[7] = 10;
    s[12] = asc;
    ScsiResponse::check_condition(s)
}

impl ScsiTarget for RamTarget {
    fn execute(&self, _nexus: &Nexus, cmd: &ScsiCommand<'_>) -> ScsiResponse {
        let delay = *self.delay.lock();
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let cdb = cmd.cdb;
        match cdb[0] {
            0x00 => ScsiResponse::good(),
            0x12 => {
                let mut inq = vec![0u8; 36];
                inq[4] = 31;
                inq[8..16].copy_from_slice(b"OPENARRY");
                ScsiResponse::with_data(inq)
            }
            0x28 | 0x2a => {
                let lba = u32::from_be_bytes([cdb[2], cdb[3], cdb[4], cdb[5]]) as usize;
                let len = u16::from_be_bytes([cdb[7], cdb[8]]) as usize * BLOCK;
                let start = lba * BLOCK;
                let mut data = self.data.lock();
                if start + len > data.len() {
                    return sense(0x05, 0x21);
                }
                if cdb[0] == 0x28 {
                    ScsiResponse::with_data(data[start..start + len].to_vec())
                } else {
                    let n = cmd.data_out.len().min(len);
                    data[start..start + n].copy_from_slice(&cmd.data_out[..n]);
                    ScsiResponse {
                        data_out_wanted: Some(len as u32),
                        ..Default::default()
                    }
                }
            }
            _ => sense(0x05, 0x20),
        }
    }

    fn may_block(&self, _lun: u64) -> bool {
        self.blocking
    }

    fn batches(&self, _lun: u64, cdb: &[u8]) -> bool {
        cdb[0] == 0x28 && self.ring_file.lock().is_some()
    }

    fn start_read(&self, _nexus: &Nexus, cmd: &ScsiCommand<'_>) -> ReadStart {
        self.ring_read(cmd)
    }

    fn lun_exists(&self, _nexus: &Nexus, lun: u64) -> bool {
        lun == 0
    }

    fn task_management(&self, _nexus: &Nexus, tmf: TaskManagement) -> TmfResult {
        self.events.lock().push(format!("tmf {tmf:?}"));
        TmfResult::Complete
    }

    fn nexus_lost(&self, nexus: &Nexus) {
        self.events
            .lock()
            .push(format!("lost {}", nexus.initiator_port_name()));
    }

    fn nexus_added(&self, nexus: &Nexus) {
        self.events
            .lock()
            .push(format!("added {}", nexus.initiator_port_name()));
    }
}

pub const TARGET: &str = "iqn.2024-01.org.openarray:test";

/// A server on a loopback port with one target backed by `ram`.
pub async fn start(options: ServerOptions, ram: Arc<RamTarget>) -> (Arc<Server>, SocketAddr) {
    start_with(options, vec![target(TARGET, ram)]).await
}

/// A server without pings whose READs run on the connection's ring, and
/// a client logged in to it; the server lives as long as its handle.
pub async fn ring_session(seed: u8) -> (Arc<RamTarget>, Vec<u8>, Arc<Server>, Client) {
    let (ram, content) = RamTarget::reading_through_ring(seed);
    let options = ServerOptions {
        nop_interval: None,
        ..Default::default()
    };
    let (server, addr) = start(options, ram.clone()).await;
    let mut c = Client::connect(addr).await;
    c.login_normal("MaxRecvDataSegmentLength=65536").await;
    (ram, content, server, c)
}

/// READs asked for and not yet answered: the LBA of each, by its ITT.
pub type Asked = std::collections::HashMap<u32, usize>;

/// Send READ(10)s of 8 blocks at `lbas` in one write, noting each in
/// `asked`.
pub async fn send_reads(c: &mut Client, lbas: impl Iterator<Item = u32>, asked: &mut Asked) {
    let mut burst = Vec::new();
    for lba in lbas {
        let cmd = c.command(&read10(lba, 8), 8 * BLOCK as u32, true, false, true, &[]);
        asked.insert(cmd.bhs.itt(), lba as usize);
        burst.extend_from_slice(&cmd.bhs.0);
        burst.extend_from_slice(&cmd.data);
    }
    c.send_raw(&burst).await;
}

pub fn target(name: &str, ram: Arc<RamTarget>) -> Target {
    Target {
        name: name.into(),
        alias: Some("test disk".into()),
        portal_group: 1,
        portals: vec![],
        scsi: ram,
    }
}

pub async fn start_with(options: ServerOptions, targets: Vec<Target>) -> (Arc<Server>, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = Server::new(options, targets);
    tokio::spawn(server.clone().serve(listener));
    (server, addr)
}

/// Minimal initiator.
pub struct Client {
    pub stream: TcpStream,
    pub framing: Framing,
    buf: Vec<u8>,
    pub itt: u32,
    pub cmdsn: u32,
    pub isid: [u8; 6],
    pub tsih: u16,
}

pub fn kv(text: &[u8]) -> Vec<(String, String)> {
    iscsi::text::parse(text).unwrap()
}

pub fn key<'a>(pairs: &'a [(String, String)], k: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(kk, _)| kk == k)
        .map(|(_, v)| v.as_str())
}

impl Client {
    pub async fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        Client {
            stream,
            framing: Framing::LOGIN,
            buf: Vec::new(),
            itt: 0x100,
            cmdsn: 1000,
            isid: [0x80, 0x12, 0x34, 0x56, 0, 1],
            tsih: 0,
        }
    }

    pub async fn send(&mut self, pdu: &Pdu) {
        let bytes = pdu::encode(pdu, &self.framing);
        self.stream.write_all(&bytes).await.unwrap();
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// Next PDU, or None when the connection closed or nothing came in time.
    pub async fn recv_within(&mut self, wait: Duration) -> Option<Pdu> {
        let framing = Framing {
            max_data_segment: 1 << 24,
            ..self.framing
        };
        loop {
            if let Decoded::Complete { pdu, consumed } = pdu::decode(&self.buf, &framing).unwrap() {
                self.buf.drain(..consumed);
                return Some(pdu);
            }
            let mut chunk = vec![0u8; 65536];
            let n = match tokio::time::timeout(wait, self.stream.read(&mut chunk)).await {
                Ok(Ok(n)) => n,
                Ok(Err(_)) | Err(_) => return None,
            };
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    pub async fn recv(&mut self) -> Pdu {
        self.recv_within(Duration::from_secs(10))
            .await
            .expect("expected a PDU")
    }

    /// Receive, answering target pings on the way.
    pub async fn recv_answering_pings(&mut self) -> Pdu {
        loop {
            let p = self.recv().await;
            if p.bhs.opcode() == Some(Opcode::NopIn) && p.bhs.itt() == 0xffff_ffff {
                let ttt = p.bhs.u32_at(20);
                self.nop_out(0xffff_ffff, ttt, b"").await;
                continue;
            }
            return p;
        }
    }

    /// True once the server has closed the connection.
    pub async fn closed_within(&mut self, wait: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            let mut chunk = [0u8; 4096];
            match tokio::time::timeout(left, self.stream.read(&mut chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
    }

    pub fn login_pdu(&self, csg: u8, nsg: u8, transit: bool, text: &str) -> Pdu {
        let flags = (if transit { 0x80 } else { 0 }) | (csg << 2) | nsg;
        let mut b = Bhs::new(Opcode::LoginRequest, flags);
        b.set_immediate(true);
        b.0[8..14].copy_from_slice(&self.isid);
        b.set_u16(14, self.tsih);
        b.set_itt(self.itt);
        b.set_u32(24, self.cmdsn);
        Pdu::new(b, Bytes::from(text.replace(';', "\0")))
    }

    /// Log in with one operational-stage PDU; returns the final response.
    pub async fn login(&mut self, text: &str) -> Pdu {
        let p = self.login_pdu(1, 3, true, text);
        self.send(&p).await;
        self.recv().await
    }

    /// Normal session login to the test target; panics on failure.
    pub async fn login_normal(&mut self, extra: &str) -> Vec<(String, String)> {
        let text = format!(
            "InitiatorName=iqn.2024-01.test:client;TargetName={TARGET};SessionType=Normal;{extra}"
        );
        let r = self.login(&text).await;
        assert_eq!(r.bhs.opcode(), Some(Opcode::LoginResponse));
        assert_eq!((r.bhs.byte(36), r.bhs.byte(37)), (0, 0), "login status");
        assert_eq!(r.bhs.flags() & 0x83, 0x83, "transit to full feature phase");
        self.tsih = r.bhs.u16_at(14);
        let keys = kv(&r.data);
        if key(&keys, "HeaderDigest") == Some("CRC32C") {
            self.framing.header_digest = true;
        }
        if key(&keys, "DataDigest") == Some("CRC32C") {
            self.framing.data_digest = true;
        }
        keys
    }

    pub fn next_itt(&mut self) -> u32 {
        self.itt += 1;
        self.itt
    }

    /// A SCSI Command PDU. Takes the next CmdSN unless immediate.
    pub fn command(
        &mut self,
        cdb: &[u8],
        edtl: u32,
        read: bool,
        write: bool,
        final_: bool,
        data: &[u8],
    ) -> Pdu {
        let mut flags = 0x01; // SIMPLE
        if final_ {
            flags |= 0x80;
        }
        if read {
            flags |= 0x40;
        }
        if write {
            flags |= 0x20;
        }
        let mut b = Bhs::new(Opcode::ScsiCommand, flags);
        let itt = self.next_itt();
        b.set_itt(itt);
        b.set_u32(20, edtl);
        b.set_u32(24, self.cmdsn);
        self.cmdsn = self.cmdsn.wrapping_add(1);
        b.0[32..32 + cdb.len()].copy_from_slice(cdb);
        Pdu::new(b, Bytes::copy_from_slice(data))
    }

    pub fn data_out(
        &self,
        itt: u32,
        ttt: u32,
        datasn: u32,
        offset: u32,
        final_: bool,
        data: &[u8],
    ) -> Pdu {
        let mut b = Bhs::new(Opcode::DataOut, if final_ { 0x80 } else { 0 });
        b.set_itt(itt);
        b.set_u32(20, ttt);
        b.set_u32(36, datasn);
        b.set_u32(40, offset);
        Pdu::new(b, Bytes::copy_from_slice(data))
    }

    pub async fn nop_out(&mut self, itt: u32, ttt: u32, data: &[u8]) {
        let mut b = Bhs::new(Opcode::NopOut, 0x80);
        b.set_immediate(true);
        b.set_itt(itt);
        b.set_u32(20, ttt);
        b.set_u32(24, self.cmdsn);
        let p = Pdu::new(b, Bytes::copy_from_slice(data));
        self.send(&p).await;
    }

    /// Collect Data-In until the status (S bit or SCSI Response).
    /// Returns (data, status PDU).
    pub async fn collect_read(&mut self, itt: u32) -> (Vec<u8>, Pdu) {
        let mut data = Vec::new();
        loop {
            let p = self.recv_answering_pings().await;
            assert_eq!(p.bhs.itt(), itt, "response for another task: {:?}", p.bhs);
            match p.bhs.opcode() {
                Some(Opcode::DataIn) => {
                    assert_eq!(
                        p.bhs.u32_at(40) as usize,
                        data.len(),
                        "Data-In offsets are contiguous"
                    );
                    data.extend_from_slice(&p.data);
                    if p.bhs.flags() & 0x01 != 0 {
                        return (data, p);
                    }
                }
                Some(Opcode::ScsiResponse) => return (data, p),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// Send a write, answering R2Ts with Data-Out of `chunk` bytes.
    pub async fn write(
        &mut self,
        cdb: &[u8],
        payload: &[u8],
        immediate: usize,
        unsolicited: usize,
        chunk: usize,
    ) -> Pdu {
        let edtl = payload.len() as u32;
        let final_ = unsolicited == 0;
        let cmd = self.command(cdb, edtl, false, true, final_, &payload[..immediate]);
        let itt = cmd.bhs.itt();
        self.send(&cmd).await;
        let mut off = immediate;
        let mut datasn = 0;
        while off < immediate + unsolicited {
            let end = (off + chunk).min(immediate + unsolicited);
            let d = self.data_out(
                itt,
                0xffff_ffff,
                datasn,
                off as u32,
                end == immediate + unsolicited,
                &payload[off..end],
            );
            self.send(&d).await;
            datasn += 1;
            off = end;
        }
        loop {
            let p = self.recv_answering_pings().await;
            match p.bhs.opcode() {
                Some(Opcode::R2t) => {
                    assert_eq!(p.bhs.itt(), itt);
                    let ttt = p.bhs.u32_at(20);
                    let offset = p.bhs.u32_at(40) as usize;
                    let len = p.bhs.u32_at(44) as usize;
                    let mut o = offset;
                    let mut sn = 0;
                    while o < offset + len {
                        let e = (o + chunk).min(offset + len);
                        let d = self.data_out(
                            itt,
                            ttt,
                            sn,
                            o as u32,
                            e == offset + len,
                            &payload[o..e],
                        );
                        self.send(&d).await;
                        sn += 1;
                        o = e;
                    }
                }
                Some(Opcode::ScsiResponse) => {
                    assert_eq!(p.bhs.itt(), itt);
                    return p;
                }
                other => panic!("unexpected {other:?} during write"),
            }
        }
    }

    pub async fn logout(&mut self) -> Pdu {
        let mut b = Bhs::new(Opcode::LogoutRequest, 0x80);
        b.set_immediate(true);
        let itt = self.next_itt();
        b.set_itt(itt);
        b.set_u32(24, self.cmdsn);
        self.send(&Pdu::new(b, Bytes::new())).await;
        self.recv_answering_pings().await
    }
}

pub fn read10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = vec![0x28, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

pub fn write10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = read10(lba, blocks);
    c[0] = 0x2a;
    c
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}
