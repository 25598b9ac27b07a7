//! Decode NBD negotiation options and transmission requests from
//! arbitrary bytes, and check what the checks let through. The first
//! byte picks the session: extended headers, structured replies,
//! read-only, block status.

#![no_main]

use libfuzzer_sys::fuzz_target;
use nbd::wire::{self, Agreed, Command};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, mut rest)) = data.split_first() else {
        return;
    };
    let agreed = Agreed {
        size: 1 << (20 + (mode >> 4)),
        read_only: mode & 4 != 0,
        structured: mode & 3 != 0,
        extended: mode & 1 != 0,
        block_status: mode & 8 != 0,
        max_payload: 1 << 16,
    };
    // Options: a header, then its data as every parser reads it.
    if let Ok(h) = wire::decode_option_header(rest) {
        let body = &rest[16..];
        let body = &body[..body.len().min(h.len as usize)];
        let _ = wire::parse_info_request(body);
        let _ = wire::parse_meta_request(body);
        let _ = wire::parse_export_name(body);
        rest = &rest[16 + body.len()..];
    }
    // Requests, one after another, their payloads skipped.
    let header_len = wire::request_header_len(agreed.extended);
    while rest.len() >= header_len {
        let Ok(h) = wire::decode_request(rest, agreed.extended, agreed.max_payload) else {
            return;
        };
        let payload = h.payload_len(agreed.extended);
        assert!(payload <= agreed.max_payload);
        if let Ok(cmd) = wire::check_request(&h, &agreed) {
            let range = match cmd {
                Command::Read { offset, len, .. } => {
                    assert!(len <= agreed.max_payload);
                    Some((offset, len))
                }
                Command::Write { offset, len, .. }
                | Command::Trim { offset, len, .. }
                | Command::WriteZeroes { offset, len, .. } => {
                    assert!(!agreed.read_only);
                    Some((offset, len))
                }
                Command::Cache { offset, len } => Some((offset, len)),
                Command::BlockStatus { offset, len, .. } => {
                    assert!(agreed.block_status && len > 0);
                    Some((offset, len))
                }
                Command::Flush | Command::Disconnect => None,
            };
            if let Some((offset, len)) = range {
                assert!(offset
                    .checked_add(len)
                    .is_some_and(|end| end <= agreed.size));
            }
        }
        let skip = header_len.saturating_add(payload as usize);
        if skip > rest.len() {
            return;
        }
        rest = &rest[skip..];
    }
});
