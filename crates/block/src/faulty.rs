//! A device that misbehaves on purpose, for crash and error-path tests and
//! for admins rehearsing failures (`kind = "faulty"`).
//!
//! It acts like a disk with a volatile write cache: writes are held in an
//! overlay until `flush` (or a FUA write) carries them to the child, so
//! [`Faults::drop_unflushed`] simulates power loss by losing exactly the
//! writes no flush has covered. It can also fail reads or writes, corrupt
//! ranges silently, and slow every call down.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::overlay::{Overlay, Pending};
use crate::wrapper::{Wrapped, Wrapper};
use crate::{check_range, Allocation, AtomicWrites, BlockDevice, Capabilities};

/// The faults of a [`FaultyDevice`], set live.
#[derive(Default)]
pub struct Faults {
    /// Writes since the last flush. Reads hold the read lock across the
    /// child's read and the patch, so a concurrent flush can't slip between.
    pending: RwLock<Overlay>,
    fail_reads: AtomicBool,
    fail_writes: AtomicBool,
    delay: Mutex<Option<Duration>>,
    /// Ranges whose stored bytes read back inverted until rewritten, as
    /// silently corrupted media would.
    corrupt: Mutex<Vec<(u64, u64)>>,
}

/// A device with [`Faults`] over its child.
pub type FaultyDevice = Wrapped<Faults>;

impl Wrapped<Faults> {
    pub fn new(inner: Arc<dyn BlockDevice>) -> FaultyDevice {
        Wrapped::over(inner, Faults::default())
    }
}

fn injected(what: &str) -> io::Error {
    io::Error::other(format!("faulty device: injected {what} failure"))
}

impl Faults {
    /// Loses every write, discard and zeroing since the last flush, as a
    /// power cut would.
    pub fn drop_unflushed(&self) {
        self.pending.write().clear();
    }

    pub fn set_fail_writes(&self, fail: bool) {
        self.fail_writes.store(fail, Ordering::SeqCst);
    }

    pub fn set_fail_reads(&self, fail: bool) {
        self.fail_reads.store(fail, Ordering::SeqCst);
    }

    /// Whether reads and writes fail.
    pub fn failing(&self) -> (bool, bool) {
        (
            self.fail_reads.load(Ordering::SeqCst),
            self.fail_writes.load(Ordering::SeqCst),
        )
    }

    /// The ranges that read back corrupted, as (start, end).
    pub fn corrupt_ranges(&self) -> Vec<(u64, u64)> {
        self.corrupt.lock().clone()
    }

    /// Sleep this long before every operation.
    pub fn set_delay(&self, delay: Option<Duration>) {
        *self.delay.lock() = delay;
    }

    /// Make `len` bytes at `offset` read back with every bit inverted, and
    /// no error, until they are written again.
    pub fn corrupt(&self, offset: u64, len: u64) {
        if len > 0 {
            self.corrupt
                .lock()
                .push((offset, offset.saturating_add(len)));
        }
    }

    /// Clear every fault: no failures, no corruption, no delay. Unflushed
    /// writes stay (they are not a fault).
    pub fn heal(&self) {
        self.set_fail_reads(false);
        self.set_fail_writes(false);
        self.set_delay(None);
        self.corrupt.lock().clear();
    }

    /// Bytes of written data waiting for a flush.
    pub fn unflushed_bytes(&self) -> u64 {
        self.pending.read().data_bytes()
    }

    fn pause(&self) {
        let delay = *self.delay.lock();
        if let Some(d) = delay {
            std::thread::sleep(d);
        }
    }

    fn before_write(&self) -> io::Result<()> {
        self.pause();
        if self.fail_writes.load(Ordering::SeqCst) {
            return Err(injected("write"));
        }
        Ok(())
    }

    fn queue(&self, child: &dyn BlockDevice, offset: u64, change: Pending) -> io::Result<()> {
        check_range(child.size(), offset, change.len())?;
        self.before_write()?;
        self.rewritten(offset, change.len());
        self.pending.write().insert(offset, change);
        Ok(())
    }

    /// Bytes written again are no longer corrupt.
    fn rewritten(&self, offset: u64, len: u64) {
        let end = offset.saturating_add(len);
        let mut corrupt = self.corrupt.lock();
        if corrupt.is_empty() {
            return;
        }
        let mut kept = Vec::with_capacity(corrupt.len());
        for &(s, e) in corrupt.iter() {
            if e <= offset || s >= end {
                kept.push((s, e));
                continue;
            }
            if s < offset {
                kept.push((s, offset));
            }
            if e > end {
                kept.push((end, e));
            }
        }
        *corrupt = kept;
    }

    fn invert_corrupt(&self, buf: &mut [u8], offset: u64) {
        let end = offset + buf.len() as u64;
        for &(s, e) in self.corrupt.lock().iter() {
            let (from, to) = (s.max(offset), e.min(end));
            if from < to {
                for b in &mut buf[(from - offset) as usize..(to - offset) as usize] {
                    *b = !*b;
                }
            }
        }
    }
}

impl Wrapper for Faults {
    fn describe(&self, child: &dyn BlockDevice) -> String {
        format!("faulty({})", child.describe())
    }

    fn read_at(&self, child: &dyn BlockDevice, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(child.size(), offset, buf.len() as u64)?;
        self.pause();
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(injected("read"));
        }
        let pending = self.pending.read();
        child.read_at(buf, offset)?;
        pending.patch(buf, offset);
        drop(pending);
        self.invert_corrupt(buf, offset);
        Ok(())
    }

    fn write_at(
        &self,
        child: &dyn BlockDevice,
        buf: &[u8],
        offset: u64,
        fua: bool,
    ) -> io::Result<()> {
        if !fua {
            return self.queue(child, offset, Pending::Data(buf.to_vec()));
        }
        check_range(child.size(), offset, buf.len() as u64)?;
        self.before_write()?;
        // Stable at once; only this write, not the other cached ones.
        let mut pending = self.pending.write();
        child.write_at(buf, offset, true)?;
        pending.punch(offset, offset + buf.len() as u64);
        self.rewritten(offset, buf.len() as u64);
        Ok(())
    }

    /// The child's atomic writes, written through: were one held in the
    /// overlay, a flush would carry it to the child as plain writes, which
    /// a crash of the child could tear. Written through, the overlay's
    /// copy of the range is dropped, as a FUA write drops it.
    fn atomic_writes(&self, child: &dyn BlockDevice) -> Option<AtomicWrites> {
        child.atomic_writes()
    }

    fn write_atomic(
        &self,
        child: &dyn BlockDevice,
        buf: &[u8],
        offset: u64,
        fua: bool,
    ) -> io::Result<()> {
        check_range(child.size(), offset, buf.len() as u64)?;
        self.before_write()?;
        let mut pending = self.pending.write();
        child.write_atomic(buf, offset, fua)?;
        pending.punch(offset, offset + buf.len() as u64);
        self.rewritten(offset, buf.len() as u64);
        Ok(())
    }

    fn flush(&self, child: &dyn BlockDevice) -> io::Result<()> {
        self.before_write()?;
        let mut pending = self.pending.write();
        // Failing writes set while this flush waited for the lock win: a
        // power cut rehearsed as `fail` then `drop_unflushed` must not let
        // a flush that lost its data report success.
        if self.fail_writes.load(Ordering::SeqCst) {
            return Err(injected("write"));
        }
        for (offset, change) in pending.iter() {
            match change {
                Pending::Data(data) => child.write_at(data, offset, false)?,
                Pending::Zeroes(len) => child.write_zeroes(offset, *len)?,
                Pending::Discard(len) => child.discard(offset, *len)?,
            }
        }
        child.flush()?;
        pending.clear();
        Ok(())
    }

    fn discard(&self, child: &dyn BlockDevice, offset: u64, len: u64) -> io::Result<()> {
        self.queue(child, offset, Pending::Discard(len))
    }

    fn write_zeroes(&self, child: &dyn BlockDevice, offset: u64, len: u64) -> io::Result<()> {
        self.queue(child, offset, Pending::Zeroes(len))
    }

    fn allocate_zeroes(&self, child: &dyn BlockDevice, offset: u64, len: u64) -> io::Result<()> {
        // Written zeros, never a deallocation, cached like any write.
        const CHUNK: u64 = 1 << 20;
        let zeros = vec![0u8; CHUNK.min(len) as usize];
        let mut done = 0;
        while done < len {
            let n = CHUNK.min(len - done);
            self.write_at(child, &zeros[..n as usize], offset + done, false)?;
            done += n;
        }
        Ok(())
    }

    fn allocation(
        &self,
        child: &dyn BlockDevice,
        offset: u64,
        len: u64,
    ) -> io::Result<(Allocation, u64)> {
        check_range(child.size(), offset, len)?;
        let pending = self.pending.read();
        let (containing, next) = pending.at(offset);
        if let Some((start, change)) = containing {
            let state = match change {
                Pending::Data(_) => Allocation::Mapped,
                _ if child.capabilities().thin => Allocation::Deallocated,
                _ => Allocation::Mapped,
            };
            return Ok((state, (start + change.len() - offset).min(len)));
        }
        // The child's state, but only up to where the next pending change
        // starts.
        let limit = next.map_or(len, |n| (n - offset).min(len));
        child.allocation(offset, limit)
    }

    fn capabilities(&self, child: &dyn BlockDevice) -> Capabilities {
        Capabilities {
            volatile_cache: true,
            // Delays sleep in the calling thread.
            may_block: true,
            discard_zeroes: true,
            ..child.capabilities()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;
    use proptest::prelude::*;
    use std::time::Instant;

    fn faulty(size: u64) -> (Arc<MemDevice>, FaultyDevice) {
        let mem = Arc::new(MemDevice::new(size));
        (mem.clone(), FaultyDevice::new(mem))
    }

    fn read(dev: &dyn BlockDevice, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0; len];
        dev.read_at(&mut buf, offset).unwrap();
        buf
    }

    #[test]
    fn unflushed_writes_are_visible_then_lost() {
        let (mem, dev) = faulty(1 << 20);
        dev.write_at(&[1; 4096], 0, false).unwrap();
        dev.flush().unwrap();
        dev.write_at(&[2; 4096], 2048, false).unwrap();
        assert_eq!(
            read(&dev, 2000, 200),
            [[1u8; 48].as_slice(), &[2u8; 152]].concat()
        );
        // The inner device only has the flushed data.
        assert_eq!(
            read(mem.as_ref(), 2048, 4096),
            [[1u8; 2048].as_slice(), &[0u8; 2048]].concat()
        );
        assert_eq!(dev.unflushed_bytes(), 4096);
        dev.drop_unflushed();
        assert_eq!(
            read(&dev, 0, 6144),
            [[1u8; 4096].as_slice(), &[0u8; 2048]].concat()
        );
        assert_eq!(dev.unflushed_bytes(), 0);
    }

    #[test]
    fn fua_write_survives_a_drop_but_others_do_not() {
        let (_, dev) = faulty(1 << 20);
        dev.write_at(&[3; 1024], 0, false).unwrap();
        dev.write_at(&[4; 512], 256, true).unwrap();
        dev.drop_unflushed();
        let back = read(&dev, 0, 1024);
        assert_eq!(&back[..256], &[0; 256]);
        assert_eq!(&back[256..768], &[4; 512]);
        assert_eq!(&back[768..], &[0; 256]);
    }

    #[test]
    fn atomic_writes_go_through_to_a_child_that_has_them() {
        let (mem, dev) = faulty(1 << 20);
        assert_eq!(dev.atomic_writes(), mem.atomic_writes());
        dev.write_at(&[3; 1024], 0, false).unwrap();
        dev.write_atomic(&[6; 512], 256, false).unwrap();
        assert_eq!(
            read(mem.as_ref(), 256, 512),
            vec![6; 512],
            "written through"
        );
        dev.drop_unflushed();
        let back = read(&dev, 0, 1024);
        assert_eq!(&back[..256], &[0; 256]);
        assert_eq!(&back[256..768], &[6; 512]);
        dev.set_fail_writes(true);
        assert!(dev.write_atomic(&[7; 512], 0, false).is_err());
        assert_eq!(
            read(mem.as_ref(), 0, 512)[..256],
            [0; 256],
            "nothing written"
        );
    }

    #[test]
    fn discard_is_cached_like_a_write() {
        let (_, dev) = faulty(1 << 20);
        dev.write_at(&[5; 65536], 0, false).unwrap();
        dev.flush().unwrap();
        dev.discard(0, 65536).unwrap();
        assert_eq!(read(&dev, 0, 16), [0; 16]);
        assert_eq!(
            dev.allocation(0, 65536).unwrap(),
            (Allocation::Deallocated, 65536)
        );
        dev.drop_unflushed();
        assert_eq!(read(&dev, 0, 16), [5; 16]);
        dev.write_zeroes(0, 65536).unwrap();
        dev.flush().unwrap();
        dev.drop_unflushed();
        assert_eq!(read(&dev, 100, 16), [0; 16]);
    }

    #[test]
    fn injected_failures_and_delay() {
        let (_, dev) = faulty(1 << 20);
        dev.set_fail_writes(true);
        assert!(dev.write_at(&[1], 0, false).is_err());
        assert!(dev.write_at(&[1], 0, true).is_err());
        assert!(dev.flush().is_err());
        assert!(dev.discard(0, 512).is_err());
        dev.set_fail_writes(false);
        dev.write_at(&[1], 0, false).unwrap();
        dev.set_fail_reads(true);
        assert!(dev.read_at(&mut [0], 0).is_err());
        dev.set_fail_reads(false);
        dev.set_delay(Some(Duration::from_millis(20)));
        let start = Instant::now();
        dev.read_at(&mut [0], 0).unwrap();
        assert!(start.elapsed() >= Duration::from_millis(20));
        dev.set_delay(None);
    }

    #[test]
    fn corruption_reads_back_inverted_until_rewritten_or_healed() {
        let (_, dev) = faulty(1 << 20);
        dev.write_at(&[0x0f; 4096], 0, false).unwrap();
        dev.flush().unwrap();
        dev.corrupt(1000, 100);
        let back = read(&dev, 900, 300);
        assert_eq!(&back[..100], &[0x0f; 100]);
        assert_eq!(&back[100..200], &[0xf0; 100], "silently wrong");
        assert_eq!(&back[200..], &[0x0f; 100]);
        // A write over part of the range makes that part good again.
        dev.write_at(&[7; 50], 1000, false).unwrap();
        assert_eq!(read(&dev, 1000, 100), [[7u8; 50], [0xf0; 50]].concat());
        dev.heal();
        assert_eq!(read(&dev, 1050, 50), [0x0f; 50]);
        dev.set_fail_reads(true);
        dev.heal();
        dev.read_at(&mut [0], 0).unwrap();
    }

    #[test]
    fn allocation_sees_pending_data_over_unmapped_inner() {
        let (_, dev) = faulty(1 << 20);
        dev.write_at(&[1; 100], 70000, false).unwrap();
        assert_eq!(
            dev.allocation(0, 1 << 20).unwrap(),
            (Allocation::Deallocated, 70000)
        );
        assert_eq!(
            dev.allocation(70000, 1000).unwrap(),
            (Allocation::Mapped, 100)
        );
    }

    #[derive(Clone, Debug)]
    enum Op {
        Write {
            offset: u64,
            len: u64,
            byte: u8,
            fua: bool,
        },
        Discard {
            offset: u64,
            len: u64,
        },
        Flush,
        Drop,
    }

    const SIZE: u64 = 3 * 65536;

    fn op() -> impl Strategy<Value = Op> {
        let range = (0..SIZE).prop_flat_map(|o| (Just(o), 0..=(SIZE - o).min(40000)));
        prop_oneof![
            4 => (range.clone(), any::<u8>(), any::<bool>())
                .prop_map(|((offset, len), byte, fua)| Op::Write { offset, len, byte, fua }),
            1 => range.prop_map(|(offset, len)| Op::Discard { offset, len }),
            1 => Just(Op::Flush),
            1 => Just(Op::Drop),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Model: `durable` is what survives power loss, `visible` what
        /// reads return.
        #[test]
        fn drop_loses_exactly_the_unflushed_changes(ops in proptest::collection::vec(op(), 1..30)) {
            let (mem, dev) = faulty(SIZE);
            let mut durable = vec![0u8; SIZE as usize];
            let mut visible = durable.clone();
            for op in ops {
                match op {
                    Op::Write { offset, len, byte, fua } => {
                        let r = offset as usize..(offset + len) as usize;
                        dev.write_at(&vec![byte; len as usize], offset, fua).unwrap();
                        visible[r.clone()].fill(byte);
                        if fua {
                            durable[r].fill(byte);
                        }
                    }
                    Op::Discard { offset, len } => {
                        dev.discard(offset, len).unwrap();
                        visible[offset as usize..(offset + len) as usize].fill(0);
                    }
                    Op::Flush => {
                        dev.flush().unwrap();
                        durable.copy_from_slice(&visible);
                    }
                    Op::Drop => {
                        dev.drop_unflushed();
                        visible.copy_from_slice(&durable);
                    }
                }
                prop_assert_eq!(&read(&dev, 0, SIZE as usize), &visible);
                prop_assert_eq!(&read(mem.as_ref(), 0, SIZE as usize), &durable);
            }
        }
    }
}
