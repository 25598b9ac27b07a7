//! Configuration text and edits as the administration API takes them:
//! `POST /v1/config/apply` carries a whole file, `POST /v1/edit` one JSON
//! edit made to the running file. The first byte picks which; the rest is
//! the body. Every body must be refused with an error that renders, or
//! give a configuration that diffs against the one it replaces.

#![no_main]

use std::sync::OnceLock;

use control::{apply_edit, diff, parse_config, Config, Edit};
use libfuzzer_sys::fuzz_target;

/// The running configuration edits are made to: the documented example,
/// with portals, several device kinds, targets and LUNs.
const RUNNING: &str = include_str!("../../examples/openarray.toml");

/// [`RUNNING`] parsed, once: every input is compared with it.
fn running() -> &'static Config {
    static PARSED: OnceLock<Config> = OnceLock::new();
    PARSED.get_or_init(|| {
        parse_config(RUNNING, "examples/openarray.toml").expect("the example is valid")
    })
}

fn accept(text: &str, running: &Config) {
    match parse_config(text, "fuzz.toml") {
        Ok(config) => {
            let _ = diff(running, &config);
        }
        Err(e) => assert!(!e.to_string().is_empty(), "an error without a message"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let running = running();
    if mode & 1 == 0 {
        if let Ok(text) = std::str::from_utf8(body) {
            accept(text, running);
        }
        return;
    }
    let Ok(edit) = serde_json::from_slice::<Edit>(body) else {
        return;
    };
    match apply_edit(RUNNING, &edit) {
        Ok(text) => accept(&text, running),
        Err(e) => assert!(!e.is_empty(), "an edit refused without a reason"),
    }
});
