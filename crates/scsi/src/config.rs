//! Per-LU identity and policy, and the NAA designator derivation.

use std::path::PathBuf;

/// What a logical unit reports about itself and how it behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LuConfig {
    /// T10 vendor identification, up to 8 ASCII characters.
    pub vendor: String,
    /// Product identification, up to 16 ASCII characters.
    pub product: String,
    /// Product revision level, up to 4 ASCII characters.
    pub revision: String,
    /// Unit serial number (VPD page 0x80). Empty: derived from the NAA.
    pub serial: String,
    /// NAA IEEE Registered Extended designator (VPD page 0x83). All zero:
    /// derived from the serial number (or made unique when that is empty).
    pub naa: [u8; 16],
    /// Logical block size in bytes: 512 or 4096.
    pub block_size: u32,
    /// Logical blocks per physical block as a power of two (READ CAPACITY
    /// 16's LBPPBE): 3 for 512-byte blocks on 4 KiB sectors ("512e").
    pub physical_block_exponent: u8,
    pub read_only: bool,
    /// Initial WCE bit of the caching mode page. While WCE is zero every
    /// write reaches the device as a FUA write.
    pub write_cache: bool,
    /// Where persistent reservations with APTPL are kept.
    pub pr_state_file: Option<PathBuf>,
}

impl Default for LuConfig {
    fn default() -> LuConfig {
        LuConfig {
            vendor: "OPENARRY".into(),
            product: "VIRTUAL-DISK".into(),
            revision: "0001".into(),
            serial: String::new(),
            naa: [0; 16],
            block_size: 512,
            physical_block_exponent: 0,
            read_only: false,
            write_cache: true,
            pr_state_file: None,
        }
    }
}

/// The IEEE company identifier field of derived designators. It has the
/// local bit pattern of a CID (SPC-4 7.8.6.6: X bit set), so it cannot
/// collide with an OUI assigned to a manufacturer.
const DERIVED_COMPANY_ID: u32 = 0x0A_4F_41;

/// 64-bit FNV-1a, stable across Rust versions (unlike `DefaultHasher`), so
/// designators derived from configuration never change between releases.
fn fnv1a(seed: &[u8], basis: u64) -> u64 {
    seed.iter().fold(basis, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// Derives a stable NAA type 6 (IEEE Registered Extended) designator from a
/// seed string such as `"<target name>/<device name>"`.
pub fn naa_from_seed(seed: &str) -> [u8; 16] {
    let vendor_id = fnv1a(seed.as_bytes(), 0xCBF2_9CE4_8422_2325) & 0xF_FFFF_FFFF;
    let extension = fnv1a(seed.as_bytes(), 0x6C62_272E_07BB_0142);
    let mut naa = [0u8; 16];
    naa[0] = 0x60 | ((DERIVED_COMPANY_ID >> 20) & 0x0F) as u8;
    naa[1] = (DERIVED_COMPANY_ID >> 12) as u8;
    naa[2] = (DERIVED_COMPANY_ID >> 4) as u8;
    naa[3] = (((DERIVED_COMPANY_ID & 0x0F) as u8) << 4) | ((vendor_id >> 32) as u8 & 0x0F);
    naa[4..8].copy_from_slice(&(vendor_id as u32).to_be_bytes());
    naa[8..16].copy_from_slice(&extension.to_be_bytes());
    naa
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn naa_is_type_6_stable_and_seed_dependent() {
        let a = naa_from_seed("iqn.2026-11.org.openarray:t/lun0");
        assert_eq!(a[0] >> 4, 6);
        assert_eq!(a, naa_from_seed("iqn.2026-11.org.openarray:t/lun0"));
        assert_ne!(a, naa_from_seed("iqn.2026-11.org.openarray:t/lun1"));
        // Company id field round-trips.
        let cid = (u32::from(a[0] & 0x0F) << 20)
            | (u32::from(a[1]) << 12)
            | (u32::from(a[2]) << 4)
            | u32::from(a[3] >> 4);
        assert_eq!(cid, DERIVED_COMPANY_ID);
    }

    #[test]
    fn defaults_match_the_contract() {
        let c = LuConfig::default();
        assert_eq!(c.vendor, "OPENARRY");
        assert_eq!(c.product, "VIRTUAL-DISK");
        assert_eq!(c.block_size, 512);
    }
}
