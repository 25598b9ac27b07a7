//! The mirror's metadata on its local device, at the device's end.
//!
//! ```text
//! 0 ............ data_size | slot 0 (4 KiB) | slot 1 (4 KiB) | bitmap image
//! ```
//!
//! At the end rather than the start so that the replica's data sits at
//! the same offsets as the mirror's: the local device can be read alone
//! (to recover from it without the mirror), as with DRBD's internal
//! metadata. The header alternates between two slots with a sequence
//! number, each with a CRC, so a write torn by a power cut leaves the
//! previous header readable. Both are written with FUA: a write that
//! depends on them starts only once they are stable.

use std::io;

use block::{BlockDevice, DeviceError, ErrorClass};
use regions::{bitmap_bytes, RegionSet};

use super::generations::Generations;

const MAGIC: &[u8; 8] = b"OAMIRROR";
const VERSION: u32 = 1;
const SLOT: u64 = 4096;
/// The smallest region; larger devices get larger ones so that the
/// bitmap stays within [`MAX_REGIONS`] bits.
const MIN_REGION: u64 = 64 << 10;
const MAX_REGIONS: u64 = 1 << 20;

/// Where things are on a local device of a given size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub device_size: u64,
    /// Bytes the mirror serves, from offset 0.
    pub data_size: u64,
    pub region_size: u64,
    pub regions: u64,
}

impl Layout {
    pub fn for_device(device_size: u64) -> io::Result<Layout> {
        let mut region_size = MIN_REGION;
        while device_size.div_ceil(region_size) > MAX_REGIONS {
            region_size *= 2;
        }
        let regions = device_size.div_ceil(region_size).max(1);
        let meta = 2 * SLOT + bitmap_bytes(regions) as u64;
        if device_size < meta + MIN_REGION {
            return Err(DeviceError::new(
                ErrorClass::Invalid,
                format!(
                    "a mirror needs a device of at least {} bytes (this one has {device_size})",
                    meta + MIN_REGION
                ),
            )
            .into());
        }
        Ok(Layout {
            device_size,
            data_size: (device_size - meta) & !(SLOT - 1),
            region_size,
            regions,
        })
    }

    fn slot_offset(&self, slot: u64) -> u64 {
        self.data_size + slot * SLOT
    }

    fn bitmap_offset(&self) -> u64 {
        self.data_size + 2 * SLOT
    }

    /// The regions `len` bytes at `offset` touch (`len` > 0).
    pub fn regions_of(&self, offset: u64, len: u64) -> std::ops::RangeInclusive<u64> {
        offset / self.region_size..=(offset + len - 1) / self.region_size
    }

    /// The bytes of region `r` inside the data area.
    pub fn region_range(&self, r: u64) -> (u64, u64) {
        let start = r * self.region_size;
        let end = (start + self.region_size).min(self.data_size);
        (start, end.saturating_sub(start))
    }
}

/// The header's contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub seq: u64,
    pub generations: Generations,
    /// This replica was primary when last written: after a crash with the
    /// same generation as its peer, it is the one to copy from.
    pub was_primary: bool,
    /// A resync into this replica began and did not end: its data is a
    /// mix of two generations and must never be served.
    pub inconsistent: bool,
}

impl Header {
    fn encode(&self, layout: &Layout) -> Vec<u8> {
        let mut b = Vec::with_capacity(SLOT as usize);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        for v in [
            self.seq,
            layout.device_size,
            layout.region_size,
            self.generations.current,
            self.generations.bitmap,
            self.generations.history[0],
            self.generations.history[1],
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        let flags = self.was_primary as u32 | (self.inconsistent as u32) << 1;
        b.extend_from_slice(&flags.to_le_bytes());
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b.resize(SLOT as usize, 0);
        b
    }

    /// `Ok(None)`: no header of ours; `Err`: ours but damaged or foreign.
    fn decode(b: &[u8], layout: &Layout) -> Result<Option<Header>, String> {
        if b.len() < 80 || &b[..8] != MAGIC {
            return Ok(None);
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let version = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        let flags = u32::from_le_bytes([b[68], b[69], b[70], b[71]]);
        let crc = u32::from_le_bytes([b[72], b[73], b[74], b[75]]);
        if crc != crc32c::crc32c(&b[..72]) {
            return Err("mirror metadata checksum mismatch".into());
        }
        if version != VERSION {
            return Err(format!(
                "mirror metadata version {version} is not supported"
            ));
        }
        let (size, region) = (u64_at(20), u64_at(28));
        if size != layout.device_size || region != layout.region_size {
            return Err(format!(
                "the mirror metadata was written for a device of {size} bytes (this one has {})",
                layout.device_size
            ));
        }
        Ok(Some(Header {
            seq: u64_at(12),
            generations: Generations {
                current: u64_at(36),
                bitmap: u64_at(44),
                history: [u64_at(52), u64_at(60)],
            },
            was_primary: flags & 1 != 0,
            inconsistent: flags & 2 != 0,
        }))
    }
}

fn corrupt(why: String) -> io::Error {
    DeviceError::new(ErrorClass::NotReady, why).into()
}

/// Reads the newest valid header and the bitmap, or formats a device
/// that holds no metadata of ours yet.
pub fn load(dev: &dyn BlockDevice, layout: &Layout) -> io::Result<(Header, RegionSet)> {
    let mut best: Option<Header> = None;
    let mut damage = None;
    for slot in 0..2 {
        let mut b = vec![0u8; SLOT as usize];
        dev.read_at(&mut b, layout.slot_offset(slot))?;
        match Header::decode(&b, layout) {
            Ok(Some(h)) if best.is_none_or(|b| h.seq > b.seq) => best = Some(h),
            Ok(_) => {}
            Err(e) => damage = Some(e),
        }
    }
    match (best, damage) {
        (Some(h), _) => {
            let mut image = vec![0u8; bitmap_bytes(layout.regions)];
            dev.read_at(&mut image, layout.bitmap_offset())?;
            Ok((h, RegionSet::from_bytes(&image, layout.regions)))
        }
        (None, Some(e)) => Err(corrupt(e)),
        (None, None) => {
            let h = Header {
                seq: 0,
                generations: Generations::fresh(),
                was_primary: false,
                inconsistent: false,
            };
            let empty = RegionSet::new(layout.regions);
            write_bitmap(dev, layout, &empty.to_bytes(bitmap_bytes(layout.regions)))?;
            let h = write_header(dev, layout, &h)?;
            Ok((h, empty))
        }
    }
}

/// Writes `h` with the next sequence number into the other slot.
pub fn write_header(dev: &dyn BlockDevice, layout: &Layout, h: &Header) -> io::Result<Header> {
    let next = Header {
        seq: h.seq + 1,
        ..*h
    };
    dev.write_at(&next.encode(layout), layout.slot_offset(next.seq % 2), true)?;
    Ok(next)
}

pub fn write_bitmap(dev: &dyn BlockDevice, layout: &Layout, image: &[u8]) -> io::Result<()> {
    dev.write_at(image, layout.bitmap_offset(), true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use block::MemDevice;

    #[test]
    fn a_new_device_is_formatted_and_headers_alternate() {
        let dev = MemDevice::new(16 << 20);
        let layout = Layout::for_device(16 << 20).unwrap();
        assert_eq!(layout.region_size, 64 << 10);
        assert_eq!(layout.data_size, (16 << 20) - 3 * 4096);
        let (h, bits) = load(&dev, &layout).unwrap();
        assert_eq!(h.generations, Generations::fresh());
        assert!(bits.is_empty());
        let mut g = h.generations;
        g.start_tracking();
        let h2 = write_header(
            &dev,
            &layout,
            &Header {
                generations: g,
                was_primary: true,
                ..h
            },
        )
        .unwrap();
        let mut set = RegionSet::new(layout.regions);
        set.set(3, true);
        write_bitmap(&dev, &layout, &set.to_bytes(4096)).unwrap();
        let (back, bits) = load(&dev, &layout).unwrap();
        assert_eq!(back, h2);
        assert_eq!(bits, set);
        // A torn newest slot leaves the one before.
        let torn = vec![0xaa; 4096];
        let mut newest = MAGIC.to_vec();
        newest.extend_from_slice(&torn[8..]);
        dev.write_at(&newest, layout.slot_offset(h2.seq % 2), false)
            .unwrap();
        assert_eq!(load(&dev, &layout).unwrap().0, h);
        // Both damaged: refused, never formatted over.
        dev.write_at(&newest, layout.slot_offset(h.seq % 2), false)
            .unwrap();
        assert!(load(&dev, &layout).is_err());
    }

    #[test]
    fn large_devices_get_larger_regions_and_other_sizes_are_refused() {
        let l = Layout::for_device(1 << 40).unwrap();
        assert!(l.regions <= MAX_REGIONS && l.region_size == 1 << 20);
        let dev = MemDevice::new(16 << 20);
        let small = Layout::for_device(16 << 20).unwrap();
        load(&dev, &small).unwrap();
        let other = Layout {
            device_size: 32 << 20,
            ..small
        };
        let e = load(&dev, &other).unwrap_err();
        assert!(e.to_string().contains("16777216"), "{e}");
        assert!(Layout::for_device(4096).is_err());
    }
}
