//! The identity of a device as hosts see it, derived in one place for
//! every transport: SCSI reports the NAA designator (VPD page 0x83), NVMe
//! the namespace's NGUID, EUI-64 and UUID, all from the same 16 bytes, so
//! a host that reaches one device both ways can tell it is the same.

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

/// The NVMe namespace identifiers of a device whose SCSI designator is
/// `naa`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespaceIds {
    /// The designator itself: 128 bits, as the NGUID field holds.
    pub nguid: [u8; 16],
    /// The company identifier then 40 bits of the designator's extension.
    pub eui64: [u8; 8],
    /// The designator as an RFC 9562 version 8 (custom) UUID.
    pub uuid: [u8; 16],
}

impl NamespaceIds {
    pub fn from_naa(naa: [u8; 16]) -> NamespaceIds {
        let mut eui64 = [0u8; 8];
        eui64[..3].copy_from_slice(&DERIVED_COMPANY_ID.to_be_bytes()[1..]);
        eui64[3..].copy_from_slice(&naa[11..16]);
        let mut uuid = naa;
        uuid[6] = (uuid[6] & 0x0F) | 0x80;
        uuid[8] = (uuid[8] & 0x3F) | 0x80;
        NamespaceIds {
            nguid: naa,
            eui64,
            uuid,
        }
    }
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
    fn derived_designators_do_not_change_between_releases() {
        // Hosts keep these (multipath, udev links): they must never move.
        let naa = naa_from_seed("mem0");
        let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(hex(&naa), "60a4f412e313bcca06eb9f540950cafd");
        let ids = NamespaceIds::from_naa(naa);
        assert_eq!(ids.nguid, naa);
        assert_eq!(hex(&ids.eui64), "0a4f41540950cafd");
        assert_eq!(hex(&ids.uuid), "60a4f412e3138cca86eb9f540950cafd");
        assert_eq!(ids.uuid[6] >> 4, 8, "version 8");
        assert_eq!(ids.uuid[8] >> 6, 0b10, "RFC variant");
    }
}
