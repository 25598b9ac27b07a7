//! Frame NVMe/TCP PDUs from arbitrary bytes as the target receives them
//! (the first byte picks the digests), and read every capsule's entry as
//! the queue does: each ends in a PDU or a fatal error, never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use nvmf::capsule::Sqe;
use nvmf::wire::{self, kind, Digests, Pdu};

const HOST_SENDS: &[u8] = &[
    kind::IC_REQ,
    kind::H2C_TERM,
    kind::CAPSULE_CMD,
    kind::H2C_DATA,
];

fuzz_target!(|data: &[u8]| {
    let Some((&mode, mut rest)) = data.split_first() else {
        return;
    };
    let digests = Digests {
        header: mode & 1 != 0,
        data: mode & 2 != 0,
    };
    while rest.len() >= wire::COMMON_LEN {
        let c = wire::common(rest);
        let Ok(plen) = wire::check_common(&c, HOST_SENDS, digests, 1 << 20) else {
            return;
        };
        if rest.len() < plen {
            return;
        }
        if let Ok(Pdu::Command { sqe, .. }) = wire::decode(&rest[..plen], digests) {
            let sqe = Sqe(sqe);
            let _ = (sqe.sgl(), sqe.fuse(), sqe.cdw10_11(), sqe.cdw(15));
        }
        rest = &rest[plen..];
    }
});
