//! Where physical units live: the data devices, each starting with a
//! superblock unit that names the pool and the device's place in it.

use std::io;
use std::ops::Range;
use std::sync::Arc;

use block::{BlockDevice, MappedBytes};

const MAGIC: &[u8; 8] = b"OAPOOLv1";
/// Bytes of the superblock actually used; the rest of unit 0 is zeros.
const SUPERBLOCK_LEN: usize = 8 + 16 + 8 + 4 + 4 + 8;

/// The identity written at the start of every data device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub pool_id: u128,
    pub unit_size: u64,
    pub index: u32,
    pub device_count: u32,
    /// Data units on this device (after the superblock unit).
    pub units: u64,
}

impl Superblock {
    pub fn encode(&self) -> [u8; SUPERBLOCK_LEN] {
        let mut out = [0u8; SUPERBLOCK_LEN];
        out[0..8].copy_from_slice(MAGIC);
        out[8..24].copy_from_slice(&self.pool_id.to_le_bytes());
        out[24..32].copy_from_slice(&self.unit_size.to_le_bytes());
        out[32..36].copy_from_slice(&self.index.to_le_bytes());
        out[36..40].copy_from_slice(&self.device_count.to_le_bytes());
        out[40..48].copy_from_slice(&self.units.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> io::Result<Superblock> {
        let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_string());
        if bytes.len() < SUPERBLOCK_LEN || &bytes[0..8] != MAGIC {
            return Err(bad("no pool superblock on the device"));
        }
        let field = |r: std::ops::Range<usize>| bytes[r].to_vec();
        let u64_at = |r| u64::from_le_bytes(field(r).try_into().unwrap_or([0; 8]));
        let u32_at = |r| u32::from_le_bytes(field(r).try_into().unwrap_or([0; 4]));
        Ok(Superblock {
            pool_id: u128::from_le_bytes(field(8..24).try_into().unwrap_or([0; 16])),
            unit_size: u64_at(24..32),
            index: u32_at(32..36),
            device_count: u32_at(36..40),
            units: u64_at(40..48),
        })
    }

    pub fn read_from(device: &dyn BlockDevice) -> io::Result<Superblock> {
        let mut buf = vec![0u8; SUPERBLOCK_LEN];
        if device.size() < SUPERBLOCK_LEN as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "device too small for a pool",
            ));
        }
        device.read_at(&mut buf, 0)?;
        Superblock::decode(&buf)
    }
}

/// One data device and the global unit numbers it holds.
struct Slot {
    device: Arc<dyn BlockDevice>,
    first_unit: u64,
    units: u64,
}

/// The data devices of a pool, addressed by global unit number.
pub struct Layout {
    unit_size: u64,
    slots: Vec<Slot>,
    total_units: u64,
}

impl Layout {
    /// Data units a device of `size` bytes holds with this unit size (the
    /// first unit is the superblock).
    pub fn units_for(size: u64, unit_size: u64) -> u64 {
        (size / unit_size).saturating_sub(1)
    }

    pub fn new(unit_size: u64, devices: Vec<(Arc<dyn BlockDevice>, u64)>) -> Layout {
        let mut slots = Vec::with_capacity(devices.len());
        let mut next = 0;
        for (device, units) in devices {
            slots.push(Slot {
                device,
                first_unit: next,
                units,
            });
            next += units;
        }
        Layout {
            unit_size,
            slots,
            total_units: next,
        }
    }

    pub fn unit_size(&self) -> u64 {
        self.unit_size
    }

    pub fn total_units(&self) -> u64 {
        self.total_units
    }

    /// Device and byte offset of `offset` inside physical unit `unit`.
    fn locate(&self, unit: u64, offset: u64) -> io::Result<(&dyn BlockDevice, u64)> {
        let slot = self
            .slots
            .iter()
            .find(|s| unit >= s.first_unit && unit < s.first_unit + s.units)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("physical unit {unit} is outside the pool"),
                )
            })?;
        let local = unit - slot.first_unit + 1;
        Ok((&*slot.device, local * self.unit_size + offset))
    }

    /// Whether unit `next` starts where `unit` ends, on the same device.
    pub fn follows(&self, unit: u64, next: u64) -> bool {
        next == unit + 1
            && self
                .slots
                .iter()
                .any(|s| unit >= s.first_unit && next < s.first_unit + s.units)
    }

    /// `len` bytes at `offset` of `unit`, for a transport to send from
    /// the device's pages (`BlockDevice::mapped_bytes`), where it can.
    pub fn mapped_bytes(&self, unit: u64, offset: u64, len: usize) -> Option<MappedBytes> {
        let (device, at) = self.locate(unit, offset).ok()?;
        device.mapped_bytes(at, len)
    }

    pub fn read(&self, unit: u64, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let (device, at) = self.locate(unit, offset)?;
        device.read_at(buf, at)
    }

    pub fn write(&self, unit: u64, offset: u64, buf: &[u8], fua: bool) -> io::Result<()> {
        let (device, at) = self.locate(unit, offset)?;
        device.write_at(buf, at, fua)
    }

    /// Writes `data` at `offset` of a unit just taken from the free ones,
    /// so that the rest of the unit reads as zeros.
    pub fn fill_fresh(&self, unit: u64, offset: u64, data: &[u8]) -> io::Result<()> {
        let (device, at) = self.locate(unit, 0)?;
        if data.len() as u64 == self.unit_size {
            return device.write_at(data, at, false);
        }
        if device.capabilities().discard_zeroes {
            // Zeroing by deallocation (a hole punched in a file) costs one
            // call instead of a unit's worth of writes, and the unwritten
            // rest of the unit takes no space. The next flush, which comes
            // before the mapping commits, makes the hole durable too.
            device.write_zeroes(at, self.unit_size)?;
            return device.write_at(data, at + offset, false);
        }
        let zeros = vec![0u8; self.unit_size as usize];
        write_over(device, at, zeros, offset, data)
    }

    /// Writes `data` at `offset` of unit `to`, just taken from the free
    /// ones, and the rest of the unit as unit `from` (which a snapshot
    /// shares) has it: copied inside the devices where they can, through
    /// a buffer otherwise.
    pub fn fill_copy(&self, from: u64, to: u64, offset: u64, data: &[u8]) -> io::Result<()> {
        if data.len() as u64 == self.unit_size {
            return self.fill_fresh(to, offset, data);
        }
        let (dst, dst_at) = self.locate(to, 0)?;
        if self.copy_unit_around(from, to, offset..offset + data.len() as u64)? {
            return dst.write_at(data, dst_at + offset, false);
        }
        let mut shared = vec![0u8; self.unit_size as usize];
        self.read(from, 0, &mut shared)?;
        write_over(dst, dst_at, shared, offset, data)
    }

    /// Makes a unit read as zeros with its space set aside (a thick
    /// volume's), without writing them where the device can.
    pub fn allocate_zeroes(&self, unit: u64) -> io::Result<()> {
        let (device, at) = self.locate(unit, 0)?;
        device.allocate_zeroes(at, self.unit_size)
    }

    /// Fills unit `to` with the bytes of unit `from` outside `keep`, where
    /// the caller writes its own, when the devices copy between themselves
    /// (files: inside the kernel). False: they cannot, nothing was done.
    fn copy_unit_around(&self, from: u64, to: u64, keep: Range<u64>) -> io::Result<bool> {
        let (src, src_at) = self.locate(from, 0)?;
        let (dst, dst_at) = self.locate(to, 0)?;
        let mut copied_any = false;
        for part in [0..keep.start, keep.end..self.unit_size] {
            if part.is_empty() {
                continue;
            }
            let (at, len) = (part.start, part.end - part.start);
            match dst.copy_from(src, src_at + at, dst_at + at, len) {
                Some(done) => done?,
                None if !copied_any => return Ok(false),
                None => {
                    let mut buf = vec![0u8; len as usize];
                    src.read_at(&mut buf, src_at + at)?;
                    dst.write_at(&buf, dst_at + at, false)?;
                }
            }
            copied_any = true;
        }
        Ok(copied_any)
    }

    /// Tell the devices a unit's content is no longer needed.
    pub fn release(&self, unit: u64) -> io::Result<()> {
        let (device, at) = self.locate(unit, 0)?;
        if device.capabilities().discard {
            device.discard(at, self.unit_size)?;
        }
        Ok(())
    }

    pub fn flush(&self) -> io::Result<()> {
        for slot in &self.slots {
            slot.device.flush()?;
        }
        Ok(())
    }
}

/// Writes a whole unit at `at` of `device`: `unit`'s bytes with `data`
/// laid over them at `offset`.
fn write_over(
    device: &dyn BlockDevice,
    at: u64,
    mut unit: Vec<u8>,
    offset: u64,
    data: &[u8],
) -> io::Result<()> {
    unit[offset as usize..offset as usize + data.len()].copy_from_slice(data);
    device.write_at(&unit, at, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use block::{Allocation, MemDevice};

    #[test]
    fn superblock_round_trip() {
        let sb = Superblock {
            pool_id: 0x1234_5678_9abc_def0_1122_3344_5566_7788,
            unit_size: 65536,
            index: 1,
            device_count: 2,
            units: 99,
        };
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
        assert!(Superblock::decode(&[0u8; 64]).is_err());
    }

    #[test]
    fn units_are_spread_over_devices_after_their_superblock() {
        let a: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(4 * 4096));
        let b: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(3 * 4096));
        let layout = Layout::new(4096, vec![(a.clone(), 3), (b.clone(), 2)]);
        assert_eq!(layout.total_units(), 5);
        layout.write(3, 10, b"xy", false).unwrap();
        let mut got = [0u8; 2];
        b.read_at(&mut got, 4096 + 10).unwrap();
        assert_eq!(&got, b"xy");
        layout.write(2, 0, b"z", false).unwrap();
        a.read_at(&mut got[..1], 3 * 4096).unwrap();
        assert_eq!(got[0], b'z');
        assert!(layout.write(5, 0, b"z", false).is_err());
    }

    /// A disk that cannot zero a range by deallocating it.
    struct NoCheapZeros;

    impl block::Wrapper for NoCheapZeros {
        fn write_zeroes(&self, _: &dyn BlockDevice, _: u64, _: u64) -> io::Result<()> {
            panic!("a unit's fill writes its zeros along with the data");
        }
        fn capabilities(&self, child: &dyn BlockDevice) -> block::Capabilities {
            block::Capabilities {
                discard_zeroes: false,
                ..child.capabilities()
            }
        }
        fn describe(&self, _: &dyn BlockDevice) -> String {
            "no-cheap-zeros".into()
        }
    }

    #[test]
    fn a_fresh_unit_reads_zeros_around_its_first_write() {
        // Four of the RAM device's allocation chunks per unit.
        const UNIT: u64 = 1 << 18;
        let mem = Arc::new(MemDevice::new(3 * UNIT));
        let devices: [Arc<dyn BlockDevice>; 2] = [
            mem.clone(),
            Arc::new(block::Wrapped::over(
                Arc::new(MemDevice::new(3 * UNIT)),
                NoCheapZeros,
            )),
        ];
        for device in devices {
            let layout = Layout::new(UNIT, vec![(device.clone(), 2)]);
            // What a unit's last owner left behind.
            layout.write(1, 0, &[0xAB; UNIT as usize], false).unwrap();
            layout.fill_fresh(1, 8192, &[7; 4096]).unwrap();
            let mut unit = vec![0xEE; UNIT as usize];
            layout.read(1, 0, &mut unit).unwrap();
            let mut expect = vec![0u8; UNIT as usize];
            expect[8192..12288].fill(7);
            assert!(unit == expect, "{}", device.describe());
        }
        // Where zeros come from deallocation, the rest takes no space.
        assert_eq!(
            mem.allocation(2 * UNIT + UNIT / 4, UNIT * 3 / 4).unwrap(),
            (Allocation::Deallocated, UNIT * 3 / 4)
        );
    }
}
