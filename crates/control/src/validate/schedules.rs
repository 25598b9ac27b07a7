//! The `[[schedule]]` tables: periodic snapshots of volumes.

use std::time::Duration;

use toml::Spanned;

use super::Checker;
use crate::duration::parse_duration;
use crate::model::{PoolConfig, Schedule};
use crate::raw::RawSchedule;

/// Snapshots kept when `keep` is not given.
const DEFAULT_KEEP: usize = 7;

/// `HH:MM` or `HH:MM:SS`, a time of day (UTC).
fn parse_time_of_day(text: &str) -> Result<Duration, String> {
    let parts: Vec<&str> = text.trim().split(':').collect();
    let bad = || format!("{text:?} is not a time of day such as \"02:00\" (UTC)");
    if !(2..=3).contains(&parts.len()) {
        return Err(bad());
    }
    let mut secs = 0u64;
    for (part, limit) in parts.iter().zip([24u64, 60, 60]) {
        let n: u64 = part.parse().map_err(|_| bad())?;
        if n >= limit || part.len() != 2 {
            return Err(bad());
        }
        secs = secs * 60 + n;
    }
    if parts.len() == 2 {
        secs *= 60;
    }
    Ok(Duration::from_secs(secs))
}

impl Checker<'_> {
    pub(super) fn schedules(
        &mut self,
        raw: Vec<Spanned<RawSchedule>>,
        pools: &[PoolConfig],
    ) -> Vec<Schedule> {
        let mut out: Vec<Schedule> = Vec::new();
        for (i, entry) in raw.into_iter().enumerate() {
            let at = self.at(&entry.span());
            let s = entry.into_inner();
            let field = |name: &str| format!("schedule[{i}].{name}");
            let volume = s.volume.get_ref().trim().to_string();
            if volume.is_empty() {
                self.fail(&s.volume.span(), field("volume"), "must not be empty");
            }
            let pool = match (&s.pool, pools) {
                (Some(p), _) if pools.iter().any(|c| c.name == *p.get_ref()) => {
                    Some(p.get_ref().clone())
                }
                (Some(p), _) => {
                    self.fail(
                        &p.span(),
                        field("pool"),
                        format!("no [[pool]] is named {:?}", p.get_ref()),
                    );
                    None
                }
                (None, [only]) => Some(only.name.clone()),
                (None, _) => {
                    let why = if pools.is_empty() {
                        "a schedule needs a [[pool]] holding its volume"
                    } else {
                        "name the pool holding the volume: there are several"
                    };
                    self.fail(&s.volume.span(), field("pool"), why);
                    None
                }
            };
            let every = parse_duration(s.every.get_ref()).and_then(|d| {
                if d < Duration::from_secs(1) {
                    Err(format!("{:?} is shorter than a second", s.every.get_ref()))
                } else {
                    Ok(d)
                }
            });
            let every = self.check(&s.every.span(), || field("every"), every);
            let time = s.at.as_ref().and_then(|t| {
                self.check(&t.span(), || field("at"), parse_time_of_day(t.get_ref()))
            });
            let keep = match &s.keep {
                Some(k) => {
                    let ok = match usize::try_from(*k.get_ref()) {
                        Ok(n) if (1..=10_000).contains(&n) => Ok(n),
                        _ => Err(format!("{} is outside 1..=10000", k.get_ref())),
                    };
                    self.check(&k.span(), || field("keep"), ok)
                }
                None => Some(DEFAULT_KEEP),
            };
            let mut refresh = Vec::new();
            for r in &s.refresh {
                let name = r.get_ref().trim();
                if name.is_empty() || name == volume {
                    self.fail(
                        &r.span(),
                        field("refresh"),
                        "names clones of the volume, not the volume itself or nothing",
                    );
                } else {
                    refresh.push(name.to_string());
                }
            }
            if let Some(first) = out
                .iter()
                .find(|o| Some(&o.pool) == pool.as_ref() && o.spec.volume == volume)
            {
                let line = first.at.map_or(0, |l| l.line);
                self.fail(
                    &s.volume.span(),
                    field("volume"),
                    format!("{volume} already has a schedule (line {line})"),
                );
                continue;
            }
            if let (Some(pool), Some(every), Some(keep)) = (pool, every, keep) {
                out.push(Schedule {
                    pool,
                    spec: schedule::Spec {
                        volume,
                        every,
                        at: time,
                        keep,
                    },
                    refresh,
                    at,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::parse_time_of_day;
    use std::time::Duration;

    #[test]
    fn times_of_day() {
        assert_eq!(parse_time_of_day("02:00"), Ok(Duration::from_secs(7200)));
        assert_eq!(
            parse_time_of_day("23:59:30"),
            Ok(Duration::from_secs(86_370))
        );
        for bad in ["24:00", "2:00", "02:60", "02", "x", "02:00:00:00"] {
            assert!(parse_time_of_day(bad).is_err(), "{bad}");
        }
    }
}
