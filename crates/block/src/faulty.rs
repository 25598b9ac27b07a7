//! A device that misbehaves on purpose, for crash and error-path tests.
//!
//! It acts like a disk with a volatile write cache: writes are held in an
//! overlay until `flush` (or a FUA write) carries them to the inner device,
//! so [`FaultyDevice::drop_unflushed`] simulates power loss by losing
//! exactly the writes no flush has covered. It can also fail reads or
//! writes and slow every call down.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::overlay::{Overlay, Pending};
use crate::{check_range, Allocation, BlockDevice, Capabilities};

pub struct FaultyDevice {
    inner: Arc<dyn BlockDevice>,
    /// Writes since the last flush. Reads hold the read lock across the
    /// inner read and the patch, so a concurrent flush can't slip between.
    pending: RwLock<Overlay>,
    fail_reads: AtomicBool,
    fail_writes: AtomicBool,
    delay: Mutex<Option<Duration>>,
}

fn injected(what: &str) -> io::Error {
    io::Error::other(format!("faulty device: injected {what} failure"))
}

impl FaultyDevice {
    pub fn new(inner: Arc<dyn BlockDevice>) -> FaultyDevice {
        FaultyDevice {
            inner,
            pending: RwLock::new(Overlay::default()),
            fail_reads: AtomicBool::new(false),
            fail_writes: AtomicBool::new(false),
            delay: Mutex::new(None),
        }
    }

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

    /// Sleep this long before every operation.
    pub fn set_delay(&self, delay: Option<Duration>) {
        *self.delay.lock() = delay;
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

    fn queue(&self, offset: u64, change: Pending) -> io::Result<()> {
        check_range(self.inner.size(), offset, change.len())?;
        self.before_write()?;
        self.pending.write().insert(offset, change);
        Ok(())
    }
}

impl BlockDevice for FaultyDevice {
    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.inner.size(), offset, buf.len() as u64)?;
        self.pause();
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(injected("read"));
        }
        let pending = self.pending.read();
        self.inner.read_at(buf, offset)?;
        pending.patch(buf, offset);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        if !fua {
            return self.queue(offset, Pending::Data(buf.to_vec()));
        }
        check_range(self.inner.size(), offset, buf.len() as u64)?;
        self.before_write()?;
        // Stable at once; only this write, not the other cached ones.
        let mut pending = self.pending.write();
        self.inner.write_at(buf, offset, true)?;
        pending.punch(offset, offset + buf.len() as u64);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.before_write()?;
        let mut pending = self.pending.write();
        for (offset, change) in pending.iter() {
            match change {
                Pending::Data(data) => self.inner.write_at(data, offset, false)?,
                Pending::Zeroes(len) => self.inner.write_zeroes(offset, *len)?,
                Pending::Discard(len) => self.inner.discard(offset, *len)?,
            }
        }
        self.inner.flush()?;
        pending.clear();
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.queue(offset, Pending::Discard(len))
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.queue(offset, Pending::Zeroes(len))
    }

    fn allocation(&self, offset: u64, len: u64) -> io::Result<(Allocation, u64)> {
        check_range(self.inner.size(), offset, len)?;
        let pending = self.pending.read();
        let (containing, next) = pending.at(offset);
        if let Some((start, change)) = containing {
            let state = match change {
                Pending::Data(_) => Allocation::Mapped,
                _ if self.inner.capabilities().thin => Allocation::Deallocated,
                _ => Allocation::Mapped,
            };
            return Ok((state, (start + change.len() - offset).min(len)));
        }
        // Inner state, but only up to where the next pending change starts.
        let limit = next.map_or(len, |n| (n - offset).min(len));
        self.inner.allocation(offset, limit)
    }

    fn granularity(&self) -> u64 {
        self.inner.granularity()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            volatile_cache: true,
            // Delays sleep in the calling thread.
            may_block: true,
            discard_zeroes: true,
            ..self.inner.capabilities()
        }
    }

    fn describe(&self) -> String {
        format!("faulty({})", self.inner.describe())
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
