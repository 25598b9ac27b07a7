//! READs and WRITEs of a device that ends requests on threads of its own
//! ([`block::BlockDevice::completes_async`], an RBD image): the command is
//! accepted and checked on the transport's thread, the device request is
//! put in flight, and the response is made where the device ends it
//! ([`scsi_api::ScsiTarget::start_async`]). No thread waits for each
//! request, so an initiator's queue depth reaches the device whole.
//!
//! Only the plain commands go this way: READ and WRITE (10, 12, 16) of
//! whole blocks, Data-Out exactly what the CDB asks for. Everything else
//! (residuals, VERIFY, COMPARE AND WRITE, ...) is declined and executed as
//! usual.

use std::sync::Arc;

use scsi_api::{Answer, ScsiResponse};

use crate::cdb::u8_at;
use crate::commands::op;
use crate::lu::{Ctx, LogicalUnit, Outcome};
use crate::rw::{extent, fua_of};
use crate::sense::io_sense;
use crate::started_read::Hold;
use crate::transfer;

impl LogicalUnit {
    /// See [`scsi_api::ScsiTarget::start_async`].
    pub(crate) fn start_async(
        self: &Arc<Self>,
        ctx: &Ctx<'_>,
        answer: Answer,
    ) -> Result<(), Answer> {
        if !self.device.completes_async() {
            return Err(answer);
        }
        match u8_at(ctx.cdb(), 0) {
            op::READ_10 | op::READ_12 | op::READ_16 => self.start_async_read(ctx, answer),
            op::WRITE_10 | op::WRITE_12 | op::WRITE_16 => self.start_async_write(ctx, answer),
            _ => Err(answer),
        }
    }

    fn start_async_read(self: &Arc<Self>, ctx: &Ctx<'_>, answer: Answer) -> Result<(), Answer> {
        let e = extent(ctx.cdb());
        // Taken before anything with effects (a unit attention is
        // reported once): declining must leave no trace.
        let Some(hold) = self.locks.try_lock(e.lba, e.blocks, false) else {
            return Err(answer);
        };
        if let Err(failure) = self.accept(ctx) {
            answer(self.respond(ctx, Err(failure)));
            return Ok(());
        }
        let len = match self.read_len(&e) {
            Ok(0) => {
                answer(self.respond(ctx, Ok(ScsiResponse::good())));
                return Ok(());
            }
            Ok(len) => len,
            Err(sense) => {
                answer(self.respond(ctx, Err(sense.into())));
                return Ok(());
            }
        };
        let hold = Hold {
            lu: self.clone(),
            id: hold.detach(),
        };
        self.device.read_async(
            self.offset(e.lba),
            len,
            Box::new(move |read| {
                let lu = hold.lu.clone();
                // The range is free again before the answer goes out.
                drop(hold);
                let outcome: Outcome = read
                    .map(ScsiResponse::with_data)
                    .map_err(|err| io_sense(&err, false).into());
                // A READ has no Data-Out, so no residual of it to report.
                answer(lu.respond_wanting(outcome, None));
            }),
        );
        Ok(())
    }

    fn start_async_write(self: &Arc<Self>, ctx: &Ctx<'_>, answer: Answer) -> Result<(), Answer> {
        let cdb = ctx.cdb();
        let e = extent(cdb);
        // Only a transfer of exactly what the CDB asks for, all of it here:
        // any other has residuals and partial blocks to work out, as
        // `write` does.
        let len = e.blocks.checked_mul(u64::from(self.block_size));
        let want = u64::from(ctx.cmd.data_out_len);
        if e.blocks == 0 || len != Some(want) || ctx.cmd.data_out_total() as u64 != want {
            return Err(answer);
        }
        let Some(hold) = self.locks.try_lock(e.lba, e.blocks, false) else {
            return Err(answer);
        };
        if let Err(failure) = self.accept(ctx) {
            answer(self.respond(ctx, Err(failure)));
            return Ok(());
        }
        if let Err(sense) = self
            .check_transfer(&e)
            .and_then(|()| self.check_writable(ctx))
        {
            answer(self.respond(ctx, Err(sense.into())));
            return Ok(());
        }
        let data = if ctx.cmd.data_out_parts.is_empty() {
            ctx.cmd.data_out.to_vec()
        } else {
            ctx.cmd.data_out_parts.concat()
        };
        let wanted = transfer::data_out_wanted(cdb, self.block_size);
        let hold = Hold {
            lu: self.clone(),
            id: hold.detach(),
        };
        self.device.write_async(
            data,
            self.offset(e.lba),
            self.force_unit_access(fua_of(cdb)),
            Box::new(move |written| {
                let lu = hold.lu.clone();
                drop(hold);
                let outcome: Outcome = written
                    .map(|()| ScsiResponse::good())
                    .map_err(|err| io_sense(&err, true).into());
                answer(lu.respond_wanting(outcome, wanted));
            }),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::mpsc;

    use block::{BlockDevice, Capabilities, Done, MemDevice};

    use super::*;
    use crate::config::LuConfig;
    use crate::lu::test_support::{command, ctx, nexus, ready, registry_of, run, rw10, sense_of};
    use crate::sense::key;

    /// A RAM device that answers its asynchronous requests on a thread of
    /// its own, as librbd does.
    struct Answering(MemDevice);

    impl BlockDevice for Answering {
        fn size(&self) -> u64 {
            self.0.size()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            self.0.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
            self.0.write_at(buf, offset, fua)
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities {
                may_block: true,
                ..self.0.capabilities()
            }
        }
        fn describe(&self) -> String {
            "answering".into()
        }
        fn completes_async(&self) -> bool {
            true
        }
        fn read_async(&self, offset: u64, len: usize, done: Done<Vec<u8>>) {
            let mut buf = vec![0; len];
            let read = self.0.read_at(&mut buf, offset).map(|()| buf);
            std::thread::spawn(move || done(read));
        }
        fn write_async(&self, data: Vec<u8>, offset: u64, fua: bool, done: Done<()>) {
            let written = self.0.write_at(&data, offset, fua);
            std::thread::spawn(move || done(written));
        }
    }

    fn start(lu: &Arc<LogicalUnit>, cdb: &[u8], data: &[u8], read: u32) -> Option<ScsiResponse> {
        let n = nexus("i");
        let registry = registry_of(lu);
        let mut cmd = command(cdb, read, data.len() as u32);
        cmd.data_out = data;
        let (tx, rx) = mpsc::channel();
        let answer: Answer = Box::new(move |r| tx.send(r).unwrap());
        lu.start_async(&ctx(&n, &cmd, &registry), answer).ok()?;
        Some(rx.recv().unwrap())
    }

    #[test]
    fn reads_and_writes_are_answered_where_the_device_ends_them() {
        let lu = LogicalUnit::new(
            Arc::new(Answering(MemDevice::new(1 << 20))),
            LuConfig {
                naa: crate::config::naa_from_seed("answering"),
                ..LuConfig::default()
            },
        )
        .unwrap();
        ready(&lu, &nexus("i"));
        let data = vec![0x5A; 4096];
        let w = start(&lu, &rw10(0x2A, 0, 16, 8), &data, 0).expect("taken");
        assert_eq!(w.status, 0);
        let r = start(&lu, &rw10(0x28, 0, 16, 8), &[], 4096).expect("taken");
        assert_eq!((r.status, r.data_in_len()), (0, 4096));
        // What the asynchronous write wrote, a synchronous READ sees.
        let sync = run(&lu, &nexus("i"), &rw10(0x28, 0, 16, 8), &[]);
        assert_eq!(sync.data_in_len(), 4096);
        // Checked as `execute` would: out of range.
        let r = start(&lu, &rw10(0x28, 0, 4096, 8), &[], 4096).expect("taken");
        assert_eq!(sense_of(&r).0, key::ILLEGAL_REQUEST);
        // Not taken: other commands, and a write whose data falls short.
        assert!(start(&lu, &[0x00; 6], &[], 0).is_none());
        assert!(start(&lu, &rw10(0x2A, 0, 16, 8), &data[..512], 0).is_none());
    }

    #[test]
    fn devices_that_wait_in_place_are_not_taken() {
        let lu = crate::lu::test_support::lu();
        ready(&lu, &nexus("i"));
        assert!(start(&lu, &rw10(0x28, 0, 0, 1), &[], 512).is_none());
    }
}
