//! `pool check`: every unit must be owned exactly as its reference count
//! says, both in memory and in the committed metadata.

use std::collections::BTreeMap;
use std::io;

use crate::pool::Pool;
use crate::store::Loaded;

/// What a check found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    pub total_units: u64,
    pub used_units: u64,
    pub volumes: u64,
    pub mappings: u64,
    /// Every inconsistency, one line each; empty when the pool is clean.
    pub problems: Vec<String>,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Compares reference counts with the mappings that should account for
/// them: a count above the mappings is a leak, below is double ownership.
fn compare(
    what: &str,
    total: u64,
    unit_size: u64,
    volumes: &BTreeMap<u64, (String, u64, &BTreeMap<u64, u64>)>,
    count_of: &dyn Fn(u64) -> u32,
    counted_units: &[u64],
    problems: &mut Vec<String>,
) -> u64 {
    let mut seen: BTreeMap<u64, u32> = BTreeMap::new();
    let mut mappings = 0;
    for (name, size, map) in volumes.values() {
        let vunits = size.div_ceil(unit_size);
        for (&vunit, &unit) in map.iter() {
            mappings += 1;
            if vunit >= vunits {
                problems.push(format!("{what}: {name} maps unit {vunit} beyond its size"));
            }
            if unit >= total {
                problems.push(format!(
                    "{what}: {name} maps physical unit {unit} beyond the pool"
                ));
            }
            *seen.entry(unit).or_default() += 1;
        }
    }
    for (&unit, &n) in &seen {
        let c = count_of(unit);
        if c < n {
            problems.push(format!(
                "{what}: unit {unit} is mapped {n} times but counted {c} (double ownership)"
            ));
        }
    }
    for &unit in counted_units {
        let c = count_of(unit);
        let n = seen.get(&unit).copied().unwrap_or(0);
        if c > n {
            problems.push(format!(
                "{what}: unit {unit} is counted {c} but mapped {n} times (leak)"
            ));
        }
    }
    mappings
}

impl Pool {
    /// Verifies unit ownership in memory and in the committed metadata,
    /// and that the data devices still carry this pool's superblocks.
    pub fn check(&self) -> io::Result<CheckReport> {
        let mut report = CheckReport::default();
        let unit_size = self.unit_size();
        {
            let st = self.state.read();
            let total = st.space.total();
            report.total_units = total;
            report.used_units = st.space.used();
            report.volumes = st.volumes.len() as u64;
            // In unit order, as the store keeps them, so both read alike.
            let maps: BTreeMap<u64, BTreeMap<u64, u64>> = st
                .volumes
                .iter()
                .map(|(&id, v)| (id, v.map.iter().collect()))
                .collect();
            let vols = st
                .volumes
                .iter()
                .map(|(&id, v)| (id, (v.record.name.clone(), v.record.size, &maps[&id])))
                .collect();
            let counted: Vec<u64> = (0..total).filter(|&u| st.space.count(u) > 0).collect();
            report.mappings = compare(
                "memory",
                total,
                unit_size,
                &vols,
                &|u| st.space.count(u),
                &counted,
                &mut report.problems,
            );
            for u in 0..total {
                if st.space.is_held(u) && st.space.count(u) != 0 {
                    report
                        .problems
                        .push(format!("memory: held unit {u} is still referenced"));
                }
            }
            if st.space.used() != counted.len() as u64 {
                report.problems.push(format!(
                    "memory: {} units counted used, {} have references",
                    st.space.used(),
                    counted.len()
                ));
            }
        }
        let loaded: Loaded = self.store().load()?;
        let vols = loaded
            .volumes
            .iter()
            .map(|(&id, (rec, map))| (id, (rec.name.clone(), rec.size, map)))
            .collect();
        let counted: Vec<u64> = loaded.refs.keys().copied().collect();
        compare(
            "committed",
            report.total_units,
            unit_size,
            &vols,
            &|u| loaded.refs.get(&u).copied().unwrap_or(0),
            &counted,
            &mut report.problems,
        );
        for (&id, (rec, _)) in &loaded.volumes {
            if let Some(p) = rec.parent {
                if !loaded.volumes.contains_key(&p) {
                    report.problems.push(format!(
                        "committed: {} (id {id}) names a missing parent {p}",
                        rec.name
                    ));
                }
            }
        }
        Ok(report)
    }
}
