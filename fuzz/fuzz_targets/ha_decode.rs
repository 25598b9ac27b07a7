//! Decode what the HA link's peer sends a mirror (its state, its
//! requests, its replies) from arbitrary bytes: never a panic, and what
//! decodes encodes back to the same bytes.

#![no_main]

use ha::mirror::wire::{self, Request, State};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = Request::decode(data) {
        assert_eq!(req.encode(), data);
    }
    if let Ok(state) = State::decode(data) {
        assert_eq!(State::decode(&state.encode()).unwrap(), state);
    }
    let _ = wire::reply(data, "peer");
});
