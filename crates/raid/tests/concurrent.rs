//! Writers on many threads while a member fails, a spare rebuilds and a
//! scrub runs: every block reads back as its writer last wrote it, the
//! scrub finds nothing, and the rebuilt member holds the data.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use block::BlockDevice;
use common::*;
use parking_lot::Mutex;
use raid::{ArrayState, Level, RaidOptions};

const BLOCK: u64 = 1536; // crosses sectors, chunks and rows at odd places

#[test]
fn writers_rebuild_and_scrub_together() {
    for level in [Level::Raid1, Level::Raid10, Level::Raid5, Level::Raid6] {
        let n = members_for(level);
        let size = member_size(48);
        let members: Vec<_> = (0..n).map(|_| faulty(size)).collect();
        let spare = faulty(size);
        let opts = RaidOptions {
            // Slow enough that writes land on both sides of the rebuild.
            sync_speed_min: 2 << 20,
            sync_speed_max: 2 << 20,
            ..options()
        };
        let a = raid::RaidArray::create(
            level,
            devs(&members),
            devs(std::slice::from_ref(&spare)),
            opts,
        )
        .unwrap();
        let blocks = a.size() / BLOCK;
        let model = Mutex::new(vec![0u8; (blocks * BLOCK) as usize]);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (a, model, stop) = (&a, &model, &stop);
                s.spawn(move || {
                    let mut round = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        // Thread t owns blocks t, t+4, ...: neighbours share
                        // rows with other threads.
                        let b = t + 4 * ((round * 7919) % (blocks / 4));
                        let data = pattern(BLOCK as usize, t << 32 | round);
                        a.write_at(&data, b * BLOCK, round.is_multiple_of(5))
                            .unwrap();
                        model.lock()[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize]
                            .copy_from_slice(&data);
                        let mut back = vec![0u8; BLOCK as usize];
                        a.read_at(&mut back, b * BLOCK).unwrap();
                        assert!(back == data, "{level:?}: block {b} reads back wrong");
                        round += 1;
                        if round.is_multiple_of(64) {
                            a.flush().unwrap();
                        }
                    }
                });
            }
            std::thread::sleep(Duration::from_millis(50));
            members[1].set_fail_writes(true);
            members[1].set_fail_reads(true);
            // The writers find the member failed; then it is rebuilt.
            let failing = std::time::Instant::now();
            while a.status().member_failures == 0 {
                assert!(
                    failing.elapsed() < Duration::from_secs(10),
                    "{level:?}: no failure seen"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            assert!(
                a.wait_idle(Duration::from_secs(30)),
                "{level:?}: rebuild did not end"
            );
            let scrub = a.scrub(false).unwrap();
            stop.store(true, Ordering::Relaxed);
            assert_eq!(scrub.mismatches, 0, "{level:?}: {scrub:?}");
        });
        let st = a.status();
        assert_eq!(
            st.state,
            ArrayState::Clean,
            "{level:?}: {}",
            serde_json::to_string(&st).unwrap()
        );
        let model = model.into_inner();
        let mut got = vec![0u8; model.len()];
        a.read_at(&mut got, 0).unwrap();
        assert!(got == model, "{level:?}: content differs");
        // The rebuilt member carries its share: lose another one.
        members[0].set_fail_reads(true);
        a.read_at(&mut got, 0).unwrap();
        assert!(got == model, "{level:?}: content differs without member 0");
    }
}
