//! Forced assembly (md's `--assemble --force`): when too few members
//! saw the newest events for the array to serve its data, the freshest of
//! the stale members are taken as in sync until it can.
//!
//! Members that fail one after another while the array runs each bump the
//! events of those still in, so after a restart the array may have no
//! quorum of members at the newest events though every acknowledged
//! write is on the members that went last. Forcing those back (and
//! resyncing every region any member's bitmap marks dirty, as after an
//! unclean stop) brings the array back; writes the forced members missed
//! are lost, which is why it is never done unasked.

use std::sync::Arc;

use block::BlockDevice;
use serde::Serialize;

use crate::array::RaidArray;
use crate::geometry::Geometry;
use crate::member::{Member, SyncState};
use crate::superblock::Superblock;

/// A stale member that forced assembly took as in sync.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ForcedMember {
    pub slot: usize,
    pub name: String,
    /// The events its superblock had.
    pub events: u64,
    /// How many events it was behind the newest members.
    pub gap: u64,
}

/// What a forced assembly made.
pub struct Forced {
    pub array: RaidArray,
    /// Stale members neither needed nor forceable: re-add them to catch
    /// up (or rebuild), as after any absence.
    pub left_out: Vec<Arc<dyn BlockDevice>>,
}

/// Whether a stale member may be forced at all: a released member, an
/// unfinished replacement, a spare or one that was being rebuilt holds
/// no whole copy of its slot's data.
pub(crate) fn forceable(sb: &Superblock, geo: &Geometry) -> bool {
    !sb.released
        && !sb.replacement
        && !sb.recovering
        && !sb.is_spare()
        && (sb.slot as usize) < geo.members
}

/// A stale member found at assembly: device, name, slot, events.
pub(crate) type Stale = (Arc<dyn BlockDevice>, String, usize, u64);

/// Puts into `slots` the stale members the array needs to survive,
/// freshest first, as in sync; the others go to `left_out`. `at`: the
/// newest events and the data offset.
pub(crate) fn force_in(
    geo: &Geometry,
    slots: &mut [Option<Arc<Member>>],
    stale: Vec<Stale>,
    at: (u64, u64),
    left_out: &mut Vec<Arc<dyn BlockDevice>>,
) -> Vec<ForcedMember> {
    let (events, data_offset) = at;
    let lost: Vec<bool> = slots
        .iter()
        .map(|s| s.as_ref().is_none_or(|m| !m.is_in_sync()))
        .collect();
    // A slot someone holds (even recovering) is not taken over.
    let (stale, held): (Vec<_>, Vec<_>) = stale.into_iter().partition(|s| slots[s.2].is_none());
    left_out.extend(held.into_iter().map(|s| s.0));
    let candidates: Vec<(usize, u64)> = stale.iter().map(|s| (s.2, s.3)).collect();
    let chosen = if geo.survives(&lost) {
        Some(Vec::new())
    } else {
        choose(geo, &lost, &candidates)
    };
    let mut forced = Vec::new();
    for (i, (dev, name, slot, ev)) in stale.into_iter().enumerate() {
        if !chosen.as_ref().is_some_and(|c| c.contains(&i)) {
            left_out.push(dev);
            continue;
        }
        let member = Member::new(dev, name.clone(), SyncState::InSync, data_offset);
        slots[slot] = Some(Arc::new(member));
        forced.push(ForcedMember {
            slot,
            name,
            events: ev,
            gap: events - ev,
        });
    }
    forced
}

/// Picks, from `candidates` (`(slot, events)` of stale members that pass
/// [`forceable`]), the freshest ones that fill lost slots, one at a time,
/// until the geometry survives. `lost` is by slot. Returns the indices
/// into `candidates` to force, or `None` if even all of them are too few.
pub(crate) fn choose(
    geo: &Geometry,
    lost: &[bool],
    candidates: &[(usize, u64)],
) -> Option<Vec<usize>> {
    let mut lost = lost.to_vec();
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    // Freshest first; the sort is stable, so ties go in the order given.
    order.sort_by_key(|&i| std::cmp::Reverse(candidates[i].1));
    let mut chosen = Vec::new();
    for i in order {
        if geo.survives(&lost) {
            break;
        }
        let slot = candidates[i].0;
        if lost[slot] {
            lost[slot] = false;
            chosen.push(i);
        }
    }
    geo.survives(&lost).then_some(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::Level;

    fn geo(level: Level, members: usize) -> Geometry {
        Geometry {
            level,
            members,
            chunk: 4096,
            rows: 16,
        }
    }

    #[test]
    fn the_freshest_stale_members_are_forced_until_the_array_survives() {
        let g = geo(Level::Raid6, 6);
        // Slots 3..5 fresh; 0, 1, 2 stale at 5, 9 and 7 events.
        let lost = [true, true, true, false, false, false];
        let got = choose(&g, &lost, &[(0, 5), (1, 9), (2, 7)]).unwrap();
        assert_eq!(got, vec![1]);
        let g = geo(Level::Raid5, 4);
        let lost = [true, true, true, false];
        assert_eq!(
            choose(&g, &lost, &[(0, 5), (1, 9), (2, 7)]).unwrap(),
            vec![1, 2]
        );
    }

    #[test]
    fn released_replacement_recovering_spare_and_out_of_range_members_are_never_forced() {
        let g = geo(Level::Raid5, 4);
        let sb = Superblock::plain(Level::Raid5, 4, 1, 3);
        assert!(forceable(&sb, &g));
        let not = [
            Superblock {
                released: true,
                ..sb.clone()
            },
            Superblock {
                replacement: true,
                ..sb.clone()
            },
            Superblock {
                recovering: true,
                ..sb.clone()
            },
            Superblock {
                slot: crate::superblock::SPARE_SLOT,
                ..sb.clone()
            },
            Superblock { slot: 4, ..sb },
        ];
        for sb in &not {
            assert!(!forceable(sb, &g), "{sb:?}");
        }
    }

    #[test]
    fn too_few_even_forced_is_none_and_a_held_slot_is_not_forced_twice() {
        let g = geo(Level::Raid5, 4);
        assert_eq!(choose(&g, &[true, true, true, false], &[(0, 3)]), None);
        // Two stale copies of slot 0: only one can fill it.
        assert_eq!(
            choose(&g, &[true, true, true, false], &[(0, 3), (0, 4)]),
            None
        );
        assert_eq!(
            choose(&g, &[true, false, false, false], &[(0, 3)]).unwrap(),
            Vec::<usize>::new()
        );
    }
}
