//! The guard rail of write patterns: a device that holds data is only
//! written with `--destroy-data`. "Holds data" is judged by a sample of
//! blocks spread over the whole device, any of them non-zero.

use anyhow::Result;

/// How many blocks are sampled, and their size.
pub const SAMPLES: u64 = 64;
pub const SAMPLE_BYTES: u32 = 4096;

/// What the sample reads through.
pub trait BlockReader {
    fn size(&self) -> u64;
    fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>>;
}

impl BlockReader for crate::nbd_client::NbdClient {
    fn size(&self) -> u64 {
        self.size()
    }
    fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>> {
        self.read(offset, len)
    }
}

/// The sampled offsets: the first block, the last, and evenly between.
pub fn sample_offsets(size: u64) -> Vec<u64> {
    let blocks = size / SAMPLE_BYTES as u64;
    if blocks == 0 {
        return Vec::new();
    }
    let n = SAMPLES.min(blocks);
    let mut offsets: Vec<u64> = (0..n)
        .map(|i| if n == 1 { 0 } else { (blocks - 1) * i / (n - 1) } * SAMPLE_BYTES as u64)
        .collect();
    offsets.dedup();
    offsets
}

/// The first sampled offset whose block is not all zeros.
pub fn first_data(dev: &mut dyn BlockReader) -> Result<Option<u64>> {
    for offset in sample_offsets(dev.size()) {
        if dev.read(offset, SAMPLE_BYTES)?.iter().any(|&b| b != 0) {
            return Ok(Some(offset));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Mem(Vec<u8>);
    impl BlockReader for Mem {
        fn size(&self) -> u64 {
            self.0.len() as u64
        }
        fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>> {
            Ok(self.0[offset as usize..][..len as usize].to_vec())
        }
    }

    #[test]
    fn samples_span_the_device() {
        let offsets = sample_offsets(1 << 30);
        assert_eq!(offsets.len(), 64);
        assert_eq!(offsets[0], 0);
        assert_eq!(*offsets.last().unwrap(), (1 << 30) - 4096);
        assert_eq!(sample_offsets(8192), vec![0, 4096]);
    }

    #[test]
    fn names_the_first_block_with_data() {
        let mut dev = Mem(vec![0; 1 << 20]);
        assert_eq!(first_data(&mut dev).unwrap(), None);
        let at = sample_offsets(1 << 20)[10];
        dev.0[at as usize + 100] = 7;
        assert_eq!(first_data(&mut dev).unwrap(), Some(at));
    }
}
