//! One iSCSI session of the built-in initiator: login without
//! authentication, one command at a time for setup (READ CAPACITY) and for
//! the guard rail's sample reads, and logout. The load itself is queued by
//! iscsi_load on the same connection.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::iscsi_pdu::*;
use crate::probe::BlockReader;
use crate::url::Target;

/// This initiator's name, as targets log and filter it.
const INITIATOR: &str = "iqn.2026-11.org.openarray:bench";
/// What this side receives per PDU (and so the largest Data-In).
const OUR_SEGMENT: u32 = 262_144;

/// What login settled that the data path depends on.
#[derive(Clone, Copy, Debug)]
pub struct Negotiated {
    /// The largest data segment the target takes in one PDU.
    pub segment: u32,
    /// The most immediate data a command may carry.
    pub first_burst: u32,
    pub immediate_data: bool,
}

pub struct Session {
    pub stream: TcpStream,
    pub lun: u64,
    pub itt: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub max_cmd_sn: u32,
    pub negotiated: Negotiated,
    pub block_size: u32,
    pub blocks: u64,
}

impl Session {
    /// Logs in to `target`; `isid_n` tells sessions of one run apart.
    pub fn login(target: &Target, isid_n: u16) -> Result<Session> {
        let Target::Iscsi { iqn, lun, .. } = target else {
            bail!("{target} is not an iSCSI URL");
        };
        let addr = target.addr().expect("TCP target");
        let stream = TcpStream::connect(&addr).with_context(|| format!("connect {addr}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut s = Session {
            stream,
            lun: *lun,
            itt: 0,
            cmd_sn: 1,
            exp_stat_sn: 0,
            max_cmd_sn: 1,
            negotiated: Negotiated {
                segment: 8192,
                first_burst: 65536,
                immediate_data: false,
            },
            block_size: 0,
            blocks: 0,
        };
        // The process id in it too: sessions of two bench processes at
        // once must not reinstate (end) each other.
        let pid = std::process::id() as u16;
        let isid = [
            0x80,
            0x00,
            (pid >> 8) as u8,
            pid as u8,
            (isid_n >> 8) as u8,
            isid_n as u8,
        ];
        let security = [
            ("InitiatorName", INITIATOR.to_string()),
            ("TargetName", iqn.clone()),
            ("SessionType", "Normal".into()),
            ("AuthMethod", "None".into()),
        ];
        s.login_stage(&isid, 0, 1, &security)
            .with_context(|| format!("login to {target}"))?;
        let operational = [
            ("HeaderDigest", "None".to_string()),
            ("DataDigest", "None".into()),
            ("ImmediateData", "Yes".into()),
            ("InitialR2T", "Yes".into()),
            ("MaxRecvDataSegmentLength", OUR_SEGMENT.to_string()),
            ("MaxBurstLength", "16776192".into()),
            ("FirstBurstLength", "262144".into()),
            ("MaxOutstandingR2T", "1".into()),
        ];
        let answer = s
            .login_stage(&isid, 1, 3, &operational)
            .with_context(|| format!("login to {target}"))?;
        // Declarative keys the target leaves out keep their defaults.
        let mut immediate = true;
        for (k, v) in answer {
            match k.as_str() {
                "MaxRecvDataSegmentLength" => s.negotiated.segment = v.parse().unwrap_or(8192),
                "FirstBurstLength" => s.negotiated.first_burst = v.parse().unwrap_or(65536),
                "ImmediateData" => immediate = v == "Yes",
                _ => {}
            }
        }
        s.negotiated.immediate_data = immediate;
        s.read_capacity()?;
        Ok(s)
    }

    /// One login request from stage `csg` to `nsg` (transit), repeated
    /// while the target answers without transit; the target's keys.
    fn login_stage(
        &mut self,
        isid: &[u8; 6],
        csg: u8,
        nsg: u8,
        keys_out: &[(&str, String)],
    ) -> Result<Vec<(String, String)>> {
        let mut answer = Vec::new();
        let mut data = keys(keys_out);
        for _ in 0..8 {
            let mut pdu = Pdu::new(LOGIN_REQUEST | IMMEDIATE);
            pdu.bhs[1] = 0x80 | (csg << 2) | nsg;
            pdu.bhs[8..14].copy_from_slice(isid);
            pdu.set_u32(16, self.next_itt());
            pdu.set_u32(24, self.cmd_sn);
            pdu.set_u32(28, self.exp_stat_sn);
            pdu.data = std::mem::take(&mut data);
            pdu.send(&mut self.stream)?;
            let reply = Pdu::read(&mut self.stream)?;
            if reply.opcode() != LOGIN_RESPONSE {
                bail!(
                    "expected a login response, got opcode {:#x}",
                    reply.opcode()
                );
            }
            let (class, detail) = (reply.bhs[36], reply.bhs[37]);
            if class != 0 {
                let why = match (class, detail) {
                    (2, 1) => {
                        "authentication failed (CHAP is not supported by the built-in initiator)"
                    }
                    (2, 2) => "this initiator is not allowed",
                    (2, 3) => "no such target",
                    _ => "refused",
                };
                bail!("the target answered status {class:#x}/{detail:#x}: {why}");
            }
            self.exp_stat_sn = reply.u32_at(24).wrapping_add(1);
            self.max_cmd_sn = reply.u32_at(32);
            answer.extend(parse_keys(&reply.data));
            if reply.bhs[1] & 0x80 != 0 && reply.bhs[1] & 3 == nsg {
                return Ok(answer);
            }
        }
        bail!("the login did not move on to the next stage")
    }

    pub fn next_itt(&mut self) -> u32 {
        self.itt = self.itt.wrapping_add(1) % NO_TAG;
        self.itt
    }

    /// A SCSI command PDU for `cdb`; CmdSN taken.
    pub fn command_pdu(&mut self, cdb: &[u8; 16], read: bool, write: bool, length: u32) -> Pdu {
        let mut pdu = Pdu::new(SCSI_COMMAND);
        pdu.bhs[1] = FINAL | if read { 0x40 } else { 0 } | if write { 0x20 } else { 0 } | 1;
        pdu.set_lun(self.lun);
        pdu.set_u32(16, self.next_itt());
        pdu.set_u32(20, length);
        pdu.set_u32(24, self.cmd_sn);
        pdu.set_u32(28, self.exp_stat_sn);
        pdu.bhs[32..48].copy_from_slice(cdb);
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        pdu
    }

    /// One read-direction command to its end; the data read.
    fn read_command(&mut self, cdb: &[u8; 16], length: u32) -> Result<Vec<u8>> {
        let pdu = self.command_pdu(cdb, true, false, length);
        pdu.send(&mut self.stream)?;
        let mut data = vec![0u8; length as usize];
        loop {
            let reply = Pdu::read(&mut self.stream)?;
            match reply.opcode() {
                DATA_IN => {
                    let at = reply.u32_at(40) as usize;
                    let end = (at + reply.data.len()).min(data.len());
                    data[at.min(end)..end].copy_from_slice(&reply.data[..end - at.min(end)]);
                    if reply.bhs[1] & 1 != 0 {
                        self.status(&reply, reply.bhs[3])?;
                        return Ok(data);
                    }
                }
                SCSI_RESPONSE => {
                    self.status(&reply, reply.bhs[3])?;
                    return Ok(data);
                }
                NOP_IN => self.answer_nop(&reply)?,
                op => bail!("unexpected PDU opcode {op:#x} during a command"),
            }
        }
    }

    fn status(&mut self, reply: &Pdu, status: u8) -> Result<()> {
        self.exp_stat_sn = reply.u32_at(24).wrapping_add(1);
        self.max_cmd_sn = reply.u32_at(32);
        if status != 0 {
            bail!("the command ended with SCSI status {status:#x}");
        }
        Ok(())
    }

    /// A target's NOP-In that asks for an answer (it carries a tag).
    pub fn answer_nop(&mut self, nop: &Pdu) -> Result<()> {
        let ttt = nop.u32_at(20);
        if ttt != NO_TAG {
            let mut out = Pdu::new(NOP_OUT | IMMEDIATE);
            out.bhs[1] = FINAL;
            out.set_lun(self.lun);
            out.set_u32(16, NO_TAG);
            out.set_u32(20, ttt);
            out.set_u32(24, self.cmd_sn);
            out.set_u32(28, self.exp_stat_sn);
            out.send(&mut self.stream)?;
        }
        Ok(())
    }

    fn read_capacity(&mut self) -> Result<()> {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x9e;
        cdb[1] = 0x10;
        cdb[13] = 32;
        // A new session's first command reports the unit attentions a
        // target keeps for it (power on, LUNs changed): asked again, it runs.
        let mut data = self.read_command(&cdb, 32);
        for _ in 0..3 {
            if data.is_ok() {
                break;
            }
            data = self.read_command(&cdb, 32);
        }
        let data = data.context("READ CAPACITY(16)")?;
        self.blocks = u64::from_be_bytes(data[..8].try_into()?) + 1;
        self.block_size = u32::from_be_bytes(data[8..12].try_into()?);
        if self.block_size == 0 {
            bail!("the LUN reports a block size of 0");
        }
        Ok(())
    }

    /// Asks to end the session; whoever reads the connection sees the
    /// answer.
    pub fn logout_request(&mut self) -> Result<()> {
        let mut pdu = Pdu::new(LOGOUT_REQUEST | IMMEDIATE);
        pdu.bhs[1] = FINAL;
        pdu.set_u32(16, self.next_itt());
        pdu.set_u32(24, self.cmd_sn);
        pdu.set_u32(28, self.exp_stat_sn);
        pdu.send(&mut self.stream)?;
        self.stream.flush()?;
        Ok(())
    }

    pub fn logout(&mut self) -> Result<()> {
        self.logout_request()?;
        loop {
            let reply = Pdu::read(&mut self.stream)?;
            if reply.opcode() == LOGOUT_RESPONSE {
                return Ok(());
            }
        }
    }
}

impl BlockReader for Session {
    fn size(&self) -> u64 {
        self.blocks * self.block_size as u64
    }

    fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>> {
        let bs = self.block_size as u64;
        let (lba, blocks) = (offset / bs, (offset % bs + len as u64).div_ceil(bs) as u32);
        let data = self.read_command(&rw16(false, lba, blocks), blocks * self.block_size)?;
        Ok(data[(offset % bs) as usize..][..len as usize].to_vec())
    }
}
