//! EXTENDED COPY (LID1) as an initiator sends it: the LUNs named by their
//! NAA designators, one block-to-block segment per command.

use super::iscsi::Session;

/// LUN `lun`'s 16-byte NAA designator, from INQUIRY VPD page 83h.
pub fn naa(s: &mut Session, lun: u64) -> [u8; 16] {
    let page = s
        .command_good(lun, &[0x12, 0x01, 0x83, 0x01, 0x00, 0x00], &[], 256)
        .expect("INQUIRY VPD 83h");
    let mut at = 4;
    while at + 4 <= page.len() {
        let len = page[at + 3] as usize;
        let (kind, assoc) = (page[at + 1] & 0x0F, (page[at + 1] >> 4) & 0x03);
        if kind == 3 && assoc == 0 && len == 16 && at + 4 + len <= page.len() {
            let mut out = [0u8; 16];
            out.copy_from_slice(&page[at + 4..at + 20]);
            return out;
        }
        at += 4 + len;
    }
    panic!("LUN {lun} has no 16-byte NAA designator");
}

/// An identification target descriptor naming the LUN `naa` with
/// `block`-byte blocks.
pub fn target_descriptor(naa: &[u8; 16], block: u32) -> Vec<u8> {
    let mut d = vec![0u8; 32];
    d[0] = 0xE4; // identification descriptor
    d[4] = 0x01; // binary
    d[5] = 0x03; // NAA, logical unit
    d[7] = 16;
    d[8..24].copy_from_slice(naa);
    d[29..32].copy_from_slice(&block.to_be_bytes()[1..]);
    d
}

/// One EXTENDED COPY, sent to LUN `to`: `blocks` blocks from `src_lba` of
/// the first target descriptor of `targets` to `dst_lba` of the second.
pub fn block_to_block(
    s: &mut Session,
    to: u64,
    targets: &[u8],
    src_lba: u64,
    dst_lba: u64,
    blocks: u16,
) {
    let mut seg = vec![0u8; 28];
    seg[0] = 0x02; // block to block
    seg[3] = 0x18;
    seg[6..8].copy_from_slice(&1u16.to_be_bytes());
    seg[10..12].copy_from_slice(&blocks.to_be_bytes());
    seg[12..20].copy_from_slice(&src_lba.to_be_bytes());
    seg[20..28].copy_from_slice(&dst_lba.to_be_bytes());
    let mut list = vec![0u8; 16];
    list[1] = 3 << 3; // no list identifier
    list[2..4].copy_from_slice(&(targets.len() as u16).to_be_bytes());
    list[8..12].copy_from_slice(&(seg.len() as u32).to_be_bytes());
    list.extend_from_slice(targets);
    list.extend_from_slice(&seg);
    let mut cdb = vec![0x83, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    cdb.extend_from_slice(&(list.len() as u32).to_be_bytes());
    cdb.extend_from_slice(&[0, 0]);
    s.command_good(to, &cdb, &list, 0).expect("EXTENDED COPY");
}
