//! The RAID5/6 write hole: a power cut between the data and the parity
//! writes of a partial row, then the loss of a member, must not change
//! the columns nobody was writing. The same scenario without the partial
//! parity log shows that it does without it.

mod common;

use std::sync::Arc;

use block::{BlockDevice, FaultyDevice};
use common::*;
use raid::{Level, RaidArray, RaidOptions};

/// Which members' caches reach their media before the cut.
#[derive(Clone, Copy, Debug)]
enum Cut {
    /// The written data column made it, the parity did not.
    DataOnly,
    /// The parity made it, the data did not.
    ParityOnly,
}

/// Writes a whole array, flushes, rewrites one page of column 0 of row 0,
/// cuts the power as `cut` says, loses the members holding `lost`
/// columns of row 0 (never column 0), and returns whether row 0's other
/// columns read back as before.
fn untouched_columns_survive(level: Level, log_slots: u32, cut: Cut, lost: &[usize]) -> bool {
    let opts = RaidOptions {
        log_slots,
        ..options()
    };
    let n = members_for(level);
    let members: Vec<Arc<FaultyDevice>> = (0..n).map(|_| faulty(member_size(8))).collect();
    let a = RaidArray::create(level, devs(&members), vec![], opts.clone()).unwrap();
    let g = a.geometry();
    let data = pattern(a.size() as usize, 11);
    a.write_at(&data, 0, false).unwrap();
    a.flush().unwrap();
    a.write_at(&pattern(4096, 12), 0, false).unwrap();
    let flushed: Vec<usize> = match cut {
        Cut::DataOnly => vec![g.data_member(0, 0)],
        Cut::ParityOnly => {
            let mut p = vec![g.p_member(0)];
            if level == Level::Raid6 {
                p.push(g.q_member(0));
            }
            p
        }
    };
    for m in &flushed {
        members[*m].flush().unwrap();
    }
    drop(a);
    for m in &members {
        m.drop_unflushed();
    }
    let gone: Vec<usize> = lost.iter().map(|c| g.data_member(0, *c)).collect();
    let live: Vec<Arc<dyn BlockDevice>> = (0..n)
        .filter(|i| !gone.contains(i))
        .map(|i| members[i].clone() as Arc<dyn BlockDevice>)
        .collect();
    let a = RaidArray::assemble(live, opts).unwrap();
    let row_bytes = (g.data_columns() as u64 * CHUNK) as usize;
    let mut got = vec![0u8; row_bytes - 4096];
    a.read_at(&mut got, 4096).unwrap();
    got == data[4096..row_bytes]
}

#[test]
fn raid5_write_hole_is_closed() {
    for cut in [Cut::DataOnly, Cut::ParityOnly] {
        for lost in 1..3 {
            assert!(
                untouched_columns_survive(Level::Raid5, 16, cut, &[lost]),
                "{cut:?}, column {lost} lost"
            );
        }
    }
}

#[test]
fn raid6_write_hole_is_closed() {
    for cut in [Cut::DataOnly, Cut::ParityOnly] {
        assert!(
            untouched_columns_survive(Level::Raid6, 16, cut, &[1]),
            "{cut:?}, one lost"
        );
        assert!(
            untouched_columns_survive(Level::Raid6, 16, cut, &[1, 2]),
            "{cut:?}, two lost"
        );
    }
}

#[test]
fn without_the_log_the_same_cut_corrupts_untouched_columns() {
    // What the log is for: each of these reads wrong data without it.
    for cut in [Cut::DataOnly, Cut::ParityOnly] {
        assert!(
            !untouched_columns_survive(Level::Raid5, 0, cut, &[1]),
            "{cut:?}"
        );
        assert!(
            !untouched_columns_survive(Level::Raid6, 0, cut, &[1, 2]),
            "{cut:?}"
        );
    }
}

/// A FUA partial write of a row leaves its entry on the members until a
/// flush; a later whole-row write of the row must supersede it there
/// too, or replay rebuilds the missing column from the old entry's
/// partial parity and rewrites the parity to match that.
#[test]
fn a_whole_row_write_supersedes_an_older_entry_of_its_row() {
    let n = members_for(Level::Raid5);
    let members: Vec<Arc<FaultyDevice>> = (0..n).map(|_| faulty(member_size(8))).collect();
    let opts = RaidOptions {
        log_slots: 16,
        ..options()
    };
    let a = RaidArray::create(Level::Raid5, devs(&members), vec![], opts.clone()).unwrap();
    let g = a.geometry();
    let lost = g.data_member(0, 1);
    a.fail(lost).unwrap();
    a.write_at(&pattern(512, 1), 0, true).unwrap();
    let row = pattern((g.data_columns() as u64 * CHUNK) as usize, 2);
    a.write_at(&row, 0, true).unwrap();
    drop(a);
    let live: Vec<Arc<dyn BlockDevice>> = (0..n)
        .filter(|i| *i != lost)
        .map(|i| members[i].clone() as Arc<dyn BlockDevice>)
        .collect();
    let a = RaidArray::assemble(live, opts).unwrap();
    let mut got = vec![0u8; row.len()];
    a.read_at(&mut got, 0).unwrap();
    assert!(got == row, "row 0 reads other than its last FUA write");
}
