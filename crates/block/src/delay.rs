//! A device that is slower than its child, like dm-delay with limits: a
//! fixed latency on every call, and caps on operations and bytes a second,
//! to rehearse a slow disk under a pool, RAID or cache (`kind = "delay"`).

use std::io;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::wrapper::{Wrapped, Wrapper};
use crate::{AtomicWrites, BlockDevice, Capabilities};

/// The limits of a [`DelayDevice`], changeable live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DelayLimits {
    /// Added to every call.
    pub latency: Duration,
    /// Most reads and writes a second.
    pub iops: Option<u32>,
    /// Most bytes read and written a second.
    pub bandwidth: Option<u64>,
}

#[derive(Default)]
struct Schedule {
    limits: DelayLimits,
    /// When the next operation may start, by the IOPS cap.
    next_op: Option<Instant>,
    /// When the next byte may move, by the bandwidth cap.
    next_byte: Option<Instant>,
}

/// The delays of a [`DelayDevice`].
#[derive(Default)]
pub struct Delay(Mutex<Schedule>);

/// A device with [`Delay`] over its child.
pub type DelayDevice = Wrapped<Delay>;

impl Wrapped<Delay> {
    pub fn new(child: std::sync::Arc<dyn BlockDevice>, limits: DelayLimits) -> DelayDevice {
        let delay = Delay::default();
        delay.set_limits(limits);
        Wrapped::over(child, delay)
    }
}

impl Delay {
    pub fn set_limits(&self, limits: DelayLimits) {
        let mut s = self.0.lock();
        *s = Schedule {
            limits,
            ..Schedule::default()
        };
    }

    pub fn limits(&self) -> DelayLimits {
        self.0.lock().limits
    }

    /// Wait until an operation of `bytes` may end. Operations queue for
    /// their turn as on a real disk: each takes the next free slot of the
    /// caps, then the latency.
    fn wait(&self, bytes: u64, counts_as_op: bool) {
        let until = {
            let mut s = self.0.lock();
            let now = Instant::now();
            let mut start = now;
            if let (true, Some(iops)) = (counts_as_op, s.limits.iops) {
                let slot = s.next_op.map_or(now, |n| n.max(now));
                s.next_op = Some(slot + Duration::from_secs(1) / iops.max(1));
                start = start.max(slot);
            }
            if let (true, Some(bw)) = (bytes > 0, s.limits.bandwidth) {
                let slot = s.next_byte.map_or(now, |n| n.max(now));
                let takes = Duration::from_secs_f64(bytes as f64 / bw.max(1) as f64);
                s.next_byte = Some(slot + takes);
                start = start.max(slot + takes);
            }
            start + s.limits.latency
        };
        let now = Instant::now();
        if until > now {
            std::thread::sleep(until - now);
        }
    }
}

impl Wrapper for Delay {
    fn describe(&self, child: &dyn BlockDevice) -> String {
        format!("delay({})", child.describe())
    }

    fn read_at(&self, child: &dyn BlockDevice, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.wait(buf.len() as u64, true);
        child.read_at(buf, offset)
    }

    fn write_at(
        &self,
        child: &dyn BlockDevice,
        buf: &[u8],
        offset: u64,
        fua: bool,
    ) -> io::Result<()> {
        self.wait(buf.len() as u64, true);
        child.write_at(buf, offset, fua)
    }

    fn flush(&self, child: &dyn BlockDevice) -> io::Result<()> {
        self.wait(0, false);
        child.flush()
    }

    /// A delay changes when a write happens, not what it leaves after a
    /// crash: the child's atomic writes pass, slowed like any write.
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
        self.wait(buf.len() as u64, true);
        child.write_atomic(buf, offset, fua)
    }

    fn discard(&self, child: &dyn BlockDevice, offset: u64, len: u64) -> io::Result<()> {
        self.wait(0, true);
        child.discard(offset, len)
    }

    fn write_zeroes(&self, child: &dyn BlockDevice, offset: u64, len: u64) -> io::Result<()> {
        self.wait(0, true);
        child.write_zeroes(offset, len)
    }

    fn capabilities(&self, child: &dyn BlockDevice) -> Capabilities {
        Capabilities {
            // The waits sleep in the calling thread.
            may_block: true,
            ..child.capabilities()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;
    use std::sync::Arc;

    fn delayed(limits: DelayLimits) -> DelayDevice {
        DelayDevice::new(Arc::new(MemDevice::new(1 << 20)), limits)
    }

    #[test]
    fn the_childs_atomic_writes_pass_slowed() {
        let dev = delayed(DelayLimits {
            latency: Duration::from_millis(20),
            ..Default::default()
        });
        assert_eq!(
            dev.atomic_writes(),
            Some(crate::AtomicWrites::up_to(u64::MAX))
        );
        let start = Instant::now();
        dev.write_atomic(&[7; 512], 512, true).unwrap();
        assert!(start.elapsed() >= Duration::from_millis(20));
        let mut back = [0; 512];
        dev.read_at(&mut back, 512).unwrap();
        assert_eq!(back, [7; 512]);
    }

    #[test]
    fn latency_is_added_to_every_call() {
        let dev = delayed(DelayLimits {
            latency: Duration::from_millis(20),
            ..Default::default()
        });
        let start = Instant::now();
        dev.write_at(&[1; 512], 0, false).unwrap();
        dev.read_at(&mut [0; 512], 0).unwrap();
        dev.flush().unwrap();
        assert!(start.elapsed() >= Duration::from_millis(60));
        assert!(dev.capabilities().may_block);
    }

    #[test]
    fn iops_and_bandwidth_are_capped() {
        let dev = delayed(DelayLimits {
            iops: Some(100),
            ..Default::default()
        });
        let start = Instant::now();
        for _ in 0..21 {
            dev.read_at(&mut [0; 512], 0).unwrap();
        }
        // 21 operations at 100 a second: the last starts 200 ms in.
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(195), "{took:?}");
        assert!(took < Duration::from_millis(600), "{took:?}");

        dev.set_limits(DelayLimits {
            bandwidth: Some(1 << 20),
            ..Default::default()
        });
        let start = Instant::now();
        for _ in 0..4 {
            dev.write_at(&[0; 65536], 0, false).unwrap();
        }
        // 256 KiB at 1 MiB/s.
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(245), "{took:?}");
        assert_eq!(dev.limits().bandwidth, Some(1 << 20));
    }
}
