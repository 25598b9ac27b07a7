//! The login phase as a pure state machine (RFC 7143 sections 6.3 and 11.12).
//!
//! [`LoginMachine::step`] takes one Login Request and answers with the
//! Login Response to send. It checks versions, stage transitions (CSG, NSG,
//! T and C bits), gathers text spread over several PDUs, negotiates keys,
//! finds the target and runs the authentication hook. Session-table
//! decisions (TSIH, reinstatement) are left to the caller, which receives a
//! [`LoginResult`] once the initiator may enter the full feature phase.

use std::sync::Arc;

use crate::auth::{AuthExchange, AuthStep, Authenticator};
use crate::negotiation::{
    NegotiationError, Negotiator, SessionParams, SessionType, Stage, TargetLimits,
};
use crate::pdu::initiator::LoginRequest;
use crate::pdu::target::LoginResponse;
use crate::text::{self, Accumulator};

/// Total login text accepted from an initiator across all PDUs of a login.
pub const LOGIN_TEXT_LIMIT: usize = 64 * 1024;

/// Stage codes of the CSG/NSG fields.
pub const STAGE_SECURITY: u8 = 0;
pub const STAGE_OPERATIONAL: u8 = 1;
pub const STAGE_FULL_FEATURE: u8 = 3;

/// Login status class and detail (RFC 7143 11.13.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoginStatus {
    pub class: u8,
    pub detail: u8,
}

impl LoginStatus {
    pub const SUCCESS: LoginStatus = LoginStatus {
        class: 0,
        detail: 0,
    };
    pub const INITIATOR_ERROR: LoginStatus = LoginStatus {
        class: 2,
        detail: 0x00,
    };
    pub const AUTHENTICATION_FAILURE: LoginStatus = LoginStatus {
        class: 2,
        detail: 0x01,
    };
    pub const AUTHORIZATION_FAILURE: LoginStatus = LoginStatus {
        class: 2,
        detail: 0x02,
    };
    pub const TARGET_NOT_FOUND: LoginStatus = LoginStatus {
        class: 2,
        detail: 0x03,
    };
    pub const TARGET_REMOVED: LoginStatus = LoginStatus {
        class: 2,
        detail: 0x04,
    };
    pub const UNSUPPORTED_VERSION: LoginStatus = LoginStatus {
        class: 2,
        detail: 0x05,
    };
    pub const TOO_MANY_CONNECTIONS: LoginStatus = LoginStatus {
        class: 2,
        detail: 0x06,
    };
    pub const MISSING_PARAMETER: LoginStatus = LoginStatus {
        class: 2,
        detail: 0x07,
    };
    pub const CANNOT_INCLUDE_IN_SESSION: LoginStatus = LoginStatus {
        class: 2,
        detail: 0x08,
    };
    pub const SESSION_TYPE_NOT_SUPPORTED: LoginStatus = LoginStatus {
        class: 2,
        detail: 0x09,
    };
    pub const SESSION_DOES_NOT_EXIST: LoginStatus = LoginStatus {
        class: 2,
        detail: 0x0a,
    };
    pub const INVALID_DURING_LOGIN: LoginStatus = LoginStatus {
        class: 2,
        detail: 0x0b,
    };
    pub const TARGET_ERROR: LoginStatus = LoginStatus {
        class: 3,
        detail: 0x00,
    };
    pub const SERVICE_UNAVAILABLE: LoginStatus = LoginStatus {
        class: 3,
        detail: 0x01,
    };
    pub const OUT_OF_RESOURCES: LoginStatus = LoginStatus {
        class: 3,
        detail: 0x02,
    };

    pub fn code(self) -> u16 {
        u16::from(self.class) << 8 | u16::from(self.detail)
    }

    /// What the status means, for log lines.
    pub fn reason(self) -> &'static str {
        match (self.class, self.detail) {
            (0, _) => "success",
            (2, 0x01) => "authentication failure",
            (2, 0x02) => "authorization failure",
            (2, 0x03) => "target not found",
            (2, 0x04) => "target removed",
            (2, 0x05) => "unsupported version",
            (2, 0x06) => "too many connections",
            (2, 0x07) => "missing parameter",
            (2, 0x08) => "cannot include in session",
            (2, 0x09) => "session type not supported",
            (2, 0x0a) => "session does not exist",
            (2, 0x0b) => "invalid request during login",
            (2, _) => "initiator error",
            (3, 0x01) => "service unavailable",
            (3, 0x02) => "out of resources",
            _ => "target error",
        }
    }
}

/// What the login needs to know about a target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetInfo {
    pub portal_group: u16,
    pub alias: Option<String>,
}

/// Looks targets up by name.
pub trait TargetDirectory {
    fn target_info(&self, name: &str) -> Option<TargetInfo>;

    /// Whether `initiator` may log in to the target `name` (login status
    /// 0x0202 when not).
    fn admits(&self, _initiator: &str, _name: &str) -> bool {
        true
    }
}

/// A Login Response and its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub response: LoginResponse,
    pub text: Vec<u8>,
}

/// Everything the session layer needs once login has succeeded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoginResult {
    pub initiator_name: String,
    pub initiator_alias: Option<String>,
    /// `None` for discovery sessions.
    pub target_name: Option<String>,
    pub session_type: SessionType,
    pub params: SessionParams,
    pub isid: [u8; 6],
    /// TSIH the initiator asked for (0 for a new session).
    pub tsih: u16,
    pub cid: u16,
    /// ExpCmdSN the full feature phase starts with.
    pub exp_cmdsn: u32,
    /// StatSN of the next response after the final Login Response.
    pub next_statsn: u32,
}

/// What to do after one Login Request.
#[derive(Debug)]
pub enum LoginStep {
    /// Send the reply, then read the next Login Request.
    Reply(Reply),
    /// Send the reply (after setting its TSIH) and enter the full feature phase.
    Complete(Reply, Box<LoginResult>),
    /// Send the reply and close the connection.
    Fail(Reply, LoginStatus),
}

/// Fixed by the first Login Request.
#[derive(Clone, Copy, Debug)]
struct Leading {
    isid: [u8; 6],
    tsih: u16,
    cid: u16,
    exp_cmdsn: u32,
}

/// State of one connection's login.
pub struct LoginMachine {
    negotiator: Negotiator,
    authenticator: Arc<dyn Authenticator>,
    auth: Option<Box<dyn AuthExchange>>,
    /// Current stage; None before the first request.
    stage: Option<u8>,
    leading: Option<Leading>,
    text: Accumulator,
    text_total: usize,
    statsn: u32,
    cmdsn_window: u32,
    identified: bool,
    target: Option<TargetInfo>,
}

impl LoginMachine {
    pub fn new(
        limits: TargetLimits,
        authenticator: Arc<dyn Authenticator>,
        first_statsn: u32,
        cmdsn_window: u32,
    ) -> Self {
        LoginMachine {
            negotiator: Negotiator::new(limits),
            authenticator,
            auth: None,
            stage: None,
            leading: None,
            text: Accumulator::default(),
            text_total: 0,
            statsn: first_statsn,
            cmdsn_window: cmdsn_window.max(1),
            identified: false,
            target: None,
        }
    }

    /// Initiator name once known, for logging refused logins.
    pub fn initiator_name(&self) -> Option<&str> {
        self.negotiator.initiator_name.as_deref()
    }

    /// Target name once known.
    pub fn target_name(&self) -> Option<&str> {
        self.negotiator.target_name.as_deref()
    }

    /// The authentication exchange, once the initiator has named itself.
    pub fn auth(&self) -> Option<&dyn AuthExchange> {
        self.auth.as_deref()
    }

    /// Target found for this login, once known.
    pub fn target(&self) -> Option<&TargetInfo> {
        self.target.as_ref()
    }

    fn base_response(&mut self, req: &LoginRequest) -> LoginResponse {
        let exp_cmdsn = self.leading.map(|l| l.exp_cmdsn).unwrap_or(req.cmdsn);
        let statsn = self.statsn;
        self.statsn = self.statsn.wrapping_add(1);
        LoginResponse {
            transit: false,
            continue_: false,
            csg: req.csg,
            nsg: 0,
            version_max: 0,
            version_active: 0,
            isid: req.isid,
            tsih: 0,
            itt: req.itt,
            statsn,
            exp_cmdsn,
            max_cmdsn: exp_cmdsn.wrapping_add(self.cmdsn_window - 1),
            status_class: 0,
            status_detail: 0,
        }
    }

    /// A failure reply for `req` with the given status.
    pub fn failure(&mut self, req: &LoginRequest, status: LoginStatus) -> Reply {
        let mut response = self.base_response(req);
        response.max_cmdsn = response.exp_cmdsn;
        response.status_class = status.class;
        response.status_detail = status.detail;
        Reply {
            response,
            text: Vec::new(),
        }
    }

    fn fail(&mut self, req: &LoginRequest, status: LoginStatus) -> LoginStep {
        LoginStep::Fail(self.failure(req, status), status)
    }

    /// Handle one Login Request.
    pub fn step(&mut self, req: &LoginRequest, directory: &dyn TargetDirectory) -> LoginStep {
        match self.leading {
            None => {
                // Version 0x00 is the only one defined.
                if req.version_min > 0 {
                    return self.fail(req, LoginStatus::UNSUPPORTED_VERSION);
                }
                if req.csg != STAGE_SECURITY && req.csg != STAGE_OPERATIONAL {
                    return self.fail(req, LoginStatus::INITIATOR_ERROR);
                }
                self.leading = Some(Leading {
                    isid: req.isid,
                    tsih: req.tsih,
                    cid: req.cid,
                    exp_cmdsn: req.cmdsn,
                });
                self.stage = Some(req.csg);
            }
            Some(l) => {
                if l.isid != req.isid || l.tsih != req.tsih || l.cid != req.cid {
                    return self.fail(req, LoginStatus::INITIATOR_ERROR);
                }
            }
        }
        let stage = self.stage.unwrap_or(STAGE_SECURITY);
        if req.csg != stage {
            return self.fail(req, LoginStatus::INITIATOR_ERROR);
        }
        if req.transit && req.continue_ {
            return self.fail(req, LoginStatus::INITIATOR_ERROR);
        }
        if req.transit && !valid_transition(stage, req.nsg) {
            return self.fail(req, LoginStatus::INITIATOR_ERROR);
        }

        self.text_total += req.data.len();
        if self.text_total > LOGIN_TEXT_LIMIT
            || self.text.push(&req.data, LOGIN_TEXT_LIMIT).is_err()
        {
            return self.fail(req, LoginStatus::OUT_OF_RESOURCES);
        }
        if req.continue_ {
            // More text follows: acknowledge with an empty response.
            let response = self.base_response(req);
            return LoginStep::Reply(Reply {
                response,
                text: Vec::new(),
            });
        }
        let keys = match text::parse(&self.text.take()) {
            Ok(k) => k,
            Err(_) => return self.fail(req, LoginStatus::INITIATOR_ERROR),
        };
        let (auth_keys, op_keys): (Vec<_>, Vec<_>) = keys
            .into_iter()
            .partition(|(k, _)| crate::negotiation::is_auth_key(k));

        let neg_stage = if stage == STAGE_SECURITY {
            Stage::Security
        } else {
            Stage::Operational
        };
        let mut answers = match self.negotiator.negotiate(neg_stage, &op_keys) {
            Ok(a) => a,
            Err(NegotiationError::UnsupportedSessionType(_)) => {
                return self.fail(req, LoginStatus::SESSION_TYPE_NOT_SUPPORTED)
            }
            Err(_) => return self.fail(req, LoginStatus::INITIATOR_ERROR),
        };

        if !self.identified {
            if let Err(status) = self.identify(directory) {
                return self.fail(req, status);
            }
            if let Some(t) = &self.target {
                answers.push((
                    "TargetPortalGroupTag".to_string(),
                    t.portal_group.to_string(),
                ));
                if let Some(alias) = &t.alias {
                    answers.push(("TargetAlias".to_string(), alias.clone()));
                }
            }
        }
        let Some(auth) = self.auth.as_mut() else {
            return self.fail(req, LoginStatus::TARGET_ERROR);
        };

        let may_leave_stage = if stage == STAGE_SECURITY {
            match auth.step(&auth_keys) {
                AuthStep::Failed => return self.fail(req, LoginStatus::AUTHENTICATION_FAILURE),
                AuthStep::Continue(keys) => {
                    answers.extend(keys);
                    false
                }
                AuthStep::Done(keys) => {
                    answers.extend(keys);
                    auth.complete()
                }
            }
        } else {
            if req.csg == STAGE_OPERATIONAL && !auth.complete() && !auth.allows_skipping_security()
            {
                return self.fail(req, LoginStatus::AUTHENTICATION_FAILURE);
            }
            // Security keys have no place outside the security stage.
            answers.extend(
                auth_keys
                    .into_iter()
                    .map(|(k, _)| (k, "Reject".to_string())),
            );
            answers.extend(self.negotiator.operational_declarations());
            true
        };

        let mut response = self.base_response(req);
        if req.transit && may_leave_stage {
            response.transit = true;
            response.nsg = req.nsg;
            self.stage = Some(req.nsg);
        }
        let reply = Reply {
            response,
            text: text::encode(&answers),
        };
        if response.transit && response.nsg == STAGE_FULL_FEATURE {
            return self.complete(reply);
        }
        LoginStep::Reply(reply)
    }

    /// First complete request: who is logging in, to what.
    fn identify(&mut self, directory: &dyn TargetDirectory) -> Result<(), LoginStatus> {
        let Some(initiator) = self.negotiator.initiator_name.clone() else {
            return Err(LoginStatus::MISSING_PARAMETER);
        };
        if initiator.is_empty() {
            return Err(LoginStatus::INITIATOR_ERROR);
        }
        let session_type = *self
            .negotiator
            .session_type
            .get_or_insert(SessionType::Normal);
        let target_name = self.negotiator.target_name.clone();
        if session_type == SessionType::Normal {
            let Some(name) = target_name.as_deref() else {
                return Err(LoginStatus::MISSING_PARAMETER);
            };
            match directory.target_info(name) {
                Some(info) => self.target = Some(info),
                None => return Err(LoginStatus::TARGET_NOT_FOUND),
            }
            if !directory.admits(&initiator, name) {
                return Err(LoginStatus::AUTHORIZATION_FAILURE);
            }
        }
        let for_target = if session_type == SessionType::Normal {
            target_name.as_deref()
        } else {
            None
        };
        self.auth = Some(self.authenticator.begin(&initiator, for_target));
        self.identified = true;
        Ok(())
    }

    fn complete(&mut self, reply: Reply) -> LoginStep {
        let Some(leading) = self.leading else {
            // Unreachable in practice: `step` always records the leading request.
            let status = LoginStatus::TARGET_ERROR;
            return LoginStep::Fail(reply, status);
        };
        let n = &self.negotiator;
        let session_type = n.session_type.unwrap_or(SessionType::Normal);
        let result = LoginResult {
            initiator_name: n.initiator_name.clone().unwrap_or_default(),
            initiator_alias: n.initiator_alias.clone(),
            target_name: if session_type == SessionType::Normal {
                n.target_name.clone()
            } else {
                None
            },
            session_type,
            params: n.params.clone(),
            isid: leading.isid,
            tsih: leading.tsih,
            cid: leading.cid,
            exp_cmdsn: leading.exp_cmdsn,
            next_statsn: self.statsn,
        };
        LoginStep::Complete(reply, Box::new(result))
    }
}

fn valid_transition(from: u8, to: u8) -> bool {
    matches!(
        (from, to),
        (STAGE_SECURITY, STAGE_OPERATIONAL)
            | (STAGE_SECURITY, STAGE_FULL_FEATURE)
            | (STAGE_OPERATIONAL, STAGE_FULL_FEATURE)
    )
}

#[cfg(test)]
mod tests;
