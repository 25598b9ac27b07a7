use super::*;

fn nexus(name: &str, isid: u8) -> Nexus {
    Nexus {
        initiator_name: name.into(),
        isid: [0x80, 0, 0, 0, 0, isid],
        target_name: "iqn.t".into(),
        relative_port: 1,
        portal_group: 1,
    }
}

fn out(
    st: &mut PrState,
    n: &Nexus,
    action: u8,
    kind: u8,
    key: u64,
    sark: u64,
) -> Result<Notices, Failure> {
    let cdb = [0x5F, action, kind, 0, 0, 0, 0, 0, 24, 0];
    let mut p = [0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sark.to_be_bytes());
    st.prout(n, &cdb, &p, false)
}

#[test]
fn register_rules() {
    let a = nexus("a", 1);
    let mut st = PrState::default();
    // Unregistered with a non-zero key conflicts.
    assert_eq!(out(&mut st, &a, 0, 0, 5, 7), Err(conflict()));
    out(&mut st, &a, 0, 0, 0, 7).unwrap();
    assert_eq!(st.generation, 1);
    // Re-register with the wrong key conflicts; with the right key changes it.
    assert_eq!(out(&mut st, &a, 0, 0, 8, 9), Err(conflict()));
    out(&mut st, &a, 0, 0, 7, 9).unwrap();
    assert_eq!(st.registrations[0].key, 9);
    // Register and ignore needs no key.
    out(&mut st, &a, 6, 0, 0, 11).unwrap();
    assert_eq!(st.registrations[0].key, 11);
    out(&mut st, &a, 0, 0, 11, 0).unwrap();
    assert!(st.registrations.is_empty());
    assert_eq!(st.generation, 4);
}

#[test]
fn access_per_type() {
    use Access::{Read, Write};
    let (a, b, c) = (nexus("a", 1), nexus("b", 2), nexus("c", 3));
    // (type, registered reader/writer, unregistered reader/writer)
    let table = [
        (3u8, (false, false), (false, false)),
        (1, (true, false), (true, false)),
        (6, (true, true), (false, false)),
        (5, (true, true), (true, false)),
        (8, (true, true), (false, false)),
        (7, (true, true), (true, false)),
    ];
    for (kind, reg, unreg) in table {
        let mut st = PrState::default();
        out(&mut st, &a, 6, 0, 0, 1).unwrap();
        out(&mut st, &b, 6, 0, 0, 2).unwrap();
        out(&mut st, &a, 1, kind, 1, 0).unwrap();
        assert!(!st.conflicts(&a, Read) && !st.conflicts(&a, Write));
        assert_eq!(
            (!st.conflicts(&b, Read), !st.conflicts(&b, Write)),
            reg,
            "type {kind}"
        );
        assert_eq!(
            (!st.conflicts(&c, Read), !st.conflicts(&c, Write)),
            unreg,
            "type {kind}"
        );
        assert!(!st.conflicts(&c, Access::Always));
    }
}

#[test]
fn reserve_release_and_ownership() {
    let (a, b) = (nexus("a", 1), nexus("b", 2));
    let mut st = PrState::default();
    out(&mut st, &a, 6, 0, 0, 1).unwrap();
    out(&mut st, &b, 6, 0, 0, 2).unwrap();
    out(&mut st, &a, 1, 5, 1, 0).unwrap();
    // Another type by the holder or any reserve by another conflicts.
    assert_eq!(out(&mut st, &a, 1, 3, 1, 0), Err(conflict()));
    assert_eq!(out(&mut st, &b, 1, 5, 2, 0), Err(conflict()));
    // Release by a non-holder is a no-op.
    out(&mut st, &b, 2, 5, 2, 0).unwrap();
    assert!(st.reservation.is_some());
    // Wrong type from the holder.
    assert!(matches!(
        out(&mut st, &a, 2, 1, 1, 0),
        Err(Failure::Check(_))
    ));
    // Holder unregisters: registrants-only reservation is released and
    // the other registrant is told.
    let n = out(&mut st, &a, 0, 0, 1, 0).unwrap();
    assert!(st.reservation.is_none());
    assert_eq!(n.to, vec![(PortPair::of(&b), asc::RESERVATIONS_RELEASED)]);

    // All-registrants reservations survive their creator.
    out(&mut st, &a, 6, 0, 0, 1).unwrap();
    out(&mut st, &a, 1, 8, 1, 0).unwrap();
    out(&mut st, &a, 0, 0, 1, 0).unwrap();
    assert!(st.reservation.is_some());
    out(&mut st, &b, 2, 8, 2, 0).unwrap();
    assert!(st.reservation.is_none());
}

#[test]
fn clear_and_preempt() {
    let (a, b) = (nexus("a", 1), nexus("b", 2));
    let mut st = PrState::default();
    out(&mut st, &a, 6, 0, 0, 1).unwrap();
    out(&mut st, &b, 6, 0, 0, 2).unwrap();
    let g = st.generation;
    // Preempt without a reservation removes the registration.
    let n = out(&mut st, &b, 4, 3, 2, 1).unwrap();
    assert_eq!(st.generation, g + 1);
    assert_eq!(st.registrations.len(), 1);
    assert_eq!(n.to, vec![(PortPair::of(&a), asc::REGISTRATIONS_PREEMPTED)]);
    assert!(st.reservation.is_none());
    // Preempting an unknown key conflicts.
    assert_eq!(out(&mut st, &b, 4, 3, 2, 99), Err(conflict()));

    // Preempting the holder takes the reservation over.
    out(&mut st, &a, 6, 0, 0, 1).unwrap();
    out(&mut st, &a, 1, 1, 1, 0).unwrap();
    out(&mut st, &b, 4, 3, 2, 1).unwrap();
    let res = st.reservation.clone().unwrap();
    assert_eq!(res.kind, PrType::ExclusiveAccess);
    assert_eq!(res.holder, Some(PortPair::of(&b)));

    let g = st.generation;
    let n = out(&mut st, &b, 3, 0, 2, 0).unwrap();
    assert!(n.to.is_empty());
    assert!(st.registrations.is_empty() && st.reservation.is_none());
    assert_eq!(st.generation, g + 1);
}

#[test]
fn parameter_and_cdb_validation() {
    let a = nexus("a", 1);
    let mut st = PrState::default();
    let cdb = [0x5F, 0, 0, 0, 0, 0, 0, 0, 20, 0];
    let e = st.prout(&a, &cdb, &[0; 20], false).unwrap_err();
    assert_eq!(e, Failure::Check(Sense::param_list_length()));
    out(&mut st, &a, 6, 0, 0, 1).unwrap();
    // Bad type, bad scope.
    assert!(matches!(
        out(&mut st, &a, 1, 2, 1, 0),
        Err(Failure::Check(_))
    ));
    assert!(matches!(
        out(&mut st, &a, 1, 0x11, 1, 0),
        Err(Failure::Check(_))
    ));
    // APTPL without a state file.
    let cdb = [0x5F, 6, 0, 0, 0, 0, 0, 0, 24, 0];
    let mut p = [0u8; 24];
    p[15] = 1;
    p[20] = 1;
    assert!(st.prout(&a, &cdb, &p, false).is_err());
    assert!(st.prout(&a, &cdb, &p, true).is_ok());
    assert!(st.aptpl);
}

#[test]
fn prin_layouts() {
    let (a, b) = (nexus("a", 1), nexus("b", 2));
    let mut st = PrState::default();
    out(&mut st, &a, 6, 0, 0, 0x11).unwrap();
    out(&mut st, &b, 6, 0, 0, 0x22).unwrap();
    out(&mut st, &a, 1, 1, 0x11, 0).unwrap();
    let keys = st.prin(0, false).unwrap();
    assert_eq!(be32(&keys, 4), 16);
    assert_eq!(be64(&keys, 8), 0x11);
    let res = st.prin(1, false).unwrap();
    assert_eq!(be32(&res, 4), 16);
    assert_eq!(be64(&res, 8), 0x11);
    assert_eq!(res[21], 1);
    let caps = st.prin(2, true).unwrap();
    assert_eq!(be16(&caps, 0), 8);
    assert_eq!(caps[2] & 1, 1);
    let full = st.prin(3, false).unwrap();
    let first_tid = be32(&full, 8 + 20) as usize;
    assert_eq!(full[8 + 12], 1, "a holds");
    assert_eq!(first_tid % 4, 0);
    let tid = &full[8 + 24..8 + 24 + first_tid];
    assert_eq!(
        parse_iscsi_transport_id(tid),
        Some(("a".to_string(), [0x80, 0, 0, 0, 0, 1]))
    );
    assert!(st.prin(4, false).is_err());
}

#[test]
fn register_and_move_hands_over_the_reservation() {
    let (a, b) = (nexus("a", 1), nexus("b", 2));
    let mut st = PrState::default();
    out(&mut st, &a, 6, 0, 0, 1).unwrap();
    out(&mut st, &a, 1, 3, 1, 0).unwrap();
    let tid = iscsi_transport_id(&PortPair::of(&b));
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&1u64.to_be_bytes());
    p[8..16].copy_from_slice(&5u64.to_be_bytes());
    p[17] = 0x02; // UNREG
    p[18..20].copy_from_slice(&1u16.to_be_bytes());
    p[20..24].copy_from_slice(&(tid.len() as u32).to_be_bytes());
    p.extend_from_slice(&tid);
    let cdb = [0x5F, 7, 0, 0, 0, 0, 0, 0, p.len() as u8, 0];
    st.prout(&a, &cdb, &p, false).unwrap();
    assert!(st.registration(&a).is_none());
    assert_eq!(st.registration(&b).map(|r| r.key), Some(5));
    assert!(st.is_holder(&b));
}
