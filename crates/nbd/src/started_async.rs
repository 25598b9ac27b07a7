//! Plain reads and writes of a device that ends requests on threads of its
//! own ([`block::BlockDevice::completes_async`], an RBD image): put in
//! flight from the connection's task and answered where the device ends
//! them, as the iSCSI side does (`ScsiTarget::start_async`). No blocking
//! thread waits for each request, so a client's queue depth reaches the
//! device whole.

use std::sync::Arc;

use export::Backing;

use crate::ops::{self, Outcome, Piece, ReadShape};
use crate::wire::Command;

/// Starts `cmd` when it goes this way, and `answer` then gets its outcome
/// on the device's thread. The payload comes back when the command is to
/// run as usual: anything but a plain read or write, a read to be split at
/// holes, a range someone holds exclusively (a SCSI COMPARE AND WRITE).
pub(crate) fn start(
    backing: &Arc<Backing>,
    cmd: Command,
    payload: Vec<u8>,
    shape: ReadShape,
    answer: impl FnOnce(Outcome) + Send + 'static,
) -> Result<(), Vec<u8>> {
    let device = backing.device();
    let (offset, len) = match cmd {
        Command::Read { offset, len, .. }
            if len > 0 && ops::reads_whole(&**device, len as usize, shape) =>
        {
            (offset, len)
        }
        Command::Write { offset, len, .. } if len > 0 => (offset, len),
        _ => return Err(payload),
    };
    if !device.completes_async() {
        return Err(payload);
    }
    // Held shared, as every medium access holds it, until the device
    // answers; taken without waiting, since this is the connection's task.
    let Some(held) = backing.locks.try_lock(offset, len, false) else {
        return Err(payload);
    };
    let held = held.detach();
    let owner = backing.clone();
    let release = move || owner.locks.release(held);
    match cmd {
        Command::Write { fua, .. } => device.write_async(
            payload,
            offset,
            backing.force_unit_access(fua),
            Box::new(move |written| {
                release();
                answer(written.map_or_else(failed, |()| Outcome::Done));
            }),
        ),
        _ => device.read_async(
            offset,
            len as usize,
            Box::new(move |read| {
                release();
                answer(read.map_or_else(failed, |buf| Outcome::Read {
                    pieces: vec![Piece::Data {
                        at: 0,
                        len: buf.len(),
                    }],
                    buf,
                }));
            }),
        ),
    }
    Ok(())
}

fn failed(e: std::io::Error) -> Outcome {
    Outcome::Failed {
        error: ops::errno(&e),
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::mpsc;

    use block::{BlockDevice, Capabilities, Done, MemDevice};
    use parking_lot::Mutex;

    use super::*;

    type Later = Box<dyn FnOnce() + Send>;

    /// A RAM device whose asynchronous requests end when the test says,
    /// on a thread of its own, as librbd's do.
    struct Deferred {
        mem: MemDevice,
        pending: Mutex<Vec<Later>>,
        fua_seen: Mutex<Vec<bool>>,
    }

    impl Deferred {
        fn end_all(&self) {
            for later in self.pending.lock().drain(..) {
                std::thread::spawn(later).join().unwrap();
            }
        }
    }

    impl BlockDevice for Deferred {
        fn size(&self) -> u64 {
            self.mem.size()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            self.mem.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
            self.mem.write_at(buf, offset, fua)
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities {
                may_block: true,
                ..self.mem.capabilities()
            }
        }
        fn describe(&self) -> String {
            "deferred".into()
        }
        fn completes_async(&self) -> bool {
            true
        }
        fn read_async(&self, offset: u64, len: usize, done: Done<Vec<u8>>) {
            let mut buf = vec![0; len];
            let read = self.mem.read_at(&mut buf, offset).map(|()| buf);
            self.pending.lock().push(Box::new(move || done(read)));
        }
        fn write_async(&self, data: Vec<u8>, offset: u64, fua: bool, done: Done<()>) {
            self.fua_seen.lock().push(fua);
            let written = self.mem.write_at(&data, offset, fua);
            self.pending.lock().push(Box::new(move || done(written)));
        }
    }

    fn backing() -> (Arc<Backing>, Arc<Deferred>) {
        let device = Arc::new(Deferred {
            mem: MemDevice::new(1 << 20),
            pending: Mutex::new(Vec::new()),
            fua_seen: Mutex::new(Vec::new()),
        });
        (Backing::new(device.clone(), true), device)
    }

    fn answer() -> (impl FnOnce(Outcome) + Send, mpsc::Receiver<Outcome>) {
        let (tx, rx) = mpsc::channel();
        (move |outcome| tx.send(outcome).unwrap(), rx)
    }

    #[test]
    fn reads_and_writes_are_answered_where_the_device_ends_them() {
        let (backing, device) = backing();
        let write = Command::Write {
            offset: 4096,
            len: 512,
            fua: false,
        };
        let (done, answered) = answer();
        assert!(start(&backing, write, vec![7; 512], ReadShape::Whole, done).is_ok());
        // In flight: not answered yet, its range held against an
        // exclusive holder (COMPARE AND WRITE).
        assert!(answered.try_recv().is_err());
        assert!(backing.locks.try_lock(4096, 512, true).is_none());
        device.end_all();
        assert!(matches!(answered.recv().unwrap(), Outcome::Done));
        assert!(backing.locks.try_lock(4096, 512, true).is_some());

        let read = Command::Read {
            offset: 4096,
            len: 512,
            df: false,
        };
        let (done, answered) = answer();
        assert!(start(&backing, read, Vec::new(), ReadShape::Whole, done).is_ok());
        device.end_all();
        match answered.recv().unwrap() {
            Outcome::Read { buf, pieces } => {
                assert_eq!(buf, vec![7; 512]);
                assert_eq!(pieces, vec![Piece::Data { at: 0, len: 512 }]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_write_is_forced_stable_when_the_shared_write_cache_is_off() {
        let (backing, device) = backing();
        backing.set_write_cache(false);
        let write = Command::Write {
            offset: 0,
            len: 512,
            fua: false,
        };
        let (done, _answered) = answer();
        assert!(start(&backing, write, vec![1; 512], ReadShape::Whole, done).is_ok());
        assert_eq!(*device.fua_seen.lock(), vec![true]);
        device.end_all();
    }

    #[test]
    fn other_commands_and_held_ranges_run_as_usual() {
        let (backing, _device) = backing();
        let (done, _) = answer();
        let back = start(&backing, Command::Flush, vec![1], ReadShape::Whole, done);
        assert_eq!(back.unwrap_err(), vec![1]);
        let _held = backing.locks.lock(0, 512, true);
        let write = Command::Write {
            offset: 0,
            len: 512,
            fua: false,
        };
        let (done, _) = answer();
        let back = start(&backing, write, vec![2; 512], ReadShape::Whole, done);
        assert_eq!(back.unwrap_err(), vec![2; 512]);
    }
}
