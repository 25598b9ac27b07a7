//! Splitting read data into Data-In PDUs.
//!
//! Each PDU carries at most the initiator's MaxRecvDataSegmentLength; a
//! Data-In sequence (ended by the F bit) carries at most MaxBurstLength.
//! DataSN counts every Data-In PDU of the command.

/// One Data-In PDU of a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub offset: u32,
    pub len: u32,
    pub datasn: u32,
    /// F bit: last PDU of a sequence.
    pub final_: bool,
    /// Last PDU of the command.
    pub last: bool,
}

/// Iterator over the Data-In PDUs for `total` bytes.
#[derive(Clone, Debug)]
pub struct Segments {
    total: u32,
    mrdsl: u32,
    max_burst: u32,
    offset: u32,
    burst_used: u32,
    datasn: u32,
}

/// Plan the Data-In PDUs for `total` bytes. Zero-sized limits are treated
/// as 512 (the protocol minimum) so the plan always terminates.
pub fn segments(total: u32, mrdsl: u32, max_burst: u32) -> Segments {
    Segments {
        total,
        mrdsl: mrdsl.max(512),
        max_burst: max_burst.max(512),
        offset: 0,
        burst_used: 0,
        datasn: 0,
    }
}

impl Iterator for Segments {
    type Item = Segment;

    fn next(&mut self) -> Option<Segment> {
        if self.offset >= self.total {
            return None;
        }
        let burst_left = self.max_burst - self.burst_used;
        let len = (self.total - self.offset).min(self.mrdsl).min(burst_left);
        let offset = self.offset;
        self.offset += len;
        self.burst_used += len;
        let last = self.offset == self.total;
        let final_ = last || self.burst_used == self.max_burst;
        if final_ {
            self.burst_used = 0;
        }
        let datasn = self.datasn;
        self.datasn = self.datasn.wrapping_add(1);
        Some(Segment {
            offset,
            len,
            datasn,
            final_,
            last,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn nothing_to_send() {
        assert_eq!(segments(0, 8192, 262144).count(), 0);
    }

    #[test]
    fn single_pdu() {
        let s: Vec<_> = segments(512, 8192, 262144).collect();
        assert_eq!(
            s,
            vec![Segment {
                offset: 0,
                len: 512,
                datasn: 0,
                final_: true,
                last: true
            }]
        );
    }

    #[test]
    fn split_by_mrdsl() {
        let s: Vec<_> = segments(20000, 8192, 262144).collect();
        assert_eq!(s.len(), 3);
        assert_eq!((s[0].offset, s[0].len, s[0].final_), (0, 8192, false));
        assert_eq!((s[1].offset, s[1].len, s[1].final_), (8192, 8192, false));
        assert_eq!(
            (s[2].offset, s[2].len, s[2].final_, s[2].last),
            (16384, 3616, true, true)
        );
        assert_eq!(s[2].datasn, 2);
    }

    #[test]
    fn sequences_end_at_max_burst() {
        // Burst of 10000 with PDUs of 4096: 4096 + 4096 + 1808 | 4096 ...
        let s: Vec<_> = segments(12000, 4096, 10000).collect();
        let lens: Vec<u32> = s.iter().map(|x| x.len).collect();
        assert_eq!(lens, vec![4096, 4096, 1808, 2000]);
        let finals: Vec<bool> = s.iter().map(|x| x.final_).collect();
        assert_eq!(finals, vec![false, false, true, true]);
    }

    proptest! {
        #[test]
        fn plan_covers_data_exactly(total in 0u32..2_000_000, mrdsl in 512u32..300_000, burst in 512u32..1_100_000) {
            let mut next = 0u32;
            let mut in_burst = 0u32;
            for (count, seg) in segments(total, mrdsl, burst).enumerate() {
                prop_assert_eq!(seg.offset, next);
                prop_assert!(seg.len > 0 && seg.len <= mrdsl);
                prop_assert_eq!(seg.datasn as usize, count);
                in_burst += seg.len;
                prop_assert!(in_burst <= burst);
                if seg.final_ { in_burst = 0; }
                next += seg.len;
                prop_assert_eq!(seg.last, next == total);
                if seg.last { prop_assert!(seg.final_); }
            }
            prop_assert_eq!(next, total);
        }
    }
}
