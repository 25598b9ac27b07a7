//! Attacks on logged-in sessions: discovery sessions fed garbage, full
//! feature sessions (digests on or off) fed broken, odd and valid PDUs,
//! solicited writes answered with lying Data-Out, and session or connection
//! reinstatement while a write waits for its data.

use std::net::TcpStream;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use crate::attacker::{connect, drain, flip_bits, send, Attacker};
use crate::common::iscsi::{self, op, Digests, LoginParams, Pdu, Session, FINAL, IMMEDIATE};
use crate::FUZZ_IQN;

impl Attacker {
    /// A Discovery session fed garbage Text requests and SCSI commands.
    pub(super) fn discovery_garbage(&mut self) {
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

    pub(super) fn login(&mut self, stream: TcpStream, params: &LoginParams) -> Option<Session> {
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

    pub(super) fn text_request(&mut self, s: &mut Session) -> Pdu {
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
    pub(super) fn full_feature_garbage(&mut self) {
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
    pub(super) fn r2t_abuse(&mut self, s: &mut Session) -> bool {
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
    pub(super) fn await_r2t(&mut self, s: &mut Session, itt: u32) -> Option<Pdu> {
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
    pub(super) fn session_takeover(&mut self) {
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
    pub(super) fn mutable_pdu(&mut self, s: Option<&Session>) -> Pdu {
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
    pub(super) fn mutate_header(&mut self, pdu: &mut Pdu) {
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
    pub(super) fn attack_pdu(&mut self, s: &mut Session) -> Vec<u8> {
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
