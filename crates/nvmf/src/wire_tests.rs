use super::*;
use proptest::prelude::*;

const BOTH: Digests = Digests {
    header: true,
    data: true,
};
const HOST_SENDS: &[u8] = &[
    kind::IC_REQ,
    kind::H2C_TERM,
    kind::CAPSULE_CMD,
    kind::H2C_DATA,
];

/// What a receiver does with bytes off the wire: check the common
/// header, then decode the whole PDU.
fn receive(b: &[u8], accepted: &[u8], d: Digests) -> Result<Pdu, Fatal> {
    if b.len() < COMMON_LEN {
        return Err(fatal(fes::INVALID_HEADER_FIELD, 0, "short"));
    }
    let plen = check_common(&common(b), accepted, d, 1 << 20)?;
    if b.len() < plen {
        return Err(fatal(fes::INVALID_HEADER_FIELD, 4, "short"));
    }
    decode(&b[..plen], d)
}

#[test]
fn initialization_pdus_round_trip_without_digests() {
    let req = IcReq {
        pfv: 0,
        hpda: 3,
        digests: BOTH,
        maxr2t: 7,
    };
    let b = encode_ic_req(&req);
    assert_eq!(b.len(), 128);
    assert_eq!(&b[..8], &[0, 0, 128, 0, 128, 0, 0, 0]);
    // Digests are negotiated by these PDUs, never carried in them.
    assert_eq!(receive(&b, HOST_SENDS, BOTH), Ok(Pdu::IcReq(req)));
    let resp = IcResp {
        pfv: 0,
        cpda: 0,
        digests: Digests::default(),
        maxh2cdata: 131072,
    };
    assert_eq!(
        receive(&encode_ic_resp(&resp), &[kind::IC_RESP], Digests::default()),
        Ok(Pdu::IcResp(resp))
    );
}

#[test]
fn capsules_and_data_round_trip_with_and_without_digests() {
    for d in [Digests::default(), BOTH] {
        let mut sqe = [0; SQE_LEN];
        sqe[0] = 0x01;
        sqe[2] = 9;
        let data = vec![0xab; 300];
        let b = encode_command(&sqe, &data, d);
        assert_eq!(b.len(), 72 + 300 + if d.header { 8 } else { 0 });
        assert_eq!(
            receive(&b, HOST_SENDS, d),
            Ok(Pdu::Command {
                sqe,
                data: data.clone(),
                digest_ok: true
            })
        );
        let cqe = [5; CQE_LEN];
        assert_eq!(
            receive(&encode_response(&cqe, d), &[kind::CAPSULE_RESP], d),
            Ok(Pdu::Response { cqe })
        );
        let h = DataHeader {
            cccid: 9,
            ttag: 4,
            offset: 512,
            len: 300,
            last: true,
            success: false,
        };
        let b = encode_data(kind::H2C_DATA, &h, &data, d, 4);
        assert_eq!(
            receive(&b, HOST_SENDS, d),
            Ok(Pdu::H2CData(h, data.clone(), true))
        );
        let r2t = encode_r2t(9, 4, 0, 8192, d);
        assert_eq!(
            receive(&r2t, &[kind::R2T], d),
            Ok(Pdu::R2T {
                cccid: 9,
                ttag: 4,
                offset: 0,
                len: 8192
            })
        );
    }
}

#[test]
fn c2h_data_starts_where_the_host_asked() {
    let h = DataHeader {
        cccid: 1,
        len: 8,
        last: true,
        success: true,
        ..DataHeader::default()
    };
    // HPDA 7: data at a multiple of 32 bytes.
    let b = encode_data(kind::C2H_DATA, &h, &[1; 8], BOTH, 32);
    assert_eq!(b[3], 32, "pdo");
    assert_eq!(b[1], FLAG_HDGST | FLAG_DDGST | FLAG_LAST_PDU | FLAG_SUCCESS);
    assert_eq!(
        receive(&b, &[kind::C2H_DATA], BOTH),
        Ok(Pdu::C2HData(h, vec![1; 8], true))
    );
}

#[test]
fn a_bad_header_digest_is_fatal_and_a_bad_data_digest_is_reported() {
    let sqe = [1; SQE_LEN];
    let mut b = encode_command(&sqe, &[7; 64], BOTH);
    b[20] ^= 1;
    assert_eq!(
        receive(&b, HOST_SENDS, BOTH).unwrap_err().fes,
        fes::HEADER_DIGEST
    );
    let mut b = encode_command(&sqe, &[7; 64], BOTH);
    let n = b.len();
    b[n - 10] ^= 1;
    match receive(&b, HOST_SENDS, BOTH) {
        Ok(Pdu::Command { digest_ok, .. }) => assert!(!digest_ok),
        other => panic!("{other:?}"),
    }
}

#[test]
fn framing_errors_name_the_field() {
    let sqe = [0; SQE_LEN];
    let good = encode_command(&sqe, &[], Digests::default());
    // A digest the connection did not agree to.
    assert_eq!(receive(&good, HOST_SENDS, BOTH).unwrap_err().fei, 1);
    let mut b = good.clone();
    b[2] = 70;
    assert_eq!(
        receive(&b, HOST_SENDS, Digests::default()).unwrap_err().fei,
        2
    );
    let mut b = good.clone();
    b[0] = kind::R2T;
    assert_eq!(
        receive(&b, HOST_SENDS, Digests::default()).unwrap_err().fei,
        0
    );
    let mut b = good;
    put32(&mut b, 4, 60);
    assert_eq!(
        receive(&b, HOST_SENDS, Digests::default()).unwrap_err().fei,
        4
    );
}

#[test]
fn a_termination_request_carries_the_offending_header() {
    let f = fatal(fes::PDU_SEQUENCE, 0, "x");
    let b = encode_term(kind::C2H_TERM, &f, &[9; 200]);
    assert_eq!(b.len(), TERM_LEN + TERM_MAX_DATA);
    assert_eq!(
        receive(&b, &[kind::C2H_TERM], BOTH),
        Ok(Pdu::Term {
            fes: fes::PDU_SEQUENCE,
            fei: 0,
            header: vec![9; TERM_MAX_DATA]
        })
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    /// Random bytes, and valid PDUs with bytes flipped, end in a PDU or
    /// a fatal error, never a panic.
    #[test]
    fn random_input_never_panics(
        bytes in proptest::collection::vec(any::<u8>(), 0..400),
        hd in any::<bool>(),
        dd in any::<bool>(),
    ) {
        let d = Digests { header: hd, data: dd };
        let _ = receive(&bytes, HOST_SENDS, d);
        let _ = receive(&bytes, &[kind::IC_RESP, kind::C2H_TERM, kind::CAPSULE_RESP, kind::C2H_DATA, kind::R2T], d);
        let _ = decode(&bytes, d);
    }

    #[test]
    fn mutated_pdus_never_panic(
        at in 0usize..120,
        value in any::<u8>(),
        which in 0u8..4,
    ) {
        let b = match which {
            0 => encode_command(&[3; SQE_LEN], &[1; 40], BOTH),
            1 => encode_data(kind::H2C_DATA, &DataHeader { len: 40, ..DataHeader::default() }, &[2; 40], BOTH, 4),
            2 => encode_ic_req(&IcReq { pfv: 0, hpda: 0, digests: BOTH, maxr2t: 0 }),
            _ => encode_term(kind::H2C_TERM, &fatal(1, 0, "x"), &[0; 24]),
        };
        let mut b = b;
        let at = at % b.len();
        b[at] = value;
        let _ = receive(&b, HOST_SENDS, BOTH);
    }
}
