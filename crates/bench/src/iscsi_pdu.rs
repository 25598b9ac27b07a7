//! iSCSI PDUs as the built-in initiator sends and reads them (RFC 7143):
//! the 48-byte basic header and a data segment padded to four bytes. The
//! initiator negotiates no digests, so there are none to add or check.

use std::io::{Read, Write};

use anyhow::{bail, Result};

pub const NOP_OUT: u8 = 0x00;
pub const SCSI_COMMAND: u8 = 0x01;
pub const LOGIN_REQUEST: u8 = 0x03;
pub const DATA_OUT: u8 = 0x05;
pub const LOGOUT_REQUEST: u8 = 0x06;
pub const NOP_IN: u8 = 0x20;
pub const SCSI_RESPONSE: u8 = 0x21;
pub const LOGIN_RESPONSE: u8 = 0x23;
pub const DATA_IN: u8 = 0x25;
pub const LOGOUT_RESPONSE: u8 = 0x26;
pub const R2T: u8 = 0x31;
pub const REJECT: u8 = 0x3f;
pub const IMMEDIATE: u8 = 0x40;
pub const FINAL: u8 = 0x80;
pub const NO_TAG: u32 = 0xffff_ffff;

/// The largest data segment read back; targets send no more than the
/// MaxRecvDataSegmentLength this initiator declares.
pub const MAX_SEGMENT: usize = 1 << 20;

pub struct Pdu {
    pub bhs: [u8; 48],
    pub data: Vec<u8>,
}

impl Pdu {
    pub fn new(opcode: u8) -> Pdu {
        let mut bhs = [0u8; 48];
        bhs[0] = opcode;
        Pdu {
            bhs,
            data: Vec::new(),
        }
    }

    pub fn opcode(&self) -> u8 {
        self.bhs[0] & 0x3f
    }

    pub fn u32_at(&self, at: usize) -> u32 {
        u32::from_be_bytes(self.bhs[at..at + 4].try_into().expect("four bytes"))
    }

    pub fn set_u32(&mut self, at: usize, value: u32) {
        self.bhs[at..at + 4].copy_from_slice(&value.to_be_bytes());
    }

    pub fn itt(&self) -> u32 {
        self.u32_at(16)
    }

    /// The LUN field in the single-level format SAM gives LUNs below
    /// 16384 (peripheral below 256, flat space above).
    pub fn set_lun(&mut self, lun: u64) {
        let field: [u8; 2] = if lun < 256 {
            [0, lun as u8]
        } else {
            [0x40 | ((lun >> 8) as u8 & 0x3f), lun as u8]
        };
        self.bhs[8..10].copy_from_slice(&field);
    }

    /// The header and data segment as one buffer, ready for one write.
    pub fn encode(&self, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(48 + data.len() + 3);
        out.extend_from_slice(&self.bhs);
        let len = data.len() as u32;
        out[5..8].copy_from_slice(&len.to_be_bytes()[1..]);
        out.extend_from_slice(data);
        out.resize(out.len().next_multiple_of(4), 0);
        out
    }

    pub fn send(&self, w: &mut impl Write) -> Result<()> {
        w.write_all(&self.encode(&self.data))?;
        Ok(())
    }

    pub fn read(r: &mut impl Read) -> Result<Pdu> {
        let mut bhs = [0u8; 48];
        r.read_exact(&mut bhs)?;
        if bhs[4] != 0 {
            bail!("the target sent additional header segments");
        }
        let len = u32::from_be_bytes([0, bhs[5], bhs[6], bhs[7]]) as usize;
        if len > MAX_SEGMENT {
            bail!("a data segment of {len} bytes, beyond what was declared");
        }
        let mut data = vec![0u8; len.next_multiple_of(4)];
        r.read_exact(&mut data)?;
        data.truncate(len);
        Ok(Pdu { bhs, data })
    }
}

/// A READ(16) or WRITE(16) CDB.
pub fn rw16(write: bool, lba: u64, blocks: u32) -> [u8; 16] {
    let mut cdb = [0u8; 16];
    cdb[0] = if write { 0x8a } else { 0x88 };
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
    cdb
}

/// `key=value` pairs, NUL-separated as login and text PDUs carry them.
pub fn keys(pairs: &[(&str, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(format!("{k}={v}").as_bytes());
        out.push(0);
    }
    out
}

pub fn parse_keys(data: &[u8]) -> Vec<(String, String)> {
    data.split(|&b| b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_padding() {
        let mut pdu = Pdu::new(SCSI_COMMAND);
        pdu.set_lun(300);
        pdu.set_u32(16, 7);
        let bytes = pdu.encode(b"hello");
        assert_eq!(bytes.len(), 48 + 8);
        assert_eq!(&bytes[8..10], &[0x41, 44]);
        let back = Pdu::read(&mut &bytes[..]).unwrap();
        assert_eq!(
            (back.opcode(), back.itt(), back.data.as_slice()),
            (SCSI_COMMAND, 7, &b"hello"[..])
        );
    }

    #[test]
    fn keys_round_trip() {
        let data = keys(&[
            ("HeaderDigest", "None".into()),
            ("MaxBurstLength", "262144".into()),
        ]);
        assert_eq!(
            parse_keys(&data),
            [
                ("HeaderDigest".into(), "None".into()),
                ("MaxBurstLength".into(), "262144".into())
            ]
        );
    }
}
