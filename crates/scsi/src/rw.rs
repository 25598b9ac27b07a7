//! Medium access: READ, WRITE, VERIFY, WRITE AND VERIFY, ORWRITE,
//! COMPARE AND WRITE, PRE-FETCH, SYNCHRONIZE CACHE (WRITE ATOMIC: atomic.rs).

use block::BatchRead;
use scsi_api::{status, FileRegion, HeldData, ScsiResponse};
use smallvec::SmallVec;

use crate::cdb::{be16, be24, be32, be64, u8_at};
use crate::commands::op;
use crate::lu::{io_sense, Ctx, LogicalUnit, Outcome, MAX_COMPARE_AND_WRITE_BLOCKS};
use crate::sense::{asc, Sense};

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
mod tests {
    use super::*;
    use crate::lu::test_support::*;
    use crate::sense::key;

    /// A RAM disk that says it reads in batches and ends each batch's
    /// reads last to first, as a device may.
    struct Reversing;

    impl block::Wrapper for Reversing {
        fn reads_in_batches(&self, _: &dyn block::BlockDevice) -> bool {
            true
        }
        fn read_batch(
            &self,
            child: &dyn block::BlockDevice,
            reads: &mut [BatchRead],
            done: &mut dyn FnMut(usize, &mut BatchRead),
        ) {
            for (i, r) in reads.iter_mut().enumerate().rev() {
                r.result = child.read_at(&mut r.buf, r.offset);
                done(i, r);
            }
        }
        fn describe(&self, _: &dyn block::BlockDevice) -> String {
            "reversing".into()
        }
    }

    #[test]
    fn writes_in_parts_write_whole_blocks_as_one_piece_would() {
        let lu = lu();
        let n = nexus("a");
        ready(&lu, &n);
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 % 253) as u8).collect();
        let registry = crate::registry::LuRegistry::new();
        registry.add(lu.clone());
        let mut cdb = rw10(op::WRITE_10, 0, 10, 8);
        cdb.resize(16, 0);
        // 3000 bytes for 8 blocks: the five whole blocks are written, the
        // part of the sixth is not.
        let parts: [&[u8]; 3] = [&data[..700], &data[700..2600], &data[2600..]];
        let cmd = scsi_api::ScsiCommand {
            lun: 0,
            cdb: &cdb,
            data_out: &[],
            data_out_parts: &parts,
            data_in_len: 0,
            data_out_len: 4096,
            task_attr: scsi_api::TaskAttr::Simple,
            tag: 1,
            zero_copy: false,
        };
        let r = lu.execute(&Ctx {
            nexus: &n,
            cmd: &cmd,
            registry: &registry,
            read_only: false,
            protected: &[],
        });
        assert_eq!(r.status, 0);
        let back = run(&lu, &n, &rw10(op::READ_10, 0, 10, 6), &[]);
        assert_eq!(back.data_in[..2560], data[..2560]);
        assert!(
            back.data_in[2560..].iter().all(|&b| b == 0),
            "no partial block"
        );
    }

    #[test]
    fn reads_of_a_memory_file_are_its_pages_or_regions_of_it() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("lun.img");
        let opts = block::FileOptions {
            create_size: Some(1 << 20),
            ..Default::default()
        };
        let device = block::FileDevice::open(&path, opts).unwrap();
        assert!(
            block::BlockDevice::memory_file(&device).is_some(),
            "/dev/shm is tmpfs"
        );
        // Mapped now, so that the writes below mark their pages.
        assert!(block::BlockDevice::memory_map(&device).is_some());
        let lu = LogicalUnit::new(
            std::sync::Arc::new(device),
            crate::config::LuConfig::default(),
        )
        .unwrap();
        let n = nexus("a");
        ready(&lu, &n);
        let data: Vec<u8> = (0..64u32 << 10).map(|i| (i * 7 % 253) as u8).collect();
        assert_eq!(
            run(&lu, &n, &rw10(op::WRITE_10, 0, 3, 128), &data).status,
            0
        );

        let long = run_zero_copy(&lu, &n, &rw10(op::READ_10, 0, 3, 128));
        assert_eq!(long.status, 0);
        assert!(long.data_in.is_empty() && long.data_in_file.is_none());
        let pages = long.data_in_held.as_ref().expect("pages of the file");
        assert!(pages.file_pages);
        assert_eq!(pages.as_ref(), &data[..]);

        let short = run_zero_copy(&lu, &n, &rw10(op::READ_10, 0, 3, 8));
        assert!(short.data_in_file.is_none(), "short reads are mapped pages");
        let pages = short.data_in_held.as_ref().expect("pages of the file");
        assert!(pages.file_pages);
        assert_eq!(pages.as_ref(), &data[..4096]);
        let blocks = || std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&path).unwrap());
        let before = blocks();
        let hole = run_zero_copy(&lu, &n, &rw10(op::READ_10, 0, 1000, 8));
        assert!(hole.data_in_held.is_none(), "holes are read, not mapped");
        assert_eq!(hole.data_in, vec![0; 4096]);
        // A long READ of pages not known to exist: a region of the file.
        let gap = run_zero_copy(&lu, &n, &rw10(op::READ_10, 0, 1000, 128));
        let region = gap.data_in_file.expect("a region of the file");
        assert_eq!((region.offset, region.len), (1000 * 512, 64 << 10));
        assert_eq!(region.read().unwrap(), vec![0; 64 << 10]);
        assert_eq!(blocks(), before, "reading a hole allocates nothing");
        let copied = run(&lu, &n, &rw10(op::READ_10, 0, 3, 8), &[]);
        assert!(
            copied.data_in_held.is_none(),
            "only where the transport can"
        );
        let unasked = run(&lu, &n, &rw10(op::READ_10, 0, 3, 128), &[]);
        assert!(
            unasked.data_in_file.is_none(),
            "only where the transport can"
        );
        assert_eq!(unasked.data_in, data);
        let beyond = run_zero_copy(&lu, &n, &rw10(op::READ_10, 0, 2000, 128));
        assert!(beyond.data_in_file.is_none());
        assert_eq!(sense_of(&beyond).0, key::ILLEGAL_REQUEST);
    }

    #[test]
    fn batched_reads_answer_as_single_commands_do() {
        let config = || crate::config::LuConfig {
            naa: crate::config::naa_from_seed("batch"),
            ..Default::default()
        };
        let alone = lu_with(1 << 20, config());
        let batched = LogicalUnit::new(
            std::sync::Arc::new(block::Wrapped::over(
                std::sync::Arc::new(block::MemDevice::new(1 << 20)),
                Reversing,
            )),
            config(),
        )
        .unwrap();
        assert!(batched.reads_in_batches());
        let n = nexus("a");
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 13 % 251) as u8).collect();
        for lu in [&alone, &batched] {
            ready(lu, &n);
            assert_eq!(run(lu, &n, &rw10(op::WRITE_10, 0, 4, 16), &data).status, 0);
        }
        let mut read16 = vec![op::READ_16, 0];
        read16.extend_from_slice(&2000u64.to_be_bytes());
        read16.extend_from_slice(&[0, 0, 0, 100, 0, 0]);
        let cdbs: Vec<Vec<u8>> = vec![
            rw10(op::READ_10, 0, 4, 16),
            read16,                          // beyond the end
            vec![0; 6],                      // TEST UNIT READY
            rw10(op::READ_10, 0, 8, 0),      // no blocks
            vec![op::READ_6, 0, 0, 6, 2, 0], // 6-byte form
            rw10(op::READ_10, 0, 7, 1),
        ];
        let registry = crate::registry::LuRegistry::new();
        let padded: Vec<Vec<u8>> = cdbs
            .iter()
            .map(|c| {
                let mut c = c.clone();
                c.resize(16, 0);
                c
            })
            .collect();
        let cmds: Vec<scsi_api::ScsiCommand<'_>> = padded
            .iter()
            .map(|cdb| scsi_api::ScsiCommand {
                lun: 0,
                cdb,
                data_out: &[],
                data_in_len: 1 << 24,
                data_out_len: 0,
                task_attr: scsi_api::TaskAttr::Simple,
                tag: 1,
                zero_copy: false,
                data_out_parts: &[],
            })
            .collect();
        let ctxs: Vec<Ctx<'_>> = cmds
            .iter()
            .map(|cmd| Ctx {
                nexus: &n,
                cmd,
                registry: &registry,
                read_only: false,
                protected: &[],
            })
            .collect();
        let mut answers: Vec<Option<ScsiResponse>> = (0..cdbs.len()).map(|_| None).collect();
        batched.read_batch(&ctxs, &mut |i, r| {
            assert!(
                answers[i].replace(r).is_none(),
                "command {i} answered twice"
            );
        });
        for (i, cdb) in cdbs.iter().enumerate() {
            let want = run(&alone, &n, cdb, &[]);
            let got = answers[i].take().expect("every command is answered");
            assert_eq!(
                (got.status, &got.sense, &got.data_in),
                (want.status, &want.sense, &want.data_in),
                "command {i}: {cdb:02x?}"
            );
        }
    }

    fn rw16(opcode: u8, flags: u8, lba: u64, blocks: u32) -> Vec<u8> {
        let mut c = vec![opcode, flags];
        c.extend_from_slice(&lba.to_be_bytes());
        c.extend_from_slice(&blocks.to_be_bytes());
        c.extend_from_slice(&[0, 0]);
        c
    }

    #[test]
    fn write_then_read_back() {
        let lu = lu();
        let a = nexus("a");
        ready(&lu, &a);
        let data = vec![0xA5u8; 1024];
        let r = run(&lu, &a, &rw10(op::WRITE_10, 0x08, 3, 2), &data);
        assert_eq!(r.status, status::GOOD);
        assert_eq!(r.data_out_wanted, Some(1024));
        let r = run(&lu, &a, &rw16(op::READ_16, 0, 3, 2), &[]);
        assert_eq!(r.data_in, data);
        let r = run(&lu, &a, &[op::READ_6, 0, 0, 3, 1, 0], &[]);
        assert_eq!(r.data_in, vec![0xA5u8; 512]);
    }

    #[test]
    fn out_of_range_and_zero_length() {
        let lu = lu();
        let a = nexus("a");
        ready(&lu, &a);
        let blocks = lu.blocks();
        let oob = (key::ILLEGAL_REQUEST, 0x21, 0);
        assert_eq!(
            sense_of(&run(&lu, &a, &rw16(op::READ_16, 0, blocks - 1, 2), &[])),
            oob
        );
        assert_eq!(
            sense_of(&run(&lu, &a, &rw16(op::READ_16, 0, u64::MAX, 1), &[])),
            oob
        );
        assert_eq!(
            sense_of(&run(&lu, &a, &rw16(op::READ_16, 0, blocks + 1, 0), &[])),
            oob
        );
        assert_eq!(
            run(&lu, &a, &rw16(op::READ_16, 0, blocks, 0), &[]).status,
            status::GOOD
        );
        assert_eq!(
            run(&lu, &a, &rw16(op::READ_16, 0, blocks - 1, 1), &[]).status,
            status::GOOD
        );
        // LBA so large that the byte offset would overflow.
        assert_eq!(
            sense_of(&run(&lu, &a, &rw16(op::READ_16, 0, 1 << 55, 1), &[])),
            oob
        );
    }

    #[test]
    fn protection_fields_are_rejected() {
        let lu = lu();
        let a = nexus("a");
        ready(&lu, &a);
        for p in 1..8u8 {
            let r = run(&lu, &a, &rw10(op::WRITE_10, p << 5, 0, 1), &[0; 512]);
            assert_eq!(sense_of(&r), (key::ILLEGAL_REQUEST, 0x24, 0));
        }
    }

    #[test]
    fn short_data_writes_whole_blocks_only() {
        let lu = lu();
        let a = nexus("a");
        ready(&lu, &a);
        run(&lu, &a, &rw10(op::WRITE_10, 0, 0, 2), &[b'a'; 1024]);
        // Two blocks announced, one sent: only the first is written.
        let r = run(&lu, &a, &rw10(op::WRITE_10, 0, 0, 2), &[b'b'; 512]);
        assert_eq!(r.status, status::GOOD);
        assert_eq!(r.data_out_wanted, Some(1024));
        let back = run(&lu, &a, &rw10(op::READ_10, 0, 0, 2), &[]).data_in;
        assert!(back[..512].iter().all(|&b| b == b'b') && back[512..].iter().all(|&b| b == b'a'));
        // Part of a block is not written.
        let r = run(&lu, &a, &rw10(op::WRITE_10, 0, 0, 1), &[0; 200]);
        assert_eq!(r.status, status::GOOD);
        let back = run(&lu, &a, &rw10(op::READ_10, 0, 0, 1), &[]).data_in;
        assert!(back.iter().all(|&b| b == b'b'));
        // Nothing sent at all: nothing written, GOOD.
        assert_eq!(
            run(&lu, &a, &rw10(op::WRITE_10, 0, 0, 1), &[]).status,
            status::GOOD
        );
    }

    #[test]
    fn verify_compares_and_reports_offset() {
        let lu = lu();
        let a = nexus("a");
        ready(&lu, &a);
        run(&lu, &a, &rw10(op::WRITE_10, 0, 8, 2), &[7; 1024]);
        assert_eq!(
            run(&lu, &a, &rw10(op::VERIFY_10, 0x02, 8, 2), &[7; 1024]).status,
            status::GOOD
        );
        let mut bad = vec![7u8; 1024];
        bad[700] = 0;
        let r = run(&lu, &a, &rw10(op::VERIFY_10, 0x02, 8, 2), &bad);
        assert_eq!(sense_of(&r), (key::MISCOMPARE, 0x1D, 0));
        assert_eq!(&r.sense[3..7], &700u32.to_be_bytes());
        // BYTCHK 0: medium verification only.
        assert_eq!(
            run(&lu, &a, &rw10(op::VERIFY_10, 0, 8, 2), &[]).status,
            status::GOOD
        );
        // BYTCHK 11b: one block against every block.
        assert_eq!(
            run(&lu, &a, &rw10(op::VERIFY_10, 0x06, 8, 2), &[7; 512]).status,
            status::GOOD
        );
        assert_eq!(
            sense_of(&run(&lu, &a, &rw10(op::VERIFY_10, 0x04, 8, 2), &[])).2,
            0
        );
    }

    #[test]
    fn compare_and_write() {
        let lu = lu();
        let a = nexus("a");
        ready(&lu, &a);
        let mut caw = rw16(op::COMPARE_AND_WRITE, 0, 5, 0);
        caw[13] = 1;
        caw[10..13].fill(0);
        let mut data = vec![0u8; 512];
        data.extend_from_slice(&[9u8; 512]);
        assert_eq!(run(&lu, &a, &caw, &data).status, status::GOOD);
        // Now the block holds 9s: comparing against zeros fails at byte 0.
        let r = run(&lu, &a, &caw, &data);
        assert_eq!(sense_of(&r), (key::MISCOMPARE, 0x1D, 0));
        assert_eq!(&r.sense[3..7], &[0, 0, 0, 0]);
        assert_eq!(
            run(&lu, &a, &rw10(op::READ_10, 0, 5, 1), &[]).data_in,
            vec![9u8; 512]
        );
        // Data-Out of the wrong size is refused.
        let r = run(&lu, &a, &caw, &data[..512]);
        assert_eq!(sense_of(&r).0, key::ILLEGAL_REQUEST);
        caw[13] = 0;
        let r = run(&lu, &a, &caw, &data);
        assert_eq!(sense_of(&r), (key::ILLEGAL_REQUEST, 0x24, 0));
    }

    #[test]
    fn compare_and_write_is_atomic_across_nexuses() {
        // Two initiators increment a counter in block 9 with
        // read / COMPARE AND WRITE retry loops; no increment may be lost.
        let lu = lu();
        let rounds = 200u32;
        let workers: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|name| {
                let lu = lu.clone();
                std::thread::spawn(move || {
                    let n = nexus(name);
                    ready(&lu, &n);
                    let mut caw = rw16(op::COMPARE_AND_WRITE, 0, 9, 0);
                    caw[10..13].fill(0);
                    caw[13] = 1;
                    let mut done = 0;
                    while done < rounds {
                        let cur = run(&lu, &n, &rw10(op::READ_10, 0, 9, 1), &[]).data_in;
                        let value = u32::from_be_bytes([cur[0], cur[1], cur[2], cur[3]]);
                        let mut data = cur.clone();
                        data.extend_from_slice(&cur);
                        data[512..516].copy_from_slice(&(value + 1).to_be_bytes());
                        if run(&lu, &n, &caw, &data).status == status::GOOD {
                            done += 1;
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        let a = nexus("a");
        let cur = run(&lu, &a, &rw10(op::READ_10, 0, 9, 1), &[]).data_in;
        assert_eq!(
            u32::from_be_bytes([cur[0], cur[1], cur[2], cur[3]]),
            2 * rounds
        );
    }

    #[test]
    fn orwrite_ors_into_the_medium() {
        let lu = lu();
        let a = nexus("a");
        ready(&lu, &a);
        run(&lu, &a, &rw10(op::WRITE_10, 0, 0, 1), &[0x0F; 512]);
        assert_eq!(
            run(&lu, &a, &rw16(op::ORWRITE_16, 0, 0, 1), &[0xF0; 512]).status,
            status::GOOD
        );
        assert_eq!(
            run(&lu, &a, &rw10(op::READ_10, 0, 0, 1), &[]).data_in,
            vec![0xFF; 512]
        );
    }

    #[test]
    fn prefetch_and_sync_check_range() {
        let lu = lu();
        let a = nexus("a");
        ready(&lu, &a);
        let r = run(&lu, &a, &rw10(op::PRE_FETCH_10, 0, 0, 8), &[]);
        assert_eq!(r.status, status::CONDITION_MET);
        assert_eq!(
            run(&lu, &a, &rw10(op::PRE_FETCH_10, 0x02, 0, 8), &[]).status,
            status::GOOD
        );
        let blocks = lu.blocks() as u32;
        assert_eq!(
            sense_of(&run(&lu, &a, &rw10(op::PRE_FETCH_10, 0, blocks, 1), &[])).1,
            0x21
        );
        assert_eq!(
            run(&lu, &a, &rw10(op::SYNCHRONIZE_CACHE_10, 0, 0, 0), &[]).status,
            status::GOOD
        );
        assert_eq!(
            sense_of(&run(
                &lu,
                &a,
                &rw10(op::SYNCHRONIZE_CACHE_10, 0, blocks, 2),
                &[]
            ))
            .1,
            0x21
        );
    }
}
