//! Why a login was refused, in words for the audit log and as a label
//! from a fixed set for metrics, and the count of logins by outcome.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::auth::AuthExchange;
use crate::login::LoginStatus;

/// The reason a login was refused, as metrics count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// CHAP is required and the initiator did not offer it (or skipped
    /// the security stage).
    NoChap,
    /// CHAP_N names no user this login may use.
    UnknownUser,
    /// CHAP_N is right, the response is not: a wrong secret.
    WrongSecret,
    /// Mutual CHAP asked for by one side only.
    MutualChap,
    /// Any other CHAP failure: an algorithm other than MD5, keys missing,
    /// malformed or out of order, a reflected challenge, CHAP insisted on
    /// where none is configured.
    ChapOther,
    /// The initiator may not use the target (status 0x0202).
    NotAllowed,
    /// No target has that name (0x0203).
    TargetUnknown,
    /// The target was removed during the login (0x0204).
    TargetRemoved,
    /// The portal holds as many logged-in connections as it may.
    PortalFull,
    /// Too many sessions, of the initiator or in all, or login text too
    /// long (0x0302).
    OutOfResources,
    /// The daemon is shutting down, or an old session would not end
    /// (0x0301).
    Unavailable,
    /// A connection to a session that does not exist (0x020a).
    SessionUnknown,
    /// Any other initiator error: a missing key, a bad stage transition,
    /// malformed text.
    Protocol,
    /// A fault of the target (0x0300).
    TargetError,
}

impl Refusal {
    pub const ALL: [Refusal; 14] = [
        Refusal::NoChap,
        Refusal::UnknownUser,
        Refusal::WrongSecret,
        Refusal::MutualChap,
        Refusal::ChapOther,
        Refusal::NotAllowed,
        Refusal::TargetUnknown,
        Refusal::TargetRemoved,
        Refusal::PortalFull,
        Refusal::OutOfResources,
        Refusal::Unavailable,
        Refusal::SessionUnknown,
        Refusal::Protocol,
        Refusal::TargetError,
    ];

    /// The `reason` label of `openarray_logins_total`.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::NoChap => "no_chap",
            Refusal::UnknownUser => "unknown_user",
            Refusal::WrongSecret => "wrong_secret",
            Refusal::MutualChap => "mutual_chap_mismatch",
            Refusal::ChapOther => "chap_other",
            Refusal::NotAllowed => "initiator_not_allowed",
            Refusal::TargetUnknown => "target_unknown",
            Refusal::TargetRemoved => "target_removed",
            Refusal::PortalFull => "portal_full",
            Refusal::OutOfResources => "out_of_resources",
            Refusal::Unavailable => "unavailable",
            Refusal::SessionUnknown => "session_unknown",
            Refusal::Protocol => "protocol_error",
            Refusal::TargetError => "target_error",
        }
    }

    fn index(self) -> usize {
        Refusal::ALL
            .iter()
            .position(|r| *r == self)
            .unwrap_or_default()
    }
}

/// A refused login: its metric label and the words of its audit line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refused {
    pub refusal: Refusal,
    /// The status's meaning, then what exactly went wrong where the
    /// status alone does not say (`authentication failure: wrong CHAP
    /// secret`). Never a secret.
    pub reason: String,
}

impl Refused {
    /// Why a login ended with `status`, with the authentication exchange
    /// that ran, if one did.
    pub fn of(status: LoginStatus, auth: Option<&dyn AuthExchange>) -> Refused {
        let (refusal, detail) = if status == LoginStatus::AUTHENTICATION_FAILURE {
            match auth.and_then(|a| a.failure_reason()) {
                Some(why) => (chap_refusal(why), why),
                // The exchange did not fail: the initiator left the
                // security stage (or never entered it) without CHAP.
                None => (
                    Refusal::NoChap,
                    "CHAP required, the initiator skipped the security stage",
                ),
            }
        } else if status == LoginStatus::AUTHORIZATION_FAILURE {
            (
                Refusal::NotAllowed,
                "initiator not allowed to use the target",
            )
        } else if status == LoginStatus::TARGET_NOT_FOUND {
            (Refusal::TargetUnknown, "no target of that name")
        } else if status == LoginStatus::TARGET_REMOVED {
            (Refusal::TargetRemoved, "")
        } else if status == LoginStatus::OUT_OF_RESOURCES {
            (Refusal::OutOfResources, "")
        } else if status == LoginStatus::SERVICE_UNAVAILABLE {
            (Refusal::Unavailable, "")
        } else if status == LoginStatus::SESSION_DOES_NOT_EXIST {
            (Refusal::SessionUnknown, "")
        } else if status.code() >> 8 == 2 {
            (Refusal::Protocol, "")
        } else {
            (Refusal::TargetError, "")
        };
        let reason = if detail.is_empty() {
            status.reason().to_string()
        } else {
            format!("{}: {detail}", status.reason())
        };
        Refused { refusal, reason }
    }
}

/// The metric reason of a failed CHAP exchange, from its failure.
fn chap_refusal(why: &str) -> Refusal {
    match why {
        "AuthMethod missing" | "AuthMethod without CHAP" => Refusal::NoChap,
        "unknown CHAP user" => Refusal::UnknownUser,
        "wrong CHAP secret" => Refusal::WrongSecret,
        "mutual CHAP asked for by one side only" => Refusal::MutualChap,
        _ => Refusal::ChapOther,
    }
}

/// Logins accepted and refused (by reason) since the server started.
#[derive(Debug, Default)]
pub struct LoginCounters {
    accepted: AtomicU64,
    refused: [AtomicU64; Refusal::ALL.len()],
}

impl LoginCounters {
    pub(crate) fn count_accepted(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_refused(&self, refusal: Refusal) {
        self.refused[refusal.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Logins that reached the full feature phase.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Refused logins, for every reason (zero included).
    pub fn refused(&self) -> Vec<(Refusal, u64)> {
        Refusal::ALL
            .iter()
            .map(|r| (*r, self.refused[r.index()].load(Ordering::Relaxed)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::AuthStep;
    use crate::auth_chap::{chap_response, ChapCredentials, ChapExchange, ChapRequirement, Secret};

    const CHALLENGE: [u8; 16] = [9; 16];

    /// Runs a CHAP exchange to its end, the initiator sending the login
    /// text `first` and then `answer` (NUL-separated keys); what a refusal
    /// of it says.
    fn refused_after(mutual: bool, first: &str, answer: &str) -> Refused {
        let keys = |text: &str| crate::text::parse(text.replace(';', "\0").as_bytes()).unwrap();
        let secret = |s: &str| Secret::new(s).unwrap();
        let req = ChapRequirement {
            initiator: ChapCredentials {
                user: "alice".into(),
                secret: secret("alice-secret-1"),
            },
            mutual: mutual.then(|| ChapCredentials {
                user: "array".into(),
                secret: secret("array-secret-1"),
            }),
        };
        let mut ex = ChapExchange::new(Some(req), 42, CHALLENGE);
        let mut step = ex.step(&keys(first));
        if matches!(step, AuthStep::Continue(_)) && !answer.is_empty() {
            step = ex.step(&keys(answer));
        }
        assert_eq!(step, AuthStep::Failed);
        Refused::of(LoginStatus::AUTHENTICATION_FAILURE, Some(&ex))
    }

    fn response(secret: &str) -> String {
        let r = chap_response(42, secret, &CHALLENGE);
        format!(
            "0x{}",
            r.iter().map(|b| format!("{b:02x}")).collect::<String>()
        )
    }

    #[test]
    fn chap_failures_are_told_apart() {
        let offer = "AuthMethod=CHAP;CHAP_A=5;";
        let good = response("alice-secret-1");
        let wrong = response("alice-secret-2");
        let cases = [
            (
                refused_after(false, "AuthMethod=None;", ""),
                Refusal::NoChap,
                "authentication failure: AuthMethod without CHAP",
            ),
            (
                refused_after(false, offer, &format!("CHAP_N=mallory;CHAP_R={good};")),
                Refusal::UnknownUser,
                "authentication failure: unknown CHAP user",
            ),
            (
                refused_after(false, offer, &format!("CHAP_N=alice;CHAP_R={wrong};")),
                Refusal::WrongSecret,
                "authentication failure: wrong CHAP secret",
            ),
            (
                refused_after(true, offer, &format!("CHAP_N=alice;CHAP_R={good};")),
                Refusal::MutualChap,
                "authentication failure: mutual CHAP asked for by one side only",
            ),
            (
                refused_after(false, "AuthMethod=CHAP;CHAP_A=7;", ""),
                Refusal::ChapOther,
                "authentication failure: no CHAP_A=5 (MD5) offered",
            ),
        ];
        for (refused, refusal, reason) in cases {
            assert_eq!(refused.refusal, refusal, "{reason}");
            assert_eq!(refused.reason, reason);
            assert!(!refused.reason.contains("alice-secret"));
        }
    }

    #[test]
    fn statuses_say_what_was_refused() {
        let of = |s| Refused::of(s, None);
        assert_eq!(
            of(LoginStatus::AUTHENTICATION_FAILURE).refusal,
            Refusal::NoChap
        );
        let not_allowed = of(LoginStatus::AUTHORIZATION_FAILURE);
        assert_eq!(not_allowed.refusal, Refusal::NotAllowed);
        assert_eq!(
            not_allowed.reason,
            "authorization failure: initiator not allowed to use the target"
        );
        assert_eq!(
            of(LoginStatus::TARGET_NOT_FOUND).refusal,
            Refusal::TargetUnknown
        );
        assert_eq!(of(LoginStatus::OUT_OF_RESOURCES).reason, "out of resources");
        assert_eq!(
            of(LoginStatus::MISSING_PARAMETER).refusal,
            Refusal::Protocol
        );
        assert_eq!(of(LoginStatus::TARGET_ERROR).refusal, Refusal::TargetError);
    }

    #[test]
    fn counters_count_each_reason_apart() {
        let c = LoginCounters::default();
        c.count_accepted();
        c.count_refused(Refusal::WrongSecret);
        c.count_refused(Refusal::WrongSecret);
        c.count_refused(Refusal::TargetError);
        assert_eq!(c.accepted(), 1);
        let refused = c.refused();
        assert_eq!(refused.len(), Refusal::ALL.len());
        let count = |r| refused.iter().find(|(x, _)| *x == r).map(|(_, n)| *n);
        assert_eq!(count(Refusal::WrongSecret), Some(2));
        assert_eq!(count(Refusal::TargetError), Some(1));
        assert_eq!(count(Refusal::NoChap), Some(0));
        // Labels are distinct.
        let mut labels: Vec<_> = Refusal::ALL.iter().map(|r| r.label()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), Refusal::ALL.len());
    }
}
