use super::*;

fn kv(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn answer_of<'a>(answers: &'a [(String, String)], key: &str) -> Option<&'a str> {
    answers
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[test]
fn typical_linux_offer() {
    let mut n = Negotiator::new(TargetLimits::default());
    let offer = kv(&[
        ("InitiatorName", "iqn.2004-10.com.ubuntu:01:abc"),
        ("SessionType", "Normal"),
        ("TargetName", "iqn.2024-01.org.openarray:t0"),
        ("HeaderDigest", "None,CRC32C"),
        ("DataDigest", "None"),
        ("InitialR2T", "No"),
        ("ImmediateData", "Yes"),
        ("MaxBurstLength", "16776192"),
        ("FirstBurstLength", "262144"),
        ("MaxRecvDataSegmentLength", "262144"),
        ("MaxOutstandingR2T", "1"),
        ("MaxConnections", "1"),
        ("DefaultTime2Wait", "0"),
        ("DefaultTime2Retain", "0"),
        ("ErrorRecoveryLevel", "0"),
        ("IFMarker", "No"),
        ("OFMarker", "No"),
        ("DataPDUInOrder", "Yes"),
        ("DataSequenceInOrder", "Yes"),
    ]);
    let a = n.negotiate(Stage::Operational, &offer).unwrap();
    assert_eq!(
        answer_of(&a, "InitiatorName"),
        None,
        "declarative keys are not answered"
    );
    assert_eq!(
        answer_of(&a, "HeaderDigest"),
        Some("None"),
        "first offered value we support"
    );
    assert_eq!(answer_of(&a, "InitialR2T"), Some("No"));
    assert_eq!(answer_of(&a, "ImmediateData"), Some("Yes"));
    assert_eq!(answer_of(&a, "MaxBurstLength"), Some("1048576"));
    assert_eq!(answer_of(&a, "FirstBurstLength"), Some("262144"));
    assert_eq!(answer_of(&a, "DefaultTime2Wait"), Some("2"), "maximum");
    assert_eq!(answer_of(&a, "DefaultTime2Retain"), Some("0"), "minimum");
    assert_eq!(answer_of(&a, "MaxOutstandingR2T"), Some("1"));
    assert_eq!(answer_of(&a, "IFMarker"), Some("No"));
    assert_eq!(answer_of(&a, "MaxRecvDataSegmentLength"), None);
    assert_eq!(n.params.initiator_mrdsl, 262_144);
    assert_eq!(n.params.max_burst_length, 1_048_576);
    assert_eq!(
        n.initiator_name.as_deref(),
        Some("iqn.2004-10.com.ubuntu:01:abc")
    );
    assert_eq!(
        n.target_name.as_deref(),
        Some("iqn.2024-01.org.openarray:t0")
    );
    assert_eq!(n.session_type, Some(SessionType::Normal));
    // Answers come in the order offered.
    let order: Vec<&str> = a.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(order.first(), Some(&"HeaderDigest"));
}

#[test]
fn boolean_result_functions() {
    let limits = TargetLimits {
        initial_r2t: true,
        immediate_data: false,
        ..Default::default()
    };
    let mut n = Negotiator::new(limits);
    let a = n
        .negotiate(
            Stage::Operational,
            &kv(&[("InitialR2T", "No"), ("ImmediateData", "Yes")]),
        )
        .unwrap();
    assert_eq!(a, kv(&[("InitialR2T", "Yes"), ("ImmediateData", "No")]));
    assert!(n.params.initial_r2t);
    assert!(!n.params.immediate_data);
}

#[test]
fn digest_preference_follows_initiator() {
    let mut n = Negotiator::new(TargetLimits::default());
    let a = n
        .negotiate(Stage::Operational, &kv(&[("HeaderDigest", "CRC32C,None")]))
        .unwrap();
    assert_eq!(a, kv(&[("HeaderDigest", "CRC32C")]));
    assert_eq!(n.params.header_digest, Digest::Crc32c);
}

#[test]
fn digest_required_but_not_offered() {
    let limits = TargetLimits {
        header_digests: vec![Digest::Crc32c],
        ..Default::default()
    };
    let mut n = Negotiator::new(limits);
    assert_eq!(
        n.negotiate(Stage::Operational, &kv(&[("HeaderDigest", "None")])),
        Err(NegotiationError::NoAcceptableValue("HeaderDigest"))
    );
    let mut n = Negotiator::new(TargetLimits {
        data_digests: vec![Digest::None],
        ..Default::default()
    });
    assert_eq!(
        n.negotiate(Stage::Operational, &kv(&[("DataDigest", "CRC32C")]))
            .unwrap(),
        kv(&[("DataDigest", "Reject")])
    );
}

#[test]
fn ranges_and_syntax_are_checked() {
    let mut n = Negotiator::new(TargetLimits::default());
    let a = n
        .negotiate(
            Stage::Operational,
            &kv(&[
                ("MaxBurstLength", "100"),
                ("ErrorRecoveryLevel", "5"),
                ("InitialR2T", "maybe"),
                ("MaxOutstandingR2T", "0x10"),
                ("MaxRecvDataSegmentLength", "16777216"),
            ]),
        )
        .unwrap();
    assert_eq!(
        a,
        kv(&[
            ("MaxBurstLength", "Reject"),
            ("ErrorRecoveryLevel", "Reject"),
            ("InitialR2T", "Reject"),
            ("MaxOutstandingR2T", "16"),
            ("MaxRecvDataSegmentLength", "Reject"),
        ])
    );
    assert_eq!(n.params.max_burst_length, 262_144, "default kept");
    assert_eq!(n.params.initiator_mrdsl, 8192, "default kept");
}

#[test]
fn numbers_outside_each_range_are_rejected_and_change_nothing() {
    let keys = [
        "MaxRecvDataSegmentLength",
        "MaxBurstLength",
        "FirstBurstLength",
        "DefaultTime2Wait",
        "DefaultTime2Retain",
        "MaxOutstandingR2T",
        "MaxConnections",
        "ErrorRecoveryLevel",
        "iSCSIProtocolLevel",
    ];
    let wild = [
        "4294967296",
        "-1",
        "",
        "1e3",
        " 512",
        "0x",
        "18446744073709551616",
    ];
    for key in keys {
        // 0 is in four of these ranges and below the others; each key
        // also gets a value just above its range.
        let zero_ok = matches!(
            key,
            "DefaultTime2Wait" | "DefaultTime2Retain" | "ErrorRecoveryLevel" | "iSCSIProtocolLevel"
        );
        let mut values: Vec<&str> = wild.to_vec();
        if !zero_ok {
            values.push("0");
        }
        values.push(match key {
            "DefaultTime2Wait" | "DefaultTime2Retain" => "3601",
            "MaxOutstandingR2T" | "MaxConnections" => "65536",
            "ErrorRecoveryLevel" => "3",
            "iSCSIProtocolLevel" => "32",
            _ => "16777216",
        });
        for value in values {
            let mut n = Negotiator::new(TargetLimits::default());
            let before = n.params.clone();
            let a = n
                .negotiate(Stage::Operational, &kv(&[(key, value)]))
                .unwrap();
            assert_eq!(a, kv(&[(key, "Reject")]), "{key}={value}");
            assert_eq!(n.params, before, "{key}={value}");
        }
    }
}

#[test]
fn first_burst_never_exceeds_max_burst() {
    let mut n = Negotiator::new(TargetLimits::default());
    let a = n
        .negotiate(
            Stage::Operational,
            &kv(&[("FirstBurstLength", "262144"), ("MaxBurstLength", "4096")]),
        )
        .unwrap();
    assert_eq!(
        a,
        kv(&[("FirstBurstLength", "4096"), ("MaxBurstLength", "4096")])
    );
    assert_eq!(n.params.first_burst_length, 4096);
}

#[test]
fn unknown_and_special_keys() {
    let mut n = Negotiator::new(TargetLimits::default());
    let a = n
        .negotiate(
            Stage::Operational,
            &kv(&[
                ("X-com.example.foo", "1"),
                ("OFMarkInt", "2048~8192"),
                ("TargetAlias", "x"),
                ("Foo", "NotUnderstood"),
            ]),
        )
        .unwrap();
    assert_eq!(
        a,
        kv(&[
            ("X-com.example.foo", "NotUnderstood"),
            ("OFMarkInt", "Irrelevant"),
            ("TargetAlias", "Reject")
        ])
    );
}

#[test]
fn duplicate_keys_fail_login() {
    let mut n = Negotiator::new(TargetLimits::default());
    n.negotiate(Stage::Operational, &kv(&[("MaxBurstLength", "4096")]))
        .unwrap();
    assert_eq!(
        n.negotiate(Stage::Operational, &kv(&[("MaxBurstLength", "8192")])),
        Err(NegotiationError::DuplicateKey("MaxBurstLength".into()))
    );
}

#[test]
fn repeated_identity_is_tolerated() {
    let mut n = Negotiator::new(TargetLimits::default());
    n.negotiate(
        Stage::Security,
        &kv(&[("InitiatorName", "iqn.i"), ("SessionType", "Normal")]),
    )
    .unwrap();
    assert!(n
        .negotiate(
            Stage::Operational,
            &kv(&[("InitiatorName", "iqn.i"), ("SessionType", "Normal")])
        )
        .is_ok());
    assert!(n
        .negotiate(Stage::Operational, &kv(&[("InitiatorName", "iqn.other")]))
        .is_err());
}

#[test]
fn discovery_session_irrelevant_keys() {
    let mut n = Negotiator::new(TargetLimits::default());
    let a = n
        .negotiate(
            Stage::Security,
            &kv(&[
                ("InitiatorName", "iqn.i"),
                ("MaxBurstLength", "4096"),
                ("SessionType", "Discovery"),
                ("HeaderDigest", "None"),
            ]),
        )
        .unwrap();
    assert_eq!(
        a,
        kv(&[("MaxBurstLength", "Irrelevant"), ("HeaderDigest", "None")])
    );
    assert!(n.is_discovery());
}

#[test]
fn bad_session_type() {
    let mut n = Negotiator::new(TargetLimits::default());
    assert!(matches!(
        n.negotiate(Stage::Security, &kv(&[("SessionType", "Bogus")])),
        Err(NegotiationError::UnsupportedSessionType(_))
    ));
}

#[test]
fn full_feature_phase_rejects_login_keys() {
    let mut n = Negotiator::new(TargetLimits::default());
    let a = n
        .negotiate(
            Stage::FullFeature,
            &kv(&[("MaxBurstLength", "4096"), ("Other", "1")]),
        )
        .unwrap();
    assert_eq!(
        a,
        kv(&[("MaxBurstLength", "Reject"), ("Other", "NotUnderstood")])
    );
}

#[test]
fn declarations_once() {
    let mut n = Negotiator::new(TargetLimits::default());
    assert_eq!(
        n.operational_declarations(),
        kv(&[("MaxRecvDataSegmentLength", "262144")])
    );
    assert!(n.operational_declarations().is_empty());
}

#[test]
fn number_syntax() {
    assert_eq!(parse_number("0x1f"), Some(31));
    assert_eq!(parse_number("10"), Some(10));
    assert_eq!(parse_number("+10"), None);
    assert_eq!(parse_number(""), None);
    assert_eq!(parse_number("0x"), None);
    assert_eq!(parse_number("99999999999999999999999"), None);
}
