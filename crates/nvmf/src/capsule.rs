//! Submission and completion queue entries (NVMe Base 2.0, 4.2 and 4.6)
//! as a fabrics capsule carries them, and the one SGL descriptor an
//! NVMe/TCP command names its data with.

use crate::status::Status;
use crate::wire::{le16, le32, le64, put16, put64, CQE_LEN, SQE_LEN};

/// The fused operation bits of a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fuse {
    Normal,
    First,
    Second,
    Reserved,
}

/// SGL descriptor types NVMe/TCP uses (Fabrics 2.0, 7.4.5; TCP 3.3.3).
pub const SGL_IN_CAPSULE: u8 = 0x01;
pub const SGL_TRANSPORT: u8 = 0x5A;

/// A command as submitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sqe(pub [u8; SQE_LEN]);

/// Where a command's data is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sgl {
    pub addr: u64,
    pub len: u32,
    pub kind: u8,
}

impl Sqe {
    pub fn opcode(&self) -> u8 {
        self.0[0]
    }

    pub fn fuse(&self) -> Fuse {
        match self.0[1] & 3 {
            0 => Fuse::Normal,
            1 => Fuse::First,
            2 => Fuse::Second,
            _ => Fuse::Reserved,
        }
    }

    /// Data pointer form: fabrics commands must name an SGL (PSDT 01 or 10).
    pub fn psdt(&self) -> u8 {
        self.0[1] >> 6
    }

    pub fn cid(&self) -> u16 {
        le16(&self.0, 2)
    }

    pub fn nsid(&self) -> u32 {
        le32(&self.0, 4)
    }

    /// Command dword `n` (10 to 15).
    pub fn cdw(&self, n: usize) -> u32 {
        le32(&self.0, n * 4)
    }

    /// Dwords 10 and 11 as one 64-bit field (a starting LBA).
    pub fn cdw10_11(&self) -> u64 {
        le64(&self.0, 40)
    }

    pub fn sgl(&self) -> Sgl {
        Sgl {
            addr: le64(&self.0, 24),
            len: le32(&self.0, 32),
            kind: self.0[39],
        }
    }

    /// A fabrics command's type (its opcode is 0x7F).
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }
}

/// A completion as sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cqe {
    /// Dwords 0 and 1.
    pub result: u64,
    pub sq_head: u16,
    pub sq_id: u16,
    pub cid: u16,
    pub status: Status,
}

impl Cqe {
    pub fn encode(&self) -> [u8; CQE_LEN] {
        let mut b = [0; CQE_LEN];
        put64(&mut b, 0, self.result);
        put16(&mut b, 8, self.sq_head);
        put16(&mut b, 10, self.sq_id);
        put16(&mut b, 12, self.cid);
        // The phase bit means nothing on a fabric.
        put16(&mut b, 14, self.status.0 << 1);
        b
    }

    pub fn decode(b: &[u8; CQE_LEN]) -> Cqe {
        Cqe {
            result: le64(b, 0),
            sq_head: le16(b, 8),
            sq_id: le16(b, 10),
            cid: le16(b, 12),
            status: Status(le16(b, 14) >> 1),
        }
    }
}

/// Builds submission entries, for hosts (the test initiator) and tests.
#[derive(Clone, Copy, Debug)]
pub struct SqeBuilder(pub [u8; SQE_LEN]);

impl SqeBuilder {
    pub fn new(opcode: u8, cid: u16) -> SqeBuilder {
        let mut b = [0; SQE_LEN];
        b[0] = opcode;
        b[1] = 1 << 6; // PSDT: SGL
        put16(&mut b, 2, cid);
        SqeBuilder(b)
    }

    pub fn nsid(mut self, nsid: u32) -> Self {
        crate::wire::put32(&mut self.0, 4, nsid);
        self
    }

    pub fn byte(mut self, at: usize, v: u8) -> Self {
        self.0[at] = v;
        self
    }

    pub fn cdw(mut self, n: usize, v: u32) -> Self {
        crate::wire::put32(&mut self.0, n * 4, v);
        self
    }

    pub fn fuse(mut self, f: Fuse) -> Self {
        let bits = match f {
            Fuse::Normal => 0,
            Fuse::First => 1,
            Fuse::Second => 2,
            Fuse::Reserved => 3,
        };
        self.0[1] = (self.0[1] & !3) | bits;
        self
    }

    pub fn sgl(mut self, kind: u8, addr: u64, len: u32) -> Self {
        put64(&mut self.0, 24, addr);
        crate::wire::put32(&mut self.0, 32, len);
        self.0[39] = kind;
        self
    }

    pub fn build(self) -> Sqe {
        Sqe(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip() {
        let sqe = SqeBuilder::new(0x02, 77)
            .nsid(3)
            .cdw(10, 100)
            .cdw(12, 7 | 1 << 30)
            .fuse(Fuse::First)
            .sgl(SGL_TRANSPORT, 0, 4096)
            .build();
        assert_eq!(sqe.opcode(), 2);
        assert_eq!(sqe.cid(), 77);
        assert_eq!(sqe.nsid(), 3);
        assert_eq!(sqe.cdw10_11(), 100);
        assert_eq!(sqe.cdw(12) >> 30 & 1, 1);
        assert_eq!(sqe.fuse(), Fuse::First);
        assert_eq!(sqe.psdt(), 1);
        assert_eq!(sqe.sgl().len, 4096);
        let cqe = Cqe {
            result: 5,
            sq_head: 2,
            sq_id: 1,
            cid: 77,
            status: Status::LBA_OUT_OF_RANGE,
        };
        let b = cqe.encode();
        assert_eq!(le16(&b, 14), (0x4080) << 1);
        assert_eq!(Cqe::decode(&b), cqe);
    }
}
