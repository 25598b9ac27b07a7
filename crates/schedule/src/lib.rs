//! Periodic snapshots, as an admin sets them with `[[schedule]]`: a
//! snapshot of a volume every `every`, aligned on `at` (UTC), the newest
//! `keep` kept. This crate decides; the daemon carries out.
//!
//! Snapshots are named after the volume and the time they were taken
//! (`gold.auto-20261125T020000Z`), so the pool itself records what ran:
//! after a restart the newest such name tells whether the last due time
//! was missed, and one snapshot (not one per missed time) catches up.

use std::time::Duration;

/// What one schedule asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    pub volume: String,
    pub every: Duration,
    /// Offset of the due times within a day (UTC), e.g. 02:00.
    pub at: Option<Duration>,
    pub keep: usize,
}

/// What to do now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The snapshot to take, if one is due.
    pub take: Option<String>,
    /// Snapshots beyond `keep`, oldest first, to delete.
    pub prune: Vec<String>,
    /// Snapshots beyond `keep` that something depends on (a clone), kept.
    pub held: Vec<String>,
}

const MARK: &str = ".auto-";
const FORMAT: &str = "%Y%m%dT%H%M%SZ";

/// The name of `volume`'s snapshot taken at `unix` seconds.
pub fn snapshot_name(volume: &str, unix: i64) -> String {
    let at = jiff::Timestamp::from_second(unix).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    format!("{volume}{MARK}{}", at.strftime(FORMAT))
}

/// When `name` was taken, if it is one of `volume`'s scheduled snapshots.
pub fn taken_at(volume: &str, name: &str) -> Option<i64> {
    let stamp = name.strip_prefix(volume)?.strip_prefix(MARK)?;
    let civil = jiff::fmt::strtime::parse(FORMAT, stamp)
        .ok()?
        .to_datetime()
        .ok()?;
    let at = jiff::tz::TimeZone::UTC.to_timestamp(civil).ok()?;
    Some(at.as_second())
}

fn seconds(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX).max(1)
}

/// The latest due time at or before `now`: `at` plus a whole number of
/// `every`, counted from the Unix epoch.
pub fn last_due(spec: &Spec, now: i64) -> i64 {
    let every = seconds(spec.every);
    let offset = spec.at.map_or(0, seconds_of_day) % every;
    (now - offset).div_euclid(every) * every + offset
}

fn seconds_of_day(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(0) % 86_400
}

/// The first due time after `now`.
pub fn next_due(spec: &Spec, now: i64) -> i64 {
    last_due(spec, now) + seconds(spec.every)
}

/// What to do at `now`, given the names of the volume's snapshots and
/// whether anything depends on a snapshot (a clone made from it).
pub fn plan(
    spec: &Spec,
    now: i64,
    snapshots: &[String],
    depended_on: impl Fn(&str) -> bool,
) -> Plan {
    let mut ours: Vec<(i64, String)> = snapshots
        .iter()
        .filter_map(|n| taken_at(&spec.volume, n).map(|t| (t, n.clone())))
        .collect();
    ours.sort();
    let newest = ours.last().map(|(t, _)| *t);
    let take = match newest {
        Some(t) if t >= last_due(spec, now) => None,
        // Named by the second it is taken, unless that name exists (two
        // due times within one second).
        _ if newest == Some(now) => None,
        _ => Some(snapshot_name(&spec.volume, now)),
    };
    if let Some(name) = &take {
        ours.push((now, name.clone()));
    }
    let beyond = ours.len().saturating_sub(spec.keep.max(1));
    let (prune, held) = ours[..beyond]
        .iter()
        .map(|(_, n)| n.clone())
        .partition(|n| !depended_on(n));
    Plan { take, prune, held }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn daily_at_two(keep: usize) -> Spec {
        Spec {
            volume: "gold".into(),
            every: Duration::from_secs(86_400),
            at: Some(Duration::from_secs(2 * 3600)),
            keep,
        }
    }

    // 2026-11-25T02:00:00Z
    const NOV25_0200: i64 = 1_795_572_000;

    #[test]
    fn names_carry_their_time_and_read_back() {
        let n = snapshot_name("gold", NOV25_0200);
        assert_eq!(n, "gold.auto-20261125T020000Z");
        assert_eq!(taken_at("gold", &n), Some(NOV25_0200));
        assert_eq!(taken_at("golden", &n), None);
        assert_eq!(taken_at("gold", "gold.manual"), None);
        assert_eq!(taken_at("gold", "gold.auto-garbage"), None);
    }

    #[test]
    fn due_times_follow_at_and_every() {
        let s = daily_at_two(7);
        assert_eq!(last_due(&s, NOV25_0200), NOV25_0200);
        assert_eq!(last_due(&s, NOV25_0200 - 1), NOV25_0200 - 86_400);
        assert_eq!(next_due(&s, NOV25_0200 + 5), NOV25_0200 + 86_400);
        let every_3s = Spec {
            every: Duration::from_secs(3),
            at: None,
            ..s
        };
        assert_eq!(last_due(&every_3s, 10), 9);
        assert_eq!(next_due(&every_3s, 10), 12);
    }

    #[test]
    fn one_snapshot_per_due_time_and_one_to_catch_up() {
        let s = daily_at_two(7);
        let first = plan(&s, NOV25_0200 + 10, &[], |_| false);
        let name = first.take.clone().expect("none yet: take one");
        // Later the same day: nothing due.
        let again = plan(&s, NOV25_0200 + 3600, std::slice::from_ref(&name), |_| {
            false
        });
        assert_eq!(again, Plan::default());
        // Three days of downtime: one snapshot, not three.
        let after = plan(&s, NOV25_0200 + 3 * 86_400 + 60, &[name], |_| false);
        assert_eq!(after.take.as_deref(), Some("gold.auto-20261128T020100Z"));
        assert!(after.prune.is_empty());
    }

    #[test]
    fn prunes_the_oldest_beyond_keep_but_never_one_a_clone_needs() {
        let s = daily_at_two(2);
        let names: Vec<String> = (0..4)
            .map(|d| snapshot_name("gold", NOV25_0200 + d * 86_400))
            .chain(["gold.manual".to_string()])
            .collect();
        let p = plan(&s, NOV25_0200 + 4 * 86_400, &names, |n| n == names[1]);
        assert_eq!(p.take.as_deref(), Some("gold.auto-20261129T020000Z"));
        // Five of ours with the new one, keep 2: three beyond.
        assert_eq!(p.prune, vec![names[0].clone(), names[2].clone()]);
        assert_eq!(p.held, vec![names[1].clone()]);
    }
}
