//! Sequential cutoff: I/O that continues a stream longer than the cutoff
//! bypasses the cache, so a backup or a large copy does not fill it with
//! data read once.
//!
//! A caller that knows who issues the I/O (an initiator, a session) passes
//! that as the stream id, and each id has its own streams; without one,
//! streams are told apart by address continuity alone.

/// Streams followed at once; the least recently used is forgotten.
const TRACKED: usize = 32;

#[derive(Clone, Copy, Default)]
struct Stream {
    id: Option<u64>,
    /// Where the stream's next I/O would start.
    next: u64,
    /// Bytes of the stream so far.
    run: u64,
    used: u64,
}

pub struct Streams {
    cutoff: u64,
    streams: Vec<Stream>,
    clock: u64,
}

impl Streams {
    /// `cutoff` 0 turns detection off.
    pub fn new(cutoff: u64) -> Streams {
        Streams {
            cutoff,
            streams: Vec::with_capacity(TRACKED),
            clock: 0,
        }
    }

    pub fn cutoff(&self) -> u64 {
        self.cutoff
    }

    pub fn set_cutoff(&mut self, cutoff: u64) {
        self.cutoff = cutoff;
    }

    /// Records an I/O of `len` bytes at `offset`; true when it should
    /// bypass the cache.
    pub fn observe(&mut self, id: Option<u64>, offset: u64, len: u64) -> bool {
        if self.cutoff == 0 {
            return false;
        }
        self.clock += 1;
        let clock = self.clock;
        let found = self
            .streams
            .iter_mut()
            .find(|s| s.id == id && s.next == offset);
        let run = match found {
            Some(s) => {
                s.run += len;
                s.next = offset + len;
                s.used = clock;
                s.run
            }
            None => {
                let fresh = Stream {
                    id,
                    next: offset + len,
                    run: len,
                    used: clock,
                };
                if self.streams.len() < TRACKED {
                    self.streams.push(fresh);
                } else {
                    let oldest = self.streams.iter_mut().min_by_key(|s| s.used).unwrap();
                    *oldest = fresh;
                }
                len
            }
        };
        run > self.cutoff
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_stream_bypasses_after_the_cutoff() {
        let mut s = Streams::new(1 << 20);
        let bypassed: Vec<bool> = (0..8)
            .map(|i| s.observe(None, i * (256 << 10), 256 << 10))
            .collect();
        assert_eq!(
            bypassed,
            [false, false, false, false, true, true, true, true]
        );
        // Random I/O elsewhere does not.
        assert!(!s.observe(None, 100 << 20, 4096));
    }

    #[test]
    fn interleaved_streams_of_two_initiators_are_told_apart() {
        let mut s = Streams::new(64 << 10);
        let mut last = (false, false);
        for i in 0..32u64 {
            last = (
                s.observe(Some(1), i * 4096, 4096),
                s.observe(Some(2), (1 << 30) + i * 4096, 4096),
            );
        }
        assert_eq!(last, (true, true));
        // The same addresses from another initiator start a new stream.
        assert!(!s.observe(Some(3), 32 * 4096, 4096));
        let mut off = Streams::new(0);
        assert!(!off.observe(None, 0, u64::MAX / 2));
    }
}
