//! What the login fuzz targets share: a SCSI target without LUNs (login
//! never reaches it) and the decoding of fuzz input into login requests.

use bytes::Bytes;
use iscsi::pdu::initiator::LoginRequest;
pub use scsi_api::testing::NoLuns;

/// Fuzz input as a sequence of Login Requests of one new session: chunks
/// separated by 0xff, each a flags byte (T, C, CSG, NSG as in the PDU)
/// followed by the text.
pub fn login_requests(data: &[u8]) -> impl Iterator<Item = LoginRequest> + '_ {
    data.split(|&b| b == 0xff).filter_map(|chunk| {
        let (&flags, text) = chunk.split_first()?;
        Some(LoginRequest {
            transit: flags & 0x80 != 0,
            continue_: flags & 0x40 != 0,
            csg: (flags >> 2) & 3,
            nsg: flags & 3,
            version_max: 0,
            version_min: 0,
            isid: [0x80, 0, 0, 0, 0, 1],
            tsih: 0,
            itt: 1,
            cid: 0,
            cmdsn: 1,
            exp_statsn: 0,
            data: Bytes::copy_from_slice(text),
        })
    })
}
