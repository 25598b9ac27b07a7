//! The authentication step of login, as a pluggable hook.
//!
//! The login state machine hands every authentication key of the security
//! stage (AuthMethod, CHAP_*, ...) to an [`AuthExchange`] and lets it decide
//! when the initiator may leave the security stage. [`NoAuthentication`]
//! accepts `AuthMethod=None`; CHAP plugs in the same way.

/// Outcome of one step of an authentication exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthStep {
    /// Send these keys and wait for the initiator's next PDU.
    Continue(Vec<(String, String)>),
    /// Authentication succeeded; these keys (possibly none) go in the response.
    Done(Vec<(String, String)>),
    /// Authentication failed (login status 0x0201).
    Failed,
}

/// Creates one exchange per login attempt.
pub trait Authenticator: Send + Sync {
    /// Start the exchange once the initiator has named itself (and, for a
    /// normal session, the target).
    fn begin(&self, initiator: &str, target: Option<&str>) -> Box<dyn AuthExchange>;
}

/// One login's authentication conversation.
pub trait AuthExchange: Send {
    /// Handle the authentication keys of one security-stage request (may
    /// be empty).
    fn step(&mut self, keys: &[(String, String)]) -> AuthStep;

    /// True once the initiator may move past the security stage.
    fn complete(&self) -> bool;

    /// Whether an initiator may skip the security stage entirely (start
    /// its login in the operational stage).
    fn allows_skipping_security(&self) -> bool;

    /// Why the exchange failed, once it has; never a secret.
    fn failure_reason(&self) -> Option<&'static str> {
        None
    }
}

/// Accepts every initiator without authentication (`AuthMethod=None`).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoAuthentication;

impl Authenticator for NoAuthentication {
    fn begin(&self, _initiator: &str, _target: Option<&str>) -> Box<dyn AuthExchange> {
        Box::new(NoAuthExchange)
    }
}

struct NoAuthExchange;

impl AuthExchange for NoAuthExchange {
    fn step(&mut self, keys: &[(String, String)]) -> AuthStep {
        let mut answers = Vec::new();
        for (key, value) in keys {
            if key == "AuthMethod" {
                if value.split(',').any(|m| m == "None") {
                    answers.push((key.clone(), "None".to_string()));
                } else {
                    return AuthStep::Failed;
                }
            } else {
                // CHAP_* and friends mean nothing without a method that uses them.
                answers.push((key.clone(), "Irrelevant".to_string()));
            }
        }
        AuthStep::Done(answers)
    }

    fn complete(&self) -> bool {
        true
    }

    fn allows_skipping_security(&self) -> bool {
        true
    }
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

    #[test]
    fn none_is_chosen_from_a_list() {
        let mut ex = NoAuthentication.begin("iqn.i", Some("iqn.t"));
        assert_eq!(
            ex.step(&kv(&[("AuthMethod", "CHAP,None")])),
            AuthStep::Done(kv(&[("AuthMethod", "None")]))
        );
        assert!(ex.complete());
    }

    #[test]
    fn chap_only_fails() {
        let mut ex = NoAuthentication.begin("iqn.i", None);
        assert_eq!(ex.step(&kv(&[("AuthMethod", "CHAP")])), AuthStep::Failed);
    }

    #[test]
    fn no_keys_is_fine() {
        let mut ex = NoAuthentication.begin("iqn.i", None);
        assert_eq!(ex.step(&[]), AuthStep::Done(vec![]));
        assert!(ex.allows_skipping_security());
    }
}
