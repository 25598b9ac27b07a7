//! Frame a stream of PDUs from arbitrary bytes and parse each one.
//! The first byte picks digests and the data segment limit.

#![no_main]

use iscsi::pdu::initiator::Request;
use iscsi::pdu::{decode, Decoded, Framing};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, mut rest)) = data.split_first() else {
        return;
    };
    let framing = Framing {
        header_digest: mode & 1 != 0,
        data_digest: mode & 2 != 0,
        max_data_segment: 512u32 << (mode >> 4),
    };
    while let Ok(Decoded::Complete { pdu, consumed }) = decode(rest, &framing) {
        let _ = Request::parse(pdu);
        if consumed == 0 || consumed > rest.len() {
            panic!("decode consumed {consumed} of {} bytes", rest.len());
        }
        rest = &rest[consumed..];
    }
});
