//! Reads submitted together through io_uring, for files opened with
//! O_DIRECT: one system call puts a whole batch in the device's queue and
//! one wait collects it, where a thread per read would pay a wake-up, a
//! context switch and a device notification for each.
//!
//! Each thread has its own ring, so batches never contend for one; a
//! thread whose kernel refuses io_uring (an old kernel, a seccomp filter)
//! reads one by one instead.

use std::cell::RefCell;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::fs::FileExt;
use std::panic::AssertUnwindSafe;

use io_uring::{opcode, types, IoUring};

/// Submission queue entries per ring; larger batches go in several rounds.
const RING_ENTRIES: u32 = 64;

thread_local! {
    static RING: RefCell<Option<IoUring>> = RefCell::new(IoUring::new(RING_ENTRIES).ok());
}

/// One read of `len` bytes at `offset` into memory at `ptr`.
pub(crate) struct Slot {
    pub ptr: *mut u8,
    pub len: usize,
    pub offset: u64,
    /// Bytes read, or the error; set by [`read_all`].
    pub got: io::Result<usize>,
}

impl Slot {
    pub fn new(buf: &mut [u8], offset: u64) -> Slot {
        Slot {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            offset,
            got: Ok(0),
        }
    }
}

/// Reads every slot of `file` (whose descriptor is `fd`), each wholly or
/// with an error, calling `done` with a slot's index as soon as it has
/// ended. Returns false, having done nothing, when this thread has no
/// ring; the caller then reads one by one.
///
/// Every slot's memory must stay valid and unaliased until its `done`;
/// the kernel has finished with a slot when `done` is called for it.
pub(crate) fn read_all(
    file: &std::fs::File,
    fd: RawFd,
    slots: &mut [Slot],
    done: &mut dyn FnMut(usize, &mut Slot),
) -> bool {
    RING.with(|cell| {
        let mut cell = cell.borrow_mut();
        let Some(ring) = cell.as_mut() else {
            return false;
        };
        let mut first = 0;
        for round in slots.chunks_mut(RING_ENTRIES as usize) {
            read_round(ring, fd, round, &mut |i, slot| {
                finish_short_read(file, slot);
                done(first + i, slot);
            });
            first += round.len();
        }
        true
    })
}

/// What the kernel read only in part, or asked us to retry, is finished
/// synchronously.
fn finish_short_read(file: &std::fs::File, slot: &mut Slot) {
    let done = match slot.got {
        Ok(n) if n < slot.len => n,
        Err(ref e) if retryable(e) => 0,
        _ => return,
    };
    // SAFETY: the caller keeps the slot's memory valid and unaliased; the
    // kernel is done with it.
    let rest = unsafe { std::slice::from_raw_parts_mut(slot.ptr.add(done), slot.len - done) };
    slot.got = file
        .read_exact_at(rest, slot.offset + done as u64)
        .map(|()| slot.len);
}

fn read_round(
    ring: &mut IoUring,
    fd: RawFd,
    slots: &mut [Slot],
    done: &mut dyn FnMut(usize, &mut Slot),
) {
    let mut left = 0;
    {
        let mut sq = ring.submission();
        for (i, slot) in slots.iter_mut().enumerate() {
            // Lengths above u32 do not occur: a batch holds SCSI transfers,
            // bounded far below 4 GiB by MAXIMUM TRANSFER LENGTH; a longer
            // one would be finished synchronously as a short read.
            let len = u32::try_from(slot.len).unwrap_or(u32::MAX);
            let entry = opcode::Read::new(types::Fd(fd), slot.ptr, len)
                .offset(slot.offset)
                .build()
                .user_data(i as u64);
            // SAFETY: the caller keeps the memory valid until read_all
            // returns, and every completion is reaped before that.
            if unsafe { sq.push(&entry) }.is_ok() {
                left += 1;
                slot.got = Ok(0);
            } else {
                // The queue has room (a round holds at most RING_ENTRIES
                // slots and the previous round was reaped whole); should it
                // not, the read is done synchronously below.
                slot.got = Err(io::Error::from_raw_os_error(libc::EAGAIN));
            }
        }
    }
    let mut panicked = None;
    for (i, slot) in slots.iter_mut().enumerate() {
        if slot.got.is_err() && panicked.is_none() {
            let answered = std::panic::catch_unwind(AssertUnwindSafe(|| done(i, slot)));
            panicked = answered.err();
        }
    }
    while left > 0 {
        // Only an interrupted or busy wait fails on a working ring. Were
        // the ring to fail otherwise, the kernel could still hold our
        // buffers, so we must not return before it gives them back:
        // waiting again is the only safe answer.
        // One completion is enough to wake for: it is answered at once.
        if ring.submit_and_wait(1).is_err() {
            std::thread::yield_now();
        }
        // Collected first: `done` may take long (it answers the command),
        // and the completion queue stays borrowed while iterated.
        // At most one completion per slot of the round is outstanding.
        let mut ended = [(0usize, 0i32); RING_ENTRIES as usize];
        let mut n = 0;
        for cqe in ring.completion().take(ended.len()) {
            ended[n] = (cqe.user_data() as usize, cqe.result());
            n += 1;
        }
        for &(i, res) in &ended[..n] {
            let Some(slot) = slots.get_mut(i) else {
                continue;
            };
            slot.got = if res < 0 {
                Err(io::Error::from_raw_os_error(-res))
            } else if res == 0 && slot.len > 0 {
                Err(io::ErrorKind::UnexpectedEof.into())
            } else {
                Ok(res as usize)
            };
            left -= 1;
            // A panic in `done` must not leave this function while the
            // kernel still writes into the other slots' memory: it is held
            // until every read of the round has ended.
            if panicked.is_none() {
                let answered = std::panic::catch_unwind(AssertUnwindSafe(|| done(i, slot)));
                panicked = answered.err();
            }
        }
    }
    if let Some(payload) = panicked {
        std::panic::resume_unwind(payload);
    }
}

fn retryable(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EAGAIN))
}
