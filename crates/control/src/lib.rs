//! Configuration model, validation and the building of live objects.
//!
//! The TOML file is the source of truth at start. [`parse_config`] reads
//! and validates it completely, reporting every problem with the file,
//! line:column, field path and reason; [`build`] then opens the devices
//! and creates the logical units and targets the transports serve.

mod api_token;
mod diff;
mod duration;
mod edit;
mod error;
pub mod kinds;
mod live_change;
mod locate;
mod model;
mod names;
mod pool_metrics;
mod pools;
mod raw;
mod render;
mod runtime;
pub mod sections;
mod show;
mod size;
mod validate;

use std::path::Path;

pub use api_token::{load_api_token, load_read_only_token};
pub use diff::diff;
pub use duration::parse_duration;
pub use edit::{apply_edit, typed_value, ChapScope, Edit};
pub use error::{ConfigError, Issue, Location};
pub use live_change::{check_live_change, loss_notes};
pub use model::{
    Chap, Config, Daemon, Device, Group, LuIdentity, Lun, Nbd, NbdExport, PoolConfig, PoolMember,
    Portal, Schedule, Target, DEFAULT_DEVICE_SIZE, DEFAULT_GROUP, DEFAULT_ISCSI_PORT,
    DEFAULT_NBD_LISTEN,
};
pub use names::check_iscsi_name;
pub use pools::{open_device, open_pool};
pub use runtime::{build, problems_under, rebuild, DeviceHealth, DeviceNode, Runtime};
pub use show::show_object;
pub use size::parse_size;
pub use validate::{parse_listen, MAX_LUN};

/// The configuration used when none is given: one 1 GiB RAM LUN, offered
/// on loopback only.
pub const DEFAULT_CONFIG_TOML: &str = include_str!("default.toml");

/// Where [`default_config`] says it comes from.
pub const DEFAULT_ORIGIN: &str = "<built-in default>";

pub fn load_config(path: &Path) -> Result<Config, ConfigError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError::single(
            &origin,
            None,
            "",
            format!("cannot read the configuration: {e}"),
        )
    })?;
    let config = parse_config(&text, &origin)?;
    warn_if_secrets_are_readable(path, &config);
    Ok(config)
}

/// CHAP secrets belong in a file only its owner can read (mode 0600).
fn warn_if_secrets_are_readable(path: &Path, config: &Config) {
    use std::os::unix::fs::PermissionsExt;
    if !config.has_secrets() {
        return;
    }
    if let Ok(meta) = std::fs::metadata(path) {
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            tracing::warn!(
                file = %path.display(),
                mode = format_args!("{:o}", mode & 0o777),
                "the configuration holds CHAP secrets but others may read it; chmod 600 it"
            );
        }
    }
}

/// Parses and validates configuration text; `origin` names it in errors.
pub fn parse_config(text: &str, origin: &str) -> Result<Config, ConfigError> {
    let raw: raw::RawConfig = toml::from_str(text).map_err(|e| serde_error(text, origin, &e))?;
    validate::validate(raw, text, origin)
}

/// The built-in default with the registered sections' parts.
pub fn default_config_text() -> String {
    format!("{DEFAULT_CONFIG_TOML}{}", sections::default_texts())
}

pub fn default_config() -> Config {
    // The embedded text is fixed at build time and checked by a unit test.
    parse_config(&default_config_text(), DEFAULT_ORIGIN)
        .expect("the built-in default configuration is valid")
}

/// Turns a TOML or serde error into an issue with the field path at its
/// position.
fn serde_error(text: &str, origin: &str, err: &toml::de::Error) -> ConfigError {
    let span = err.span();
    let location = span.as_ref().map(|s| Location::of_span(text, s));
    let mut field = span
        .map(|s| locate::field_at(text, s.start))
        .unwrap_or_default();
    let message = err.message().trim().replace('\n', "; ");
    // A missing field is reported at its table; name the field itself.
    if let Some(missing) = message
        .strip_prefix("missing field `")
        .and_then(|m| m.split('`').next())
    {
        field = if field.is_empty() {
            missing.to_string()
        } else {
            format!("{field}.{missing}")
        };
    }
    ConfigError::single(origin, location, &field, message)
}

#[cfg(test)]
mod tests;
