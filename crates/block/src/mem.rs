//! A thin RAM disk: memory is committed per chunk on first write and given
//! back on discard, so a large device costs nothing until it is used.

use std::collections::HashMap;
use std::io;

use parking_lot::RwLock;

use crate::{check_range, Allocation, AtomicWrites, BlockDevice, Capabilities};

/// Allocation unit. Small enough that scattered writes stay cheap, large
/// enough that the chunk table stays small.
const CHUNK_SHIFT: u32 = 16;
const CHUNK: u64 = 1 << CHUNK_SHIFT;

/// Chunks are spread over this many independently locked maps, so I/O to
/// different chunks rarely contends. Consecutive chunks land in different
/// stripes, which keeps large sequential transfers parallel too.
const STRIPES: usize = 64;

type Chunk = Box<[u8]>;

pub struct MemDevice {
    size: u64,
    stripes: Box<[RwLock<HashMap<u64, Chunk>>]>,
}

/// One piece of a byte range that falls inside a single chunk.
#[derive(Clone, Copy, Debug)]
struct Piece {
    chunk: u64,
    /// Offset inside the chunk.
    at: usize,
    /// Offset inside the caller's range.
    pos: usize,
    len: usize,
}

impl Piece {
    fn whole_chunk(&self) -> bool {
        self.at == 0 && self.len as u64 == CHUNK
    }
}

/// Splits `[offset, offset + len)` at chunk boundaries.
fn pieces(offset: u64, len: u64) -> impl Iterator<Item = Piece> {
    let end = offset + len;
    let mut cur = offset;
    std::iter::from_fn(move || {
        if cur >= end {
            return None;
        }
        let chunk = cur >> CHUNK_SHIFT;
        let at = cur & (CHUNK - 1);
        let n = (CHUNK - at).min(end - cur);
        let piece = Piece {
            chunk,
            at: at as usize,
            pos: (cur - offset) as usize,
            len: n as usize,
        };
        cur += n;
        Some(piece)
    })
}

impl MemDevice {
    pub fn new(size: u64) -> MemDevice {
        let stripes = (0..STRIPES).map(|_| RwLock::new(HashMap::new())).collect();
        MemDevice { size, stripes }
    }

    fn stripe(&self, chunk: u64) -> &RwLock<HashMap<u64, Chunk>> {
        &self.stripes[(chunk % STRIPES as u64) as usize]
    }

    /// Bytes of RAM currently committed to data.
    pub fn committed_bytes(&self) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.read().len() as u64)
            .sum::<u64>()
            * CHUNK
    }

    /// Makes `[offset, offset + len)` read as zeros, releasing every chunk
    /// the range covers completely or leaves all zero.
    fn zero_range(&self, offset: u64, len: u64) {
        for p in pieces(offset, len) {
            let mut map = self.stripe(p.chunk).write();
            if p.whole_chunk() {
                map.remove(&p.chunk);
                continue;
            }
            if let Some(data) = map.get_mut(&p.chunk) {
                data[p.at..p.at + p.len].fill(0);
                if data.iter().all(|&b| b == 0) {
                    map.remove(&p.chunk);
                }
            }
        }
    }
}

impl BlockDevice for MemDevice {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        for p in pieces(offset, buf.len() as u64) {
            let out = &mut buf[p.pos..p.pos + p.len];
            match self.stripe(p.chunk).read().get(&p.chunk) {
                Some(data) => out.copy_from_slice(&data[p.at..p.at + p.len]),
                None => out.fill(0),
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        for p in pieces(offset, buf.len() as u64) {
            let src = &buf[p.pos..p.pos + p.len];
            let mut map = self.stripe(p.chunk).write();
            match map.get_mut(&p.chunk) {
                Some(data) => data[p.at..p.at + p.len].copy_from_slice(src),
                // Zeros over an unmapped chunk change nothing: stay thin.
                None if src.iter().all(|&b| b == 0) => {}
                None => {
                    let mut data = vec![0u8; CHUNK as usize].into_boxed_slice();
                    data[p.at..p.at + p.len].copy_from_slice(src);
                    map.insert(p.chunk, data);
                }
            }
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, offset, len)?;
        self.zero_range(offset, len);
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, offset, len)?;
        self.zero_range(offset, len);
        Ok(())
    }

    fn allocation(&self, offset: u64, len: u64) -> io::Result<(Allocation, u64)> {
        check_range(self.size, offset, len)?;
        let mapped = |chunk: u64| self.stripe(chunk).read().contains_key(&chunk);
        let mut run = pieces(offset, len);
        let Some(first) = run.next() else {
            return Ok((Allocation::Mapped, 0));
        };
        let state = mapped(first.chunk);
        let mut extent = first.len as u64;
        for p in run {
            if mapped(p.chunk) != state {
                break;
            }
            extent += p.len as u64;
        }
        let state = if state {
            Allocation::Mapped
        } else {
            Allocation::Deallocated
        };
        Ok((state, extent))
    }

    /// Nothing of it survives a crash, so no write can be torn by one.
    fn atomic_writes(&self) -> Option<AtomicWrites> {
        Some(AtomicWrites::up_to(u64::MAX))
    }

    fn write_atomic(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.write_at(buf, offset, fua)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            thin: true,
            volatile_cache: false,
            may_block: false,
            discard_zeroes: true,
            discard: true,
            read_only: false,
        }
    }

    fn describe(&self) -> String {
        format!("mem:{}", self.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn large_device_commits_nothing_until_written() {
        let dev = MemDevice::new(1 << 30);
        assert_eq!(dev.committed_bytes(), 0);
        let mut buf = vec![0xffu8; 4096];
        dev.read_at(&mut buf, (1 << 30) - 4096).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        assert_eq!(dev.committed_bytes(), 0);
        dev.write_at(&[1; 512], 1 << 20, false).unwrap();
        assert_eq!(dev.committed_bytes(), CHUNK);
    }

    #[test]
    fn writing_zeros_to_unmapped_space_stays_thin() {
        let dev = MemDevice::new(4 * CHUNK);
        dev.write_at(&vec![0; 2 * CHUNK as usize], 0, false)
            .unwrap();
        assert_eq!(dev.committed_bytes(), 0);
    }

    #[test]
    fn write_spanning_chunks_reads_back() {
        let dev = MemDevice::new(4 * CHUNK);
        let data: Vec<u8> = (0..CHUNK as usize + 1000)
            .map(|i| (i % 251) as u8)
            .collect();
        let offset = CHUNK - 500;
        dev.write_at(&data, offset, false).unwrap();
        let mut back = vec![0; data.len()];
        dev.read_at(&mut back, offset).unwrap();
        assert_eq!(back, data);
        assert_eq!(dev.committed_bytes(), 3 * CHUNK);
    }

    #[test]
    fn discard_frees_whole_chunks_and_zeroes_partial_ones() {
        let dev = MemDevice::new(4 * CHUNK);
        dev.write_at(&vec![7; 4 * CHUNK as usize], 0, false)
            .unwrap();
        dev.discard(CHUNK / 2, 2 * CHUNK).unwrap();
        // Chunk 1 freed; chunks 0 and 2 keep their other half.
        assert_eq!(dev.committed_bytes(), 3 * CHUNK);
        let mut buf = vec![0; 4 * CHUNK as usize];
        dev.read_at(&mut buf, 0).unwrap();
        let half = (CHUNK / 2) as usize;
        assert!(buf[..half].iter().all(|&b| b == 7));
        assert!(buf[half..half + 2 * CHUNK as usize].iter().all(|&b| b == 0));
        assert!(buf[half + 2 * CHUNK as usize..].iter().all(|&b| b == 7));
        // Zeroing the rest of chunk 0 releases it.
        dev.discard(0, CHUNK / 2).unwrap();
        assert_eq!(dev.committed_bytes(), 2 * CHUNK);
    }

    #[test]
    fn allocation_reports_extents() {
        let dev = MemDevice::new(8 * CHUNK);
        dev.write_at(&[1], 2 * CHUNK, false).unwrap();
        dev.write_at(&[1], 3 * CHUNK + 5, false).unwrap();
        assert_eq!(
            dev.allocation(0, 8 * CHUNK).unwrap(),
            (Allocation::Deallocated, 2 * CHUNK)
        );
        assert_eq!(
            dev.allocation(2 * CHUNK + 10, 6 * CHUNK - 10).unwrap(),
            (Allocation::Mapped, 2 * CHUNK - 10)
        );
        assert_eq!(
            dev.allocation(4 * CHUNK, 4 * CHUNK).unwrap(),
            (Allocation::Deallocated, 4 * CHUNK)
        );
        assert_eq!(
            dev.allocation(0, 100).unwrap(),
            (Allocation::Deallocated, 100)
        );
    }

    #[test]
    fn out_of_range_is_an_error() {
        let dev = MemDevice::new(1000);
        assert!(dev.write_at(&[0; 10], 995, false).is_err());
        assert!(dev.read_at(&mut [0; 10], u64::MAX - 2).is_err());
        assert!(dev.discard(999, 2).is_err());
        assert!(dev.write_at(&[1; 10], 990, false).is_ok());
    }

    #[test]
    fn concurrent_writers_to_distinct_ranges() {
        let dev = std::sync::Arc::new(MemDevice::new(64 * CHUNK));
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                let dev = dev.clone();
                std::thread::spawn(move || {
                    for i in 0..64u64 {
                        if i % 4 == t as u64 {
                            dev.write_at(&vec![t + 1; 4096], i * CHUNK + 100, false)
                                .unwrap();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for i in 0..64u64 {
            let mut buf = vec![0; 4096];
            dev.read_at(&mut buf, i * CHUNK + 100).unwrap();
            assert!(buf.iter().all(|&b| b == (i % 4) as u8 + 1));
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Write { offset: u64, len: u64, byte: u8 },
        Discard { offset: u64, len: u64 },
        Zeroes { offset: u64, len: u64 },
    }

    const MODEL_SIZE: u64 = 4 * CHUNK + 123;

    fn range() -> impl Strategy<Value = (u64, u64)> {
        (0..MODEL_SIZE).prop_flat_map(|o| (Just(o), 0..=(MODEL_SIZE - o).min(2 * CHUNK)))
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (range(), any::<u8>()).prop_map(|((offset, len), byte)| Op::Write { offset, len, byte }),
            1 => range().prop_map(|(offset, len)| Op::Discard { offset, len }),
            1 => range().prop_map(|(offset, len)| Op::Zeroes { offset, len }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn behaves_like_a_byte_vector(ops in proptest::collection::vec(op(), 1..24)) {
            let dev = MemDevice::new(MODEL_SIZE);
            let mut model = vec![0u8; MODEL_SIZE as usize];
            for op in ops {
                match op {
                    Op::Write { offset, len, byte } => {
                        let data: Vec<u8> = (0..len).map(|i| byte.wrapping_add(i as u8)).collect();
                        dev.write_at(&data, offset, false).unwrap();
                        model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
                    }
                    Op::Discard { offset, len } => {
                        dev.discard(offset, len).unwrap();
                        model[offset as usize..(offset + len) as usize].fill(0);
                    }
                    Op::Zeroes { offset, len } => {
                        dev.write_zeroes(offset, len).unwrap();
                        model[offset as usize..(offset + len) as usize].fill(0);
                    }
                }
                let mut all = vec![0u8; MODEL_SIZE as usize];
                dev.read_at(&mut all, 0).unwrap();
                prop_assert_eq!(&all, &model);
            }
            // Every extent reported deallocated reads as zeros, and the
            // extents tile the device.
            let mut at = 0;
            while at < MODEL_SIZE {
                let (state, n) = dev.allocation(at, MODEL_SIZE - at).unwrap();
                prop_assert!(n > 0);
                if state == Allocation::Deallocated {
                    prop_assert!(model[at as usize..(at + n) as usize].iter().all(|&b| b == 0));
                }
                at += n;
            }
            prop_assert_eq!(at, MODEL_SIZE);
        }
    }
}
