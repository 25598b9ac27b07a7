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

/// Derived designators come from the one derivation every transport of a
/// device uses.
pub use export::naa_from_seed;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_contract() {
        let c = LuConfig::default();
        assert_eq!(c.vendor, "OPENARRY");
        assert_eq!(c.product, "VIRTUAL-DISK");
        assert_eq!(c.block_size, 512);
    }
}
