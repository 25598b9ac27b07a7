//! Medium access: READ, WRITE, VERIFY, WRITE AND VERIFY, ORWRITE,
//! COMPARE AND WRITE, PRE-FETCH, SYNCHRONIZE CACHE (WRITE ATOMIC: atomic.rs).

use block::BatchRead;
use scsi_api::{status, FileRegion, HeldData, ScsiResponse};
use smallvec::SmallVec;

use crate::cdb::{be16, be24, be32, be64, u8_at};
use crate::commands::op;
use crate::lu::{Ctx, LogicalUnit, Outcome, MAX_COMPARE_AND_WRITE_BLOCKS};
use crate::sense::{asc, io_sense, Sense};

/// READs from this size on whose pages the file's mapping cannot send
/// (pages not known to exist) go out with `sendfile` when the transport
/// can; shorter ones are read (`read_from_pages`).
const ZERO_COPY_READ: usize = 32 << 10;

/// The addressing fields of a medium access CDB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub lba: u64,
    pub blocks: u64,
    /// Byte of the CDB holding the transfer length, for field pointers.
    pub length_at: usize,
}

/// Decodes LBA and transfer length of the medium access commands.
pub fn extent(cdb: &[u8]) -> Extent {
    match u8_at(cdb, 0) {
        op::READ_6 | op::WRITE_6 => {
            let n = u64::from(u8_at(cdb, 4));
            Extent {
                lba: u64::from(be24(cdb, 1) & 0x1F_FFFF),
                blocks: if n == 0 { 256 } else { n },
                length_at: 4,
            }
        }
        op::READ_12 | op::WRITE_12 | op::VERIFY_12 | op::WRITE_VERIFY_12 => Extent {
            lba: u64::from(be32(cdb, 2)),
            blocks: u64::from(be32(cdb, 6)),
            length_at: 6,
        },
        op::READ_16
        | op::WRITE_16
        | op::VERIFY_16
        | op::WRITE_VERIFY_16
        | op::ORWRITE_16
        | op::PRE_FETCH_16
        | op::SYNCHRONIZE_CACHE_16
        | op::WRITE_SAME_16 => Extent {
            lba: be64(cdb, 2),
            blocks: u64::from(be32(cdb, 10)),
            length_at: 10,
        },
        op::COMPARE_AND_WRITE => Extent {
            lba: be64(cdb, 2),
            blocks: u64::from(u8_at(cdb, 13)),
            length_at: 13,
        },
        op::WRITE_ATOMIC_16 => Extent {
            lba: be64(cdb, 2),
            blocks: u64::from(be16(cdb, 12)),
            length_at: 12,
        },
        // The 10-byte forms.
        _ => Extent {
            lba: u64::from(be32(cdb, 2)),
            blocks: u64::from(be16(cdb, 7)),
            length_at: 7,
        },
    }
}

/// The READ commands, which [`LogicalUnit::read_batch`] batches.
pub fn is_read(opcode: u8) -> bool {
    matches!(opcode, op::READ_6 | op::READ_10 | op::READ_12 | op::READ_16)
}

pub(crate) fn fua_of(cdb: &[u8]) -> bool {
    // FUA is byte 1 bit 3 in every CDB of this module that has it; the
    // 6-byte forms have no FUA.
    !matches!(u8_at(cdb, 0), op::READ_6 | op::WRITE_6) && u8_at(cdb, 1) & 0x08 != 0
}

/// Offset of the first differing byte.
pub fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

impl LogicalUnit {
    /// Range and MAXIMUM TRANSFER LENGTH checks shared by every transfer.
    pub(crate) fn check_transfer(&self, e: &Extent) -> Result<(), Sense> {
        self.check_range(e.lba, e.blocks)?;
        if e.blocks > self.max_transfer_blocks() {
            return Err(Sense::invalid_cdb(e.length_at, None));
        }
        Ok(())
    }

    /// Bytes a READ of `e` moves, once its transfer checks pass.
    pub(crate) fn read_len(&self, e: &Extent) -> Result<usize, Sense> {
        self.check_transfer(e)
            .and_then(|()| self.byte_len(e.blocks))
    }

    /// The Data-Out of a write of `e`: all of it, or the whole blocks that
    /// arrived when the initiator sent less than the CDB describes (the
    /// transport reports the shortfall as residual overflow). A trailing
    /// part of a block is not written: a block is written whole or not at
    /// all.
    fn write_data<'a>(&self, ctx: &'a Ctx<'_>, e: &Extent) -> &'a [u8] {
        let data = ctx.cmd.data_out;
        &data[..self.written_len(e, data.len())]
    }

    /// [`LogicalUnit::write_data`] as parts, whether the Data-Out came in
    /// parts or in one buffer: the last part cut where the written bytes
    /// end. A command has a few parts, held in place rather than allocated.
    fn write_data_parts<'a>(&self, ctx: &'a Ctx<'_>, e: &Extent) -> SmallVec<[&'a [u8]; 4]> {
        let one = [ctx.cmd.data_out];
        let received: &[&'a [u8]] = if ctx.cmd.data_out_parts.is_empty() {
            &one
        } else {
            ctx.cmd.data_out_parts
        };
        let mut left = self.written_len(e, ctx.cmd.data_out_total());
        let mut parts = SmallVec::new();
        for part in received {
            if left == 0 {
                break;
            }
            let take = part.len().min(left);
            parts.push(&part[..take]);
            left -= take;
        }
        parts
    }

    /// How many of `received` bytes a write of `e` writes: whole blocks,
    /// no more than the CDB asks for.
    fn written_len(&self, e: &Extent, received: usize) -> usize {
        let bs = u64::from(self.block_size);
        let want = (e.blocks * bs) as usize;
        let whole = (received as u64 / bs * bs) as usize;
        want.min(whole)
    }

    pub(crate) fn read(&self, ctx: &Ctx<'_>) -> Outcome {
        let e = extent(ctx.cdb());
        self.check_transfer(&e)?;
        if e.blocks == 0 {
            return Ok(ScsiResponse::good());
        }
        if let Some(response) = self.read_from_pages(ctx, e.lba, e.blocks)? {
            return Ok(response);
        }
        Ok(ScsiResponse::with_data(self.read_blocks(e.lba, e.blocks)?))
    }

    /// A READ answered with the pages of the device's file in memory, when
    /// the transport allows data read at send time (`zero_copy`):
    /// - the pages through the file's mapping, which the transport sends
    ///   with its other answers in one `writev`: no `pread` to copy and
    ///   look up each page first. Only pages known to exist qualify
    ///   (block::MemoryMap says why);
    /// - otherwise, from [`ZERO_COPY_READ`] on, a region of the file,
    ///   which the transport sends with `sendfile` (on loopback this cost
    ///   about twice the CPU per MiB of the mapping's `writev`,
    ///   docs/bench/techniques.md section 41);
    /// - the rest is read as usual.
    fn read_from_pages(
        &self,
        ctx: &Ctx<'_>,
        lba: u64,
        blocks: u64,
    ) -> Result<Option<ScsiResponse>, Sense> {
        if !ctx.cmd.zero_copy {
            return Ok(None);
        }
        let (offset, len) = (self.offset(lba), self.byte_len(blocks)?);
        if let Some(bytes) = self.device.mapped_bytes(offset, len) {
            return Ok(Some(ScsiResponse::with_held(HeldData::file_pages(
                Box::new(bytes),
            ))));
        }
        if len < ZERO_COPY_READ {
            return Ok(None);
        }
        Ok(self.device.memory_file().map(|file| ScsiResponse {
            data_in_file: Some(FileRegion {
                file: file.clone(),
                offset,
                len,
            }),
            ..ScsiResponse::default()
        }))
    }

    /// READs, all in flight on the device at once: each is accepted and
    /// checked as [`LogicalUnit::execute`] would, holds its range shared
    /// like [`LogicalUnit::read_blocks`], and one device batch reads them
    /// all; `done` gets each response as soon as its read has ended. A
    /// command that is not a READ runs alone, after the batch.
    pub(crate) fn read_batch(&self, ctxs: &[Ctx<'_>], done: &mut dyn FnMut(usize, ScsiResponse)) {
        // Planned reads: which command and the range it holds. Shared
        // holds only wait for exclusive holders, which never wait for us,
        // so holding several at once cannot deadlock.
        let mut planned = Vec::new();
        let mut reads = Vec::new();
        let mut later = Vec::new();
        for (i, ctx) in ctxs.iter().enumerate() {
            let command = match self.accept(ctx) {
                Ok(c) => c,
                Err(failure) => {
                    done(i, self.respond(ctx, Err(failure)));
                    continue;
                }
            };
            if !is_read(command.opcode) {
                // After the batch: it may want an exclusive hold on a
                // range the batch holds shared.
                later.push((i, command));
                continue;
            }
            let e = extent(ctx.cdb());
            match self.read_len(&e) {
                Err(sense) => done(i, self.respond(ctx, Err(sense.into()))),
                Ok(0) => done(i, self.respond(ctx, Ok(ScsiResponse::good()))),
                Ok(len) => {
                    let guard = self.locks.lock(e.lba, e.blocks, false);
                    planned.push((i, Some(guard)));
                    reads.push(BatchRead::new(
                        scsi_api::buffers::take(len),
                        self.offset(e.lba),
                    ));
                }
            }
        }
        self.device.read_batch(&mut reads, &mut |k, read| {
            let (i, guard) = &mut planned[k];
            drop(guard.take());
            let outcome = match std::mem::replace(&mut read.result, Ok(())) {
                Ok(()) => Ok(ScsiResponse::with_data(std::mem::take(&mut read.buf))),
                Err(e) => Err(io_sense(&e, false).into()),
            };
            done(*i, self.respond(&ctxs[*i], outcome));
        });
        drop(planned);
        for (i, command) in later {
            done(i, self.respond(&ctxs[i], self.dispatch(&ctxs[i], command)));
        }
    }

    pub(crate) fn write(&self, ctx: &Ctx<'_>) -> Outcome {
        let cdb = ctx.cdb();
        let e = extent(cdb);
        self.check_transfer(&e)?;
        self.check_writable(ctx)?;
        let parts = self.write_data_parts(ctx, &e);
        if !parts.is_empty() {
            self.write_blocks_parts(e.lba, &parts, fua_of(cdb))?;
        }
        Ok(ScsiResponse::good())
    }

    pub(crate) fn verify(&self, ctx: &Ctx<'_>) -> Outcome {
        let cdb = ctx.cdb();
        let bytchk = (u8_at(cdb, 1) >> 1) & 0x03;
        if bytchk == 2 {
            return Err(Sense::invalid_cdb(1, Some(2)).into());
        }
        let e = extent(cdb);
        self.check_transfer(&e)?;
        if e.blocks == 0 {
            return Ok(ScsiResponse::good());
        }
        let medium = self.read_blocks(e.lba, e.blocks)?;
        let bs = self.block_size as usize;
        match bytchk {
            // Medium verification: the blocks could be read.
            0 => {}
            1 => {
                let data = ctx.cmd.data_out;
                if data.len() < medium.len() {
                    return Err(Sense::illegal(asc::INVALID_FIELD_IN_INFORMATION_UNIT).into());
                }
                if let Some(at) = first_difference(&medium, data) {
                    return Err(Sense::miscompare(at as u64).into());
                }
            }
            _ => {
                let Some(block) = ctx.cmd.data_out.get(..bs) else {
                    return Err(Sense::illegal(asc::INVALID_FIELD_IN_INFORMATION_UNIT).into());
                };
                for (i, chunk) in medium.chunks(bs).enumerate() {
                    if let Some(at) = first_difference(chunk, block) {
                        return Err(Sense::miscompare((i * bs + at) as u64).into());
                    }
                }
            }
        }
        Ok(ScsiResponse::good())
    }

    pub(crate) fn write_and_verify(&self, ctx: &Ctx<'_>) -> Outcome {
        let cdb = ctx.cdb();
        let bytchk = (u8_at(cdb, 1) >> 1) & 0x03;
        if bytchk > 1 {
            return Err(Sense::invalid_cdb(1, Some(2)).into());
        }
        let e = extent(cdb);
        self.check_transfer(&e)?;
        self.check_writable(ctx)?;
        let data = self.write_data(ctx, &e);
        if data.is_empty() {
            return Ok(ScsiResponse::good());
        }
        // Verification is only meaningful against stable storage.
        self.write_blocks(e.lba, data, true)?;
        let blocks = data.len() as u64 / u64::from(self.block_size);
        let medium = self.read_blocks(e.lba, blocks)?;
        if bytchk == 1 {
            if let Some(at) = first_difference(&medium, data) {
                return Err(Sense::miscompare(at as u64).into());
            }
        }
        Ok(ScsiResponse::good())
    }

    pub(crate) fn orwrite(&self, ctx: &Ctx<'_>) -> Outcome {
        let cdb = ctx.cdb();
        let e = extent(cdb);
        self.check_transfer(&e)?;
        self.check_writable(ctx)?;
        let data = self.write_data(ctx, &e);
        if data.is_empty() {
            return Ok(ScsiResponse::good());
        }
        let blocks = data.len() as u64 / u64::from(self.block_size);
        // Read, OR, write as one operation: nothing may touch the range
        // in between.
        let _guard = self.locks.lock(e.lba, blocks, true);
        let mut buf = vec![0u8; data.len()];
        self.read_locked(&mut buf, e.lba)?;
        for (b, d) in buf.iter_mut().zip(data) {
            *b |= d;
        }
        self.write_locked(&buf, e.lba, fua_of(cdb))?;
        Ok(ScsiResponse::good())
    }

    pub(crate) fn compare_and_write(&self, ctx: &Ctx<'_>) -> Outcome {
        let cdb = ctx.cdb();
        let e = extent(cdb);
        if e.blocks > MAX_COMPARE_AND_WRITE_BLOCKS {
            return Err(Sense::invalid_cdb(13, None).into());
        }
        // The Data-Out must be exactly the compare and the write data; any
        // other amount means the CDB and the transfer disagree.
        let len = (2 * e.blocks * u64::from(self.block_size)) as usize;
        if ctx.cmd.data_out_len as usize != len || ctx.cmd.data_out.len() < len {
            return Err(Sense::invalid_cdb(13, None).into());
        }
        self.check_range(e.lba, e.blocks)?;
        self.check_writable(ctx)?;
        if e.blocks == 0 {
            return Ok(ScsiResponse::good());
        }
        let (expect, new) = ctx.cmd.data_out[..len].split_at(len / 2);
        let _guard = self.locks.lock(e.lba, e.blocks, true);
        let mut current = vec![0u8; expect.len()];
        self.read_locked(&mut current, e.lba)?;
        if let Some(at) = first_difference(&current, expect) {
            return Err(Sense::miscompare(at as u64).into());
        }
        self.write_locked(new, e.lba, fua_of(cdb))?;
        Ok(ScsiResponse::good())
    }

    pub(crate) fn pre_fetch(&self, ctx: &Ctx<'_>) -> Outcome {
        let cdb = ctx.cdb();
        let e = extent(cdb);
        self.check_range(e.lba, e.blocks)?;
        let immed = u8_at(cdb, 1) & 0x02 != 0;
        // A device that never blocks keeps every block in memory: the
        // blocks are as good as in cache (CONDITION MET). Otherwise there
        // is no cache of ours to fill.
        if !immed && !self.caps.may_block {
            return Ok(ScsiResponse::status(status::CONDITION_MET));
        }
        Ok(ScsiResponse::good())
    }

    pub(crate) fn synchronize_cache(&self, ctx: &Ctx<'_>) -> Outcome {
        let e = extent(ctx.cdb());
        self.check_range(e.lba, e.blocks)?;
        self.device.flush().map_err(|err| io_sense(&err, true))?;
        Ok(ScsiResponse::good())
    }
}

#[cfg(test)]
mod tests;
