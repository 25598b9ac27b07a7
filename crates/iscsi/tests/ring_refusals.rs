//! A connection's read ring after the kernel refuses a submit. A binary of
//! its own: the refusals asked for here are process-wide.

mod support;

use std::time::Duration;

use iscsi::pdu::Opcode;
use support::*;

#[tokio::test]
async fn reads_whose_submit_was_refused_still_complete() {
    let (ram, content, _server, mut c) = ring_session(5).await;

    // One burst, so that one submit carries every read; it and the first
    // retry are refused. Nothing else is in flight and the initiator sends
    // nothing more: only the ring itself can bring the reads back.
    iscsi::faults::refuse_ring_submits(2);
    let lbas: Vec<u32> = (0..24).map(|i| i * 41).collect();
    let mut asked = Asked::new();
    send_reads(&mut c, lbas.iter().copied(), &mut asked).await;

    for answered in 0..lbas.len() {
        let p = c
            .recv_within(Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("only {answered} of {} reads answered", lbas.len()));
        assert_eq!(p.bhs.opcode(), Some(Opcode::DataIn));
        let lba = asked.remove(&p.bhs.itt()).expect("one answer per read");
        assert_eq!(&p.data[..], &content[lba * BLOCK..(lba + 8) * BLOCK]);
        assert_eq!(p.bhs.byte(3), 0, "GOOD");
    }
    assert_eq!(iscsi::faults::ring_submits_refused(), 2);
    assert_eq!(
        ram.ring_finished.load(std::sync::atomic::Ordering::SeqCst),
        lbas.len(),
        "every read ran on the ring"
    );
}
