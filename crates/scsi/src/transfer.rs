//! How much Data-Out a CDB asks for, so the transport can report residuals
//! whatever the outcome of the command.

use crate::cdb::{be16, be32, u8_at};
use crate::commands::op;

/// Bytes of Data-Out the CDB describes, `None` for commands without a
/// Data-Out phase.
pub fn data_out_wanted(cdb: &[u8], block_size: u32) -> Option<u32> {
    let bs = u64::from(block_size);
    let blocks = |n: u64| Some(u32::try_from(n.saturating_mul(bs)).unwrap_or(u32::MAX));
    // VERIFY and WRITE AND VERIFY: BYTCHK 01b sends every block, 11b one.
    let bytchk = || (u8_at(cdb, 1) >> 1) & 0x03;
    match u8_at(cdb, 0) {
        op::WRITE_6 => {
            let n = u8_at(cdb, 4);
            blocks(if n == 0 { 256 } else { u64::from(n) })
        }
        op::WRITE_10 | op::WRITE_VERIFY_10 => blocks(u64::from(be16(cdb, 7))),
        op::WRITE_12 | op::WRITE_VERIFY_12 => blocks(u64::from(be32(cdb, 6))),
        op::WRITE_16 | op::WRITE_VERIFY_16 | op::ORWRITE_16 => blocks(u64::from(be32(cdb, 10))),
        op::WRITE_ATOMIC_16 => blocks(u64::from(be16(cdb, 12))),
        op::VERIFY_10 => verify_data(bytchk(), u64::from(be16(cdb, 7))).and_then(blocks),
        op::VERIFY_12 => verify_data(bytchk(), u64::from(be32(cdb, 6))).and_then(blocks),
        op::VERIFY_16 => verify_data(bytchk(), u64::from(be32(cdb, 10))).and_then(blocks),
        op::COMPARE_AND_WRITE => blocks(2 * u64::from(u8_at(cdb, 13))),
        op::WRITE_SAME_10 => blocks(1),
        op::WRITE_SAME_16 => {
            if u8_at(cdb, 1) & 0x01 != 0 {
                None
            } else {
                blocks(1)
            }
        }
        op::UNMAP | op::MODE_SELECT_10 | op::SANITIZE => Some(u32::from(be16(cdb, 7))),
        op::MODE_SELECT_6 => Some(u32::from(u8_at(cdb, 4))),
        op::PERSISTENT_RESERVE_OUT => Some(be32(cdb, 5)),
        op::EXTENDED_COPY => Some(be32(cdb, 10)),
        op::MAINTENANCE_OUT => Some(be32(cdb, 6)),
        _ => None,
    }
}

fn verify_data(bytchk: u8, blocks: u64) -> Option<u64> {
    match bytchk {
        1 => Some(blocks),
        3 => Some(1),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_commands_scale_by_block_size() {
        assert_eq!(
            data_out_wanted(&[0x2A, 0, 0, 0, 0, 0, 0, 0, 2, 0], 512),
            Some(1024)
        );
        assert_eq!(
            data_out_wanted(&[0x0A, 0, 0, 0, 0, 0], 4096),
            Some(256 * 4096)
        );
        let mut w16 = [0u8; 16];
        w16[0] = 0x8A;
        w16[10..14].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(data_out_wanted(&w16, 4096), Some(u32::MAX));
        assert_eq!(
            data_out_wanted(&[0x89, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0], 512),
            Some(3072)
        );
    }

    #[test]
    fn verify_depends_on_bytchk() {
        assert_eq!(
            data_out_wanted(&[0x2F, 0x00, 0, 0, 0, 0, 0, 0, 8, 0], 512),
            None
        );
        assert_eq!(
            data_out_wanted(&[0x2F, 0x02, 0, 0, 0, 0, 0, 0, 8, 0], 512),
            Some(4096)
        );
        assert_eq!(
            data_out_wanted(&[0x2F, 0x06, 0, 0, 0, 0, 0, 0, 8, 0], 512),
            Some(512)
        );
    }

    #[test]
    fn parameter_lists_and_no_data() {
        assert_eq!(
            data_out_wanted(&[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], 512),
            Some(24)
        );
        assert_eq!(data_out_wanted(&[0x15, 0x10, 0, 0, 28, 0], 512), Some(28));
        assert_eq!(
            data_out_wanted(&[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], 512),
            None
        );
        assert_eq!(
            data_out_wanted(&[0x93, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0], 512),
            None
        );
        assert_eq!(data_out_wanted(&[], 512), None);
    }
}
