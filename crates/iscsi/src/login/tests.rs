use super::*;
use crate::auth::NoAuthentication;
use bytes::Bytes;

struct OneTarget;
impl TargetDirectory for OneTarget {
    fn target_info(&self, name: &str) -> Option<TargetInfo> {
        (name == "iqn.t").then(|| TargetInfo {
            portal_group: 7,
            alias: Some("disk".into()),
        })
    }
}

/// Admits only `iqn.allowed`.
struct Guarded;
impl TargetDirectory for Guarded {
    fn target_info(&self, name: &str) -> Option<TargetInfo> {
        OneTarget.target_info(name)
    }
    fn admits(&self, initiator: &str, _name: &str) -> bool {
        initiator == "iqn.allowed"
    }
}

#[test]
fn refused_initiator_gets_authorization_failure() {
    let mut m = machine();
    let r = req(0, 1, true, "InitiatorName=iqn.other;TargetName=iqn.t;");
    let LoginStep::Fail(_, status) = m.step(&r, &Guarded) else {
        panic!()
    };
    assert_eq!(status.code(), 0x0202);
    assert_eq!(status.reason(), "authorization failure");
    assert_eq!(
        LoginStatus::AUTHENTICATION_FAILURE.reason(),
        "authentication failure"
    );
    let mut m = machine();
    let r = req(1, 3, true, "InitiatorName=iqn.allowed;TargetName=iqn.t;");
    assert!(matches!(m.step(&r, &Guarded), LoginStep::Complete(..)));
    // Unknown targets stay "not found" whoever asks.
    let mut m = machine();
    let r = req(0, 1, true, "InitiatorName=iqn.other;TargetName=iqn.x;");
    let LoginStep::Fail(_, status) = m.step(&r, &Guarded) else {
        panic!()
    };
    assert_eq!(status.code(), 0x0203);
    // Discovery sessions are not refused here; SendTargets filters.
    let mut m = machine();
    let r = req(0, 3, true, "InitiatorName=iqn.other;SessionType=Discovery;");
    assert!(matches!(m.step(&r, &Guarded), LoginStep::Complete(..)));
}

fn machine() -> LoginMachine {
    LoginMachine::new(
        TargetLimits::default(),
        Arc::new(NoAuthentication),
        100,
        128,
    )
}

fn req(csg: u8, nsg: u8, transit: bool, text: &str) -> LoginRequest {
    LoginRequest {
        transit,
        continue_: false,
        csg,
        nsg,
        version_max: 0,
        version_min: 0,
        isid: [0x80, 0, 0, 1, 0, 0],
        tsih: 0,
        itt: 1,
        cid: 0,
        cmdsn: 50,
        exp_statsn: 0,
        data: Bytes::from(text.replace(';', "\0")),
    }
}

fn keys(reply: &Reply) -> Vec<(String, String)> {
    text::parse(&reply.text).unwrap()
}

#[test]
fn security_then_operational_then_full_feature() {
    let mut m = machine();
    let r = req(
        0,
        1,
        true,
        "InitiatorName=iqn.i;TargetName=iqn.t;SessionType=Normal;AuthMethod=None;",
    );
    let LoginStep::Reply(reply) = m.step(&r, &OneTarget) else {
        panic!("expected reply")
    };
    assert!(reply.response.transit);
    assert_eq!((reply.response.csg, reply.response.nsg), (0, 1));
    assert_eq!(reply.response.statsn, 100);
    assert_eq!(
        (reply.response.exp_cmdsn, reply.response.max_cmdsn),
        (50, 177)
    );
    let k = keys(&reply);
    assert!(k.contains(&("AuthMethod".into(), "None".into())));
    assert!(k.contains(&("TargetPortalGroupTag".into(), "7".into())));
    assert!(k.contains(&("TargetAlias".into(), "disk".into())));

    let r = req(
        1,
        3,
        true,
        "HeaderDigest=None;MaxRecvDataSegmentLength=65536;ImmediateData=Yes;",
    );
    let LoginStep::Complete(reply, result) = m.step(&r, &OneTarget) else {
        panic!("expected completion")
    };
    assert!(reply.response.transit);
    assert_eq!((reply.response.csg, reply.response.nsg), (1, 3));
    assert_eq!(reply.response.statsn, 101);
    let k = keys(&reply);
    assert!(k.contains(&("MaxRecvDataSegmentLength".into(), "262144".into())));
    assert!(k.contains(&("HeaderDigest".into(), "None".into())));
    assert_eq!(result.initiator_name, "iqn.i");
    assert_eq!(result.target_name.as_deref(), Some("iqn.t"));
    assert_eq!(result.params.initiator_mrdsl, 65536);
    assert_eq!(result.exp_cmdsn, 50);
    assert_eq!(result.next_statsn, 102);
}

#[test]
fn straight_to_operational_stage() {
    let mut m = machine();
    let r = req(
        1,
        3,
        true,
        "InitiatorName=iqn.i;TargetName=iqn.t;MaxBurstLength=65536;",
    );
    let LoginStep::Complete(reply, result) = m.step(&r, &OneTarget) else {
        panic!()
    };
    assert!(reply.response.transit);
    assert_eq!(result.params.max_burst_length, 65536);
}

#[test]
fn staying_in_a_stage_without_transit() {
    let mut m = machine();
    let r = req(1, 0, false, "InitiatorName=iqn.i;TargetName=iqn.t;");
    let LoginStep::Reply(reply) = m.step(&r, &OneTarget) else {
        panic!()
    };
    assert!(!reply.response.transit);
    assert_eq!(reply.response.nsg, 0);
    let r = req(1, 3, true, "MaxBurstLength=65536;");
    assert!(matches!(m.step(&r, &OneTarget), LoginStep::Complete(..)));
}

#[test]
fn unknown_target() {
    let mut m = machine();
    let r = req(0, 1, true, "InitiatorName=iqn.i;TargetName=iqn.nope;");
    let LoginStep::Fail(reply, status) = m.step(&r, &OneTarget) else {
        panic!()
    };
    assert_eq!(status.code(), 0x0203);
    assert_eq!(
        (reply.response.status_class, reply.response.status_detail),
        (2, 3)
    );
    assert!(!reply.response.transit);
}

#[test]
fn missing_initiator_name_or_target_name() {
    let mut m = machine();
    let LoginStep::Fail(_, status) = m.step(&req(0, 1, true, "TargetName=iqn.t;"), &OneTarget)
    else {
        panic!()
    };
    assert_eq!(status.code(), 0x0207);
    let mut m = machine();
    let LoginStep::Fail(_, status) = m.step(&req(0, 1, true, "InitiatorName=iqn.i;"), &OneTarget)
    else {
        panic!()
    };
    assert_eq!(status.code(), 0x0207);
}

#[test]
fn discovery_needs_no_target() {
    let mut m = machine();
    let r = req(0, 3, true, "InitiatorName=iqn.i;SessionType=Discovery;");
    let LoginStep::Complete(reply, result) = m.step(&r, &OneTarget) else {
        panic!()
    };
    assert_eq!(result.session_type, SessionType::Discovery);
    assert_eq!(result.target_name, None);
    assert!(!keys(&reply)
        .iter()
        .any(|(k, _)| k == "TargetPortalGroupTag"));
}

#[test]
fn unsupported_version() {
    let mut m = machine();
    let mut r = req(0, 1, true, "InitiatorName=iqn.i;TargetName=iqn.t;");
    r.version_min = 2;
    r.version_max = 2;
    let LoginStep::Fail(_, status) = m.step(&r, &OneTarget) else {
        panic!()
    };
    assert_eq!(status.code(), 0x0205);
}

#[test]
fn invalid_stage_transitions() {
    for (csg, nsg) in [(1, 1), (0, 0), (1, 2), (3, 3)] {
        let mut m = machine();
        let r = req(csg, nsg, true, "InitiatorName=iqn.i;TargetName=iqn.t;");
        let LoginStep::Fail(_, status) = m.step(&r, &OneTarget) else {
            panic!("{csg}->{nsg}")
        };
        assert_eq!(status.code(), 0x0200, "{csg}->{nsg}");
    }
    // T and C together.
    let mut m = machine();
    let mut r = req(0, 1, true, "InitiatorName=iqn.i;TargetName=iqn.t;");
    r.continue_ = true;
    assert!(matches!(m.step(&r, &OneTarget), LoginStep::Fail(..)));
    // CSG must follow the previous transition.
    let mut m = machine();
    assert!(matches!(
        m.step(
            &req(0, 1, true, "InitiatorName=iqn.i;TargetName=iqn.t;"),
            &OneTarget
        ),
        LoginStep::Reply(_)
    ));
    assert!(matches!(
        m.step(&req(0, 1, true, ""), &OneTarget),
        LoginStep::Fail(..)
    ));
}

#[test]
fn text_spanning_pdus() {
    let mut m = machine();
    let mut first = req(0, 1, false, "InitiatorName=iqn.i;Target");
    first.continue_ = true;
    let LoginStep::Reply(reply) = m.step(&first, &OneTarget) else {
        panic!()
    };
    assert!(reply.text.is_empty());
    assert!(!reply.response.transit);
    let second = req(0, 1, true, "Name=iqn.t;AuthMethod=None;");
    let LoginStep::Reply(reply) = m.step(&second, &OneTarget) else {
        panic!()
    };
    assert!(reply.response.transit);
    assert_eq!(m.target_name(), Some("iqn.t"));
}

#[test]
fn text_size_is_bounded() {
    let mut m = machine();
    let chunk = "X".repeat(8000);
    let mut status = None;
    for _ in 0..20 {
        let mut r = req(0, 1, false, &chunk);
        r.continue_ = true;
        if let LoginStep::Fail(_, s) = m.step(&r, &OneTarget) {
            status = Some(s);
            break;
        }
    }
    assert_eq!(status, Some(LoginStatus::OUT_OF_RESOURCES));
}

#[test]
fn auth_method_without_none_fails() {
    let mut m = machine();
    let r = req(
        0,
        1,
        true,
        "InitiatorName=iqn.i;TargetName=iqn.t;AuthMethod=CHAP;",
    );
    let LoginStep::Fail(_, status) = m.step(&r, &OneTarget) else {
        panic!()
    };
    assert_eq!(status.code(), 0x0201);
}

#[test]
fn changing_isid_mid_login_fails() {
    let mut m = machine();
    assert!(matches!(
        m.step(
            &req(0, 1, true, "InitiatorName=iqn.i;TargetName=iqn.t;"),
            &OneTarget
        ),
        LoginStep::Reply(_)
    ));
    let mut r = req(1, 3, true, "");
    r.isid = [0; 6];
    assert!(matches!(m.step(&r, &OneTarget), LoginStep::Fail(..)));
}

#[test]
fn duplicate_key_fails() {
    let mut m = machine();
    let r = req(
        1,
        3,
        true,
        "InitiatorName=iqn.i;TargetName=iqn.t;MaxBurstLength=4096;MaxBurstLength=8192;",
    );
    assert!(matches!(
        m.step(&r, &OneTarget),
        LoginStep::Fail(_, LoginStatus::INITIATOR_ERROR)
    ));
}

#[test]
fn malformed_text_fails() {
    let mut m = machine();
    let r = req(1, 3, true, "InitiatorName=iqn.i;garbage;");
    assert!(matches!(
        m.step(&r, &OneTarget),
        LoginStep::Fail(_, LoginStatus::INITIATOR_ERROR)
    ));
}
