//! The device work of each command, run on a blocking thread: device
//! calls may block on real I/O.

use std::io;

use block::{Allocation, BlockDevice, ErrorClass};
use export::Backing;

use crate::proto::*;
use crate::wire::{Command, Extent};

/// Part of a read's reply, by offset inside the read's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Piece {
    Data {
        at: usize,
        len: usize,
    },
    /// Reads as zeros; sent as a hole instead of bytes.
    Hole {
        at: usize,
        len: usize,
    },
}

/// What a command produced.
#[derive(Debug)]
pub(crate) enum Outcome {
    Done,
    /// `buf` holds the data pieces (holes in it are zeros).
    Read {
        buf: Vec<u8>,
        pieces: Vec<Piece>,
    },
    Extents(Vec<Extent>),
    Failed {
        error: u32,
        message: String,
    },
}

/// How a read is to be answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadShape {
    /// One piece of data: simple replies, or a read with DF.
    Whole,
    /// Holes found through `allocation()` sent as holes.
    Sparse,
}

/// Most extents in one block status reply; clients ask again from where
/// it stops.
const MAX_EXTENTS: usize = 1 << 16;

/// The protocol's error for a failed device call.
pub(crate) fn errno(e: &io::Error) -> u32 {
    class_error(block::classify(e))
}

/// The protocol's error for each class of device error. The protocol asks
/// servers not to send ENOMEM, EOVERFLOW or ENOTSUP (but where it names
/// them), and has no word for "not ready" or "try again".
fn class_error(class: ErrorClass) -> u32 {
    match class {
        ErrorClass::Medium | ErrorClass::NotReady | ErrorClass::TimedOut => EIO,
        ErrorClass::SpaceExhausted => ENOSPC,
        ErrorClass::ReadOnly => EPERM,
        // The client must disconnect, and may then reach the node that
        // serves the device now.
        ErrorClass::Fenced => ESHUTDOWN,
        ErrorClass::OutOfRange | ErrorClass::Invalid | ErrorClass::Unsupported => EINVAL,
    }
}

fn failed(e: io::Error) -> Outcome {
    Outcome::Failed {
        error: errno(&e),
        message: e.to_string(),
    }
}

/// Reads shorter than this go out as data: finding their holes costs more
/// device calls than their zeros cost bytes.
const SPARSE_READ_MIN: usize = 64 * 1024;

/// Whether reads of this device are worth splitting at its holes. Not for
/// a file on a memory file system: there `allocation()` (SEEK_HOLE) walks
/// every page up to the next hole, which made 4 KiB reads of a 1 GiB
/// tmpfs file a thousand times slower; its zeros cost nothing to read.
fn reads_split_at_holes(device: &dyn BlockDevice, len: usize) -> bool {
    len >= SPARSE_READ_MIN && holes_read_zero(device) && device.memory_file().is_none()
}

/// Whether a read of `len` bytes of `device` goes out as one run of data.
pub(crate) fn reads_whole(device: &dyn BlockDevice, len: usize, shape: ReadShape) -> bool {
    shape == ReadShape::Whole || !reads_split_at_holes(device, len)
}

/// Whether a deallocated range of this device reads as zeros.
fn holes_read_zero(device: &dyn BlockDevice) -> bool {
    let caps = device.capabilities();
    caps.thin || caps.discard_zeroes
}

/// Runs `cmd` on the device of `backing` as every transport over it
/// does: its byte range held shared in the backing's range locks (so a
/// SCSI COMPARE AND WRITE of those bytes cannot interleave), and a write
/// forced to stable storage when the shared write cache is off.
pub(crate) fn run_on(backing: &Backing, cmd: Command, payload: &[u8], shape: ReadShape) -> Outcome {
    let cmd = forced(cmd, !backing.write_cache());
    let _held = medium_range(cmd).map(|(offset, len)| backing.locks.lock(offset, len, false));
    run(&**backing.device(), cmd, payload, shape)
}

/// `cmd` with FUA set when the write cache is off.
fn forced(cmd: Command, cache_off: bool) -> Command {
    if !cache_off {
        return cmd;
    }
    match cmd {
        Command::Write { offset, len, .. } => Command::Write {
            offset,
            len,
            fua: true,
        },
        Command::Trim { offset, len, .. } => Command::Trim {
            offset,
            len,
            fua: true,
        },
        Command::WriteZeroes {
            offset,
            len,
            no_hole,
            fast,
            ..
        } => Command::WriteZeroes {
            offset,
            len,
            fua: true,
            no_hole,
            fast,
        },
        other => other,
    }
}

/// The bytes a command reads or changes on the medium.
fn medium_range(cmd: Command) -> Option<(u64, u64)> {
    match cmd {
        Command::Read { offset, len, .. }
        | Command::Write { offset, len, .. }
        | Command::Trim { offset, len, .. }
        | Command::WriteZeroes { offset, len, .. }
        | Command::Cache { offset, len } => Some((offset, len)),
        Command::Flush | Command::Disconnect | Command::BlockStatus { .. } => None,
    }
}

/// Runs `cmd` on `device`; `payload` is a write's data.
pub(crate) fn run(
    device: &dyn BlockDevice,
    cmd: Command,
    payload: &[u8],
    shape: ReadShape,
) -> Outcome {
    let result = match cmd {
        Command::Read { offset, len, .. } => return read(device, offset, len as usize, shape),
        Command::BlockStatus {
            offset,
            len,
            req_one,
        } => {
            return match extents(device, offset, len, req_one) {
                Ok(e) => Outcome::Extents(e),
                Err(e) => failed(e),
            }
        }
        Command::Write { offset, fua, .. } => device.write_at(payload, offset, fua),
        Command::Flush => device.flush(),
        Command::Trim { offset, len, fua } => trim(device, offset, len, fua),
        Command::WriteZeroes {
            offset,
            len,
            fua,
            no_hole,
            fast,
        } => {
            let caps = device.capabilities();
            // Only deallocating is known to be faster than writing zeros.
            if fast && (no_hole || !(caps.thin && caps.discard && caps.discard_zeroes)) {
                return Outcome::Failed {
                    error: ENOTSUP,
                    message: "zeroing here is no faster than writing zeros".into(),
                };
            }
            zero(device, offset, len, fua, no_hole)
        }
        Command::Cache { offset, len } => cache(device, offset, len),
        Command::Disconnect => Ok(()),
    };
    match result {
        Ok(()) => Outcome::Done,
        Err(e) => failed(e),
    }
}

fn trim(device: &dyn BlockDevice, offset: u64, len: u64, fua: bool) -> io::Result<()> {
    if device.capabilities().discard && len > 0 {
        device.discard(offset, len)?;
        if fua {
            device.flush()?;
        }
    }
    Ok(())
}

fn zero(
    device: &dyn BlockDevice,
    offset: u64,
    len: u64,
    fua: bool,
    no_hole: bool,
) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    if no_hole {
        device.allocate_zeroes(offset, len)?;
    } else {
        device.write_zeroes(offset, len)?;
    }
    if fua {
        device.flush()?;
    }
    Ok(())
}

/// Brings a range into whatever cache the device has by reading it.
fn cache(device: &dyn BlockDevice, offset: u64, len: u64) -> io::Result<()> {
    const STEP: u64 = 1 << 20;
    let mut scratch = vec![0; STEP.min(len) as usize];
    let mut done = 0;
    while done < len {
        let n = STEP.min(len - done) as usize;
        device.read_at(&mut scratch[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

fn read(device: &dyn BlockDevice, offset: u64, len: usize, shape: ReadShape) -> Outcome {
    if len == 0 {
        // Nothing to send: a reply without data chunks.
        return Outcome::Read {
            buf: Vec::new(),
            pieces: Vec::new(),
        };
    }
    let mut buf = vec![0; len];
    if reads_whole(device, len, shape) {
        return match device.read_at(&mut buf, offset) {
            Ok(()) => Outcome::Read {
                buf,
                pieces: vec![Piece::Data { at: 0, len }],
            },
            Err(e) => failed(e),
        };
    }
    let mut pieces: Vec<Piece> = Vec::new();
    let mut at = 0;
    while at < len {
        let left = (len - at) as u64;
        let (state, n) = match device.allocation(offset + at as u64, left) {
            Ok((s, n)) if n > 0 => (s, n.min(left) as usize),
            Ok(_) => (Allocation::Mapped, left as usize),
            Err(e) => return failed(e),
        };
        let piece = match state {
            Allocation::Mapped => {
                if let Err(e) = device.read_at(&mut buf[at..at + n], offset + at as u64) {
                    return failed(e);
                }
                Piece::Data { at, len: n }
            }
            Allocation::Deallocated => Piece::Hole { at, len: n },
        };
        push_merged(&mut pieces, piece);
        at += n;
    }
    Outcome::Read { buf, pieces }
}

/// Appends `p`, joining it to the last piece when both are the same kind.
fn push_merged(pieces: &mut Vec<Piece>, p: Piece) {
    match (pieces.last_mut(), p) {
        (Some(Piece::Data { len, .. }), Piece::Data { len: more, .. })
        | (Some(Piece::Hole { len, .. }), Piece::Hole { len: more, .. }) => *len += more,
        _ => pieces.push(p),
    }
}

/// `base:allocation` extents from `offset`, covering at most `len` bytes.
fn extents(
    device: &dyn BlockDevice,
    offset: u64,
    len: u64,
    req_one: bool,
) -> io::Result<Vec<Extent>> {
    let zero = holes_read_zero(device);
    let mut out: Vec<Extent> = Vec::new();
    let mut at = 0;
    while at < len {
        let (state, n) = match device.allocation(offset + at, len - at)? {
            (s, n) if n > 0 => (s, n.min(len - at)),
            _ => (Allocation::Mapped, len - at),
        };
        let flags = match state {
            Allocation::Mapped => 0,
            Allocation::Deallocated if zero => STATE_HOLE | STATE_ZERO,
            Allocation::Deallocated => STATE_HOLE,
        };
        let full = out.len() == MAX_EXTENTS || (req_one && !out.is_empty());
        match out.last_mut() {
            Some(last) if last.flags == flags => last.len += n,
            _ if full => break,
            _ => out.push(Extent { len: n, flags }),
        }
        at += n;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use block::MemDevice;

    fn sparse() -> MemDevice {
        let dev = MemDevice::new(8 << 20);
        dev.write_at(&[7; 4096], 1 << 20, false).unwrap();
        dev
    }

    #[test]
    fn a_sparse_read_sends_holes_and_data() {
        let dev = sparse();
        let Outcome::Read { buf, pieces } = read(&dev, 0, 2 << 20, ReadShape::Sparse) else {
            panic!("read failed")
        };
        assert!(matches!(pieces[0], Piece::Hole { at: 0, .. }));
        let data = pieces.iter().find_map(|p| match p {
            Piece::Data { at, len } => Some((*at, *len)),
            _ => None,
        });
        let (at, len) = data.expect("a data piece");
        assert!(at <= 1 << 20 && at + len >= (1 << 20) + 4096);
        assert_eq!(&buf[1 << 20..(1 << 20) + 4096], &[7; 4096]);
        let total: usize = pieces
            .iter()
            .map(|p| match p {
                Piece::Data { len, .. } | Piece::Hole { len, .. } => *len,
            })
            .sum();
        assert_eq!(total, 2 << 20);
        // The same read in one piece carries the zeros as bytes.
        let Outcome::Read { pieces, .. } = read(&dev, 0, 2 << 20, ReadShape::Whole) else {
            panic!("read failed")
        };
        assert_eq!(
            pieces,
            vec![Piece::Data {
                at: 0,
                len: 2 << 20
            }]
        );
        // A short read is data whatever it covers.
        let Outcome::Read { pieces, .. } = read(&dev, 0, 4096, ReadShape::Sparse) else {
            panic!("read failed")
        };
        assert_eq!(pieces, vec![Piece::Data { at: 0, len: 4096 }]);
    }

    #[test]
    fn block_status_walks_extents_and_honours_req_one() {
        let dev = sparse();
        let all = extents(&dev, 0, 8 << 20, false).unwrap();
        assert!(all.len() >= 3);
        assert_eq!(all.iter().map(|e| e.len).sum::<u64>(), 8 << 20);
        assert_eq!(all[0].flags, STATE_HOLE | STATE_ZERO);
        assert_eq!(all[1].flags, 0);
        let one = extents(&dev, 0, 8 << 20, true).unwrap();
        assert_eq!(one, vec![all[0]]);
    }

    #[test]
    fn a_write_holds_its_range_and_obeys_the_shared_write_cache() {
        use block::FaultyDevice;
        let faulty = std::sync::Arc::new(FaultyDevice::new(std::sync::Arc::new(MemDevice::new(
            1 << 20,
        ))));
        let backing = Backing::new(faulty.clone(), true);
        let write = Command::Write {
            offset: 0,
            len: 4096,
            fua: false,
        };
        assert!(matches!(
            run_on(&backing, write, &[5; 4096], ReadShape::Whole),
            Outcome::Done
        ));
        // With the cache on, an unflushed write is lost in a power cut.
        faulty.drop_unflushed();
        let mut back = [0; 4096];
        faulty.read_at(&mut back, 0).unwrap();
        assert_eq!(back, [0; 4096]);
        // With it off (as MODE SELECT of a LUN over the same device turns
        // it), the same write is stable when it completes.
        backing.set_write_cache(false);
        run_on(&backing, write, &[6; 4096], ReadShape::Whole);
        faulty.drop_unflushed();
        faulty.read_at(&mut back, 0).unwrap();
        assert_eq!(back, [6; 4096]);
        // An exclusive holder of the bytes (COMPARE AND WRITE) holds the
        // write back until it is done.
        let backing = std::sync::Arc::new(backing);
        let held = backing.locks.lock(0, 512, true);
        let t = {
            let backing = backing.clone();
            std::thread::spawn(move || run_on(&backing, write, &[7; 4096], ReadShape::Whole))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!t.is_finished());
        drop(held);
        assert!(matches!(t.join().unwrap(), Outcome::Done));
    }

    fn os(n: i32) -> io::Error {
        io::Error::from_raw_os_error(n)
    }

    fn kind(k: io::ErrorKind) -> io::Error {
        io::Error::new(k, "from a device")
    }

    fn past_the_end() -> io::Error {
        MemDevice::new(4096)
            .read_at(&mut [0; 512], 4096)
            .unwrap_err()
    }

    /// The value sent for `class` raised outright and for each of `errors`.
    fn assert_sent(class: ErrorClass, errors: Vec<io::Error>, want: u32) {
        let raised = block::DeviceError::new(class, "from a device").into();
        for e in std::iter::once(raised).chain(errors) {
            assert_eq!(errno(&e), want, "{e:?}");
        }
    }

    /// A test for each class: the value sent for the class raised
    /// outright and for the errors devices raise that mean it.
    macro_rules! class_tests {
        ($($test:ident: $class:ident => $want:expr, [$($e:expr),*];)*) => {$(
            #[test]
            fn $test() {
                assert_sent(ErrorClass::$class, vec![$($e),*], $want);
            }
        )*};
    }

    class_tests! {
        // ENOMEM and EOVERFLOW are values servers should not send.
        a_medium_error_is_eio: Medium => EIO,
            [os(libc::EIO), os(libc::ENOMEM), os(libc::EOVERFLOW)];
        a_full_pool_is_enospc: SpaceExhausted => ENOSPC,
            [kind(io::ErrorKind::StorageFull), os(libc::ENOSPC), os(libc::EDQUOT), os(libc::EFBIG)];
        a_read_only_device_is_eperm: ReadOnly => EPERM,
            [os(libc::EROFS), os(libc::EPERM), os(libc::EACCES)];
        a_fenced_node_is_eshutdown: Fenced => ESHUTDOWN, [os(libc::ESHUTDOWN)];
        a_device_not_ready_is_eio: NotReady => EIO, [os(libc::ENXIO)];
        a_timeout_is_eio: TimedOut => EIO,
            [kind(io::ErrorKind::TimedOut), os(libc::ETIMEDOUT)];
        past_the_devices_end_is_einval: OutOfRange => EINVAL, [past_the_end()];
        refused_arguments_are_einval: Invalid => EINVAL, [os(libc::EINVAL)];
        // Servers send ENOTSUP only for a fast zero they cannot do.
        an_unsupported_operation_is_einval: Unsupported => EINVAL,
            [kind(io::ErrorKind::Unsupported), os(libc::EOPNOTSUPP)];
    }

    #[test]
    fn fast_zero_is_refused_where_it_would_write() {
        let dev = sparse();
        let cmd = Command::WriteZeroes {
            offset: 0,
            len: 4096,
            fua: false,
            no_hole: true,
            fast: true,
        };
        assert!(matches!(
            run(&dev, cmd, &[], ReadShape::Sparse),
            Outcome::Failed { error: ENOTSUP, .. }
        ));
        let cmd = Command::WriteZeroes {
            offset: 1 << 20,
            len: 4096,
            fua: true,
            no_hole: false,
            fast: true,
        };
        assert!(matches!(
            run(&dev, cmd, &[], ReadShape::Sparse),
            Outcome::Done
        ));
        let mut back = [1; 4096];
        dev.read_at(&mut back, 1 << 20).unwrap();
        assert_eq!(back, [0; 4096]);
    }
}
