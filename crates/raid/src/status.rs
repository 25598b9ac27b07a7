//! What `status` reports: array and member states, sync progress, the
//! bitmap, and per-member I/O figures.

use std::sync::atomic::Ordering;

use serde::Serialize;

use crate::array::RaidArray;
use crate::force::ForcedMember;
use crate::member::{Member, SyncState};
use crate::scrub::ScrubReport;
use crate::weakest::WeakLink;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ArrayState {
    Clean,
    Degraded,
    Rebuilding,
    Failed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemberState {
    InSync,
    Recovering,
    Failed,
    Missing,
    Spare,
    /// Being copied beside the member of its slot, to take its place.
    Replacement,
}

#[derive(Clone, Debug, Serialize)]
pub struct MemberIo {
    pub read_ops: u64,
    pub read_bytes: u64,
    pub write_ops: u64,
    pub write_bytes: u64,
    pub errors: u64,
    pub read_p50_ns: Option<u64>,
    pub read_p99_ns: Option<u64>,
    pub write_p50_ns: Option<u64>,
    pub write_p99_ns: Option<u64>,
    /// Bytes per second while the member was busy with the array's I/O.
    pub busy_bytes_per_sec: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct MemberStatus {
    /// `None` for spares.
    pub slot: Option<usize>,
    pub name: Option<String>,
    pub state: MemberState,
    /// For a recovering member: bytes of its data area already current.
    pub recovered_bytes: Option<u64>,
    /// A replacement: the slot it is copied into. A member being
    /// replaced: its replacement's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replacing: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replaced_by: Option<String>,
    pub io: Option<MemberIo>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SyncProgress {
    /// "resync", "rebuild", "catch-up", "replace", or a scrub's "check"
    /// or "repair".
    pub kind: &'static str,
    pub slot: Option<usize>,
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub bytes_per_sec: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct BitmapStatus {
    pub region_bytes: u64,
    pub regions: u64,
    pub dirty_regions: u64,
    /// Per member, bytes resynced after the last unclean stop.
    pub last_resync_bytes: Option<u64>,
    /// Bytes the last re-added member caught up.
    pub last_catch_up_bytes: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct RaidStatus {
    pub array_id: String,
    pub level: u32,
    pub state: ArrayState,
    pub size_bytes: u64,
    pub chunk_bytes: u64,
    pub events: u64,
    pub member_failures: u64,
    pub members: Vec<MemberStatus>,
    pub sync: Option<SyncProgress>,
    /// Resync and rebuild speed limits now, bytes a second.
    pub sync_speed_min: u64,
    pub sync_speed_max: u64,
    pub bitmap: BitmapStatus,
    pub last_scrub: Option<ScrubReport>,
    /// When the last scrub ended (milliseconds since the Unix epoch), or
    /// the array was created; `scrub_every` counts from it.
    pub last_scrub_at_ms: u64,
    /// RAID5/6: the partial parity log's slots, and sectors written since
    /// the last flush (each covered by an entry or a full-row write).
    pub log_slots: u32,
    pub log_live_sectors: usize,
    /// A member markedly slower than its peers, and what it costs.
    pub weakest_link: Option<WeakLink>,
    /// Stale members the assembly was forced to take as in sync.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub forced: Vec<ForcedMember>,
}

fn io_of(m: &Member) -> MemberIo {
    let s = &m.stats;
    let reads = s.read_latency.snapshot();
    let writes = s.write_latency.snapshot();
    let bytes = s.read_bytes.load(Ordering::Relaxed) + s.write_bytes.load(Ordering::Relaxed);
    let busy = s.busy_nanos.load(Ordering::Relaxed);
    MemberIo {
        read_ops: s.read_ops.load(Ordering::Relaxed),
        read_bytes: s.read_bytes.load(Ordering::Relaxed),
        write_ops: s.write_ops.load(Ordering::Relaxed),
        write_bytes: s.write_bytes.load(Ordering::Relaxed),
        errors: s.errors.load(Ordering::Relaxed),
        read_p50_ns: reads.quantile(0.5),
        read_p99_ns: reads.quantile(0.99),
        write_p50_ns: writes.quantile(0.5),
        write_p99_ns: writes.quantile(0.99),
        busy_bytes_per_sec: if busy == 0 {
            0
        } else {
            (bytes as f64 * 1e9 / busy as f64) as u64
        },
    }
}

impl RaidArray {
    pub fn status(&self) -> RaidStatus {
        let core = &self.core;
        let g = core.geo;
        let rr = core.region_rows();
        let mut members = Vec::new();
        let mut recovering = false;
        let mut replacements = Vec::new();
        for (slot, m) in core.members().iter().enumerate() {
            let Some(m) = m else {
                members.push(MemberStatus {
                    slot: Some(slot),
                    name: None,
                    state: MemberState::Missing,
                    recovered_bytes: None,
                    replacing: None,
                    replaced_by: None,
                    io: None,
                });
                continue;
            };
            let (state, recovered) = match &*m.state.read() {
                SyncState::InSync => (MemberState::InSync, None),
                SyncState::Failed => (MemberState::Failed, None),
                SyncState::Recovering { done_rows, .. } => {
                    recovering = true;
                    (MemberState::Recovering, Some(done_rows * g.chunk))
                }
            };
            let replacement = m.replacement().filter(|r| !r.is_failed() && !m.is_failed());
            members.push(MemberStatus {
                slot: Some(slot),
                name: Some(m.name()),
                state,
                recovered_bytes: recovered,
                replacing: None,
                replaced_by: replacement.as_ref().map(|r| r.name()),
                io: Some(io_of(m)),
            });
            if let Some(r) = replacement {
                let copied = match &*r.state.read() {
                    SyncState::Recovering { done_rows, .. } => done_rows * g.chunk,
                    _ => 0,
                };
                replacements.push(MemberStatus {
                    slot: None,
                    name: Some(r.name()),
                    state: MemberState::Replacement,
                    recovered_bytes: Some(copied),
                    replacing: Some(slot),
                    replaced_by: None,
                    io: Some(io_of(&r)),
                });
            }
        }
        // After the slots, so that members[slot] is the slot's member.
        members.extend(replacements);
        for s in core.spares.lock().iter() {
            members.push(MemberStatus {
                slot: None,
                name: Some(s.name()),
                state: MemberState::Spare,
                recovered_bytes: None,
                replacing: None,
                replaced_by: None,
                io: None,
            });
        }
        let state = if !core.survives() {
            ArrayState::Failed
        } else if core.whole() {
            ArrayState::Clean
        } else if recovering {
            ArrayState::Rebuilding
        } else {
            ArrayState::Degraded
        };
        let report = core.report.lock().clone();
        let speed = *core.sync_speed.lock();
        RaidStatus {
            array_id: format!("{:032x}", core.array_id),
            level: g.level.number(),
            state,
            size_bytes: g.size(),
            chunk_bytes: g.chunk,
            events: core.events.lock().0,
            member_failures: core.failures.load(Ordering::Relaxed),
            members,
            sync: core.progress.lock().clone().map(|p| SyncProgress {
                kind: p.kind,
                slot: p.slot,
                done_bytes: p.done_bytes,
                total_bytes: p.total_bytes,
                bytes_per_sec: p.bytes_per_sec,
            }),
            sync_speed_min: speed.0,
            sync_speed_max: speed.1,
            bitmap: BitmapStatus {
                region_bytes: rr * g.chunk,
                regions: core.bitmap.regions,
                dirty_regions: core.bitmap.dirty().count(),
                last_resync_bytes: report.last_resync_bytes,
                last_catch_up_bytes: report.last_catch_up_bytes,
            },
            last_scrub: report.last_scrub,
            last_scrub_at_ms: crate::core::unix_millis(*core.last_scrub_at.lock()),
            log_slots: core.log_slots,
            log_live_sectors: core.log.as_ref().map_or(0, |l| l.live_sectors()),
            weakest_link: self.weakest_link(),
            forced: self.forced.clone(),
        }
    }
}
