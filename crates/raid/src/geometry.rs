//! Where each byte of the array lives on the members.
//!
//! Two families: *copies* (RAID0 = one copy, RAID1 = a copy per member,
//! RAID10 = md's "near 2" layout) place each logical chunk on one or more
//! members; *parity* (RAID5 left-symmetric, RAID6 with Q after P, as md
//! lays them out) places a row of data chunks with one or two parity
//! chunks. Offsets here are relative to each member's data area.

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Level {
    Raid0,
    Raid1,
    Raid10,
    Raid5,
    Raid6,
}

impl Level {
    pub fn from_number(n: u32) -> Option<Level> {
        Some(match n {
            0 => Level::Raid0,
            1 => Level::Raid1,
            10 => Level::Raid10,
            5 => Level::Raid5,
            6 => Level::Raid6,
            _ => return None,
        })
    }

    pub fn number(self) -> u32 {
        match self {
            Level::Raid0 => 0,
            Level::Raid1 => 1,
            Level::Raid10 => 10,
            Level::Raid5 => 5,
            Level::Raid6 => 6,
        }
    }

    /// Members a level needs at least.
    pub fn min_members(self) -> usize {
        match self {
            Level::Raid0 => 1,
            Level::Raid1 | Level::Raid10 => 2,
            Level::Raid5 => 3,
            Level::Raid6 => 4,
        }
    }

    /// Parity chunks per row (0 for the copies family).
    pub fn parity(self) -> usize {
        match self {
            Level::Raid5 => 1,
            Level::Raid6 => 2,
            _ => 0,
        }
    }
}

/// One chunk of a member: which member, which row (chunk-sized unit of
/// its data area).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub member: usize,
    pub row: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub level: Level,
    pub members: usize,
    /// Bytes per chunk (stripe unit).
    pub chunk: u64,
    /// Chunk rows in each member's data area.
    pub rows: u64,
}

impl Geometry {
    /// Data chunks per parity row.
    pub fn data_columns(&self) -> usize {
        self.members - self.level.parity()
    }

    /// Copies of each chunk in the copies family.
    pub fn copies(&self) -> usize {
        match self.level {
            Level::Raid0 => 1,
            Level::Raid1 => self.members,
            Level::Raid10 => 2,
            _ => 1,
        }
    }

    pub fn is_parity(&self) -> bool {
        self.level.parity() > 0
    }

    /// Logical chunks the array holds.
    pub fn logical_chunks(&self) -> u64 {
        match self.level {
            Level::Raid0 => self.rows * self.members as u64,
            Level::Raid1 => self.rows,
            Level::Raid10 => self.rows * self.members as u64 / 2,
            Level::Raid5 | Level::Raid6 => self.rows * self.data_columns() as u64,
        }
    }

    pub fn size(&self) -> u64 {
        self.logical_chunks() * self.chunk
    }

    /// The unit writes are serialised on: a parity row, or a logical chunk.
    pub fn stripe_of_chunk(&self, chunk: u64) -> u64 {
        if self.is_parity() {
            chunk / self.data_columns() as u64
        } else {
            chunk
        }
    }

    /// Where the copies of logical chunk `chunk` are (copies family).
    pub fn copies_of(&self, chunk: u64) -> Vec<Place> {
        let n = self.members as u64;
        match self.level {
            Level::Raid0 => vec![Place {
                member: (chunk % n) as usize,
                row: chunk / n,
            }],
            Level::Raid1 => (0..self.members)
                .map(|member| Place { member, row: chunk })
                .collect(),
            Level::Raid10 => (0..2)
                .map(|c| {
                    let p = chunk * 2 + c;
                    Place {
                        member: (p % n) as usize,
                        row: p / n,
                    }
                })
                .collect(),
            _ => unreachable!("parity levels have no copies"),
        }
    }

    /// The member holding parity P of `row`.
    pub fn p_member(&self, row: u64) -> usize {
        let n = self.members as u64;
        (n - 1 - row % n) as usize
    }

    /// The member holding Q of `row` (RAID6).
    pub fn q_member(&self, row: u64) -> usize {
        (self.p_member(row) + 1) % self.members
    }

    /// The member holding data column `column` of parity row `row`.
    pub fn data_member(&self, row: u64, column: usize) -> usize {
        (self.p_member(row) + self.level.parity() + column) % self.members
    }

    /// What a member's chunk at `row` is: data column, P or Q.
    pub fn role_in_row(&self, row: u64, member: usize) -> Role {
        let p = self.p_member(row);
        let k = (member + self.members - p) % self.members;
        match (k, self.level.parity()) {
            (0, _) => Role::P,
            (1, 2) => Role::Q,
            (k, parity) => Role::Data(k - parity),
        }
    }

    /// The stripe (lock unit) a member's chunk at `row` belongs to.
    pub fn stripe_of_place(&self, place: Place) -> u64 {
        match self.level {
            Level::Raid10 => (place.row * self.members as u64 + place.member as u64) / 2,
            Level::Raid0 => place.row * self.members as u64 + place.member as u64,
            _ => place.row,
        }
    }

    /// Member sets whose loss together loses data (besides bigger sets).
    pub fn survives(&self, failed: &[bool]) -> bool {
        let lost = failed.iter().filter(|f| **f).count();
        match self.level {
            Level::Raid0 => lost == 0,
            Level::Raid1 => lost < self.members,
            Level::Raid5 | Level::Raid6 => lost <= self.level.parity(),
            Level::Raid10 => (0..self.members as u64)
                .all(|k| self.copies_of(k).iter().any(|p| !failed[p.member])),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Data(usize),
    P,
    Q,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo(level: Level, members: usize) -> Geometry {
        Geometry {
            level,
            members,
            chunk: 4096,
            rows: 10,
        }
    }

    #[test]
    fn raid5_is_left_symmetric() {
        // md's left-symmetric with 4 disks: row 0 = D0 D1 D2 P,
        // row 1 = D1 D2 P D0, row 2 = D2 P D0 D1.
        let g = geo(Level::Raid5, 4);
        assert_eq!(g.p_member(0), 3);
        assert_eq!(
            (0..3).map(|c| g.data_member(0, c)).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        assert_eq!(g.p_member(1), 2);
        assert_eq!(
            (0..3).map(|c| g.data_member(1, c)).collect::<Vec<_>>(),
            [3, 0, 1]
        );
        for row in 0..8 {
            for m in 0..4 {
                let role = g.role_in_row(row, m);
                match role {
                    Role::P => assert_eq!(g.p_member(row), m),
                    Role::Data(c) => assert_eq!(g.data_member(row, c), m),
                    Role::Q => panic!("no Q in RAID5"),
                }
            }
        }
    }

    #[test]
    fn raid6_places_every_member_once_per_row() {
        let g = geo(Level::Raid6, 5);
        for row in 0..10 {
            let mut seen = [false; 5];
            seen[g.p_member(row)] = true;
            seen[g.q_member(row)] = true;
            for c in 0..3 {
                let m = g.data_member(row, c);
                assert!(!seen[m]);
                seen[m] = true;
                assert_eq!(g.role_in_row(row, m), Role::Data(c));
            }
            assert_eq!(g.role_in_row(row, g.q_member(row)), Role::Q);
            assert!(seen.iter().all(|s| *s));
        }
        assert_eq!(g.size(), 10 * 3 * 4096);
    }

    #[test]
    fn raid10_near_layout_on_odd_members() {
        let g = geo(Level::Raid10, 3);
        // Chunk 1's copies: positions 2 and 3 = member 2 row 0, member 0 row 1.
        assert_eq!(
            g.copies_of(1),
            [Place { member: 2, row: 0 }, Place { member: 0, row: 1 }]
        );
        for k in 0..g.logical_chunks() {
            for p in g.copies_of(k) {
                assert_eq!(g.stripe_of_place(p), k);
            }
        }
        assert!(g.survives(&[true, false, false]));
        assert!(!g.survives(&[true, true, false]));
        let g4 = geo(Level::Raid10, 4);
        assert!(g4.survives(&[true, false, true, false]));
        assert!(!g4.survives(&[true, true, false, false]));
    }
}
