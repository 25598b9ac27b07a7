//! Scrub: read every stripe, check mirrors and parity, count mismatches,
//! optionally repair them; on RAID6 name the member that is wrong.

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::array::RaidArray;
use crate::core::{Core, Progress};
use crate::gf;
use crate::recent::Origin;

/// What a scrub found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ScrubReport {
    pub repair: bool,
    /// Stripes (rows, or chunks of the copies family) compared.
    pub stripes_checked: u64,
    /// Stripes skipped: a member missing or recovering there.
    pub stripes_skipped: u64,
    /// Stripes whose copies or parity disagreed.
    pub mismatches: u64,
    pub repaired: u64,
    /// Per slot, mismatches pinned on that member: a mirror copy the
    /// other copies outvote, a RAID5/6 parity chunk, or on RAID6 the data
    /// chunk P and Q both point at.
    pub wrong_members: BTreeMap<usize, u64>,
    /// RAID6 stripes where no single member explains the mismatch.
    pub unexplained: u64,
    /// Mirror chunks whose copies disagree with no majority (two copies,
    /// or a tie): nothing says which is right, since every in-sync copy
    /// saw the same events and no checksum is kept. A repair makes them
    /// the first copy, as md does; the data may be either.
    pub undecided: u64,
}

impl RaidArray {
    /// Scrubs the whole array in the calling thread (progress shows in
    /// `status().sync` meanwhile); with `repair`, fixes what it finds.
    pub fn scrub(&self, repair: bool) -> io::Result<ScrubReport> {
        self.core.scrub(repair)
    }

    /// Scrubs in a background thread; the report lands in
    /// `status().last_scrub`.
    pub fn start_scrub(&self, repair: bool) -> std::thread::JoinHandle<()> {
        let core: Arc<Core> = self.core.clone();
        std::thread::spawn(move || {
            if let Err(e) = core.scrub(repair) {
                tracing::error!(error = %e, "RAID scrub failed");
            }
        })
    }
}

impl Core {
    pub(crate) fn scrub(&self, repair: bool) -> io::Result<ScrubReport> {
        let g = self.geo;
        let mut report = ScrubReport {
            repair,
            ..Default::default()
        };
        let stripes = if g.is_parity() {
            g.rows
        } else {
            g.logical_chunks()
        };
        let started = Instant::now();
        for stripe in 0..stripes {
            {
                let _lock = self.locks.lock(stripe);
                if g.is_parity() {
                    self.scrub_row(stripe, repair, &mut report)?;
                } else {
                    self.scrub_copies(stripe, repair, &mut report)?;
                }
            }
            let done = (stripe + 1) * g.chunk;
            *self.progress.lock() = Some(Progress {
                kind: if repair { "repair" } else { "check" },
                slot: None,
                done_bytes: done,
                total_bytes: stripes * g.chunk,
                bytes_per_sec: (done as f64 / started.elapsed().as_secs_f64().max(1e-6)) as u64,
            });
        }
        *self.progress.lock() = None;
        if repair && report.repaired > 0 {
            self.flush_all()?;
        }
        self.report.lock().last_scrub = Some(report.clone());
        // A scrub by hand counts for the schedule too; the superblocks
        // keep the time, so that a restart does not reset the schedule.
        let now = std::time::SystemTime::now();
        *self.last_scrub_at.lock() = now;
        self.last_scrub_ms.store(
            crate::core::unix_millis(now),
            std::sync::atomic::Ordering::Relaxed,
        );
        self.write_superblocks();
        tracing::info!(
            mismatches = report.mismatches,
            repaired = report.repaired,
            "RAID scrub done"
        );
        Ok(report)
    }

    fn scrub_copies(&self, chunk: u64, repair: bool, report: &mut ScrubReport) -> io::Result<()> {
        let places = self.geo.copies_of(chunk);
        if places.len() < 2 {
            return Ok(());
        }
        let rr = self.region_rows();
        let members = self.members();
        let mut copies = Vec::new();
        for p in &places {
            let Some(m) = members[p.member].as_ref().filter(|m| m.readable(p.row, rr)) else {
                report.stripes_skipped += 1;
                return Ok(());
            };
            let mut buf = vec![0u8; self.geo.chunk as usize];
            if let Err(e) = m.read_for(Origin::Background, &mut buf, p.row * self.geo.chunk) {
                self.fail_member(p.member, m, &e);
                report.stripes_skipped += 1;
                return Ok(());
            }
            copies.push(buf);
        }
        report.stripes_checked += 1;
        let (right, majority) = winner(&copies);
        let wrong: Vec<usize> = (0..copies.len())
            .filter(|i| copies[*i] != copies[right])
            .collect();
        if wrong.is_empty() {
            return Ok(());
        }
        report.mismatches += 1;
        if majority {
            for i in &wrong {
                *report.wrong_members.entry(places[*i].member).or_default() += 1;
            }
        } else {
            report.undecided += 1;
        }
        if repair {
            for i in wrong {
                let p = places[i];
                let m = members[p.member].as_ref().expect("read above");
                if let Err(e) = m.write_for(
                    Origin::Background,
                    &copies[right],
                    p.row * self.geo.chunk,
                    false,
                ) {
                    self.fail_member(p.member, m, &e);
                }
            }
            report.repaired += 1;
        }
        Ok(())
    }

    fn scrub_row(&self, row: u64, repair: bool, report: &mut ScrubReport) -> io::Result<()> {
        let g = self.geo;
        let rr = self.region_rows();
        let members = self.members();
        let mut chunks: Vec<Vec<u8>> = Vec::with_capacity(g.members);
        for (slot, m) in members.iter().enumerate() {
            let Some(m) = m.as_ref().filter(|m| m.readable(row, rr)) else {
                report.stripes_skipped += 1;
                return Ok(());
            };
            let mut buf = vec![0u8; g.chunk as usize];
            if let Err(e) = m.read_for(Origin::Background, &mut buf, row * g.chunk) {
                self.fail_member(slot, m, &e);
                report.stripes_skipped += 1;
                return Ok(());
            }
            chunks.push(buf);
        }
        report.stripes_checked += 1;
        let data: Vec<&[u8]> = (0..g.data_columns())
            .map(|c| chunks[g.data_member(row, c)].as_slice())
            .collect();
        let p_slot = g.p_member(row);
        let mut p = vec![0u8; g.chunk as usize];
        gf::p_of(&data, &mut p);
        let p_ok = p == chunks[p_slot];
        let q_slot = (g.level.parity() == 2).then(|| g.q_member(row));
        let q = q_slot.map(|_| {
            let mut q = vec![0u8; g.chunk as usize];
            gf::q_of(&data.iter().map(|d| Some(*d)).collect::<Vec<_>>(), &mut q);
            q
        });
        let q_ok = match (q_slot, &q) {
            (Some(s), Some(q)) => *q == chunks[s],
            _ => true,
        };
        if p_ok && q_ok {
            return Ok(());
        }
        report.mismatches += 1;
        // Which member: on RAID5 the parity is all a scrub can blame.
        let mut fixes: Vec<(usize, Vec<u8>)> = Vec::new();
        let mut explained = true;
        match (p_ok, q_ok, q_slot) {
            (false, true, _) => fixes.push((p_slot, p.clone())),
            (true, false, Some(s)) => fixes.push((s, q.clone().expect("RAID6"))),
            (false, false, Some(s)) => {
                match gf::locate_bad_data(&data, &chunks[p_slot], &chunks[s]) {
                    Some(z) => {
                        // Column z from P and the other columns.
                        let mut d = chunks[p_slot].clone();
                        for (c, col) in data.iter().enumerate() {
                            if c != z {
                                gf::xor_into(&mut d, col);
                            }
                        }
                        fixes.push((g.data_member(row, z), d));
                    }
                    None => {
                        // Several members wrong: make the parity match the data.
                        explained = false;
                        report.unexplained += 1;
                        fixes.push((p_slot, p.clone()));
                        fixes.push((s, q.clone().expect("RAID6")));
                    }
                }
            }
            _ => unreachable!("a mismatch was found"),
        }
        if explained {
            for (slot, _) in &fixes {
                *report.wrong_members.entry(*slot).or_default() += 1;
            }
        }
        if repair {
            for (slot, bytes) in fixes {
                let m = members[slot].as_ref().expect("read above");
                if let Err(e) = m.write_for(Origin::Background, &bytes, row * g.chunk, false) {
                    self.fail_member(slot, m, &e);
                }
            }
            report.repaired += 1;
        }
        Ok(())
    }
}

/// The copy to trust: the one most copies agree with, and whether they
/// are more than any other group (else the first, undecided).
fn winner(copies: &[Vec<u8>]) -> (usize, bool) {
    let votes: Vec<usize> = copies
        .iter()
        .map(|c| copies.iter().filter(|o| *o == c).count())
        .collect();
    let best = votes.iter().copied().max().unwrap_or(0);
    let first = votes.iter().position(|v| *v == best).unwrap_or(0);
    let rivals = (0..copies.len())
        .filter(|i| votes[*i] == best && copies[*i] != copies[first])
        .count();
    (first, rivals == 0 && best > copies.len() - best)
}

#[cfg(test)]
mod tests {
    use super::winner;

    #[test]
    fn the_majority_copy_wins_and_a_tie_is_undecided() {
        let (a, b) = (vec![1u8; 4], vec![2u8; 4]);
        assert_eq!(winner(&[a.clone(), b.clone()]), (0, false), "two copies");
        assert_eq!(winner(&[b.clone(), a.clone(), a.clone()]), (1, true));
        assert_eq!(winner(&[a.clone(), a.clone(), b.clone()]), (0, true));
        let c = vec![3u8; 4];
        assert_eq!(winner(&[a, b, c]), (0, false), "all differ");
    }
}
