//! A connection's read ring answers reads that ended when the next burst
//! of commands arrives, without waiting for its reaping task. A binary of
//! its own: holding the reaping task is process-wide.

mod support;

use std::time::Duration;

use iscsi::pdu::Opcode;
use support::*;

/// Take the next answer if one comes within `wait`, checking it against
/// `content`; false if none came.
async fn take_answer(c: &mut Client, asked: &mut Asked, content: &[u8], wait: Duration) -> bool {
    let Some(p) = c.recv_within(wait).await else {
        return false;
    };
    assert_eq!(p.bhs.opcode(), Some(Opcode::DataIn));
    let lba = asked.remove(&p.bhs.itt()).expect("one answer per read");
    assert_eq!(&p.data[..], &content[lba * BLOCK..(lba + 8) * BLOCK]);
    assert_eq!(p.bhs.byte(3), 0, "GOOD");
    true
}

#[tokio::test]
async fn reads_that_ended_are_answered_by_the_next_burst() {
    let (_ram, content, _server, mut c) = ring_session(7).await;

    // With the reaping task held, only a new burst can take the first
    // burst's completions off the ring: one read at a time follows until
    // all eight are answered (each follower is answered by the next).
    iscsi::faults::hold_ring_reaper(true);
    let mut asked = Asked::new();
    send_reads(&mut c, (0..8).map(|i| i * 53), &mut asked).await;
    let first: Vec<u32> = asked.keys().copied().collect();
    // Past the LBA the target declines, so every follower uses the ring.
    let mut follower = DECLINED_LBA;
    while first.iter().any(|itt| asked.contains_key(itt)) {
        follower += 8;
        assert!(
            follower < 4000,
            "the first burst's reads were never answered by the bursts after it"
        );
        send_reads(&mut c, std::iter::once(follower), &mut asked).await;
        while take_answer(&mut c, &mut asked, &content, Duration::from_millis(50)).await {}
    }

    // Let go, the reaping task answers the rest.
    iscsi::faults::hold_ring_reaper(false);
    send_reads(&mut c, std::iter::once(4000), &mut asked).await;
    while !asked.is_empty() {
        let left = asked.len();
        let got = take_answer(&mut c, &mut asked, &content, Duration::from_secs(30)).await;
        assert!(got, "{left} reads left unanswered once the reaper is free");
    }
}
