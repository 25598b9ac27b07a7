//! CHAP credentials as a configuration gives them: a transport that
//! authenticates its logins with CHAP (iSCSI; NVMe's DH-HMAC-CHAP) checks
//! them, and the access rules of every export carry them.

/// Fewest bytes a CHAP secret may have (RFC 7143 12.1.3 asks for 96 bits).
pub const MIN_SECRET_LEN: usize = 12;
/// Most bytes a CHAP secret may have (what common initiators accept).
pub const MAX_SECRET_LEN: usize = 255;

/// A CHAP secret. Its `Debug` form hides the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// A secret of acceptable length and without control characters.
    pub fn new(value: &str) -> Result<Secret, String> {
        if value.len() < MIN_SECRET_LEN {
            return Err(format!(
                "a CHAP secret needs at least {MIN_SECRET_LEN} bytes (has {})",
                value.len()
            ));
        }
        if value.len() > MAX_SECRET_LEN {
            return Err(format!("a CHAP secret has at most {MAX_SECRET_LEN} bytes"));
        }
        if value.chars().any(char::is_control) {
            return Err("a CHAP secret has no control characters".into());
        }
        Ok(Secret(value.to_string()))
    }

    /// The secret itself, for computing responses and saving the
    /// configuration.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// A CHAP name and secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChapCredentials {
    pub user: String,
    pub secret: Secret,
}

/// The CHAP a login must pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChapRequirement {
    /// What the initiator must prove it knows.
    pub initiator: ChapCredentials,
    /// When set, the initiator must also authenticate the target, which
    /// answers with these credentials (mutual CHAP).
    pub mutual: Option<ChapCredentials>,
}
