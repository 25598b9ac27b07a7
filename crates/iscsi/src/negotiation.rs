//! Key negotiation (RFC 7143 sections 6 and 13), as a pure function of
//! the keys an initiator offers and what the target is willing to do.
//!
//! The initiator offers, the target answers. Every offered key gets exactly
//! one answer, in the order offered: a value (result function applied),
//! `Irrelevant`, `NotUnderstood` or `Reject`. Declarative keys
//! (InitiatorName, MaxRecvDataSegmentLength, ...) are recorded and not
//! answered. Authentication keys are not handled here; the login state
//! machine routes them to the authentication hook.

use std::collections::HashSet;

/// A digest choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Digest {
    None,
    Crc32c,
}

impl Digest {
    fn parse(s: &str) -> Option<Digest> {
        match s {
            "None" => Some(Digest::None),
            "CRC32C" => Some(Digest::Crc32c),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Digest::None => "None",
            Digest::Crc32c => "CRC32C",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionType {
    Normal,
    Discovery,
}

/// Login stage a negotiation happens in (or Text negotiation in the full
/// feature phase).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Security,
    Operational,
    FullFeature,
}

/// What the target is willing to do. Numbers are the target's own limits;
/// the result functions combine them with the initiator's offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetLimits {
    /// Digests the target accepts, any order.
    pub header_digests: Vec<Digest>,
    pub data_digests: Vec<Digest>,
    /// What the target declares it can receive per PDU.
    pub max_recv_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub max_outstanding_r2t: u16,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub default_time2wait: u16,
    pub default_time2retain: u16,
    pub max_connections: u16,
}

impl Default for TargetLimits {
    fn default() -> Self {
        TargetLimits {
            header_digests: vec![Digest::Crc32c, Digest::None],
            data_digests: vec![Digest::Crc32c, Digest::None],
            max_recv_data_segment_length: 262_144,
            max_burst_length: 1_048_576,
            first_burst_length: 262_144,
            max_outstanding_r2t: 16,
            initial_r2t: false,
            immediate_data: true,
            default_time2wait: 2,
            default_time2retain: 20,
            max_connections: 1,
        }
    }
}

/// Operational parameters in force for a session and its connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionParams {
    pub header_digest: Digest,
    pub data_digest: Digest,
    pub max_connections: u16,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub default_time2wait: u16,
    pub default_time2retain: u16,
    pub max_outstanding_r2t: u16,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    pub error_recovery_level: u8,
    /// Largest data segment the initiator accepts (its declaration).
    pub initiator_mrdsl: u32,
    /// Largest data segment the target accepts (its declaration).
    pub target_mrdsl: u32,
}

impl SessionParams {
    /// RFC 7143 defaults, with the target's receive limit.
    pub fn defaults(target_mrdsl: u32) -> SessionParams {
        SessionParams {
            header_digest: Digest::None,
            data_digest: Digest::None,
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            default_time2wait: 2,
            default_time2retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
            initiator_mrdsl: 8192,
            target_mrdsl,
        }
    }
}

/// Negotiation failures that end the login.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NegotiationError {
    #[error("key {0} negotiated more than once")]
    DuplicateKey(String),
    #[error("no acceptable value for {0}")]
    NoAcceptableValue(&'static str),
    #[error("unsupported session type {0:?}")]
    UnsupportedSessionType(String),
}

/// Keys that belong to the authentication exchange.
pub fn is_auth_key(key: &str) -> bool {
    key == "AuthMethod"
        || key.starts_with("CHAP_")
        || key.starts_with("SRP_")
        || key.starts_with("KRB_")
        || key.starts_with("SPKM_")
}

/// Keys that do not apply to discovery sessions (RFC 7143 section 13).
const IRRELEVANT_FOR_DISCOVERY: &[&str] = &[
    "MaxConnections",
    "InitialR2T",
    "ImmediateData",
    "MaxBurstLength",
    "FirstBurstLength",
    "MaxOutstandingR2T",
    "DataPDUInOrder",
    "DataSequenceInOrder",
];

/// Negotiation state for one login (and later Text negotiations).
#[derive(Clone, Debug)]
pub struct Negotiator {
    limits: TargetLimits,
    pub params: SessionParams,
    pub session_type: Option<SessionType>,
    pub initiator_name: Option<String>,
    pub initiator_alias: Option<String>,
    pub target_name: Option<String>,
    seen: HashSet<String>,
    declared_mrdsl: bool,
}

/// A value as written on the wire for numbers (decimal or 0x hex).
fn parse_number(s: &str) -> Option<u64> {
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        if hex.is_empty() || hex.len() > 16 {
            return None;
        }
        u64::from_str_radix(hex, 16).ok()
    } else {
        if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    }
}

fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

fn yes_no(b: bool) -> String {
    if b { "Yes" } else { "No" }.to_string()
}

/// A number within `lo..=hi`, or None.
fn number_in(s: &str, lo: u64, hi: u64) -> Option<u64> {
    parse_number(s).filter(|n| (lo..=hi).contains(n))
}

const REJECT: &str = "Reject";
const IRRELEVANT: &str = "Irrelevant";
const NOT_UNDERSTOOD: &str = "NotUnderstood";

impl Negotiator {
    pub fn new(limits: TargetLimits) -> Negotiator {
        let params = SessionParams::defaults(limits.max_recv_data_segment_length);
        Negotiator {
            limits,
            params,
            session_type: None,
            initiator_name: None,
            initiator_alias: None,
            target_name: None,
            seen: HashSet::new(),
            declared_mrdsl: false,
        }
    }

    pub fn limits(&self) -> &TargetLimits {
        &self.limits
    }

    pub fn is_discovery(&self) -> bool {
        self.session_type == Some(SessionType::Discovery)
    }

    /// Answer one batch of offered keys (one complete Login or Text request).
    /// Authentication keys must have been removed by the caller.
    pub fn negotiate(
        &mut self,
        stage: Stage,
        keys: &[(String, String)],
    ) -> Result<Vec<(String, String)>, NegotiationError> {
        // SessionType decides relevance of other keys in the same batch.
        if let Some((_, v)) = keys.iter().find(|(k, _)| k == "SessionType") {
            if stage != Stage::FullFeature && self.session_type.is_none() {
                self.session_type = Some(match v.as_str() {
                    "Normal" => SessionType::Normal,
                    "Discovery" => SessionType::Discovery,
                    other => {
                        return Err(NegotiationError::UnsupportedSessionType(other.to_string()))
                    }
                });
            }
        }
        // FirstBurstLength is capped by MaxBurstLength from the same batch.
        if let Some((_, v)) = keys.iter().find(|(k, _)| k == "MaxBurstLength") {
            if stage != Stage::FullFeature && !self.is_discovery() {
                if let Some(n) = number_in(v, 512, (1 << 24) - 1) {
                    self.params.max_burst_length =
                        n.min(u64::from(self.limits.max_burst_length)) as u32;
                }
            }
        }

        let mut answers = Vec::new();
        for (key, value) in keys {
            if is_special_value(value) {
                // An initiator's answer to something; we offered nothing negotiable.
                continue;
            }
            if stage != Stage::FullFeature && !self.seen.insert(key.clone()) {
                // Some initiators repeat their identity on every stage;
                // only a changed value is an error there.
                if self.repeats_identity(key, value) {
                    continue;
                }
                return Err(NegotiationError::DuplicateKey(key.clone()));
            }
            if let Some(answer) = self.answer(stage, key, value)? {
                answers.push((key.clone(), answer));
            }
        }
        self.params.first_burst_length = self
            .params
            .first_burst_length
            .min(self.params.max_burst_length);
        Ok(answers)
    }

    /// Declarations the target adds to its first response of the
    /// operational stage (once per login).
    pub fn operational_declarations(&mut self) -> Vec<(String, String)> {
        if self.declared_mrdsl {
            return Vec::new();
        }
        self.declared_mrdsl = true;
        vec![(
            "MaxRecvDataSegmentLength".to_string(),
            self.limits.max_recv_data_segment_length.to_string(),
        )]
    }

    fn repeats_identity(&self, key: &str, value: &str) -> bool {
        let same = |v: &Option<String>| v.as_deref() == Some(value);
        match key {
            "InitiatorName" => same(&self.initiator_name),
            "InitiatorAlias" => same(&self.initiator_alias),
            "TargetName" => same(&self.target_name),
            "SessionType" => {
                let current = match self.session_type {
                    Some(SessionType::Normal) => "Normal",
                    Some(SessionType::Discovery) => "Discovery",
                    None => return false,
                };
                current == value
            }
            _ => false,
        }
    }

    fn answer(
        &mut self,
        stage: Stage,
        key: &str,
        value: &str,
    ) -> Result<Option<String>, NegotiationError> {
        let discovery = self.is_discovery();
        if stage == Stage::FullFeature {
            // Login-only keys cannot change once the session runs.
            return Ok(Some(
                if is_known_key(key) {
                    REJECT
                } else {
                    NOT_UNDERSTOOD
                }
                .to_string(),
            ));
        }
        if discovery && IRRELEVANT_FOR_DISCOVERY.contains(&key) {
            return Ok(Some(IRRELEVANT.to_string()));
        }
        let p = &mut self.params;
        let l = &self.limits;
        let answer = match key {
            "InitiatorName" => {
                self.initiator_name = Some(value.to_string());
                None
            }
            "InitiatorAlias" => {
                self.initiator_alias = Some(value.to_string());
                None
            }
            "TargetName" => {
                self.target_name = Some(value.to_string());
                None
            }
            "SessionType" => None,
            "HeaderDigest" | "DataDigest" => {
                let (ours, slot) = if key == "HeaderDigest" {
                    (&l.header_digests, &mut p.header_digest)
                } else {
                    (&l.data_digests, &mut p.data_digest)
                };
                // The responder picks the first offered value it supports.
                let pick = value
                    .split(',')
                    .filter_map(Digest::parse)
                    .find(|d| ours.contains(d));
                match pick {
                    Some(d) => {
                        *slot = d;
                        Some(d.as_str().to_string())
                    }
                    None if ours.contains(&Digest::None) => Some(REJECT.to_string()),
                    None => {
                        return Err(NegotiationError::NoAcceptableValue(
                            if key == "HeaderDigest" {
                                "HeaderDigest"
                            } else {
                                "DataDigest"
                            },
                        ))
                    }
                }
            }
            "MaxConnections" => Some(match number_in(value, 1, 65535) {
                Some(n) => {
                    p.max_connections = n.min(u64::from(l.max_connections)) as u16;
                    p.max_connections.to_string()
                }
                None => REJECT.to_string(),
            }),
            "InitialR2T" => Some(match parse_bool(value) {
                Some(b) => {
                    p.initial_r2t = b || l.initial_r2t;
                    yes_no(p.initial_r2t)
                }
                None => REJECT.to_string(),
            }),
            "ImmediateData" => Some(match parse_bool(value) {
                Some(b) => {
                    p.immediate_data = b && l.immediate_data;
                    yes_no(p.immediate_data)
                }
                None => REJECT.to_string(),
            }),
            "MaxRecvDataSegmentLength" => match number_in(value, 512, (1 << 24) - 1) {
                Some(n) => {
                    p.initiator_mrdsl = n as u32;
                    None
                }
                None => Some(REJECT.to_string()),
            },
            "MaxBurstLength" => Some(match number_in(value, 512, (1 << 24) - 1) {
                // Already applied before the loop.
                Some(_) => p.max_burst_length.to_string(),
                None => REJECT.to_string(),
            }),
            "FirstBurstLength" => Some(match number_in(value, 512, (1 << 24) - 1) {
                Some(n) => {
                    p.first_burst_length =
                        n.min(u64::from(l.first_burst_length))
                            .min(u64::from(p.max_burst_length)) as u32;
                    p.first_burst_length.to_string()
                }
                None => REJECT.to_string(),
            }),
            "DefaultTime2Wait" => Some(match number_in(value, 0, 3600) {
                Some(n) => {
                    p.default_time2wait = n.max(u64::from(l.default_time2wait)) as u16;
                    p.default_time2wait.to_string()
                }
                None => REJECT.to_string(),
            }),
            "DefaultTime2Retain" => Some(match number_in(value, 0, 3600) {
                Some(n) => {
                    p.default_time2retain = n.min(u64::from(l.default_time2retain)) as u16;
                    p.default_time2retain.to_string()
                }
                None => REJECT.to_string(),
            }),
            "MaxOutstandingR2T" => Some(match number_in(value, 1, 65535) {
                Some(n) => {
                    p.max_outstanding_r2t = n.min(u64::from(l.max_outstanding_r2t)) as u16;
                    p.max_outstanding_r2t.to_string()
                }
                None => REJECT.to_string(),
            }),
            // We only deliver in order; OR with our Yes is always Yes.
            "DataPDUInOrder" | "DataSequenceInOrder" => Some(match parse_bool(value) {
                Some(_) => yes_no(true),
                None => REJECT.to_string(),
            }),
            "ErrorRecoveryLevel" => Some(match number_in(value, 0, 2) {
                Some(_) => {
                    p.error_recovery_level = 0;
                    "0".to_string()
                }
                None => REJECT.to_string(),
            }),
            // Markers are not supported: AND with our No.
            "IFMarker" | "OFMarker" | "RDMAExtensions" => Some(match parse_bool(value) {
                Some(_) => yes_no(false),
                None => REJECT.to_string(),
            }),
            "IFMarkInt"
            | "OFMarkInt"
            | "InitiatorRecvDataSegmentLength"
            | "TargetRecvDataSegmentLength" => Some(IRRELEVANT.to_string()),
            "iSCSIProtocolLevel" => Some(match number_in(value, 0, 31) {
                Some(n) => n.min(1).to_string(),
                None => REJECT.to_string(),
            }),
            "TaskReporting" => Some(if value.split(',').any(|v| v == "RFC3720") {
                "RFC3720".to_string()
            } else {
                REJECT.to_string()
            }),
            "SendTargets" => Some(IRRELEVANT.to_string()),
            // Target-declared keys cannot come from an initiator.
            "TargetAlias" | "TargetAddress" | "TargetPortalGroupTag" => Some(REJECT.to_string()),
            _ => Some(NOT_UNDERSTOOD.to_string()),
        };
        Ok(answer)
    }
}

fn is_special_value(v: &str) -> bool {
    matches!(v, "NotUnderstood" | "Irrelevant" | "Reject")
}

fn is_known_key(key: &str) -> bool {
    matches!(
        key,
        "InitiatorName"
            | "InitiatorAlias"
            | "TargetName"
            | "SessionType"
            | "HeaderDigest"
            | "DataDigest"
            | "MaxConnections"
            | "InitialR2T"
            | "ImmediateData"
            | "MaxRecvDataSegmentLength"
            | "MaxBurstLength"
            | "FirstBurstLength"
            | "DefaultTime2Wait"
            | "DefaultTime2Retain"
            | "MaxOutstandingR2T"
            | "DataPDUInOrder"
            | "DataSequenceInOrder"
            | "ErrorRecoveryLevel"
            | "IFMarker"
            | "OFMarker"
            | "IFMarkInt"
            | "OFMarkInt"
            | "TargetAlias"
            | "TargetAddress"
            | "TargetPortalGroupTag"
    ) || is_auth_key(key)
}

#[cfg(test)]
mod tests {
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
                "DefaultTime2Wait"
                    | "DefaultTime2Retain"
                    | "ErrorRecoveryLevel"
                    | "iSCSIProtocolLevel"
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
}
