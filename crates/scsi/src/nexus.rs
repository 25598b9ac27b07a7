//! Per-I_T-nexus state kept by a logical unit: pending unit attentions,
//! PREVENT ALLOW MEDIUM REMOVAL, and held EXTENDED COPY results.

use std::collections::{BTreeMap, VecDeque};

/// At most this many unit attentions are queued per nexus; older ones are
/// dropped first (SPC-4 allows reporting a subset when the queue overflows).
const MAX_UNIT_ATTENTIONS: usize = 8;

/// At most this many EXTENDED COPY results are held per nexus.
const MAX_HELD_COPIES: usize = 16;

/// Outcome of one EXTENDED COPY, for RECEIVE COPY RESULTS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyResult {
    pub succeeded: bool,
    pub segments_processed: u16,
    /// Bytes copied.
    pub bytes: u64,
}

#[derive(Debug, Default)]
pub struct NexusState {
    unit_attentions: VecDeque<(u8, u8)>,
    pub prevent: bool,
    copies: BTreeMap<u8, CopyResult>,
}

impl NexusState {
    /// A nexus the LU has just come to know: it starts with the power on /
    /// reset unit attention.
    pub fn fresh() -> NexusState {
        let mut s = NexusState::default();
        s.add_unit_attention(crate::sense::asc::POWER_ON_RESET);
        s
    }

    pub fn add_unit_attention(&mut self, code: (u8, u8)) {
        if self.unit_attentions.contains(&code) {
            return;
        }
        if self.unit_attentions.len() == MAX_UNIT_ATTENTIONS {
            self.unit_attentions.pop_front();
        }
        self.unit_attentions.push_back(code);
    }

    pub fn take_unit_attention(&mut self) -> Option<(u8, u8)> {
        self.unit_attentions.pop_front()
    }

    /// Drops a pending unit attention that the command just run resolves.
    pub fn remove_unit_attention(&mut self, code: (u8, u8)) {
        self.unit_attentions.retain(|c| *c != code);
    }

    pub fn hold_copy(&mut self, list_id: u8, result: CopyResult) {
        if !self.copies.contains_key(&list_id) && self.copies.len() == MAX_HELD_COPIES {
            if let Some(&oldest) = self.copies.keys().next() {
                self.copies.remove(&oldest);
            }
        }
        self.copies.insert(list_id, result);
    }

    pub fn copy(&self, list_id: u8) -> Option<CopyResult> {
        self.copies.get(&list_id).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sense::asc;

    #[test]
    fn unit_attentions_are_fifo_deduplicated_and_bounded() {
        let mut s = NexusState::fresh();
        s.add_unit_attention(asc::MODE_PARAMETERS_CHANGED);
        s.add_unit_attention(asc::MODE_PARAMETERS_CHANGED);
        assert_eq!(s.take_unit_attention(), Some(asc::POWER_ON_RESET));
        assert_eq!(s.take_unit_attention(), Some(asc::MODE_PARAMETERS_CHANGED));
        assert_eq!(s.take_unit_attention(), None);
        for i in 0..20u8 {
            s.add_unit_attention((0x2A, i));
        }
        assert_eq!(s.take_unit_attention(), Some((0x2A, 12)));
    }

    #[test]
    fn held_copies_are_bounded() {
        let mut s = NexusState::default();
        let r = CopyResult {
            succeeded: true,
            segments_processed: 1,
            bytes: 512,
        };
        for id in 0..40u8 {
            s.hold_copy(id, r);
        }
        assert_eq!(s.copy(0), None);
        assert_eq!(s.copy(39), Some(r));
    }
}
