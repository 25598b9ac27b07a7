//! WRITEs whose data the transport puts in place as it arrives
//! ([`scsi_api::StartedWrite`]): the command is accepted and checked when
//! it starts, and its bytes go from the socket straight into the pages of
//! a file in memory (block::MemoryMap).
//!
//! No range is held while the data is on its way (an initiator may take
//! its time). Each piece holds its blocks shared while it is copied, as a
//! WRITE executed whole does for its copy, so a COMPARE AND WRITE, which
//! holds its blocks exclusively, still sees no other write between its
//! compare and its write.

use std::io;
use std::sync::Arc;

use block::MemoryMap;
use scsi_api::{Fill, ScsiResponse, StartedWrite, WriteStart};

use crate::cdb::u8_at;
use crate::commands::op;
use crate::lu::{Ctx, LogicalUnit, Outcome};
use crate::rw::{extent, fua_of};
use crate::sense::io_sense;
use crate::transfer;

impl LogicalUnit {
    /// A WRITE of a device with [`block::BlockDevice::memory_map`], started
    /// for the transport; see [`scsi_api::ScsiTarget::start_write`].
    pub(crate) fn start_write(self: &Arc<Self>, ctx: &Ctx<'_>) -> WriteStart {
        let cdb = ctx.cdb();
        if !matches!(u8_at(cdb, 0), op::WRITE_10 | op::WRITE_12 | op::WRITE_16)
            || self.device.memory_map().is_none()
        {
            return WriteStart::Declined;
        }
        let e = extent(cdb);
        // Only a transfer of exactly what the CDB asks for: any other has
        // residuals and partial blocks to work out, as `write` does.
        let len = e.blocks.checked_mul(u64::from(self.block_size));
        if e.blocks == 0 || len != Some(u64::from(ctx.cmd.data_out_len)) {
            return WriteStart::Declined;
        }
        let answer = |outcome: Outcome| WriteStart::Answered(self.respond(ctx, outcome));
        if let Err(failure) = self.accept(ctx) {
            return answer(Err(failure));
        }
        if let Err(sense) = self
            .check_transfer(&e)
            .and_then(|()| self.check_writable(ctx))
        {
            return answer(Err(sense.into()));
        }
        WriteStart::Started(Box::new(LuWrite {
            lu: self.clone(),
            lba: e.lba,
            len: ctx.cmd.data_out_len as usize,
            fua: fua_of(cdb),
            data_out_wanted: transfer::data_out_wanted(cdb, self.block_size),
        }))
    }
}

/// A started WRITE: where its bytes go and how it ends.
struct LuWrite {
    lu: Arc<LogicalUnit>,
    lba: u64,
    len: usize,
    fua: bool,
    data_out_wanted: Option<u32>,
}

impl LuWrite {
    fn map(&self) -> io::Result<&MemoryMap> {
        self.lu
            .device
            .memory_map()
            .ok_or_else(|| io::Error::other("device has no memory map"))
    }

    /// Holds the blocks that bytes `at..at + len` of the write touch,
    /// shared, for as long as `copy` runs.
    fn holding<T>(&self, at: usize, len: usize, copy: impl FnOnce(u64) -> T) -> io::Result<T> {
        let end = at
            .checked_add(len)
            .filter(|&end| end <= self.len)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "past the write's end"))?;
        let bs = u64::from(self.lu.block_size);
        let first = at as u64 / bs;
        let blocks = (end as u64).div_ceil(bs) - first;
        let _hold = self.lu.locks.lock(self.lba + first, blocks, false);
        Ok(copy(self.lu.offset(self.lba) + at as u64))
    }
}

impl StartedWrite for LuWrite {
    fn write(&self, at: usize, bytes: &[u8]) -> io::Result<()> {
        self.holding(at, bytes.len(), |offset| {
            self.lu.device.write_at(bytes, offset, false)
        })?
    }

    fn fill(&self, at: usize, len: usize, fill: &mut Fill<'_>) -> io::Result<usize> {
        let map = self.map()?;
        self.holding(at, len, |offset| map.fill(offset, len, fill))?
    }

    fn finish(self: Box<Self>, failed: Option<io::Error>) -> ScsiResponse {
        let outcome: Outcome = match failed {
            Some(err) => Err(io_sense(&err, true).into()),
            // Bytes copied into the pages are where a buffered write puts
            // them; what FUA or a disabled write cache ask for on top is
            // the flush such a write would have done.
            None if self.lu.force_unit_access(self.fua) => self
                .lu
                .device
                .flush()
                .map(|()| ScsiResponse::good())
                .map_err(|err| io_sense(&err, true).into()),
            None => Ok(ScsiResponse::good()),
        };
        self.lu.respond_wanting(outcome, self.data_out_wanted)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use scsi_api::status;

    use super::*;
    use crate::config::LuConfig;
    use crate::lu::test_support::{command, ctx, nexus, ready, registry_of, run, rw10, sense_of};
    use crate::sense::key;

    fn write10(lba: u32, blocks: u16) -> Vec<u8> {
        rw10(0x2a, 0, lba, blocks)
    }

    fn start(lu: &Arc<LogicalUnit>, n: &scsi_api::Nexus, cdb: &[u8], len: u32) -> WriteStart {
        let registry = registry_of(lu);
        lu.start_write(&ctx(n, &command(cdb, 0, len), &registry))
    }

    /// A LU on a 1 MiB file in /dev/shm (tmpfs), and that file.
    fn memory_lu() -> (tempfile::TempDir, Arc<LogicalUnit>, std::fs::File) {
        let dir = tempfile::tempdir_in("/dev/shm").expect("/dev/shm for a file in memory");
        let path = dir.path().join("m.img");
        let opts = block::FileOptions {
            create_size: Some(1 << 20),
            ..Default::default()
        };
        let device = block::FileDevice::open(&path, opts).unwrap();
        let lu = LogicalUnit::new(Arc::new(device), LuConfig::default()).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        (dir, lu, file)
    }

    /// Puts `data` in place the way a transport receiving it would: the
    /// first bytes from memory, the rest through a pipe into the mapping.
    fn place(write: &dyn StartedWrite, data: &[u8], head: usize) {
        write.write(0, &data[..head]).unwrap();
        let mut fds = [0; 2];
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let mut at = head;
        while at < data.len() {
            let n = (data.len() - at).min(4096);
            assert_eq!(
                unsafe { libc::write(fds[1], data[at..].as_ptr().cast(), n) },
                n as isize
            );
            let mut recv = |ptr: *mut u8, len: usize| {
                let got = unsafe { libc::read(fds[0], ptr.cast(), len.min(n)) };
                Ok(got as usize)
            };
            at += write.fill(at, data.len() - at, &mut recv).unwrap();
        }
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }

    #[test]
    fn started_writes_land_where_executed_ones_do() {
        let (_dir, lu, file) = memory_lu();
        let n = nexus("a");
        ready(&lu, &n);
        let data: Vec<u8> = (0..40 * 512u32).map(|i| (i * 13 % 251) as u8).collect();
        let WriteStart::Started(write) = start(&lu, &n, &write10(7, 40), data.len() as u32) else {
            panic!("a WRITE of a file in memory starts");
        };
        place(&*write, &data, 1000);
        assert!(
            write.write(data.len() - 10, &[0; 11]).is_err(),
            "past its end"
        );
        let r = write.finish(None);
        assert_eq!(r.status, status::GOOD);
        assert_eq!(r.data_out_wanted, Some(data.len() as u32));
        let mut back = vec![0; data.len()];
        file.read_exact_at(&mut back, 7 * 512).unwrap();
        assert_eq!(back, data);
        let read = run(&lu, &n, &[0x28, 0, 0, 0, 0, 7, 0, 0, 40, 0], &[]);
        assert_eq!(read.data_in, data);
    }

    #[test]
    fn checks_answer_and_odd_transfers_decline() {
        let (_dir, lu, _file) = memory_lu();
        let n = nexus("a");
        // The unit attention of a new nexus is this WRITE's answer.
        let WriteStart::Answered(r) = start(&lu, &n, &write10(0, 8), 4096) else {
            panic!("a pending unit attention answers");
        };
        assert_eq!(sense_of(&r).0, key::UNIT_ATTENTION);
        let WriteStart::Answered(r) = start(&lu, &n, &write10(2047, 2), 1024) else {
            panic!("past the end answers");
        };
        assert_eq!(sense_of(&r).0, key::ILLEGAL_REQUEST);
        for (cdb, len) in [
            (write10(0, 8), 4096 - 512),
            (write10(0, 0), 0),
            (vec![0x0a, 0, 0, 0, 8, 0], 4096),
        ] {
            assert!(
                matches!(start(&lu, &n, &cdb, len), WriteStart::Declined),
                "{cdb:02x?} {len}"
            );
        }
        let failed = match start(&lu, &n, &write10(0, 8), 4096) {
            WriteStart::Started(w) => w.finish(Some(io::ErrorKind::StorageFull.into())),
            _ => panic!("starts"),
        };
        assert_eq!(sense_of(&failed).0, key::DATA_PROTECT);
    }

    #[test]
    fn files_on_disk_decline() {
        let dir = tempfile::tempdir().unwrap();
        let opts = block::FileOptions {
            create_size: Some(1 << 20),
            ..Default::default()
        };
        let device = block::FileDevice::open(&dir.path().join("d.img"), opts).unwrap();
        if block::on_memory_file_system(dir.path()) {
            return;
        }
        let lu = LogicalUnit::new(Arc::new(device), LuConfig::default()).unwrap();
        let n = nexus("a");
        ready(&lu, &n);
        assert!(matches!(
            start(&lu, &n, &write10(0, 8), 4096),
            WriteStart::Declined
        ));
    }
}
