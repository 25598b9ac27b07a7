//! READs whose device read the transport runs itself
//! ([`scsi_api::StartedRead`]): the command is accepted and checked here,
//! holds its range until it is finished, and its bytes go straight from
//! the transport's io_uring into an aligned buffer of the device's.

use std::io;
use std::sync::Arc;

use block::DirectRead;
use scsi_api::{HeldData, ReadStart, ScsiResponse, StartedRead};

use crate::lu::{Ctx, LogicalUnit, Outcome};
use crate::rw::extent;
use crate::sense::io_sense;

impl LogicalUnit {
    /// A READ of a device with [`block::BlockDevice::direct_read`], started
    /// for the transport; see [`scsi_api::ScsiTarget::start_read`].
    pub(crate) fn start_read(self: &Arc<Self>, ctx: &Ctx<'_>) -> ReadStart {
        let e = extent(ctx.cdb());
        // Taken before anything else, which may have effects (a unit
        // attention is reported once): declining must leave no trace.
        let Some(hold) = self.locks.try_lock(e.lba, e.blocks, false) else {
            return ReadStart::Declined;
        };
        let answer = |outcome: Outcome| ReadStart::Answered(self.respond(ctx, outcome));
        if let Err(failure) = self.accept(ctx) {
            return answer(Err(failure));
        }
        let len = match self.read_len(&e) {
            Ok(0) => return answer(Ok(ScsiResponse::good())),
            Ok(len) => len,
            Err(sense) => return answer(Err(sense.into())),
        };
        let read = match self.device.direct_read(self.offset(e.lba), len) {
            Some(Ok(read)) => read,
            Some(Err(err)) => return answer(Err(io_sense(&err, false).into())),
            // Only devices that read in batches get here, and those read
            // directly; another reads now, in place.
            None => {
                let data = self.read_blocks(e.lba, e.blocks);
                return answer(data.map(ScsiResponse::with_data).map_err(Into::into));
            }
        };
        ReadStart::Started(Box::new(LuRead {
            hold: Hold {
                lu: self.clone(),
                id: hold.detach(),
            },
            read,
        }))
    }
}

/// A started READ: the range it holds and the window its bytes land in.
struct LuRead {
    hold: Hold,
    read: DirectRead,
}

/// The shared hold on a READ's (or an asynchronous WRITE's) range, ended
/// on drop.
pub(crate) struct Hold {
    pub(crate) lu: Arc<LogicalUnit>,
    pub(crate) id: u64,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.lu.locks.release(self.id);
    }
}

/// A finished read's window, answered from as it is.
struct Window(DirectRead);

impl AsRef<[u8]> for Window {
    fn as_ref(&self) -> &[u8] {
        self.0.data()
    }
}

impl StartedRead for LuRead {
    fn fd(&self) -> std::os::fd::RawFd {
        self.read.fd
    }

    fn offset(&self) -> u64 {
        self.read.start
    }

    fn buf(&mut self) -> &mut [u8] {
        &mut self.read.window
    }

    fn finish(self: Box<Self>, got: io::Result<usize>) -> ScsiResponse {
        let LuRead { hold, read } = *self;
        let lu = &hold.lu;
        let outcome: Outcome = match got {
            Ok(n) if n == read.window.len() => Ok(ScsiResponse::with_held(HeldData::owned(
                Box::new(Window(read)),
            ))),
            // A short read (the kernel may stop early) is done again whole.
            Ok(_) => {
                let mut data = scsi_api::buffers::take(read.data().len());
                lu.device
                    .read_at(&mut data, read.offset())
                    .map(|()| ScsiResponse::with_data(data))
                    .map_err(|err| io_sense(&err, false).into())
            }
            Err(err) => Err(io_sense(&err, false).into()),
        };
        // A READ has no Data-Out, so no residual of it to report.
        lu.respond_wanting(outcome, None)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;
    use crate::config::LuConfig;
    use crate::lu::test_support::{command, ctx, nexus, ready, registry_of, run, rw10, sense_of};
    use crate::sense::key;

    fn read10(lba: u32, blocks: u16) -> Vec<u8> {
        let mut cdb = rw10(0x28, 0, lba, blocks);
        cdb.resize(16, 0);
        cdb
    }

    fn start(lu: &Arc<LogicalUnit>, n: &scsi_api::Nexus, cdb: &[u8]) -> ReadStart {
        let registry = registry_of(lu);
        lu.start_read(&ctx(n, &command(cdb, 1 << 24, 0), &registry))
    }

    /// Runs a started read as a transport with its own ring would.
    fn run_started(mut read: Box<dyn StartedRead>) -> ScsiResponse {
        let (fd, offset) = (read.fd(), read.offset());
        // SAFETY: `fd` is the device's open file; the buffer is ours.
        let file = std::mem::ManuallyDrop::new(unsafe {
            <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd)
        });
        let got = file.read_at(read.buf(), offset);
        read.finish(got)
    }

    /// A LU on a 1 MiB O_DIRECT file; `None` where the temporary
    /// directory has no O_DIRECT.
    fn direct_lu() -> Option<(tempfile::TempDir, Arc<LogicalUnit>)> {
        let dir = tempfile::tempdir().unwrap();
        let opts = block::FileOptions {
            create_size: Some(1 << 20),
            direct: true,
            ..Default::default()
        };
        let Ok(device) = block::FileDevice::open(&dir.path().join("d.img"), opts) else {
            eprintln!("no O_DIRECT in the temporary directory; skipped");
            return None;
        };
        let lu = LogicalUnit::new(Arc::new(device), LuConfig::default()).unwrap();
        Some((dir, lu))
    }

    #[test]
    fn started_reads_answer_as_executed_ones_do() {
        let Some((_dir, lu)) = direct_lu() else {
            return;
        };
        let n = nexus("a");
        ready(&lu, &n);
        let data: Vec<u8> = (0..16384u32).map(|i| (i * 7 % 253) as u8).collect();
        let mut write = read10(3, 32);
        write[0] = 0x2a;
        assert_eq!(run(&lu, &n, &write, &data).status, 0);

        // Misaligned within the file's alignment: the window is larger.
        let ReadStart::Started(read) = start(&lu, &n, &read10(5, 9)) else {
            panic!("a READ of a direct file starts");
        };
        assert_eq!(read.offset() % 512, 0);
        let r = run_started(read);
        assert_eq!(r.status, 0);
        let window = r.data_in_held.as_ref().expect("answered from the window");
        assert_eq!(window.as_ref(), run(&lu, &n, &read10(5, 9), &[]).data_in);
        assert_eq!(window.as_ref(), &data[1024..1024 + 9 * 512]);
        assert_eq!(r.data_in_len(), 9 * 512);

        // A short read is finished by reading again.
        let ReadStart::Started(read) = start(&lu, &n, &read10(3, 8)) else {
            panic!("a READ of a direct file starts");
        };
        assert_eq!(read.finish(Ok(512)).data_in, data[..4096]);

        // A failed read fails the command with a medium error.
        let ReadStart::Started(read) = start(&lu, &n, &read10(3, 8)) else {
            panic!("a READ of a direct file starts");
        };
        let eio = read.finish(Err(io::Error::from_raw_os_error(libc::EIO)));
        assert_eq!(sense_of(&eio).0, key::MEDIUM_ERROR);

        // Checks answer at once, with no read.
        let ReadStart::Answered(r) = start(&lu, &n, &read10(5000, 8)) else {
            panic!("a READ past the end is answered");
        };
        assert_eq!(sense_of(&r).0, key::ILLEGAL_REQUEST);
        let ReadStart::Answered(r) = start(&lu, &n, &read10(0, 0)) else {
            panic!("a READ of no blocks is answered");
        };
        assert_eq!((r.status, r.data_in.len()), (0, 0));
    }

    #[test]
    fn a_read_that_would_wait_is_declined_untouched() {
        let Some((_dir, lu)) = direct_lu() else {
            return;
        };
        let n = nexus("a");
        // The power-on unit attention is still pending.
        let held = lu.locks.lock(10, 1, true);
        assert!(matches!(start(&lu, &n, &read10(8, 8)), ReadStart::Declined));
        let ReadStart::Answered(r) = start(&lu, &n, &read10(0, 8)) else {
            panic!("a READ clear of the held range goes on");
        };
        assert_eq!(sense_of(&r).0, key::UNIT_ATTENTION, "reported once");
        drop(held);
        let ReadStart::Started(read) = start(&lu, &n, &read10(8, 8)) else {
            panic!("the range is free again");
        };
        // Holds its range until finished.
        assert!(lu.locks.try_lock(9, 1, true).is_none());
        assert_eq!(run_started(read).status, 0);
        assert!(lu.locks.try_lock(9, 1, true).is_some());
    }
}
