//! Logical block provisioning: UNMAP, WRITE SAME (with UNMAP and NDOB) and
//! GET LBA STATUS.

use block::Allocation;
use scsi_api::ScsiResponse;

use crate::cdb::{be16, be32, be64, put32, put64, truncate, u8_at};
use crate::commands::op;
use crate::lu::{Ctx, LogicalUnit, Outcome, MAX_UNMAP_DESCRIPTORS};
use crate::rw::extent;
use crate::sense::{io_sense, Sense};

/// WRITE SAME writes its pattern in pieces of this size.
const WRITE_SAME_CHUNK: usize = 1 << 20;

/// GET LBA STATUS returns at most this many descriptors.
const MAX_LBA_STATUS_DESCRIPTORS: usize = 1024;

impl LogicalUnit {
    pub(crate) fn unmap(&self, ctx: &Ctx<'_>) -> Outcome {
        let cdb = ctx.cdb();
        if u8_at(cdb, 1) & 0x01 != 0 {
            // ANCHOR: anchored LBAs are not supported (ANC_SUP = 0).
            return Err(Sense::invalid_cdb(1, Some(0)).into());
        }
        self.check_writable(ctx)?;
        let len = usize::from(be16(cdb, 7));
        if len == 0 {
            return Ok(ScsiResponse::good());
        }
        if len < 8 {
            return Err(Sense::param_list_length().into());
        }
        let param = ctx.param(len)?;
        // Whole descriptors that both the header and the list length cover.
        let count = usize::from(be16(param, 2)).min(len - 8) / 16;
        if count > MAX_UNMAP_DESCRIPTORS as usize {
            return Err(Sense::invalid_param(2, None).into());
        }
        let mut ranges = Vec::with_capacity(count);
        for i in 0..count {
            let at = 8 + 16 * i;
            let (lba, blocks) = (be64(param, at), u64::from(be32(param, at + 8)));
            self.check_range(lba, blocks)?;
            ranges.push((lba, blocks));
        }
        for (lba, blocks) in ranges.into_iter().filter(|r| r.1 > 0) {
            let _guard = self.locks.lock(lba, blocks, false);
            let bs = u64::from(self.block_size);
            self.device
                .discard(lba * bs, blocks * bs)
                .map_err(|e| io_sense(&e, true))?;
        }
        Ok(ScsiResponse::good())
    }

    pub(crate) fn write_same(&self, ctx: &Ctx<'_>) -> Outcome {
        let cdb = ctx.cdb();
        let sixteen = u8_at(cdb, 0) == op::WRITE_SAME_16;
        let flags = u8_at(cdb, 1);
        let anchor = flags & 0x10 != 0;
        let unmap = flags & 0x08 != 0;
        let ndob = sixteen && flags & 0x01 != 0;
        if anchor {
            // ANCHOR needs UNMAP, and anchored LBAs are not supported.
            return Err(Sense::invalid_cdb(1, Some(4)).into());
        }
        if unmap && !self.thin() {
            return Err(Sense::invalid_cdb(1, Some(3)).into());
        }
        let e = extent(cdb);
        let capacity = self.blocks();
        if e.lba > capacity {
            return Err(Sense::lba_out_of_range().into());
        }
        // Zero blocks (WSNZ = 0) means "through the last LBA".
        let blocks = if e.blocks == 0 {
            capacity - e.lba
        } else {
            e.blocks
        };
        self.check_range(e.lba, blocks)?;
        self.check_writable(ctx)?;
        if blocks > self.max_transfer_blocks() {
            return Err(Sense::invalid_cdb(e.length_at, None).into());
        }
        let bs = self.block_size as usize;
        let zeros;
        let block: &[u8] = if ndob {
            zeros = vec![0u8; bs];
            &zeros
        } else {
            if ctx.cmd.data_out_len as usize != bs {
                return Err(Sense::invalid_cdb(e.length_at, None).into());
            }
            ctx.cmd
                .data_out
                .get(..bs)
                .ok_or_else(Sense::param_list_length)?
        };
        if blocks == 0 {
            return Ok(ScsiResponse::good());
        }
        let (offset, len) = (self.offset(e.lba), blocks * bs as u64);
        let _guard = self.locks.lock(e.lba, blocks, false);
        let fua = self.force_unit_access(false);
        let all_zero = block.iter().all(|&b| b == 0);
        if unmap {
            // UNMAP lets the device server deallocate instead of writing
            // (SBC-3 5.44); reads then return what LBPRZ promises.
            self.device
                .discard(offset, len)
                .map_err(|err| io_sense(&err, true))?;
        } else if all_zero {
            self.device
                .write_zeroes(offset, len)
                .map_err(|err| io_sense(&err, true))?;
            if fua {
                self.device.flush().map_err(|err| io_sense(&err, true))?;
            }
        } else {
            let per_chunk = (WRITE_SAME_CHUNK / bs).max(1);
            let pattern: Vec<u8> = block.repeat(per_chunk.min(blocks as usize));
            let mut done = 0u64;
            while done < len {
                let n = (len - done).min(pattern.len() as u64) as usize;
                self.device
                    .write_at(&pattern[..n], offset + done, fua)
                    .map_err(|err| io_sense(&err, true))?;
                done += n as u64;
            }
        }
        Ok(ScsiResponse::good())
    }

    pub(crate) fn get_lba_status(&self, ctx: &Ctx<'_>) -> Outcome {
        let cdb = ctx.cdb();
        let lba = be64(cdb, 2);
        let alloc = be32(cdb, 10) as usize;
        let capacity = self.blocks();
        if lba >= capacity {
            return Err(Sense::lba_out_of_range().into());
        }
        let bs = u64::from(self.block_size);
        let room = (alloc.saturating_sub(8) / 16).clamp(1, MAX_LBA_STATUS_DESCRIPTORS);
        let mut extents: Vec<(u64, u64, u8)> = Vec::new();
        let mut at = lba;
        while at < capacity && extents.len() <= room {
            let (state, bytes) = if self.thin() {
                self.device
                    .allocation(at * bs, (capacity - at) * bs)
                    .map_err(|e| io_sense(&e, false))?
            } else {
                (Allocation::Mapped, (capacity - at) * bs)
            };
            let blocks = (bytes / bs).clamp(1, capacity - at);
            let code = match state {
                Allocation::Mapped => 0,
                Allocation::Deallocated => 1,
            };
            match extents.last_mut() {
                Some(last) if last.2 == code => last.1 += blocks,
                _ => extents.push((at, blocks, code)),
            }
            at += blocks;
        }
        let mut d = vec![0u8; 8];
        for &(start, mut blocks, code) in extents.iter().take(room) {
            // One descriptor counts at most 2^32 - 1 blocks.
            let mut start = start;
            while blocks > 0 {
                let n = blocks.min(u64::from(u32::MAX));
                let mut desc = [0u8; 16];
                put64(&mut desc, 0, start);
                put32(&mut desc, 8, n as u32);
                desc[12] = code;
                d.extend_from_slice(&desc);
                start += n;
                blocks -= n;
            }
        }
        let len = (d.len() - 4) as u32;
        put32(&mut d, 0, len);
        Ok(ScsiResponse::with_data(truncate(d, alloc)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lu::test_support::*;
    use crate::sense::key;
    use scsi_api::status;

    fn unmap_list(ranges: &[(u64, u32)]) -> Vec<u8> {
        let mut p = vec![0u8; 8];
        p[0..2].copy_from_slice(&((6 + 16 * ranges.len()) as u16).to_be_bytes());
        p[2..4].copy_from_slice(&((16 * ranges.len()) as u16).to_be_bytes());
        for &(lba, n) in ranges {
            p.extend_from_slice(&lba.to_be_bytes());
            p.extend_from_slice(&n.to_be_bytes());
            p.extend_from_slice(&[0; 4]);
        }
        p
    }

    fn unmap_cdb(len: usize) -> Vec<u8> {
        let l = (len as u16).to_be_bytes();
        vec![0x42, 0, 0, 0, 0, 0, 0, l[0], l[1], 0]
    }

    fn lba_status(lu: &LogicalUnit, lba: u64) -> Vec<(u64, u32, u8)> {
        let mut cdb = vec![0x9E, 0x12];
        cdb.extend_from_slice(&lba.to_be_bytes());
        cdb.extend_from_slice(&1024u32.to_be_bytes());
        cdb.extend_from_slice(&[0, 0]);
        let d = run(lu, &nexus("a"), &cdb, &[]).data_in;
        assert_eq!(be32(&d, 0) as usize + 4, d.len());
        d[8..]
            .chunks(16)
            .map(|c| (be64(c, 0), be32(c, 8), c[12]))
            .collect()
    }

    #[test]
    fn unmap_deallocates_and_reads_zero() {
        let lu = lu();
        let a = nexus("a");
        ready(&lu, &a);
        let w = [0x2A, 0, 0, 0, 0, 0, 0, 0, 255, 0];
        run(&lu, &a, &w, &[0xAB; 255 * 512]);
        assert_eq!(lba_status(&lu, 0)[0], (0, 256, 0));
        let p = unmap_list(&[(0, 128), (128, 0)]);
        assert_eq!(run(&lu, &a, &unmap_cdb(p.len()), &p).status, status::GOOD);
        let s = lba_status(&lu, 0);
        assert_eq!(s[0], (0, 128, 1));
        assert_eq!(s[1], (128, 128, 0));
        let r = run(&lu, &a, &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], &[]);
        assert!(r.data_in.iter().all(|&b| b == 0));
    }

    #[test]
    fn unmap_validation() {
        let lu = lu();
        let a = nexus("a");
        ready(&lu, &a);
        assert_eq!(run(&lu, &a, &unmap_cdb(0), &[]).status, status::GOOD);
        assert_eq!(sense_of(&run(&lu, &a, &unmap_cdb(4), &[0; 4])).1, 0x1A);
        let p = unmap_list(&[(lu.blocks(), 1)]);
        assert_eq!(sense_of(&run(&lu, &a, &unmap_cdb(p.len()), &p)).1, 0x21);
        let p = unmap_list(&[(lu.blocks(), 0)]);
        assert_eq!(run(&lu, &a, &unmap_cdb(p.len()), &p).status, status::GOOD);
        let p = unmap_list(&vec![(0, 1); 257]);
        assert_eq!(sense_of(&run(&lu, &a, &unmap_cdb(p.len()), &p)).1, 0x26);
        let mut anchored = unmap_cdb(0);
        anchored[1] = 1;
        assert_eq!(sense_of(&run(&lu, &a, &anchored, &[])).1, 0x24);
    }

    fn ws10(flags: u8, lba: u32, blocks: u16) -> Vec<u8> {
        let mut c = vec![0x41, flags];
        c.extend_from_slice(&lba.to_be_bytes());
        c.push(0);
        c.extend_from_slice(&blocks.to_be_bytes());
        c.push(0);
        c
    }

    #[test]
    fn write_same_patterns_zeroes_and_unmaps() {
        let lu = lu();
        let a = nexus("a");
        ready(&lu, &a);
        assert_eq!(
            run(&lu, &a, &ws10(0, 10, 3), &[5; 512]).status,
            status::GOOD
        );
        let r = run(&lu, &a, &[0x28, 0, 0, 0, 0, 9, 0, 0, 5, 0], &[]);
        assert!(r.data_in[..512].iter().all(|&b| b == 0));
        assert!(r.data_in[512..2048].iter().all(|&b| b == 5));
        assert!(r.data_in[2048..].iter().all(|&b| b == 0));
        // The UNMAP bit deallocates, whatever the block holds; the blocks
        // then read as zeros (LBPRZ).
        assert_eq!(
            run(&lu, &a, &ws10(0x08, 0, 256), &[0xFF; 512]).status,
            status::GOOD
        );
        assert_eq!(lba_status(&lu, 0)[0].2, 1);
        let r = run(&lu, &a, &[0x28, 0, 0, 0, 0, 9, 0, 0, 5, 0], &[]);
        assert!(r.data_in.iter().all(|&b| b == 0));
        // Zero blocks: through the end of the LU.
        let last = (lu.blocks() - 4) as u32;
        assert_eq!(
            run(&lu, &a, &ws10(0, last, 0), &[7; 512]).status,
            status::GOOD
        );
        let r = run(&lu, &a, &[0x28, 0, 0, 0, 0x07, 0xFC, 0, 0, 4, 0], &[]);
        assert!(r.data_in.iter().all(|&b| b == 7));
        // NDOB writes zeros without Data-Out.
        let mut ws16 = vec![0x93, 0x01];
        ws16.extend_from_slice(&(lu.blocks() - 4).to_be_bytes());
        ws16.extend_from_slice(&4u32.to_be_bytes());
        ws16.extend_from_slice(&[0, 0]);
        let r = run(&lu, &a, &ws16, &[]);
        assert_eq!((r.status, r.data_out_wanted), (status::GOOD, None));
    }

    #[test]
    fn write_same_validation() {
        let lu = lu();
        let a = nexus("a");
        ready(&lu, &a);
        let blocks = lu.blocks() as u32;
        assert_eq!(
            sense_of(&run(&lu, &a, &ws10(0, blocks, 1), &[0; 512])).1,
            0x21
        );
        assert_eq!(
            sense_of(&run(&lu, &a, &ws10(0, blocks + 1, 0), &[0; 512])).1,
            0x21
        );
        assert_eq!(
            sense_of(&run(&lu, &a, &ws10(0x10, 0, 1), &[0; 512])).1,
            0x24
        );
        assert_eq!(
            sense_of(&run(&lu, &a, &ws10(0x18, 0, 1), &[0; 512])).1,
            0x24
        );
        assert_eq!(
            sense_of(&run(&lu, &a, &ws10(0, 0, 1), &[0; 256])).0,
            key::ILLEGAL_REQUEST
        );
        assert_eq!(
            sense_of(&run(&lu, &a, &ws10(0, 0, 1), &[0; 1024])).0,
            key::ILLEGAL_REQUEST
        );
        assert_eq!(
            sense_of(&run(&lu, &a, &ws10(0x20, 0, 1), &[0; 512])).1,
            0x24
        );
    }

    #[test]
    fn get_lba_status_range_and_truncation() {
        let lu = lu();
        let a = nexus("a");
        ready(&lu, &a);
        let s = lba_status(&lu, 7);
        assert_eq!(s, vec![(7, (lu.blocks() - 7) as u32, 1)]);
        let mut cdb = vec![0x9E, 0x12];
        cdb.extend_from_slice(&lu.blocks().to_be_bytes());
        cdb.extend_from_slice(&24u32.to_be_bytes());
        cdb.extend_from_slice(&[0, 0]);
        assert_eq!(sense_of(&run(&lu, &a, &cdb, &[])).1, 0x21);
    }
}
