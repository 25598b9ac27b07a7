use std::sync::Arc;

use export::{AccessState, AccessStates, Cause, ExplicitMoves, MoveRefused, PortGroup};
use parking_lot::Mutex;
use scsi_api::{status, Nexus, ScsiResponse};

use crate::cdb::{be16, be32};
use crate::lu::test_support::*;
use crate::sense::key;
use crate::LogicalUnit;

use AccessState::*;

const STATE_CHANGED: (u8, u8, u8) = (key::UNIT_ATTENTION, 0x2A, 0x06);
const STANDBY: (u8, u8, u8) = (key::NOT_READY, 0x04, 0x0B);
const UNAVAILABLE: (u8, u8, u8) = (key::NOT_READY, 0x04, 0x0C);
const TRANSITIONING: (u8, u8, u8) = (key::NOT_READY, 0x04, 0x0A);

/// A nexus of initiator `name` through port `port` of group `group`.
fn through(name: &str, group: u16, port: u16) -> Nexus {
    Nexus {
        portal_group: group,
        relative_port: port,
        ..nexus(name)
    }
}

fn states(lu: &LogicalUnit) -> &Arc<AccessStates> {
    lu.backing().access_states()
}

/// Group 1 (this node's, port 1) and group 2 (the peer's, port 2), as a
/// pair would set them up, with every state supported.
fn paired(local: AccessState, peer: AccessState) -> Arc<LogicalUnit> {
    let lu = lu();
    states(&lu).configure(
        vec![
            PortGroup::new(1, local, true),
            PortGroup::new(2, peer, false).with_ports(&[2]),
        ],
        Unavailable,
        export::PAIR_SUPPORTED,
    );
    lu
}

fn rtpg(lu: &LogicalUnit, n: &Nexus, format: u8, alloc: u32) -> ScsiResponse {
    let a = alloc.to_be_bytes();
    let cdb = [
        0xA3,
        (format << 5) | 0x0A,
        0,
        0,
        0,
        0,
        a[0],
        a[1],
        a[2],
        a[3],
        0,
        0,
    ];
    run(lu, n, &cdb, &[])
}

fn stpg(lu: &LogicalUnit, n: &Nexus, moves: &[(u8, u16)]) -> ScsiResponse {
    let mut param = vec![0u8; 4];
    for &(state, group) in moves {
        param.push(state);
        param.push(0);
        param.extend_from_slice(&group.to_be_bytes());
    }
    stpg_raw(lu, n, &param)
}

fn stpg_raw(lu: &LogicalUnit, n: &Nexus, param: &[u8]) -> ScsiResponse {
    let l = (param.len() as u32).to_be_bytes();
    let cdb = [0xA4, 0x0A, 0, 0, 0, 0, l[0], l[1], l[2], l[3], 0, 0];
    run(lu, n, &cdb, param)
}

/// Applies what it is asked through the model, or refuses as told.
#[derive(Default)]
struct Pair {
    asked: Mutex<Vec<Vec<(u16, AccessState)>>>,
    refuse: Mutex<Option<MoveRefused>>,
}

impl ExplicitMoves for Pair {
    fn request(
        &self,
        states: &AccessStates,
        moves: &[(u16, AccessState)],
    ) -> Result<(), MoveRefused> {
        self.asked.lock().push(moves.to_vec());
        if let Some(r) = self.refuse.lock().clone() {
            return Err(r);
        }
        let groups: Vec<u16> = moves.iter().map(|m| m.0).collect();
        states.begin_transition(&groups, Cause::Explicit);
        states.set(moves, Cause::Explicit);
        Ok(())
    }
}

fn with_pair(lu: &LogicalUnit) -> Arc<Pair> {
    let pair = Arc::new(Pair::default());
    states(lu).set_explicit(Some(pair.clone()));
    pair
}

fn write10(lu: &LogicalUnit, n: &Nexus) -> ScsiResponse {
    run(lu, n, &rw10(0x2A, 0, 0, 1), &[0xAB; 512])
}

/// A command's name, CDB, Data-Out, and whether standby, unavailable and
/// transitioning let it through.
type Case = (&'static str, Vec<u8>, Vec<u8>, [bool; 3]);

/// One command of each kind the state tables tell apart.
fn commands() -> Vec<Case> {
    let rc16 = vec![0x9E, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0];
    let mut register = vec![0u8; 24];
    register[8..16].copy_from_slice(&7u64.to_be_bytes());
    vec![
        ("TEST UNIT READY", vec![0; 6], vec![], [false, false, false]),
        (
            "READ(10)",
            rw10(0x28, 0, 0, 1),
            vec![],
            [false, false, false],
        ),
        (
            "WRITE(10)",
            rw10(0x2A, 0, 0, 1),
            vec![1; 512],
            [false, false, false],
        ),
        (
            "SYNCHRONIZE CACHE(10)",
            vec![0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            vec![],
            [false, false, false],
        ),
        (
            "INQUIRY",
            vec![0x12, 0, 0, 0, 96, 0],
            vec![],
            [true, true, true],
        ),
        (
            "REQUEST SENSE",
            vec![0x03, 0, 0, 0, 252, 0],
            vec![],
            [true, true, true],
        ),
        (
            "REPORT TARGET PORT GROUPS",
            vec![0xA3, 0x2A, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
            vec![],
            [true, true, true],
        ),
        (
            "MODE SENSE(6)",
            vec![0x1A, 0, 0x3F, 0, 0xFF, 0],
            vec![],
            [true, false, false],
        ),
        (
            "READ CAPACITY(10)",
            vec![0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            vec![],
            [true, false, false],
        ),
        ("READ CAPACITY(16)", rc16, vec![], [true, false, false]),
        (
            "PERSISTENT RESERVE IN",
            vec![0x5E, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0],
            vec![],
            [true, false, false],
        ),
        (
            "PERSISTENT RESERVE OUT",
            vec![0x5F, 0, 0, 0, 0, 0, 0, 0, 24, 0],
            register,
            [true, false, false],
        ),
        (
            "REPORT SUPPORTED OPERATION CODES",
            vec![0xA3, 0x0C, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0, 0],
            vec![],
            [false, false, false],
        ),
    ]
}

#[test]
fn alone_nothing_changes() {
    let lu = lu();
    let a = nexus("a");
    ready(&lu, &a);
    let inq = run(&lu, &a, &[0x12, 0, 0, 0, 96, 0], &[]).data_in;
    assert_eq!(inq[5] & 0x30, 0x10, "implicit ALUA only");
    // No one makes explicit moves: SET TARGET PORT GROUPS is unsupported.
    assert_eq!(
        sense_of(&stpg(&lu, &a, &[(0, 1)])),
        (key::ILLEGAL_REQUEST, 0x20, 0)
    );
    let r = rtpg(&lu, &a, 1, 256);
    assert_eq!(
        r.data_in,
        [0, 0, 0, 16, 0x10, 0, 0, 0, 0, 0x01, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1]
    );
    assert_eq!(write10(&lu, &a).status, status::GOOD);
}

#[test]
fn every_state_answers_as_spc4_says() {
    for (i, state) in [Standby, Unavailable, Transitioning]
        .into_iter()
        .enumerate()
    {
        let lu = paired(ActiveOptimized, Standby);
        let a = nexus("a");
        ready(&lu, &a);
        states(&lu).set(&[(1, state)], Cause::Implicit);
        // The change comes first, then the state.
        assert_eq!(sense_of(&run(&lu, &a, &[0; 6], &[])), STATE_CHANGED);
        let refused = match state {
            Standby => STANDBY,
            Unavailable => UNAVAILABLE,
            _ => TRANSITIONING,
        };
        for (name, cdb, data, allowed) in commands() {
            let r = run(&lu, &a, &cdb, &data);
            if allowed[i] {
                assert_eq!(r.status, status::GOOD, "{name} in {state}: {r:?}");
            } else {
                assert_eq!(sense_of(&r), refused, "{name} in {state}");
            }
        }
        // REQUEST SENSE says why media access fails.
        let r = run(&lu, &a, &[0x03, 0, 0, 0, 252, 0], &[]);
        assert_eq!((r.data_in[2], r.data_in[12], r.data_in[13]), refused);
        // The peer's group is another matter: its nexuses see its state.
        let b = through("b", 2, 2);
        ready(&lu, &b);
        assert_eq!(sense_of(&write10(&lu, &b)), STANDBY);
    }
}

#[test]
fn both_active_states_serve_io() {
    for state in [ActiveOptimized, ActiveNonOptimized] {
        let lu = paired(state, Standby);
        let a = nexus("a");
        ready(&lu, &a);
        for (name, cdb, data, _) in commands() {
            let r = run(&lu, &a, &cdb, &data);
            assert_eq!(r.status, status::GOOD, "{name} in {state}: {r:?}");
        }
        let r = run(&lu, &a, &[0x03, 0, 0, 0, 252, 0], &[]);
        assert_eq!(r.data_in[2], key::NO_SENSE);
    }
}

#[test]
fn groups_no_one_named_take_the_default_state() {
    let lu = paired(ActiveOptimized, Standby);
    let c = through("c", 7, 9);
    ready(&lu, &c);
    assert_eq!(sense_of(&write10(&lu, &c)), UNAVAILABLE);
}

#[test]
fn report_target_port_groups_layout() {
    let lu = paired(ActiveOptimized, Standby);
    states(&lu).set_transition_secs(10);
    let a = nexus("a");
    ready(&lu, &a);
    // Extended header (PARAMETER DATA FORMAT 001b), SPC-4 tables 165-167.
    let d = rtpg(&lu, &a, 1, 1024).data_in;
    #[rustfmt::skip]
    let want = [
        0, 0, 0, 28,    // RETURN DATA LENGTH
        0x10, 10, 0, 0, // FORMAT TYPE 001b, IMPLICIT TRANSITION TIME
        // Group 1: active/optimized, T_SUP U_SUP S_SUP AN_SUP AO_SUP,
        // status none, one port: relative port 1.
        0x00, 0x8F, 0, 1, 0, 0, 0, 1,
        0, 0, 0, 1,
        // Group 2: standby, the peer's port 2.
        0x02, 0x8F, 0, 2, 0, 0, 0, 1,
        0, 0, 0, 2,
    ];
    assert_eq!(d, want);
    // Length-only header: the same descriptors after 4 bytes.
    let d = rtpg(&lu, &a, 0, 1024).data_in;
    assert_eq!(be32(&d, 0), 24);
    assert_eq!(&d[4..], &want[8..]);
    // The allocation length cuts the data, not the length it reports.
    let d = rtpg(&lu, &a, 1, 10).data_in;
    assert_eq!(d, want[..10]);
    // Reserved formats are refused.
    let r = rtpg(&lu, &a, 2, 1024);
    assert_eq!(sense_of(&r), (key::ILLEGAL_REQUEST, 0x24, 0));
    assert_eq!(&r.sense[15..18], &[0xC8 | 7, 0, 1]);

    // After an implicit move: the new states, status code 02h, PREF.
    let mut groups = states(&lu).groups();
    groups[1].preferred = true;
    states(&lu).configure(groups, Unavailable, export::PAIR_SUPPORTED);
    states(&lu).set(&[(1, Standby), (2, ActiveOptimized)], Cause::Implicit);
    assert_eq!(sense_of(&rtpg(&lu, &a, 1, 1024)), STATE_CHANGED);
    let d = rtpg(&lu, &a, 1, 1024).data_in;
    assert_eq!(&d[8..16], &[0x02, 0x8F, 0, 1, 0, 2, 0, 1]);
    assert_eq!(&d[20..28], &[0x80, 0x8F, 0, 2, 0, 2, 0, 1]);
}

#[test]
fn ports_seen_join_their_groups() {
    let lu = paired(ActiveOptimized, Standby);
    let a = nexus("a");
    ready(&lu, &a);
    ready(&lu, &through("b", 1, 3));
    ready(&lu, &through("c", 5, 6));
    let d = rtpg(&lu, &a, 1, 1024).data_in;
    // Group 1 with ports 1 and 3, group 2 with 2, group 5 (unnamed, so
    // unavailable) with 6.
    assert_eq!(be32(&d, 0) as usize, d.len() - 4);
    assert_eq!(&d[8..16], &[0x00, 0x8F, 0, 1, 0, 0, 0, 2]);
    assert_eq!(&d[16..24], &[0, 0, 0, 1, 0, 0, 0, 3]);
    assert_eq!(&d[24..32], &[0x02, 0x8F, 0, 2, 0, 0, 0, 1]);
    assert_eq!(&d[36..44], &[0x03, 0x8F, 0, 5, 0, 0, 0, 1]);
    assert_eq!(be16(&d, 46), 6);
}

#[test]
fn every_change_is_a_unit_attention_on_every_nexus() {
    let lu = paired(ActiveOptimized, Standby);
    let nexuses = [nexus("a"), through("b", 1, 1), through("c", 2, 2)];
    for n in &nexuses {
        ready(&lu, n);
    }
    let s = states(&lu);
    // A move through transitioning is two changes, one unit attention.
    s.begin_transition(&[1, 2], Cause::Implicit);
    s.set(&[(1, Standby), (2, ActiveOptimized)], Cause::Implicit);
    for n in &nexuses {
        assert_eq!(
            sense_of(&run(&lu, n, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[])),
            STATE_CHANGED
        );
        assert_eq!(
            run(&lu, n, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]).status,
            status::GOOD
        );
    }
    // Setting what already holds is no change.
    s.set(&[(1, Standby)], Cause::Implicit);
    assert_eq!(run(&lu, &nexuses[2], &[0; 6], &[]).status, status::GOOD);
    // A second unit over the same device is told too.
    let other = LogicalUnit::over(lu.backing().clone(), lu.config().clone()).unwrap();
    let d = nexus("d");
    ready(&other, &d);
    s.set(&[(1, ActiveNonOptimized)], Cause::Implicit);
    assert_eq!(sense_of(&run(&other, &d, &[0; 6], &[])), STATE_CHANGED);
    assert_eq!(
        sense_of(&run(&lu, &nexuses[0], &[0; 6], &[])),
        STATE_CHANGED
    );
}

#[test]
fn set_target_port_groups_moves_through_the_hook() {
    let lu = paired(Standby, ActiveOptimized);
    let pair = with_pair(&lu);
    let a = nexus("a");
    let b = through("b", 2, 2);
    ready(&lu, &a);
    ready(&lu, &b);
    let inq = run(&lu, &a, &[0x12, 0, 0, 0, 96, 0], &[]).data_in;
    assert_eq!(inq[5] & 0x30, 0x30, "implicit and explicit ALUA");
    // Offered in REPORT SUPPORTED OPERATION CODES now (from the active side).
    let one = run(
        &lu,
        &b,
        &[0xA3, 0x0C, 0x02, 0xA4, 0, 0x0A, 0, 0, 0, 64, 0, 0],
        &[],
    );
    assert_eq!(one.data_in[1] & 0x07, 3);

    // Linux's scsi_dh_alua activates a standby path so: its own group
    // to active/optimized, from a nexus in standby.
    let r = stpg(&lu, &a, &[(0x00, 1), (0x02, 2)]);
    assert_eq!(r.status, status::GOOD, "{r:?}");
    assert_eq!(pair.asked.lock()[0], [(1, ActiveOptimized), (2, Standby)]);
    assert_eq!(states(&lu).state_of(1), ActiveOptimized);
    assert_eq!(states(&lu).state_of(2), Standby);
    // The sender is not told of its own change; the others are.
    assert_eq!(write10(&lu, &a).status, status::GOOD);
    assert_eq!(sense_of(&write10(&lu, &b)), STATE_CHANGED);
    assert_eq!(sense_of(&write10(&lu, &b)), STANDBY);
    // Status code 01h: altered by SET TARGET PORT GROUPS.
    let d = rtpg(&lu, &a, 1, 1024).data_in;
    assert_eq!((d[8], d[13]), (0x00, 1));
    // An empty list changes nothing.
    assert_eq!(stpg_raw(&lu, &a, &[]).status, status::GOOD);
    assert_eq!(pair.asked.lock().len(), 1);
}

#[test]
fn set_target_port_groups_refusals() {
    let lu = paired(ActiveOptimized, Standby);
    let pair = with_pair(&lu);
    let a = nexus("a");
    ready(&lu, &a);
    let invalid_param = (key::ILLEGAL_REQUEST, 0x26, 0);
    // Transitioning, LBA dependent, offline: not states one may ask for.
    for state in [0x0F, 0x04, 0x0E] {
        let r = stpg(&lu, &a, &[(0x00, 1), (state, 2)]);
        assert_eq!(sense_of(&r), invalid_param);
        assert_eq!(&r.sense[15..18], &[0x80 | 0x08 | 3, 0, 8]);
    }
    // A group no one knows.
    let r = stpg(&lu, &a, &[(0x00, 9)]);
    assert_eq!(sense_of(&r), invalid_param);
    assert_eq!(&r.sense[15..18], &[0x80, 0, 6]);
    // A state the model does not support.
    states(&lu).configure(states(&lu).groups(), Unavailable, 0x01 | 0x04);
    assert_eq!(sense_of(&stpg(&lu, &a, &[(0x01, 1)])), invalid_param);
    // A list that is not whole descriptors.
    assert_eq!(
        sense_of(&stpg_raw(&lu, &a, &[0, 0, 0, 0, 0, 0])),
        (key::ILLEGAL_REQUEST, 0x1A, 0)
    );
    assert!(pair.asked.lock().is_empty());
    // The pair refuses a combination, or fails to make it.
    *pair.refuse.lock() = Some(MoveRefused::Invalid(1));
    let r = stpg(&lu, &a, &[(0x02, 1), (0x02, 2)]);
    assert_eq!(sense_of(&r), invalid_param);
    assert_eq!(&r.sense[15..18], &[0x80, 0, 8]);
    *pair.refuse.lock() = Some(MoveRefused::Failed("peer unreachable".into()));
    assert_eq!(
        sense_of(&stpg(&lu, &a, &[(0x02, 1)])),
        (key::HARDWARE_ERROR, 0x67, 0x0A)
    );
    assert_eq!(states(&lu).state_of(1), ActiveOptimized);
    // Without the hook the command is gone again, and INQUIRY says so.
    states(&lu).set_explicit(None);
    assert_eq!(
        sense_of(&run(&lu, &a, &[0; 6], &[])),
        (key::UNIT_ATTENTION, 0x3F, 0x03)
    );
    assert_eq!(
        sense_of(&stpg(&lu, &a, &[(0x00, 1)])),
        (key::ILLEGAL_REQUEST, 0x20, 0)
    );
}

#[test]
fn set_target_port_groups_waits_out_a_transition() {
    let lu = paired(Transitioning, Standby);
    with_pair(&lu);
    let a = nexus("a");
    let _ = run(&lu, &a, &[0; 6], &[]);
    let _ = run(&lu, &a, &[0; 6], &[]);
    assert_eq!(sense_of(&stpg(&lu, &a, &[(0x00, 1)])), TRANSITIONING);
    states(&lu).set(&[(1, Unavailable)], Cause::Implicit);
    let _ = run(&lu, &a, &[0; 6], &[]);
    assert_eq!(stpg(&lu, &a, &[(0x00, 1)]).status, status::GOOD);
}

#[test]
fn device_identification_names_the_port_and_its_group() {
    let lu = paired(ActiveOptimized, Standby);
    let n = through("a", 2, 5);
    let d = run(&lu, &n, &[0x12, 1, 0x83, 1, 0, 0], &[]).data_in;
    let mut pos = 4;
    let mut found = Vec::new();
    while pos + 4 <= d.len() {
        let (piv_assoc, kind, len) = (
            d[pos + 1] & 0xB0,
            d[pos + 1] & 0x0F,
            usize::from(d[pos + 3]),
        );
        if piv_assoc == 0x90 && (kind == 4 || kind == 5) {
            assert_eq!(d[pos] >> 4, 5, "iSCSI protocol identifier");
            found.push((kind, be16(&d, pos + 6)));
        }
        pos += 4 + len;
    }
    assert_eq!(found, [(4, 5), (5, 2)]);
}
