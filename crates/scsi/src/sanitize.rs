//! SANITIZE: OVERWRITE, BLOCK ERASE (where the device deallocates) and
//! EXIT FAILURE MODE. CRYPTO ERASE is not offered: no device encrypts.
//!
//! A sanitize runs on its own thread and holds the whole LBA range
//! exclusively; meanwhile the LU answers other commands with NOT READY,
//! SANITIZE IN PROGRESS and its progress (SBC-4 4.11). With IMMED = 0 the
//! command completes when the operation does. Overwrite proceeds at a
//! bounded rate, so sanitizing one LU cannot starve the I/O of others
//! sharing the same storage.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use scsi_api::{status, Nexus, ScsiResponse};

use crate::cdb::{be16, u8_at};
use crate::commands::{op, sa, Command};
use crate::lu::{Ctx, LogicalUnit, Outcome as CommandOutcome};
use crate::sense::{asc, key, Failure, Sense};

/// Overwrite bandwidth of a background sanitize.
pub const OVERWRITE_BYTES_PER_SECOND: u64 = 128 << 20;
const OVERWRITE_CHUNK: u64 = 4 << 20;

/// Completion of one sanitize, for a waiting IMMED = 0 command.
#[derive(Default)]
pub struct Completion {
    result: Mutex<Outcome>,
    done: Condvar,
}

#[derive(Clone, Copy, Default, PartialEq, Eq)]
enum Outcome {
    #[default]
    Pending,
    Finished(bool),
    /// The command was aborted: it stops waiting, the operation goes on.
    Abandoned,
}

impl Completion {
    fn finish(&self, ok: bool) {
        let mut r = self.result.lock();
        if *r == Outcome::Pending {
            *r = Outcome::Finished(ok);
        }
        self.done.notify_all();
    }

    pub fn abandon(&self) {
        let mut r = self.result.lock();
        if *r == Outcome::Pending {
            *r = Outcome::Abandoned;
        }
        self.done.notify_all();
    }

    /// `Some(success)` when the operation ended, `None` when abandoned.
    fn wait(&self) -> Option<bool> {
        let mut r = self.result.lock();
        loop {
            match *r {
                Outcome::Pending => self.done.wait(&mut r),
                Outcome::Finished(ok) => return Some(ok),
                Outcome::Abandoned => return None,
            }
        }
    }
}

/// A SANITIZE command waiting for its operation (IMMED = 0).
pub struct Waiter {
    pub nexus: Nexus,
    pub tag: u64,
    pub completion: Arc<Completion>,
}

pub enum SanitizeState {
    Idle,
    /// Progress in 1/65536 of the operation.
    Running(Arc<AtomicU32>),
    /// The last sanitize failed: medium access is refused until a new
    /// sanitize succeeds or EXIT FAILURE MODE.
    Failed,
}

/// Commands that access the medium, refused after a failed sanitize.
fn accesses_medium(c: &Command) -> bool {
    use op::*;
    matches!(
        c.opcode,
        READ_6
            | READ_10
            | READ_12
            | READ_16
            | WRITE_6
            | WRITE_10
            | WRITE_12
            | WRITE_16
            | VERIFY_10
            | VERIFY_12
            | VERIFY_16
            | WRITE_VERIFY_10
            | WRITE_VERIFY_12
            | WRITE_VERIFY_16
            | ORWRITE_16
            | COMPARE_AND_WRITE
            | WRITE_ATOMIC_16
            | WRITE_SAME_10
            | WRITE_SAME_16
            | UNMAP
            | PRE_FETCH_10
            | PRE_FETCH_16
            | EXTENDED_COPY
    )
}

impl SanitizeState {
    /// The sense that refuses `c` in this state, if any.
    pub fn blocks(&self, c: &Command) -> Option<Sense> {
        match self {
            SanitizeState::Running(_) if !c.during_sanitize => self.progress_sense(),
            SanitizeState::Failed if accesses_medium(c) => {
                Some(Sense::new(key::MEDIUM_ERROR, asc::SANITIZE_FAILED))
            }
            _ => None,
        }
    }

    /// NOT READY, SANITIZE IN PROGRESS with the progress, while running.
    pub fn progress_sense(&self) -> Option<Sense> {
        match self {
            SanitizeState::Running(p) => Some(Sense::sanitize_in_progress(
                p.load(Ordering::Relaxed).min(0xFFFF) as u16,
            )),
            _ => None,
        }
    }
}

/// What to do to the medium.
enum Operation {
    Overwrite {
        pattern: Vec<u8>,
        passes: u8,
        invert: bool,
    },
    BlockErase,
}

/// Parses the OVERWRITE parameter list (SBC-4 5.30.2.2).
fn overwrite_parameters(param: &[u8], block_size: usize) -> Result<Operation, Sense> {
    let passes = param[0] & 0x1F;
    let invert = param[0] & 0x80 != 0;
    if passes == 0 {
        return Err(Sense::invalid_param(0, Some(4)));
    }
    if param[0] & 0x60 != 0 {
        // TEST: vendor test modes are not supported.
        return Err(Sense::invalid_param(0, Some(6)));
    }
    let pattern_len = usize::from(be16(param, 2));
    if pattern_len == 0 || pattern_len > block_size || pattern_len + 4 != param.len() {
        return Err(Sense::invalid_param(2, None));
    }
    Ok(Operation::Overwrite {
        pattern: param[4..].to_vec(),
        passes,
        invert,
    })
}

impl LogicalUnit {
    pub(crate) fn sanitize(&self, ctx: &Ctx<'_>) -> CommandOutcome {
        let cdb = ctx.cdb();
        let immed = u8_at(cdb, 1) & 0x80 != 0;
        let action = u8_at(cdb, 1) & 0x1F;
        let len = usize::from(be16(cdb, 7));
        let operation = match action {
            sa::SANITIZE_OVERWRITE => {
                if len < 5 || len > self.block_size as usize + 4 {
                    return Err(Sense::invalid_cdb(7, None).into());
                }
                self.check_writable(ctx)?;
                overwrite_parameters(ctx.param(len)?, self.block_size as usize)?
            }
            sa::SANITIZE_BLOCK_ERASE => {
                if len != 0 {
                    return Err(Sense::invalid_cdb(7, None).into());
                }
                self.check_writable(ctx)?;
                Operation::BlockErase
            }
            _ => {
                // EXIT FAILURE MODE
                if len != 0 {
                    return Err(Sense::invalid_cdb(7, None).into());
                }
                let mut st = self.state.lock();
                if matches!(st.sanitize, SanitizeState::Failed) {
                    st.sanitize = SanitizeState::Idle;
                }
                return Ok(ScsiResponse::good());
            }
        };
        let Some(me) = self.me.upgrade() else {
            return Err(Sense::internal_failure().into());
        };
        let progress = Arc::new(AtomicU32::new(0));
        let completion = Arc::new(Completion::default());
        {
            let mut st = self.state.lock();
            if let Some(s) = st.sanitize.progress_sense() {
                return Err(s.into());
            }
            st.sanitize = SanitizeState::Running(progress.clone());
        }
        let worker = {
            let completion = completion.clone();
            std::thread::Builder::new()
                .name("sanitize".into())
                .spawn(move || {
                    let ok = me.run_sanitize(&operation, &progress);
                    me.state.lock().sanitize = if ok {
                        SanitizeState::Idle
                    } else {
                        SanitizeState::Failed
                    };
                    completion.finish(ok);
                })
        };
        if worker.is_err() {
            self.state.lock().sanitize = SanitizeState::Idle;
            return Err(Sense::internal_failure().into());
        }
        if immed {
            return Ok(ScsiResponse::good());
        }
        let waiter = Waiter {
            nexus: ctx.nexus.clone(),
            tag: ctx.cmd.tag,
            completion: completion.clone(),
        };
        self.sanitize_waiters.lock().push(waiter);
        let outcome = completion.wait();
        self.sanitize_waiters
            .lock()
            .retain(|w| !Arc::ptr_eq(&w.completion, &completion));
        match outcome {
            Some(true) => Ok(ScsiResponse::good()),
            Some(false) => Err(Sense::new(key::MEDIUM_ERROR, asc::SANITIZE_FAILED).into()),
            None => Err(Failure::Status(status::TASK_ABORTED)),
        }
    }

    /// Carries out `operation` over the whole LU; false on device errors.
    fn run_sanitize(&self, operation: &Operation, progress: &AtomicU32) -> bool {
        let blocks = self.blocks();
        let size = blocks * u64::from(self.block_size);
        // No other access may touch the medium while it is sanitized.
        let _guard = self.locks.lock(0, blocks, true);
        let ok = match operation {
            Operation::BlockErase => {
                let erased = self.device.discard(0, size).is_ok()
                    && (self.caps.discard_zeroes || self.device.write_zeroes(0, size).is_ok());
                erased && self.device.flush().is_ok()
            }
            Operation::Overwrite {
                pattern,
                passes,
                invert,
            } => {
                let total = size * u64::from(*passes);
                let started = Instant::now();
                let mut written = 0u64;
                let mut ok = true;
                'passes: for pass in 0..*passes {
                    // With INVERT, every other pass writes the complement.
                    let flip = *invert && pass % 2 == 1;
                    // The pattern restarts at every logical block.
                    let block: Vec<u8> = pattern
                        .iter()
                        .map(|b| if flip { !b } else { *b })
                        .cycle()
                        .take(self.block_size as usize)
                        .collect();
                    let per_chunk =
                        (OVERWRITE_CHUNK.min(size) / u64::from(self.block_size)).max(1) as usize;
                    let chunk = block.repeat(per_chunk);
                    // Zeros on a thin device that reads discarded blocks as
                    // zeros deallocate instead: the blocks read the pattern
                    // and the old data leaves the backing store, without
                    // allocating the whole LU (more than an overcommitted
                    // pool may hold).
                    let deallocate = self.caps.thin
                        && self.caps.discard
                        && self.caps.discard_zeroes
                        && block.iter().all(|&b| b == 0);
                    let mut at = 0;
                    while at < size {
                        let n = (size - at).min(chunk.len() as u64);
                        let done = if deallocate {
                            self.device.write_zeroes(at, n)
                        } else {
                            self.device.write_at(&chunk[..n as usize], at, false)
                        };
                        if done.is_err() {
                            ok = false;
                            break 'passes;
                        }
                        at += n;
                        written += n;
                        progress.store(
                            (written as u128 * 65536 / total as u128) as u32,
                            Ordering::Relaxed,
                        );
                        let due = Duration::from_secs_f64(
                            written as f64 / OVERWRITE_BYTES_PER_SECOND as f64,
                        );
                        if let Some(wait) = due.checked_sub(started.elapsed()) {
                            std::thread::sleep(wait);
                        }
                    }
                }
                ok && self.device.flush().is_ok()
            }
        };
        progress.store(65535, Ordering::Relaxed);
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lu::test_support::*;
    use scsi_api::status;

    fn sanitize_cdb(immed: bool, action: u8, len: u16) -> Vec<u8> {
        let l = len.to_be_bytes();
        vec![
            0x48,
            (u8::from(immed) << 7) | action,
            0,
            0,
            0,
            0,
            0,
            l[0],
            l[1],
            0,
        ]
    }

    #[test]
    fn overwrite_fills_every_block_with_the_pattern() {
        let lu = lu_with(64 << 10, crate::LuConfig::default());
        let a = nexus("a");
        ready(&lu, &a);
        let mut p = vec![0x01, 0, 0, 3];
        p.extend_from_slice(&[1, 2, 3]);
        let r = run(&lu, &a, &sanitize_cdb(false, 1, p.len() as u16), &p);
        assert_eq!(r.status, status::GOOD);
        let d = run(&lu, &a, &[0x28, 0, 0, 0, 0, 0, 0, 0, 2, 0], &[]).data_in;
        assert_eq!(&d[..6], &[1, 2, 3, 1, 2, 3]);
        // 512 is not a multiple of 3: the pattern restarts at each block.
        assert_eq!(&d[510..515], &[1, 2, 1, 2, 3]);
    }

    #[test]
    fn zero_overwrite_of_a_thin_device_deallocates() {
        let mem = Arc::new(block::MemDevice::new(1 << 20));
        let lu = LogicalUnit::new(mem.clone(), crate::LuConfig::default()).unwrap();
        let a = nexus("a");
        ready(&lu, &a);
        run(&lu, &a, &[0x2A, 0, 0, 0, 0, 0, 0, 0, 128, 0], &[9; 65536]);
        assert!(mem.committed_bytes() > 0);
        let mut p = vec![0x01, 0, 0, 4];
        p.extend_from_slice(&[0; 4]);
        let r = run(&lu, &a, &sanitize_cdb(false, 1, p.len() as u16), &p);
        assert_eq!(r.status, status::GOOD);
        // Nothing is left allocated, and every block reads the pattern.
        assert_eq!(mem.committed_bytes(), 0);
        let d = run(&lu, &a, &[0x28, 0, 0, 0, 0, 0, 0, 0, 128, 0], &[]).data_in;
        assert!(d.iter().all(|&b| b == 0));
    }

    #[test]
    fn block_erase_deallocates_everything() {
        let lu = lu();
        let a = nexus("a");
        ready(&lu, &a);
        run(&lu, &a, &[0x2A, 0, 0, 0, 0, 0, 0, 0, 8, 0], &[9; 4096]);
        assert_eq!(
            run(&lu, &a, &sanitize_cdb(false, 2, 0), &[]).status,
            status::GOOD
        );
        let d = run(&lu, &a, &[0x28, 0, 0, 0, 0, 0, 0, 0, 8, 0], &[]).data_in;
        assert!(d.iter().all(|&b| b == 0));
    }

    #[test]
    fn parameter_validation() {
        let lu = lu();
        let a = nexus("a");
        ready(&lu, &a);
        for len in 0..5u16 {
            assert_eq!(
                sense_of(&run(&lu, &a, &sanitize_cdb(false, 1, len), &[1; 8])).1,
                0x24
            );
        }
        let e = sense_of(&run(&lu, &a, &sanitize_cdb(false, 1, 517), &[1; 517]));
        assert_eq!(e.1, 0x24);
        let mut p = vec![0u8; 516];
        p[3] = 0x00;
        p[2] = 0x02;
        assert_eq!(
            sense_of(&run(&lu, &a, &sanitize_cdb(false, 1, 516), &p)).1,
            0x26
        );
        p[0] = 1;
        p[2] = 0;
        assert_eq!(
            sense_of(&run(&lu, &a, &sanitize_cdb(false, 1, 516), &p)).1,
            0x26
        );
        assert_eq!(
            sense_of(&run(&lu, &a, &sanitize_cdb(false, 2, 8), &[0; 8])).1,
            0x24
        );
        assert_eq!(
            sense_of(&run(&lu, &a, &sanitize_cdb(false, 0x1F, 8), &[0; 8])).1,
            0x24
        );
        // CRYPTO ERASE and undefined service actions.
        for action in [0u8, 3, 4, 0x1E] {
            assert_eq!(
                sense_of(&run(&lu, &a, &sanitize_cdb(false, action, 0), &[])).1,
                0x24
            );
        }
        // Reserved bit 6 of byte 1.
        let mut c = sanitize_cdb(false, 2, 0);
        c[1] |= 0x40;
        assert_eq!(sense_of(&run(&lu, &a, &c, &[])).1, 0x24);
    }

    #[test]
    fn waiting_sanitize_blocks_only_its_caller() {
        let lu = lu_with(64 << 20, crate::LuConfig::default());
        let (a, b) = (nexus("a"), nexus("b"));
        ready(&lu, &a);
        ready(&lu, &b);
        let worker = {
            let lu = lu.clone();
            std::thread::spawn(move || {
                let mut p = vec![0x01, 0, 0x02, 0];
                p.extend_from_slice(&[0; 512]);
                run(&lu, &nexus("a"), &sanitize_cdb(false, 1, 516), &p).status
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        for n in [&a, &b] {
            assert_eq!(
                sense_of(&run(&lu, n, &[0; 6], &[])),
                (key::NOT_READY, 0x04, 0x1B)
            );
        }
        assert_eq!(worker.join().unwrap(), status::GOOD);
        assert_eq!(run(&lu, &a, &[0; 6], &[]).status, status::GOOD);
    }

    #[test]
    fn immediate_sanitize_reports_progress_and_blocks_medium_access() {
        // Large enough that the rate limit keeps it running for a while.
        let lu = lu_with(64 << 20, crate::LuConfig::default());
        let a = nexus("a");
        ready(&lu, &a);
        let mut p = vec![0x01, 0, 0x02, 0];
        p.extend_from_slice(&[0xAA; 512]);
        assert_eq!(
            run(&lu, &a, &sanitize_cdb(true, 1, 516), &p).status,
            status::GOOD
        );
        let r = run(&lu, &a, &[0; 6], &[]);
        assert_eq!(sense_of(&r), (key::NOT_READY, 0x04, 0x1B));
        assert_eq!(r.sense[15], 0x80);
        assert_eq!(
            run(&lu, &a, &[0x12, 0, 0, 0, 36, 0], &[]).status,
            status::GOOD
        );
        let rs = run(&lu, &a, &[0x03, 0, 0, 0, 18, 0], &[]);
        assert_eq!((rs.data_in[2], rs.data_in[12]), (key::NOT_READY, 0x04));
        // Wait for the end.
        while run(&lu, &a, &[0; 6], &[]).status != status::GOOD {
            std::thread::sleep(Duration::from_millis(20));
        }
        let d = run(&lu, &a, &[0x28, 0, 0, 0, 0x10, 0, 0, 0, 1, 0], &[]).data_in;
        assert!(d.iter().all(|&b| b == 0xAA));
    }
}
