//! A minimal iSCSI initiator (RFC 7143) written for the tests: PDU framing
//! with optional CRC32C digests, login through the security and operational
//! stages, and one SCSI command at a time with immediate data, R2T-driven
//! Data-Out and segmented Data-In. It is deliberately independent of the
//! daemon's own codec, so the two check each other, and it hands out valid
//! PDUs that the bad-input test mutates.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub const BHS_LEN: usize = 48;

/// Opcodes (byte 0, low six bits).
pub mod op {
    pub const NOP_OUT: u8 = 0x00;
    pub const SCSI_CMD: u8 = 0x01;
    pub const TASK_MGMT: u8 = 0x02;
    pub const LOGIN: u8 = 0x03;
    pub const TEXT: u8 = 0x04;
    pub const DATA_OUT: u8 = 0x05;
    pub const LOGOUT: u8 = 0x06;
    pub const SNACK: u8 = 0x10;
    pub const NOP_IN: u8 = 0x20;
    pub const SCSI_RSP: u8 = 0x21;
    pub const LOGIN_RSP: u8 = 0x23;
    pub const DATA_IN: u8 = 0x25;
    pub const R2T: u8 = 0x31;
    pub const ASYNC: u8 = 0x32;
    pub const REJECT: u8 = 0x3f;
}

/// Byte 0 bit marking an immediate PDU.
pub const IMMEDIATE: u8 = 0x40;
/// Byte 1 final bit.
pub const FINAL: u8 = 0x80;

/// CRC32C (Castagnoli) as iSCSI digests use it.
pub fn crc32c(parts: &[&[u8]]) -> u32 {
    parts
        .iter()
        .fold(0, |crc, part| crc32c::crc32c_append(crc, part))
}

fn pad4(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// Which digests a connection carries once login is over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

/// One PDU: basic header segment, additional header segments, data segment.
#[derive(Clone, Debug)]
pub struct Pdu {
    pub bhs: [u8; BHS_LEN],
    pub ahs: Vec<u8>,
    pub data: Vec<u8>,
}

impl Pdu {
    pub fn new(opcode: u8) -> Pdu {
        let mut bhs = [0u8; BHS_LEN];
        bhs[0] = opcode;
        Pdu {
            bhs,
            ahs: Vec::new(),
            data: Vec::new(),
        }
    }

    pub fn opcode(&self) -> u8 {
        self.bhs[0] & 0x3f
    }

    pub fn flags(&self) -> u8 {
        self.bhs[1]
    }

    pub fn u32_at(&self, at: usize) -> u32 {
        u32::from_be_bytes([
            self.bhs[at],
            self.bhs[at + 1],
            self.bhs[at + 2],
            self.bhs[at + 3],
        ])
    }

    pub fn set_u32(&mut self, at: usize, value: u32) {
        self.bhs[at..at + 4].copy_from_slice(&value.to_be_bytes());
    }

    pub fn itt(&self) -> u32 {
        self.u32_at(16)
    }

    /// Wire bytes; the length fields are filled in from `ahs` and `data`.
    pub fn encode(&self, digests: Digests) -> Vec<u8> {
        let mut bhs = self.bhs;
        bhs[4] = (self.ahs.len() / 4) as u8;
        let len = self.data.len() as u32;
        bhs[5..8].copy_from_slice(&len.to_be_bytes()[1..]);
        let mut out = Vec::with_capacity(BHS_LEN + self.ahs.len() + self.data.len() + 12);
        out.extend_from_slice(&bhs);
        out.extend_from_slice(&self.ahs);
        if digests.header {
            out.extend_from_slice(&crc32c(&[&bhs, &self.ahs]).to_le_bytes());
        }
        if !self.data.is_empty() {
            let padding = [0u8; 3];
            let padding = &padding[..pad4(self.data.len())];
            out.extend_from_slice(&self.data);
            out.extend_from_slice(padding);
            if digests.data {
                out.extend_from_slice(&crc32c(&[&self.data, padding]).to_le_bytes());
            }
        }
        out
    }
}

/// How a PDU answering a command ends it: `Some(status)` for a SCSI
/// Response or a Data-In with the S bit, `None` for a Data-In without it.
/// A SCSI Response reporting a target failure, and any PDU of another
/// kind, are errors.
pub fn final_status(pdu: &Pdu) -> io::Result<Option<u8>> {
    match pdu.opcode() {
        op::DATA_IN => Ok((pdu.flags() & 0x01 != 0).then_some(pdu.bhs[3])),
        op::SCSI_RSP if pdu.bhs[2] != 0 => Err(invalid(format!(
            "iSCSI response {:#x} (target failure)",
            pdu.bhs[2]
        ))),
        op::SCSI_RSP => Ok(Some(pdu.bhs[3])),
        other => Err(invalid(format!("unexpected PDU with opcode {other:#x}"))),
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Read one PDU, checking digests; refuses data segments over `max_data`.
pub fn read_pdu(stream: &mut impl Read, digests: Digests, max_data: usize) -> io::Result<Pdu> {
    let mut pdu = Pdu::new(0);
    stream.read_exact(&mut pdu.bhs)?;
    let ahs_len = pdu.bhs[4] as usize * 4;
    let data_len = u32::from_be_bytes([0, pdu.bhs[5], pdu.bhs[6], pdu.bhs[7]]) as usize;
    if data_len > max_data {
        return Err(invalid(format!(
            "target sent a {data_len}-byte data segment"
        )));
    }
    pdu.ahs = vec![0; ahs_len];
    stream.read_exact(&mut pdu.ahs)?;
    if digests.header {
        let mut digest = [0u8; 4];
        stream.read_exact(&mut digest)?;
        if u32::from_le_bytes(digest) != crc32c(&[&pdu.bhs, &pdu.ahs]) {
            return Err(invalid("bad header digest from target".into()));
        }
    }
    if data_len > 0 {
        let mut data = vec![0; data_len + pad4(data_len)];
        stream.read_exact(&mut data)?;
        if digests.data {
            let mut digest = [0u8; 4];
            stream.read_exact(&mut digest)?;
            if u32::from_le_bytes(digest) != crc32c(&[&data]) {
                return Err(invalid("bad data digest from target".into()));
            }
        }
        data.truncate(data_len);
        pdu.data = data;
    }
    Ok(pdu)
}

/// `key=value\0` pairs of a login or text data segment.
pub fn text(pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

pub fn parse_text(data: &[u8]) -> Vec<(String, String)> {
    data.split(|&b| b == 0)
        .filter(|kv| !kv.is_empty())
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect()
}

/// 8-byte LUN field: peripheral addressing below 256, flat space above.
pub fn lun_field(lun: u64) -> [u8; 8] {
    let mut f = [0u8; 8];
    if lun < 256 {
        f[1] = lun as u8;
    } else {
        f[0] = 0x40 | ((lun >> 8) as u8 & 0x3f);
        f[1] = lun as u8;
    }
    f
}

/// What to log in to.
#[derive(Clone, Debug)]
pub struct LoginParams {
    pub initiator: String,
    /// `None` for a discovery session.
    pub target: Option<String>,
    pub isid: [u8; 6],
    /// 0 for a new session; an existing session's TSIH adds a connection.
    pub tsih: u16,
    pub digests: Digests,
}

impl LoginParams {
    pub fn normal(initiator: &str, target: &str) -> LoginParams {
        LoginParams {
            initiator: initiator.to_string(),
            target: Some(target.to_string()),
            isid: [0x80, 0x12, 0x34, 0x56, 0x78, 0x9a],
            tsih: 0,
            digests: Digests::default(),
        }
    }
}

/// Login request PDU with the given stage transition and keys; the bad-input
/// test starts its login mutations from these.
pub fn login_request(isid: [u8; 6], csg: u8, nsg: u8, transit: bool, keys: Vec<u8>) -> Pdu {
    let mut pdu = Pdu::new(op::LOGIN | IMMEDIATE);
    pdu.bhs[1] = (if transit { 0x80 } else { 0 }) | (csg & 3) << 2 | (nsg & 3);
    pdu.bhs[8..14].copy_from_slice(&isid);
    pdu.data = keys;
    pdu
}

/// Outcome of one SCSI command.
#[derive(Debug)]
pub struct Completion {
    pub status: u8,
    pub sense: Vec<u8>,
    pub data: Vec<u8>,
}

impl Completion {
    /// Sense key of fixed or descriptor format sense data.
    pub fn sense_key(&self) -> Option<u8> {
        match self.sense.first().map(|b| b & 0x7f) {
            Some(0x70 | 0x71) => self.sense.get(2).map(|b| b & 0x0f),
            Some(0x72 | 0x73) => self.sense.get(1).map(|b| b & 0x0f),
            _ => None,
        }
    }
}

pub const STATUS_GOOD: u8 = 0;
const SENSE_UNIT_ATTENTION: u8 = 6;
/// What we declare as MaxRecvDataSegmentLength.
const OUR_MAX_RECV: usize = 65536;

/// A logged-in session on one connection. Fields are public so the
/// bad-input test can keep sending on a properly logged-in connection.
pub struct Session {
    pub stream: TcpStream,
    pub digests: Digests,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub next_itt: u32,
    /// Negotiated: largest data segment the target accepts.
    pub target_max_recv: usize,
    pub first_burst: usize,
    pub immediate_data: bool,
    /// Keys the target returned in the operational stage.
    pub target_keys: Vec<(String, String)>,
    /// Session handle the target assigned.
    pub tsih: u16,
}

impl Session {
    /// Connect and log in to full feature phase.
    pub fn login(addr: SocketAddr, params: &LoginParams, timeout: Duration) -> io::Result<Session> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        Session::login_on(stream, params)
    }

    /// Log in on an already connected stream.
    pub fn login_on(stream: TcpStream, params: &LoginParams) -> io::Result<Session> {
        Session::login_declaring(stream, params, &[])
    }

    /// Log in on `stream`, declaring `extra` keys (InitiatorAlias, ...)
    /// in the security stage besides the usual ones.
    pub fn login_declaring(
        stream: TcpStream,
        params: &LoginParams,
        extra: &[(&str, &str)],
    ) -> io::Result<Session> {
        let mut s = Session {
            stream,
            digests: Digests::default(),
            cmd_sn: 1,
            exp_stat_sn: 0,
            next_itt: 1,
            target_max_recv: 8192,
            first_burst: 65536,
            immediate_data: true,
            target_keys: Vec::new(),
            tsih: params.tsih,
        };
        let session_type = if params.target.is_some() {
            "Normal"
        } else {
            "Discovery"
        };
        let mut security = vec![
            ("InitiatorName", params.initiator.as_str()),
            ("SessionType", session_type),
            ("AuthMethod", "None"),
        ];
        if let Some(target) = &params.target {
            security.push(("TargetName", target.as_str()));
        }
        security.extend_from_slice(extra);
        s.login_stage(params.isid, 0, 1, &text(&security))?;

        let digest = |on: bool| if on { "CRC32C" } else { "None" };
        let max_recv = OUR_MAX_RECV.to_string();
        let mut operational = vec![
            ("HeaderDigest", digest(params.digests.header)),
            ("DataDigest", digest(params.digests.data)),
            ("MaxRecvDataSegmentLength", max_recv.as_str()),
        ];
        // Keys about data transfer and sessions are irrelevant to discovery.
        if params.target.is_some() {
            operational.extend([
                ("ImmediateData", "Yes"),
                ("InitialR2T", "Yes"),
                ("MaxBurstLength", "262144"),
                ("FirstBurstLength", "65536"),
                ("MaxOutstandingR2T", "1"),
                ("DataPDUInOrder", "Yes"),
                ("DataSequenceInOrder", "Yes"),
                ("ErrorRecoveryLevel", "0"),
                ("MaxConnections", "1"),
                ("DefaultTime2Wait", "0"),
                ("DefaultTime2Retain", "0"),
            ]);
        }
        let operational = text(&operational);
        let keys = s.login_stage(params.isid, 1, 3, &operational)?;
        for (k, v) in &keys {
            match k.as_str() {
                "HeaderDigest" | "DataDigest" => {
                    let wanted = if k == "HeaderDigest" {
                        params.digests.header
                    } else {
                        params.digests.data
                    };
                    if v != digest(wanted) {
                        return Err(invalid(format!("target answered {k}={v}")));
                    }
                }
                "MaxRecvDataSegmentLength" => s.target_max_recv = parse_num(k, v)?,
                "FirstBurstLength" => s.first_burst = s.first_burst.min(parse_num(k, v)?),
                "ImmediateData" => s.immediate_data = v == "Yes",
                "InitialR2T" if v != "Yes" => {
                    return Err(invalid(format!("target answered InitialR2T={v}")))
                }
                _ => {}
            }
        }
        s.target_keys = keys;
        s.digests = params.digests;
        Ok(s)
    }

    /// Run one login stage until the target agrees to move to `nsg`;
    /// returns every key the target sent in it.
    fn login_stage(
        &mut self,
        isid: [u8; 6],
        csg: u8,
        nsg: u8,
        keys: &[u8],
    ) -> io::Result<Vec<(String, String)>> {
        let mut answers = Vec::new();
        // Our keys go in the first request; if the target wants another
        // exchange before moving on, the follow-ups carry no keys.
        let mut send = keys.to_vec();
        for _ in 0..8 {
            let mut req = login_request(isid, csg, nsg, true, std::mem::take(&mut send));
            req.bhs[14..16].copy_from_slice(&self.tsih.to_be_bytes());
            req.set_u32(16, self.next_itt);
            req.set_u32(24, self.cmd_sn);
            req.set_u32(28, self.exp_stat_sn);
            self.stream.write_all(&req.encode(Digests::default()))?;
            let rsp = read_pdu(&mut self.stream, Digests::default(), OUR_MAX_RECV)?;
            if rsp.opcode() != op::LOGIN_RSP {
                return Err(invalid(format!(
                    "expected a login response, got opcode {:#x}",
                    rsp.opcode()
                )));
            }
            let (class, detail) = (rsp.bhs[36], rsp.bhs[37]);
            if class != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("login rejected: status class {class:#x} detail {detail:#x}"),
                ));
            }
            self.exp_stat_sn = rsp.u32_at(24).wrapping_add(1);
            let got = parse_text(&rsp.data);
            answers.extend(got);
            let transit = rsp.flags() & 0x80 != 0;
            if transit && rsp.flags() & 3 == nsg {
                if nsg == 3 {
                    // Only the final response carries the new session's TSIH.
                    self.tsih = u16::from_be_bytes([rsp.bhs[14], rsp.bhs[15]]);
                }
                return Ok(answers);
            }
        }
        Err(invalid(format!(
            "login stage {csg} did not complete in 8 exchanges"
        )))
    }

    fn take_itt(&mut self) -> u32 {
        let itt = self.next_itt;
        // 0xffffffff is reserved.
        self.next_itt = self.next_itt.wrapping_add(1) % 0xffff_fff0;
        itt
    }

    pub fn send(&mut self, pdu: &Pdu) -> io::Result<()> {
        self.stream.write_all(&pdu.encode(self.digests))
    }

    pub fn recv(&mut self) -> io::Result<Pdu> {
        read_pdu(&mut self.stream, self.digests, OUR_MAX_RECV)
    }

    /// A SCSI Command PDU for the next CmdSN (not yet sent, CmdSN not yet
    /// advanced); immediate data is attached by `command`.
    pub fn command_pdu(&mut self, lun: u64, cdb: &[u8], write_len: usize, read_len: usize) -> Pdu {
        let mut pdu = Pdu::new(op::SCSI_CMD);
        let mut flags = FINAL | 1; // simple task attribute
        if read_len > 0 {
            flags |= 0x40;
        }
        if write_len > 0 {
            flags |= 0x20;
        }
        pdu.bhs[1] = flags;
        pdu.bhs[8..16].copy_from_slice(&lun_field(lun));
        let itt = self.take_itt();
        pdu.set_u32(16, itt);
        pdu.set_u32(20, write_len.max(read_len) as u32);
        pdu.set_u32(24, self.cmd_sn);
        pdu.set_u32(28, self.exp_stat_sn);
        let n = cdb.len().min(16);
        pdu.bhs[32..32 + n].copy_from_slice(&cdb[..n]);
        pdu
    }

    /// Execute one command and wait for its status.
    pub fn command(
        &mut self,
        lun: u64,
        cdb: &[u8],
        data_out: &[u8],
        read_len: usize,
    ) -> io::Result<Completion> {
        let mut pdu = self.command_pdu(lun, cdb, data_out.len(), read_len);
        let itt = pdu.itt();
        if self.immediate_data && !data_out.is_empty() {
            let n = data_out
                .len()
                .min(self.first_burst)
                .min(self.target_max_recv);
            pdu.data = data_out[..n].to_vec();
        }
        self.send(&pdu)?;
        self.cmd_sn = self.cmd_sn.wrapping_add(1);

        let mut data = vec![0u8; read_len];
        let mut received = 0usize;
        loop {
            let rsp = self.recv()?;
            match rsp.opcode() {
                op::DATA_IN if rsp.itt() == itt => {
                    let offset = rsp.u32_at(40) as usize;
                    let end = offset + rsp.data.len();
                    if end > data.len() {
                        return Err(invalid(format!(
                            "Data-In {offset}..{end} beyond {read_len} bytes"
                        )));
                    }
                    data[offset..end].copy_from_slice(&rsp.data);
                    received += rsp.data.len();
                    if let Some(status) = final_status(&rsp)? {
                        self.exp_stat_sn = rsp.u32_at(24).wrapping_add(1);
                        data.truncate(received);
                        return Ok(Completion {
                            status,
                            sense: Vec::new(),
                            data,
                        });
                    }
                }
                op::R2T if rsp.itt() == itt => {
                    self.answer_r2t(&rsp, pdu.bhs[8..16].try_into().unwrap_or([0; 8]), data_out)?
                }
                op::SCSI_RSP if rsp.itt() == itt => {
                    self.exp_stat_sn = rsp.u32_at(24).wrapping_add(1);
                    let status = final_status(&rsp)?.unwrap_or(rsp.bhs[3]);
                    let sense = match rsp.data.get(..2) {
                        Some(len) => {
                            let len = u16::from_be_bytes([len[0], len[1]]) as usize;
                            rsp.data.get(2..2 + len).unwrap_or(&rsp.data[2..]).to_vec()
                        }
                        None => Vec::new(),
                    };
                    data.truncate(received);
                    return Ok(Completion {
                        status,
                        sense,
                        data,
                    });
                }
                op::NOP_IN => self.answer_nop_in(&rsp)?,
                op::ASYNC if rsp.bhs[36] == 0 => {} // SCSI async event: nothing to do
                op::ASYNC => return Err(invalid(format!("async message, event {}", rsp.bhs[36]))),
                op::REJECT => {
                    return Err(invalid(format!(
                        "target rejected a PDU, reason {:#x}",
                        rsp.bhs[2]
                    )))
                }
                other => {
                    return Err(invalid(format!(
                        "unexpected opcode {other:#x} (ITT {:#x})",
                        rsp.itt()
                    )))
                }
            }
        }
    }

    fn answer_r2t(&mut self, r2t: &Pdu, lun: [u8; 8], data_out: &[u8]) -> io::Result<()> {
        let ttt = r2t.u32_at(20);
        let offset = r2t.u32_at(40) as usize;
        let len = r2t.u32_at(44) as usize;
        let end = offset.checked_add(len).filter(|&e| e <= data_out.len());
        let Some(end) = end else {
            return Err(invalid(format!(
                "R2T for {offset}+{len} beyond {} bytes",
                data_out.len()
            )));
        };
        let mut at = offset;
        let mut data_sn = 0u32;
        while at < end {
            let n = (end - at).min(self.target_max_recv);
            let mut pdu = Pdu::new(op::DATA_OUT);
            if at + n == end {
                pdu.bhs[1] = FINAL;
            }
            pdu.bhs[8..16].copy_from_slice(&lun);
            pdu.set_u32(16, r2t.itt());
            pdu.set_u32(20, ttt);
            pdu.set_u32(28, self.exp_stat_sn);
            pdu.set_u32(36, data_sn);
            pdu.set_u32(40, at as u32);
            pdu.data = data_out[at..at + n].to_vec();
            self.send(&pdu)?;
            at += n;
            data_sn += 1;
        }
        Ok(())
    }

    /// A NOP-In that carries a target transfer tag is a ping to answer.
    pub fn answer_nop_in(&mut self, nop: &Pdu) -> io::Result<()> {
        let ttt = nop.u32_at(20);
        if ttt == 0xffff_ffff {
            return Ok(());
        }
        let mut pdu = Pdu::new(op::NOP_OUT | IMMEDIATE);
        pdu.bhs[1] = FINAL;
        pdu.bhs[8..16].copy_from_slice(&nop.bhs[8..16]);
        pdu.set_u32(16, 0xffff_ffff);
        pdu.set_u32(20, ttt);
        pdu.set_u32(24, self.cmd_sn);
        pdu.set_u32(28, self.exp_stat_sn);
        self.send(&pdu)
    }

    /// A command that must end GOOD; unit attentions (e.g. the one after
    /// login) are retried a few times.
    pub fn command_good(
        &mut self,
        lun: u64,
        cdb: &[u8],
        data_out: &[u8],
        read_len: usize,
    ) -> io::Result<Vec<u8>> {
        for _ in 0..4 {
            let c = self.command(lun, cdb, data_out, read_len)?;
            if c.status == STATUS_GOOD {
                return Ok(c.data);
            }
            if c.sense_key() != Some(SENSE_UNIT_ATTENTION) {
                return Err(io::Error::other(format!(
                    "CDB {:02x?}: status {:#x}, sense {:02x?}",
                    &cdb[..cdb.len().min(10)],
                    c.status,
                    c.sense
                )));
            }
        }
        Err(io::Error::other("unit attention kept coming back"))
    }

    /// (number of blocks, block size) from READ CAPACITY(10).
    pub fn read_capacity(&mut self, lun: u64) -> io::Result<(u64, u32)> {
        let data = self.command_good(lun, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 8)?;
        if data.len() < 8 {
            return Err(invalid(format!(
                "READ CAPACITY returned {} bytes",
                data.len()
            )));
        }
        let last = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as u64;
        let block = u32::from_be_bytes([data[4], data[5], data[6], data[7]]);
        Ok((last + 1, block))
    }

    pub fn read10(
        &mut self,
        lun: u64,
        lba: u32,
        blocks: u16,
        block_size: u32,
    ) -> io::Result<Vec<u8>> {
        let len = blocks as usize * block_size as usize;
        let data = self.command_good(lun, &rw10_cdb(0x28, lba, blocks), &[], len)?;
        if data.len() != len {
            return Err(invalid(format!(
                "READ(10) returned {} of {len} bytes",
                data.len()
            )));
        }
        Ok(data)
    }

    pub fn write10(&mut self, lun: u64, lba: u32, data: &[u8], block_size: u32) -> io::Result<()> {
        let blocks = (data.len() / block_size as usize) as u16;
        self.command_good(lun, &rw10_cdb(0x2a, lba, blocks), data, 0)
            .map(|_| ())
    }

    /// Close the session (logout reason 0) and wait for the response.
    pub fn logout(mut self) -> io::Result<()> {
        let mut pdu = Pdu::new(op::LOGOUT | IMMEDIATE);
        pdu.bhs[1] = FINAL;
        let itt = self.take_itt();
        pdu.set_u32(16, itt);
        pdu.set_u32(24, self.cmd_sn);
        pdu.set_u32(28, self.exp_stat_sn);
        self.send(&pdu)?;
        loop {
            let rsp = self.recv()?;
            match rsp.opcode() {
                0x26 => {
                    return if rsp.bhs[2] == 0 {
                        Ok(())
                    } else {
                        Err(invalid(format!("logout response {}", rsp.bhs[2])))
                    }
                }
                op::NOP_IN => self.answer_nop_in(&rsp)?,
                op::ASYNC => {}
                other => {
                    return Err(invalid(format!(
                        "unexpected opcode {other:#x} while logging out"
                    )))
                }
            }
        }
    }
}

fn parse_num(key: &str, value: &str) -> io::Result<usize> {
    value
        .parse()
        .map_err(|_| invalid(format!("target sent {key}={value}")))
}

/// READ(10) / WRITE(10) CDB.
pub fn rw10_cdb(opcode: u8, lba: u32, blocks: u16) -> [u8; 10] {
    let mut cdb = [0u8; 10];
    cdb[0] = opcode;
    cdb[2..6].copy_from_slice(&lba.to_be_bytes());
    cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
    cdb
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_rfc_examples() {
        // RFC 7143 appendix: 32 bytes of zeros and of 0xff.
        assert_eq!(crc32c(&[&[0u8; 32]]), 0x8a91_36aa);
        assert_eq!(crc32c(&[&[0xffu8; 32]]), 0x62a8_ab43);
        assert_eq!(crc32c(&[b"1234", b"56789"]), 0xe306_9283);
    }

    #[test]
    fn pdu_round_trips_with_digests_and_padding() {
        let mut pdu = Pdu::new(op::NOP_OUT);
        pdu.data = b"hello".to_vec();
        let digests = Digests {
            header: true,
            data: true,
        };
        let wire = pdu.encode(digests);
        assert_eq!(wire.len(), 48 + 4 + 8 + 4);
        let back = read_pdu(&mut &wire[..], digests, 1024).unwrap();
        assert_eq!(back.data, b"hello");
        let mut bad = wire.clone();
        bad[60] ^= 1;
        assert!(read_pdu(&mut &bad[..], digests, 1024).is_err());
    }
}
