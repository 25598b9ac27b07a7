//! What a token or a console session may do.

/// The full token may do everything; the read-only token may read
/// everything and change nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Full,
    ReadOnly,
}

impl Role {
    /// Whether this role may make a request of `method`: reads (`GET`,
    /// `HEAD`) for every role, anything else for the full token only.
    pub fn may(self, method: &str) -> bool {
        self == Role::Full || matches!(method, "GET" | "HEAD")
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Full => "full",
            Role::ReadOnly => "read-only",
        }
    }
}

/// The refusal of a change to a read-only caller.
pub const READ_ONLY_REFUSAL: &str =
    "this token is read-only: it may read everything but change nothing";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_only_may_only_read() {
        assert!(Role::ReadOnly.may("GET"));
        assert!(Role::ReadOnly.may("HEAD"));
        for method in ["POST", "DELETE", "PUT", "PATCH"] {
            assert!(!Role::ReadOnly.may(method), "{method}");
            assert!(Role::Full.may(method), "{method}");
        }
    }
}
