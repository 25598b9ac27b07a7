//! The token of the TCP administration API: read from `[daemon]
//! api_token_file`, which only its owner may read, and the read-only token
//! of `api_read_only_token_file`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::error::ConfigError;
use crate::model::Config;

/// Fewer characters than this would be guessable.
pub const MIN_TOKEN_LEN: usize = 16;

/// The token, or `None` without a TCP API. Refused when the file is
/// readable by others, empty, short, or holds characters an HTTP header
/// cannot carry.
pub fn load_api_token(config: &Config) -> Result<Option<String>, ConfigError> {
    match &config.daemon.api_token_file {
        Some(path) => read_token(config, path, "daemon.api_token_file").map(Some),
        None => Ok(None),
    }
}

/// The token of `[daemon] api_read_only_token_file`, whose callers may
/// read everything and change nothing; `None` when not set. The same rules
/// as [`load_api_token`], and it must differ from the full token.
pub fn load_read_only_token(config: &Config) -> Result<Option<String>, ConfigError> {
    const FIELD: &str = "daemon.api_read_only_token_file";
    let Some(path) = &config.daemon.api_read_only_token_file else {
        return Ok(None);
    };
    let token = read_token(config, path, FIELD)?;
    if load_api_token(config)?.as_deref() == Some(token.as_str()) {
        return Err(ConfigError::single(
            &config.origin,
            None,
            FIELD,
            format!(
                "{} holds the same token as api_token_file: a read-only token must differ",
                path.display()
            ),
        ));
    }
    Ok(Some(token))
}

fn read_token(config: &Config, path: &Path, field: &str) -> Result<String, ConfigError> {
    let fail = |reason: String| ConfigError::single(&config.origin, None, field, reason);
    let meta = std::fs::metadata(path)
        .map_err(|e| fail(format!("cannot read {}: {e}", path.display())))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(fail(format!(
            "{} has mode {mode:o}: others could read the token; chmod 600 it",
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| fail(format!("cannot read {}: {e}", path.display())))?;
    let token = text.trim();
    if token.len() < MIN_TOKEN_LEN {
        return Err(fail(format!(
            "the token in {} is shorter than {MIN_TOKEN_LEN} characters",
            path.display()
        )));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(fail(format!(
            "the token in {} must be one word of visible ASCII characters",
            path.display()
        )));
    }
    Ok(token.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_with(dir: &std::path::Path, token: &str, mode: u32) -> Config {
        let file = dir.join("token");
        std::fs::write(&file, token).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
        let text = format!(
            "[daemon]\napi_listen = \"127.0.0.1:8470\"\napi_token_file = \"{}\"\n",
            file.display()
        );
        crate::parse_config(&text, "t.toml").unwrap()
    }

    #[test]
    fn the_token_file_must_be_private_and_long_enough() {
        let dir = tempfile::tempdir().unwrap();
        let good = "0123456789abcdef0123\n";
        let config = config_with(dir.path(), good, 0o600);
        assert_eq!(
            load_api_token(&config).unwrap().as_deref(),
            Some("0123456789abcdef0123")
        );
        assert!(load_api_token(&config_with(dir.path(), good, 0o400)).is_ok());

        let err = load_api_token(&config_with(dir.path(), good, 0o640))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("daemon.api_token_file") && err.contains("mode 640"),
            "{err}"
        );
        let err = load_api_token(&config_with(dir.path(), "short", 0o600))
            .unwrap_err()
            .to_string();
        assert!(err.contains("shorter than 16"), "{err}");
        let err = load_api_token(&config_with(dir.path(), "0123456789 abcdef", 0o600))
            .unwrap_err()
            .to_string();
        assert!(err.contains("one word"), "{err}");
    }

    #[test]
    fn the_read_only_token_follows_the_same_rules_and_differs() {
        let dir = tempfile::tempdir().unwrap();
        let full = dir.path().join("token");
        let read_only = dir.path().join("ro");
        std::fs::write(&full, "0123456789abcdef0123").unwrap();
        std::fs::set_permissions(&full, std::fs::Permissions::from_mode(0o600)).unwrap();
        let config = |ro_text: &str, mode: u32| {
            std::fs::write(&read_only, ro_text).unwrap();
            std::fs::set_permissions(&read_only, std::fs::Permissions::from_mode(mode)).unwrap();
            let text = format!(
                "[daemon]\napi_listen = \"127.0.0.1:8470\"\napi_token_file = \"{}\"\n\
                 api_read_only_token_file = \"{}\"\n",
                full.display(),
                read_only.display()
            );
            crate::parse_config(&text, "t.toml").unwrap()
        };
        let good = config("readonly-0123456789", 0o600);
        assert_eq!(
            load_read_only_token(&good).unwrap().as_deref(),
            Some("readonly-0123456789")
        );
        let err = load_read_only_token(&config("readonly-0123456789", 0o644))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("daemon.api_read_only_token_file") && err.contains("mode 644"),
            "{err}"
        );
        let err = load_read_only_token(&config("0123456789abcdef0123", 0o600))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("daemon.api_read_only_token_file") && err.contains("must differ"),
            "{err}"
        );
        let err = crate::parse_config("[daemon]\napi_read_only_token_file = \"/x\"\n", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("daemon.api_listen"), "{err}");
    }

    #[test]
    fn no_tcp_api_needs_no_token() {
        let config = crate::parse_config("", "t.toml").unwrap();
        assert_eq!(load_api_token(&config), Ok(None));
    }

    #[test]
    fn listen_and_token_file_come_together() {
        let err = crate::parse_config("[daemon]\napi_listen = \"127.0.0.1:8470\"\n", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("daemon.api_token_file: required"), "{err}");
        let err = crate::parse_config("[daemon]\napi_token_file = \"/x\"\n", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("daemon.api_listen"), "{err}");
    }

    #[test]
    fn timeouts_parse_with_units() {
        let config = crate::parse_config(
            "[daemon]\nlogin_timeout = \"2s\"\nnop_interval = \"off\"\nnop_timeout = \"500ms\"\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(
            config.daemon.login_timeout,
            Some(std::time::Duration::from_secs(2))
        );
        assert_eq!(config.daemon.nop_interval, Some(None));
        assert_eq!(
            config.daemon.nop_timeout,
            Some(std::time::Duration::from_millis(500))
        );
        let err = crate::parse_config("[daemon]\nlogin_timeout = \"2\"\n", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("t.toml:2:17: daemon.login_timeout"), "{err}");
    }
}
