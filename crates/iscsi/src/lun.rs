//! The 8-byte LUN field (SAM-5 4.7) as a plain LUN number.

/// Decode a LUN field. Peripheral (00b) and flat (01b) single-level
/// addressing give the LUN number (0..16383); any other form is returned as
/// the raw 64-bit value so it never aliases a real LUN.
pub fn decode(lun: [u8; 8]) -> u64 {
    let method = lun[0] >> 6;
    let single_level = lun[2..].iter().all(|&b| b == 0);
    if single_level && (method == 0 || method == 1) {
        (u64::from(lun[0] & 0x3f) << 8) | u64::from(lun[1])
    } else {
        u64::from_be_bytes(lun)
    }
}

/// Encode a LUN number: peripheral addressing below 256, flat above.
pub fn encode(lun: u64) -> [u8; 8] {
    let mut out = [0u8; 8];
    if lun < 256 {
        out[1] = lun as u8;
    } else if lun < 16384 {
        out[0] = 0x40 | (lun >> 8) as u8;
        out[1] = (lun & 0xff) as u8;
    } else {
        out = lun.to_be_bytes();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peripheral_and_flat() {
        assert_eq!(decode([0, 0, 0, 0, 0, 0, 0, 0]), 0);
        assert_eq!(decode([0, 5, 0, 0, 0, 0, 0, 0]), 5);
        assert_eq!(decode([0x40, 0x01, 0, 0, 0, 0, 0, 0]), 1);
        assert_eq!(decode([0x7f, 0xff, 0, 0, 0, 0, 0, 0]), 16383);
    }

    #[test]
    fn other_forms_stay_distinct() {
        let wlun = [0xc1, 0x01, 0, 0, 0, 0, 0, 0];
        assert_eq!(decode(wlun), 0xc101_0000_0000_0000);
        assert!(decode([0, 1, 0, 1, 0, 0, 0, 0]) > 16383);
    }

    #[test]
    fn round_trip() {
        for lun in [0u64, 1, 255, 256, 1000, 16383] {
            assert_eq!(decode(encode(lun)), lun);
        }
    }
}
