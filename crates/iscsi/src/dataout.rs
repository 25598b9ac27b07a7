//! Collecting a command's write data: immediate data, the unsolicited
//! Data-Out sequence and R2T-solicited sequences (RFC 7143 sections 4.2.5
//! and 11.7, 11.8).
//!
//! [`WriteState`] is pure bookkeeping: it checks every Data-Out against the
//! sequence it belongs to (DataSN, buffer offset, length, F bit) and plans
//! the R2Ts that ask for what is still missing. The caller copies the bytes.

use crate::pdu::RESERVED_TAG;

/// Negotiated limits that shape write transfers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteLimits {
    pub first_burst_length: u32,
    pub max_burst_length: u32,
    pub max_outstanding_r2t: u16,
}

/// One R2T to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct R2tRequest {
    pub ttt: u32,
    pub r2tsn: u32,
    pub offset: u32,
    pub len: u32,
}

/// A Data-Out that does not fit the transfer; at ERL 0 the connection ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DataOutError {
    #[error("immediate data of {len} bytes exceeds {limit}")]
    ImmediateTooLong { len: u32, limit: u32 },
    #[error("unsolicited Data-Out not expected")]
    UnexpectedUnsolicited,
    #[error("Data-Out for unknown target transfer tag {0:#x}")]
    UnknownTransferTag(u32),
    #[error("DataSN {got} where {expected} was expected")]
    DataSn { expected: u32, got: u32 },
    #[error("buffer offset {got} where {expected} was expected")]
    Offset { expected: u32, got: u32 },
    #[error("Data-Out overruns its sequence")]
    Overrun,
    #[error("F bit before the sequence was complete")]
    EarlyFinal,
}

/// One data sequence being received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sequence {
    ttt: u32,
    offset: u32,
    len: u32,
    received: u32,
    next_datasn: u32,
}

/// Where accepted Data-Out bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub offset: u32,
    pub len: u32,
    /// A solicited sequence finished: more R2Ts may be sent.
    pub sequence_done: bool,
}

/// Write-side state of one command.
#[derive(Clone, Debug)]
pub struct WriteState {
    edtl: u32,
    limits: WriteLimits,
    received: u32,
    unsolicited: Option<Sequence>,
    /// Offset the next R2T asks for.
    next_offset: u32,
    r2tsn: u32,
    outstanding: Vec<Sequence>,
}

impl WriteState {
    /// Start a write of `edtl` bytes with `immediate_len` bytes of
    /// immediate data; `unsolicited_follows` is the command's F bit clear.
    pub fn new(
        edtl: u32,
        immediate_len: u32,
        unsolicited_follows: bool,
        limits: WriteLimits,
    ) -> Result<WriteState, DataOutError> {
        let unsolicited_limit = limits.first_burst_length.min(edtl);
        if immediate_len > unsolicited_limit {
            return Err(DataOutError::ImmediateTooLong {
                len: immediate_len,
                limit: unsolicited_limit,
            });
        }
        let unsolicited =
            (unsolicited_follows && immediate_len < unsolicited_limit).then_some(Sequence {
                ttt: RESERVED_TAG,
                offset: immediate_len,
                len: unsolicited_limit - immediate_len,
                received: 0,
                next_datasn: 0,
            });
        Ok(WriteState {
            edtl,
            limits,
            received: immediate_len,
            unsolicited,
            next_offset: immediate_len,
            r2tsn: 0,
            outstanding: Vec::new(),
        })
    }

    /// Bytes received so far.
    pub fn received(&self) -> u32 {
        self.received
    }

    /// R2Ts sent so far.
    pub fn r2ts_sent(&self) -> u32 {
        self.r2tsn
    }

    /// All expected data is in.
    pub fn complete(&self) -> bool {
        self.unsolicited.is_none() && self.outstanding.is_empty() && self.next_offset >= self.edtl
    }

    /// After a sequence error the command is failed, but the target still
    /// waits for the F bit of every sequence in progress before answering
    /// (RFC 3720 6.7, 6.8). How many F bits are still to come, given the
    /// offending PDU's TTT and F bit.
    pub fn finals_after_error(&self, ttt: u32, final_: bool) -> u32 {
        let open = self.outstanding.len() as u32 + u32::from(self.unsolicited.is_some());
        let own_sequence = if ttt == RESERVED_TAG {
            self.unsolicited.is_some()
        } else {
            self.outstanding.iter().any(|s| s.ttt == ttt)
        };
        if final_ && own_sequence {
            open - 1
        } else {
            open
        }
    }

    /// Still waiting for the unsolicited sequence.
    pub fn awaiting_unsolicited(&self) -> bool {
        self.unsolicited.is_some()
    }

    /// Check one Data-Out and say where its data goes.
    pub fn accept(
        &mut self,
        ttt: u32,
        datasn: u32,
        offset: u32,
        len: u32,
        final_: bool,
    ) -> Result<Placement, DataOutError> {
        let seq = if ttt == RESERVED_TAG {
            self.unsolicited
                .as_mut()
                .ok_or(DataOutError::UnexpectedUnsolicited)?
        } else {
            self.outstanding
                .iter_mut()
                .find(|s| s.ttt == ttt)
                .ok_or(DataOutError::UnknownTransferTag(ttt))?
        };
        if datasn != seq.next_datasn {
            return Err(DataOutError::DataSn {
                expected: seq.next_datasn,
                got: datasn,
            });
        }
        let expected = seq.offset + seq.received;
        if offset != expected {
            return Err(DataOutError::Offset {
                expected,
                got: offset,
            });
        }
        if len > seq.len - seq.received {
            return Err(DataOutError::Overrun);
        }
        seq.received += len;
        seq.next_datasn = seq.next_datasn.wrapping_add(1);
        self.received += len;
        let full = seq.received == seq.len;
        let placement = Placement {
            offset,
            len,
            sequence_done: false,
        };
        if ttt == RESERVED_TAG {
            // The initiator may send less unsolicited data than allowed; the
            // F bit ends the sequence and R2Ts fetch the rest.
            if final_ || full {
                let end = seq.offset + seq.received;
                self.unsolicited = None;
                self.next_offset = end;
                return Ok(Placement {
                    sequence_done: true,
                    ..placement
                });
            }
            return Ok(placement);
        }
        if final_ && !full {
            return Err(DataOutError::EarlyFinal);
        }
        if full {
            self.outstanding.retain(|s| s.ttt != ttt);
            return Ok(Placement {
                sequence_done: true,
                ..placement
            });
        }
        Ok(placement)
    }

    /// Bytes R2Ts have yet to ask for: everything past the unsolicited
    /// sequence (whole or cut short) not yet solicited.
    pub fn left_to_solicit(&self) -> u32 {
        let from = match &self.unsolicited {
            Some(s) => s.offset + s.len,
            None => self.next_offset,
        };
        self.edtl.saturating_sub(from)
    }

    /// R2Ts to send now (none while the unsolicited sequence is running),
    /// up to MaxOutstandingR2T sequences at once.
    pub fn next_r2ts(&mut self, mut new_ttt: impl FnMut() -> u32) -> Vec<R2tRequest> {
        let mut out = Vec::new();
        if self.unsolicited.is_some() {
            return out;
        }
        let max_outstanding = usize::from(self.limits.max_outstanding_r2t.max(1));
        while self.outstanding.len() < max_outstanding && self.next_offset < self.edtl {
            let len = (self.edtl - self.next_offset).min(self.limits.max_burst_length.max(512));
            let ttt = new_ttt();
            let r = R2tRequest {
                ttt,
                r2tsn: self.r2tsn,
                offset: self.next_offset,
                len,
            };
            self.outstanding.push(Sequence {
                ttt,
                offset: r.offset,
                len,
                received: 0,
                next_datasn: 0,
            });
            self.r2tsn = self.r2tsn.wrapping_add(1);
            self.next_offset += len;
            out.push(r);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: WriteLimits = WriteLimits {
        first_burst_length: 8192,
        max_burst_length: 16384,
        max_outstanding_r2t: 2,
    };

    fn ttts() -> impl FnMut() -> u32 {
        let mut n = 100;
        move || {
            n += 1;
            n
        }
    }

    #[test]
    fn all_immediate() {
        let w = WriteState::new(4096, 4096, false, LIMITS).unwrap();
        assert!(w.complete());
    }

    #[test]
    fn immediate_longer_than_first_burst() {
        assert_eq!(
            WriteState::new(65536, 10000, false, LIMITS).unwrap_err(),
            DataOutError::ImmediateTooLong {
                len: 10000,
                limit: 8192
            }
        );
    }

    #[test]
    fn unsolicited_then_r2ts() {
        let mut tags = ttts();
        let mut w = WriteState::new(60000, 1000, true, LIMITS).unwrap();
        assert!(
            w.next_r2ts(&mut tags).is_empty(),
            "no R2T during the unsolicited sequence"
        );
        let p = w.accept(RESERVED_TAG, 0, 1000, 4000, false).unwrap();
        assert_eq!((p.offset, p.len, p.sequence_done), (1000, 4000, false));
        let p = w.accept(RESERVED_TAG, 1, 5000, 3192, true).unwrap();
        assert!(p.sequence_done);
        let r = w.next_r2ts(&mut tags);
        // Two outstanding R2Ts of up to MaxBurstLength each.
        assert_eq!(
            r,
            vec![
                R2tRequest {
                    ttt: 101,
                    r2tsn: 0,
                    offset: 8192,
                    len: 16384
                },
                R2tRequest {
                    ttt: 102,
                    r2tsn: 1,
                    offset: 24576,
                    len: 16384
                },
            ]
        );
        // The second sequence may complete first; a slot frees up.
        w.accept(102, 0, 24576, 16384, true).unwrap();
        let r = w.next_r2ts(&mut tags);
        assert_eq!(
            r,
            vec![R2tRequest {
                ttt: 103,
                r2tsn: 2,
                offset: 40960,
                len: 16384
            }]
        );
        w.accept(101, 0, 8192, 8192, false).unwrap();
        w.accept(101, 1, 16384, 8192, true).unwrap();
        let r = w.next_r2ts(&mut tags);
        assert_eq!(
            r,
            vec![R2tRequest {
                ttt: 104,
                r2tsn: 3,
                offset: 57344,
                len: 2656
            }]
        );
        assert!(!w.complete());
        w.accept(103, 0, 40960, 16384, true).unwrap();
        w.accept(104, 0, 57344, 2656, true).unwrap();
        assert!(w.complete());
        assert_eq!(w.received(), 60000);
        assert_eq!(w.r2ts_sent(), 4);
    }

    #[test]
    fn short_unsolicited_sequence_is_allowed() {
        let mut w = WriteState::new(10000, 0, true, LIMITS).unwrap();
        w.accept(RESERVED_TAG, 0, 0, 512, true).unwrap();
        let r = w.next_r2ts(ttts());
        assert_eq!(r[0].offset, 512);
        assert_eq!(r[0].len, 9488);
    }

    #[test]
    fn datasn_errors() {
        let mut w = WriteState::new(1024, 0, true, LIMITS).unwrap();
        w.accept(RESERVED_TAG, 0, 0, 512, false).unwrap();
        assert_eq!(
            w.accept(RESERVED_TAG, 0, 512, 512, true),
            Err(DataOutError::DataSn {
                expected: 1,
                got: 0
            })
        );
        let mut w = WriteState::new(512, 0, true, LIMITS).unwrap();
        assert_eq!(
            w.accept(RESERVED_TAG, 27, 0, 512, true),
            Err(DataOutError::DataSn {
                expected: 0,
                got: 27
            })
        );
        let mut w = WriteState::new(512, 0, true, LIMITS).unwrap();
        assert!(w.accept(RESERVED_TAG, u32::MAX, 0, 512, true).is_err());
    }

    #[test]
    fn offset_and_overrun_errors() {
        let mut w = WriteState::new(1024, 0, true, LIMITS).unwrap();
        assert_eq!(
            w.accept(RESERVED_TAG, 0, 512, 512, false),
            Err(DataOutError::Offset {
                expected: 0,
                got: 512
            })
        );
        assert_eq!(
            w.accept(RESERVED_TAG, 0, 0, 2048, false),
            Err(DataOutError::Overrun)
        );
        let mut w = WriteState::new(1024, 0, false, LIMITS).unwrap();
        let r = w.next_r2ts(ttts());
        assert_eq!(
            w.accept(r[0].ttt, 0, 0, 512, true),
            Err(DataOutError::EarlyFinal)
        );
        assert_eq!(
            w.accept(999, 0, 0, 512, true),
            Err(DataOutError::UnknownTransferTag(999))
        );
    }

    #[test]
    fn unsolicited_when_not_expected() {
        let mut w = WriteState::new(1024, 0, false, LIMITS).unwrap();
        assert_eq!(
            w.accept(RESERVED_TAG, 0, 0, 512, true),
            Err(DataOutError::UnexpectedUnsolicited)
        );
    }

    #[test]
    fn finals_to_wait_for_after_an_error() {
        let mut w = WriteState::new(65536, 0, true, LIMITS).unwrap();
        assert_eq!(w.finals_after_error(RESERVED_TAG, false), 1);
        assert_eq!(w.finals_after_error(RESERVED_TAG, true), 0);
        w.accept(RESERVED_TAG, 0, 0, 8192, true).unwrap();
        let r = w.next_r2ts(ttts());
        assert_eq!(r.len(), 2);
        assert_eq!(w.finals_after_error(r[0].ttt, true), 1);
        assert_eq!(w.finals_after_error(r[0].ttt, false), 2);
        assert_eq!(w.finals_after_error(12345, true), 2, "unknown sequence");
    }

    #[test]
    fn left_to_solicit_counts_what_r2ts_will_ask_for() {
        // 4 KiB immediate, unsolicited up to FirstBurstLength (8 KiB).
        let mut w = WriteState::new(65536, 4096, true, LIMITS).unwrap();
        assert_eq!(w.left_to_solicit(), 65536 - 8192);
        // Cut short by the F bit: R2Ts fetch from where it ended.
        w.accept(RESERVED_TAG, 0, 4096, 1024, true).unwrap();
        assert_eq!(w.left_to_solicit(), 65536 - 5120);
        let r = w.next_r2ts(ttts());
        assert_eq!(r.len(), 2);
        assert_eq!(w.left_to_solicit(), 65536 - 5120 - 2 * 16384);
        let all_immediate = WriteState::new(4096, 4096, false, LIMITS).unwrap();
        assert_eq!(all_immediate.left_to_solicit(), 0);
    }
}
