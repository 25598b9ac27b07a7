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
        match key {
            "InitiatorName" | "InitiatorAlias" | "TargetName" | "SessionType" => {
                self.record_identity(key, value);
                Ok(None)
            }
            "HeaderDigest" | "DataDigest" => self.answer_digest(key, value).map(Some),
            _ => Ok(self.answer_operational(key, value)),
        }
    }

    /// Identity keys are declarations: recorded, never answered.
    /// SessionType was taken before the batch.
    fn record_identity(&mut self, key: &str, value: &str) {
        let slot = match key {
            "InitiatorName" => &mut self.initiator_name,
            "InitiatorAlias" => &mut self.initiator_alias,
            "TargetName" => &mut self.target_name,
            _ => return,
        };
        *slot = Some(value.to_string());
    }

    /// The responder picks the first offered digest it supports; with
    /// none of them, Reject leaves the default (None) in force, unless the
    /// target does not accept None either.
    fn answer_digest(&mut self, key: &str, value: &str) -> Result<String, NegotiationError> {
        let (ours, slot, name) = if key == "HeaderDigest" {
            (
                &self.limits.header_digests,
                &mut self.params.header_digest,
                "HeaderDigest",
            )
        } else {
            (
                &self.limits.data_digests,
                &mut self.params.data_digest,
                "DataDigest",
            )
        };
        let pick = value
            .split(',')
            .filter_map(Digest::parse)
            .find(|d| ours.contains(d));
        match pick {
            Some(d) => {
                *slot = d;
                Ok(d.as_str().to_string())
            }
            None if ours.contains(&Digest::None) => Ok(REJECT.to_string()),
            None => Err(NegotiationError::NoAcceptableValue(name)),
        }
    }

    /// Keys that set a session parameter, combined with the target's
    /// limit by the key's result function; `None` for a declaration. Any
    /// other key has a [`fixed_answer`].
    fn answer_operational(&mut self, key: &str, value: &str) -> Option<String> {
        let p = &mut self.params;
        let l = &self.limits;
        match key {
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
            "ErrorRecoveryLevel" => Some(match number_in(value, 0, 2) {
                Some(_) => {
                    p.error_recovery_level = 0;
                    "0".to_string()
                }
                None => REJECT.to_string(),
            }),
            _ => Some(fixed_answer(key, value)),
        }
    }
}

/// The answer to a key whose outcome the target decides alone: what it
/// always does (in-order delivery, no markers, RFC 3720 task reporting),
/// Irrelevant, Reject or NotUnderstood.
fn fixed_answer(key: &str, value: &str) -> String {
    match key {
        // We only deliver in order; OR with our Yes is always Yes.
        "DataPDUInOrder" | "DataSequenceInOrder" => match parse_bool(value) {
            Some(_) => yes_no(true),
            None => REJECT.to_string(),
        },
        // Markers are not supported: AND with our No.
        "IFMarker" | "OFMarker" | "RDMAExtensions" => match parse_bool(value) {
            Some(_) => yes_no(false),
            None => REJECT.to_string(),
        },
        "IFMarkInt"
        | "OFMarkInt"
        | "InitiatorRecvDataSegmentLength"
        | "TargetRecvDataSegmentLength" => IRRELEVANT.to_string(),
        "iSCSIProtocolLevel" => match number_in(value, 0, 31) {
            Some(n) => n.min(1).to_string(),
            None => REJECT.to_string(),
        },
        "TaskReporting" => {
            if value.split(',').any(|v| v == "RFC3720") {
                "RFC3720".to_string()
            } else {
                REJECT.to_string()
            }
        }
        "SendTargets" => IRRELEVANT.to_string(),
        // Target-declared keys cannot come from an initiator.
        "TargetAlias" | "TargetAddress" | "TargetPortalGroupTag" => REJECT.to_string(),
        _ => NOT_UNDERSTOOD.to_string(),
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
mod tests;
