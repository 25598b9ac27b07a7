//! A RAID array in `/metrics`: its state, sync progress, and per member
//! its state, bytes, operations, errors and latency.

use stats::{Sample, SampleKind};

/// The array state as a number: 0 clean, 1 degraded, 2 rebuilding, 3 failed.
fn array_state(state: raid::ArrayState) -> u64 {
    match state {
        raid::ArrayState::Clean => 0,
        raid::ArrayState::Degraded => 1,
        raid::ArrayState::Rebuilding => 2,
        raid::ArrayState::Failed => 3,
    }
}

/// The samples of the array open as device `name`.
pub fn raid_samples(name: &str, array: &raid::RaidArray) -> Vec<Sample> {
    use SampleKind::{Counter, Gauge};
    let s = array.status();
    let at = || vec![("device", name.to_string())];
    let sample = |name, help, kind, labels, value| Sample {
        name,
        help,
        kind,
        labels,
        value,
    };
    let mut out = vec![
        sample(
            "openarray_raid_state",
            "0 clean, 1 degraded, 2 rebuilding, 3 failed",
            Gauge,
            at(),
            array_state(s.state),
        ),
        sample(
            "openarray_raid_member_failures",
            "Members failed by an I/O error, a timeout or the administrator",
            Counter,
            at(),
            s.member_failures,
        ),
        sample(
            "openarray_raid_dirty_regions",
            "Write-intent bitmap regions dirty now",
            Gauge,
            at(),
            s.bitmap.dirty_regions,
        ),
    ];
    if let Some(p) = &s.sync {
        let mut labels = at();
        labels.push(("kind", p.kind.to_string()));
        out.push(sample(
            "openarray_raid_sync_done_bytes",
            "Bytes of the running resync, rebuild or scrub done",
            Gauge,
            labels.clone(),
            p.done_bytes,
        ));
        out.push(sample(
            "openarray_raid_sync_total_bytes",
            "Bytes the running resync, rebuild or scrub covers",
            Gauge,
            labels,
            p.total_bytes,
        ));
    }
    for m in &s.members {
        let labels = || {
            vec![
                ("device", name.to_string()),
                ("member", m.name.clone().unwrap_or_else(|| "-".into())),
                ("slot", m.slot.map_or("spare".into(), |s| s.to_string())),
                ("state", super::member_state(m.state).to_string()),
            ]
        };
        out.push(sample(
            "openarray_raid_member_up",
            "1 when the member serves I/O in sync (labelled with its state)",
            Gauge,
            labels(),
            u64::from(m.state == raid::MemberState::InSync),
        ));
        let Some(io) = &m.io else { continue };
        let figures = [
            (
                "openarray_raid_member_read_bytes",
                "Bytes read from the member",
                Counter,
                io.read_bytes,
            ),
            (
                "openarray_raid_member_write_bytes",
                "Bytes written to the member",
                Counter,
                io.write_bytes,
            ),
            (
                "openarray_raid_member_read_ops",
                "Reads of the member",
                Counter,
                io.read_ops,
            ),
            (
                "openarray_raid_member_write_ops",
                "Writes to the member",
                Counter,
                io.write_ops,
            ),
            (
                "openarray_raid_member_errors",
                "I/O errors of the member",
                Counter,
                io.errors,
            ),
            (
                "openarray_raid_member_busy_bytes_per_second",
                "Bytes a second while the member was busy with the array's I/O",
                Gauge,
                io.busy_bytes_per_sec,
            ),
        ];
        for (metric, help, kind, value) in figures {
            out.push(sample(metric, help, kind, labels(), value));
        }
        let latencies = [
            (
                "openarray_raid_member_read_p50_ns",
                "Median read latency, ns",
                io.read_p50_ns,
            ),
            (
                "openarray_raid_member_read_p99_ns",
                "99th percentile read latency, ns",
                io.read_p99_ns,
            ),
            (
                "openarray_raid_member_write_p50_ns",
                "Median write latency, ns",
                io.write_p50_ns,
            ),
            (
                "openarray_raid_member_write_p99_ns",
                "99th percentile write latency, ns",
                io.write_p99_ns,
            ),
        ];
        for (metric, help, value) in latencies {
            if let Some(v) = value {
                out.push(sample(metric, help, Gauge, labels(), v));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use block::{BlockDevice, MemDevice};
    use raid::{Level, RaidArray, RaidOptions};

    use super::*;

    #[test]
    fn an_array_and_its_members_are_sampled() {
        let members: Vec<Arc<dyn BlockDevice>> = (0..3)
            .map(|_| Arc::new(MemDevice::new(16 << 20)) as Arc<dyn BlockDevice>)
            .collect();
        let array = RaidArray::create(
            Level::Raid5,
            members.clone(),
            vec![],
            RaidOptions::default(),
        )
        .unwrap();
        array.wait_idle(std::time::Duration::from_secs(30));
        array.name_members(&[(members[1].clone(), "m1".into())]);
        // Whole rows: every member takes data or parity.
        array.write_at(&vec![3; 1 << 20], 0, true).unwrap();
        array.fail(2).unwrap();
        let s = raid_samples("r5", &array);
        let find = |name: &str, member: Option<&str>| {
            s.iter()
                .find(|x| {
                    x.name == name
                        && member
                            .is_none_or(|m| x.labels.iter().any(|(k, v)| *k == "member" && v == m))
                })
                .map(|x| x.value)
        };
        assert_eq!(find("openarray_raid_state", None), Some(1));
        assert_eq!(find("openarray_raid_member_failures", None), Some(1));
        assert_eq!(find("openarray_raid_member_up", Some("m1")), Some(1));
        assert!(find("openarray_raid_member_write_bytes", Some("m1")).unwrap() > 0);
        let down = s
            .iter()
            .filter(|x| x.name == "openarray_raid_member_up" && x.value == 0)
            .count();
        assert_eq!(down, 1);
    }
}
