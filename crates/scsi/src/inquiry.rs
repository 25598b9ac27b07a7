//! INQUIRY (standard data and VPD pages) and READ CAPACITY.

use scsi_api::{Nexus, ScsiResponse};

use crate::cdb::{be16, be32, put16, put32, put64, put_ascii, truncate, u8_at};
use crate::lu::{
    Ctx, LogicalUnit, Outcome, MAX_COMPARE_AND_WRITE_BLOCKS, MAX_UNMAP_DESCRIPTORS,
    OPTIMAL_TRANSFER_BYTES,
};
use crate::sense::Sense;

pub const VPD_SUPPORTED: u8 = 0x00;
pub const VPD_SERIAL: u8 = 0x80;
pub const VPD_DEVICE_ID: u8 = 0x83;
pub const VPD_EXTENDED: u8 = 0x86;
pub const VPD_BLOCK_LIMITS: u8 = 0xB0;
pub const VPD_CHARACTERISTICS: u8 = 0xB1;
pub const VPD_PROVISIONING: u8 = 0xB2;
const VPD_PAGES: [u8; 7] = [
    VPD_SUPPORTED,
    VPD_SERIAL,
    VPD_DEVICE_ID,
    VPD_EXTENDED,
    VPD_BLOCK_LIMITS,
    VPD_CHARACTERISTICS,
    VPD_PROVISIONING,
];

/// Version descriptors: SAM-5, iSCSI, SPC-4, SBC-3.
const VERSION_DESCRIPTORS: [u16; 4] = [0x00A0, 0x0960, 0x0460, 0x04C0];

/// Standard INQUIRY data for an LU that is not mapped at this LUN:
/// peripheral qualifier 011b, device type 1Fh (SPC-4 6.6.2).
pub fn unmapped_standard_inquiry() -> Vec<u8> {
    let mut d = vec![0u8; 36];
    d[0] = 0x7F;
    d[2] = 0x06;
    d[3] = 0x12;
    d[4] = 31;
    d
}

/// A designation descriptor of VPD page 0x83.
fn designator(out: &mut Vec<u8>, code_set: u8, piv_assoc_type: u8, value: &[u8]) {
    // Protocol identifier 5 (iSCSI) is only meaningful with PIV set.
    let proto = if piv_assoc_type & 0x80 != 0 { 0x50 } else { 0 };
    out.extend_from_slice(&[proto | code_set, piv_assoc_type, 0, value.len() as u8]);
    out.extend_from_slice(value);
}

/// A SCSI name string: UTF-8, NUL terminated, padded to a multiple of 4.
fn name_string(s: &str) -> Vec<u8> {
    let mut v: Vec<u8> = s.bytes().take(251).collect();
    v.push(0);
    while !v.len().is_multiple_of(4) {
        v.push(0);
    }
    v
}

impl LogicalUnit {
    pub(crate) fn inquiry(&self, ctx: &Ctx<'_>) -> Outcome {
        let cdb = ctx.cdb();
        let evpd = u8_at(cdb, 1) & 0x01 != 0;
        let page = u8_at(cdb, 2);
        let alloc = usize::from(be16(cdb, 3));
        let data = if !evpd {
            if page != 0 {
                return Err(Sense::invalid_cdb(2, None).into());
            }
            self.standard_inquiry()
        } else {
            self.vpd_page(page, ctx.nexus)?
        };
        Ok(ScsiResponse::with_data(truncate(data, alloc)))
    }

    fn standard_inquiry(&self) -> Vec<u8> {
        let mut d = vec![0u8; 96];
        d[2] = 0x06; // SPC-4
        d[3] = 0x10 | 0x02; // HISUP, response data format 2
        d[4] = (d.len() - 5) as u8;
        d[5] = self.tpgs() | 0x08; // TPGS, 3PC (EXTENDED COPY)
        d[7] = 0x02; // CMDQUE
        put_ascii(&mut d[8..16], &self.config().vendor);
        put_ascii(&mut d[16..32], &self.config().product);
        put_ascii(&mut d[32..36], &self.config().revision);
        for (i, v) in VERSION_DESCRIPTORS.iter().enumerate() {
            put16(&mut d, 58 + 2 * i, *v);
        }
        d
    }

    fn vpd_page(&self, page: u8, nexus: &Nexus) -> Result<Vec<u8>, Sense> {
        let mut d = vec![0, page, 0, 0];
        match page {
            VPD_SUPPORTED => d.extend_from_slice(&VPD_PAGES),
            VPD_SERIAL => {
                d.extend(
                    self.serial
                        .bytes()
                        .filter(|c| (0x20..0x7F).contains(c))
                        .take(250),
                );
            }
            VPD_DEVICE_ID => self.device_identification(&mut d, nexus),
            VPD_EXTENDED => {
                d.resize(64, 0);
                // HEADSUP, ORDSUP, SIMPSUP: every task attribute is accepted.
                d[5] = 0x07;
                // V_SUP: a volatile cache exists (SYNCHRONIZE CACHE matters).
                d[6] = u8::from(self.caps.volatile_cache);
            }
            VPD_BLOCK_LIMITS => self.block_limits(&mut d),
            VPD_CHARACTERISTICS => {
                d.resize(64, 0);
                // Non-rotating medium.
                put16(&mut d, 4, 1);
                // WABEREQ 01b: after BLOCK ERASE, reads succeed.
                if self.thin() {
                    d[7] = 0x40;
                }
            }
            VPD_PROVISIONING => {
                d.resize(8, 0);
                d[4] = self.threshold_exponent();
                if self.thin() {
                    // LBPU, LBPWS, LBPWS10
                    d[5] = 0x80 | 0x40 | 0x20;
                    if self.unmapped_reads_zero() {
                        d[5] |= 0x04; // LBPRZ
                    }
                    d[6] = 0x02; // thin provisioned
                }
            }
            _ => return Err(Sense::invalid_cdb(2, None)),
        }
        let len = (d.len() - 4) as u16;
        put16(&mut d, 2, len);
        Ok(d)
    }

    fn device_identification(&self, d: &mut Vec<u8>, nexus: &Nexus) {
        // Logical unit: NAA (binary) and T10 vendor id + serial (ASCII).
        designator(d, 0x01, 0x03, &self.naa);
        let mut t10 = vec![b' '; 8];
        put_ascii(&mut t10, &self.config().vendor);
        t10.extend(
            self.serial
                .bytes()
                .filter(|c| (0x20..0x7F).contains(c))
                .take(200),
        );
        designator(d, 0x02, 0x01, &t10);
        // Target port the command came through: relative port, port group,
        // SCSI name; and the target device name.
        let mut rel = [0u8; 4];
        put16(&mut rel, 2, nexus.relative_port);
        designator(d, 0x01, 0x80 | 0x10 | 0x04, &rel);
        let mut tpg = [0u8; 4];
        put16(&mut tpg, 2, nexus.portal_group);
        designator(d, 0x01, 0x80 | 0x10 | 0x05, &tpg);
        let port_name = format!("{},t,0x{:04x}", nexus.target_name, nexus.portal_group);
        designator(d, 0x03, 0x80 | 0x10 | 0x08, &name_string(&port_name));
        designator(
            d,
            0x03,
            0x80 | 0x20 | 0x08,
            &name_string(&nexus.target_name),
        );
    }

    fn block_limits(&self, d: &mut Vec<u8>) {
        let bs = u64::from(self.block_size);
        let max = self.max_transfer_blocks();
        d.resize(64, 0);
        d[5] = MAX_COMPARE_AND_WRITE_BLOCKS as u8;
        // OPTIMAL TRANSFER LENGTH GRANULARITY: the device's granularity up
        // to the optimal transfer length, else a 4 KiB page.
        let page = (4096 / bs).max(1);
        let gran = self.granularity_blocks();
        let otlg = if gran > 1 {
            gran.min(OPTIMAL_TRANSFER_BYTES / bs).max(page)
        } else {
            page
        };
        put16(&mut d[..], 6, u16::try_from(otlg).unwrap_or(u16::MAX));
        put32(&mut d[..], 8, max as u32);
        put32(&mut d[..], 12, (OPTIMAL_TRANSFER_BYTES / bs) as u32);
        // MAXIMUM PREFETCH LENGTH
        put32(&mut d[..], 16, max as u32);
        if self.thin() {
            // MAXIMUM UNMAP LBA COUNT: unlimited; descriptors per UNMAP.
            put32(&mut d[..], 20, u32::MAX);
            put32(&mut d[..], 24, MAX_UNMAP_DESCRIPTORS);
            // OPTIMAL UNMAP GRANULARITY: the device's granularity (a thin
            // volume's allocation unit), else a 4 KiB page.
            put32(
                &mut d[..],
                28,
                u32::try_from(gran.max(page)).unwrap_or(u32::MAX),
            );
        }
        put64(&mut d[..], 36, max);
        self.put_atomic_limits(&mut d[..]);
    }

    pub(crate) fn read_capacity_10(&self, ctx: &Ctx<'_>) -> Outcome {
        let cdb = ctx.cdb();
        if u8_at(cdb, 8) & 0x01 == 0 && be32(cdb, 2) != 0 {
            return Err(Sense::invalid_cdb(2, None).into());
        }
        let last = self.blocks() - 1;
        let mut d = vec![0u8; 8];
        put32(&mut d, 0, u32::try_from(last).unwrap_or(u32::MAX));
        put32(&mut d, 4, self.block_size);
        Ok(ScsiResponse::with_data(d))
    }

    pub(crate) fn read_capacity_16(&self, ctx: &Ctx<'_>) -> Outcome {
        let alloc = be32(ctx.cdb(), 10) as usize;
        let mut d = vec![0u8; 32];
        put64(&mut d, 0, self.blocks() - 1);
        put32(&mut d, 8, self.block_size);
        // LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT is what the
        // configuration says, not derived from a device's granularity:
        // libiscsi 1.19's GetLBAStatus.UnmapSingle expects, with more than
        // one logical block per physical block, a descriptor for LBA n + 1
        // to start at n + LBPPB, which no correct target returns. The
        // granularity goes to initiators through the Block Limits page
        // instead (see docs/pool.md).
        d[13] = self.config().physical_block_exponent & 0x0F;
        if self.thin() {
            d[14] = 0x80;
            if self.unmapped_reads_zero() {
                d[14] |= 0x40;
            }
        }
        Ok(ScsiResponse::with_data(truncate(d, alloc)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdb::be64;
    use crate::lu::test_support::*;
    use scsi_api::status;

    fn inq(lu: &LogicalUnit, evpd: bool, page: u8) -> ScsiResponse {
        run(
            lu,
            &nexus("a"),
            &[0x12, u8::from(evpd), page, 0x01, 0x00, 0],
            &[],
        )
    }

    #[test]
    fn standard_data() {
        let lu = lu();
        let d = inq(&lu, false, 0).data_in;
        assert_eq!(d.len(), 96);
        assert_eq!(d[0], 0);
        assert_eq!(d[2], 6);
        assert_eq!(d[3] & 0x0F, 2);
        assert_eq!(usize::from(d[4]) + 5, d.len());
        assert_eq!(&d[8..16], b"OPENARRY");
        assert_eq!(&d[16..32], b"VIRTUAL-DISK    ");
        assert!(d[58..74].chunks(2).any(|c| c == [0x04, 0xC0]));
        // Allocation length truncates; page code without EVPD is invalid.
        let r = run(&lu, &nexus("a"), &[0x12, 0, 0, 0, 5, 0], &[]);
        assert_eq!(r.data_in.len(), 5);
        assert_eq!(sense_of(&inq(&lu, false, 1)).1, 0x24);
        // CMDDT is obsolete: rejected.
        assert_eq!(
            sense_of(&run(&lu, &nexus("a"), &[0x12, 0x02, 0, 0, 96, 0], &[])).1,
            0x24
        );
    }

    #[test]
    fn every_listed_vpd_page_is_readable_and_sized_right() {
        let lu = lu();
        let list = inq(&lu, true, 0).data_in;
        for &p in &list[4..] {
            let d = inq(&lu, true, p).data_in;
            assert_eq!(d[1], p);
            assert_eq!(usize::from(be16(&d, 2)) + 4, d.len(), "page {p:#x}");
        }
        assert_eq!(sense_of(&inq(&lu, true, 0x8F)).1, 0x24);
    }

    #[test]
    fn device_identification_designators() {
        let lu = lu();
        let d = inq(&lu, true, VPD_DEVICE_ID).data_in;
        // First designator: LU NAA.
        assert_eq!(&d[4..8], &[0x01, 0x03, 0, 16]);
        assert_eq!(&d[8..24], &lu.naa());
        let mut pos = 4;
        let mut types = Vec::new();
        while pos + 4 <= d.len() {
            types.push((d[pos + 1] >> 4 & 3, d[pos + 1] & 0x0F));
            let len = usize::from(d[pos + 3]);
            if d[pos + 1] & 0x0F == 8 {
                assert_eq!(len % 4, 0);
            }
            pos += 4 + len;
        }
        assert_eq!(pos, d.len());
        assert_eq!(types, vec![(0, 3), (0, 1), (1, 4), (1, 5), (1, 8), (2, 8)]);
    }

    #[test]
    fn block_limits_and_provisioning() {
        let lu = lu();
        let bl = inq(&lu, true, VPD_BLOCK_LIMITS).data_in;
        assert_eq!(bl.len(), 64);
        assert_eq!(bl[5], 255);
        assert_eq!(be32(&bl, 8), 65536);
        assert_eq!(be32(&bl, 24), MAX_UNMAP_DESCRIPTORS);
        assert_eq!(be64(&bl, 36), 65536);
        let lbp = inq(&lu, true, VPD_PROVISIONING).data_in;
        assert_eq!(lbp[5], 0xE4);
        let bdc = inq(&lu, true, VPD_CHARACTERISTICS).data_in;
        assert_eq!(be16(&bdc, 4), 1);
    }

    /// A thin device with an allocation unit, as a pool volume is.
    struct Granular {
        unit: u64,
    }

    impl block::Wrapper for Granular {
        fn granularity(&self, _: &dyn block::BlockDevice) -> u64 {
            self.unit
        }
        fn describe(&self, _: &dyn block::BlockDevice) -> String {
            "granular".into()
        }
    }

    fn granular_lu(unit: u64, block_size: u32) -> std::sync::Arc<LogicalUnit> {
        let dev = block::Wrapped::over(
            std::sync::Arc::new(block::MemDevice::new(4 << 20)),
            Granular { unit },
        );
        let config = crate::config::LuConfig {
            naa: crate::config::naa_from_seed("granular"),
            block_size,
            ..crate::config::LuConfig::default()
        };
        LogicalUnit::new(std::sync::Arc::new(dev), config).unwrap()
    }

    fn rc16(lu: &LogicalUnit) -> Vec<u8> {
        let a = nexus("a");
        ready(lu, &a);
        let mut cdb = [0u8; 16];
        cdb[0] = 0x9E;
        cdb[1] = 0x10;
        cdb[13] = 32;
        run(lu, &a, &cdb, &[]).data_in
    }

    #[test]
    fn configured_physical_blocks_are_reported() {
        let config = crate::LuConfig {
            physical_block_exponent: 3,
            ..crate::LuConfig::default()
        };
        let lu = lu_with(1 << 20, config);
        assert_eq!(rc16(&lu)[13] & 0x0F, 3);
    }

    #[test]
    fn granularity_reported_in_block_limits() {
        // 64 KiB units on 512-byte blocks: unmap and transfer granularity
        // of one unit; one logical block per physical block.
        let lu = granular_lu(64 << 10, 512);
        assert_eq!(rc16(&lu)[13] & 0x0F, 0);
        let bl = inq(&lu, true, VPD_BLOCK_LIMITS).data_in;
        assert_eq!(be16(&bl, 6), 128);
        assert_eq!(be32(&bl, 28), 128);
        let lu = granular_lu(64 << 10, 4096);
        assert_eq!(be32(&inq(&lu, true, VPD_BLOCK_LIMITS).data_in, 28), 16);
        // A granularity below the block size is no granularity.
        let bl = inq(&granular_lu(256, 512), true, VPD_BLOCK_LIMITS).data_in;
        assert_eq!(be32(&bl, 28), 8);
        // Transfer granularity stops at the optimal transfer length.
        let bl = inq(&granular_lu(64 << 20, 512), true, VPD_BLOCK_LIMITS).data_in;
        assert_eq!(u64::from(be16(&bl, 6)), OPTIMAL_TRANSFER_BYTES / 512);
    }

    #[test]
    fn no_granularity_reports_a_page() {
        let lu = lu();
        assert_eq!(rc16(&lu)[13] & 0x0F, 0);
        let bl = inq(&lu, true, VPD_BLOCK_LIMITS).data_in;
        assert_eq!(be16(&bl, 6), 8);
        assert_eq!(be32(&bl, 28), 8);
    }

    #[test]
    fn read_capacity() {
        let lu = lu();
        let a = nexus("a");
        ready(&lu, &a);
        let r = run(&lu, &a, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
        assert_eq!(be32(&r.data_in, 0), 2047);
        assert_eq!(be32(&r.data_in, 4), 512);
        assert_eq!(
            sense_of(&run(&lu, &a, &[0x25, 0, 0, 0, 0, 1, 0, 0, 0, 0], &[])).1,
            0x24
        );
        let mut rc16 = [0u8; 16];
        rc16[0] = 0x9E;
        rc16[1] = 0x10;
        rc16[13] = 32;
        let r = run(&lu, &a, &rc16, &[]);
        assert_eq!(r.status, status::GOOD);
        assert_eq!(be64(&r.data_in, 0), 2047);
        assert_eq!(r.data_in[14], 0xC0);
        rc16[13] = 10;
        assert_eq!(run(&lu, &a, &rc16, &[]).data_in.len(), 10);
    }
}
