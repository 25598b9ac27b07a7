//! Mode parameters: MODE SENSE(6/10) and MODE SELECT(6/10).
//!
//! Pages: caching (0x08, WCE changeable), control (0x0A, D_SENSE and SWP
//! changeable) and informational exceptions control (0x1C, nothing
//! changeable: there is no failure prediction to report); for a volume of
//! a pool, the Logical Block Provisioning subpage (0x1C/0x02, nothing
//! changeable: the configuration sets the threshold, thresholds.rs).
//! Parameters are not saveable; current values start at the defaults and
//! return to them on logical unit reset.

use crate::cdb::{be16, be32, be64, put16, put32, put64, u8_at};
use crate::sense::{asc, Sense};
use crate::thresholds::{PAGE_PROVISIONING, SUBPAGE_PROVISIONING};

pub const PAGE_CACHING: u8 = 0x08;
pub const PAGE_CONTROL: u8 = 0x0A;
pub const PAGE_INFORMATIONAL_EXCEPTIONS: u8 = 0x1C;
pub const ALL_PAGES: u8 = 0x3F;
const PAGES: [u8; 3] = [PAGE_CACHING, PAGE_CONTROL, PAGE_INFORMATIONAL_EXCEPTIONS];

/// The changeable mode parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModeParams {
    /// Write cache enable (caching page).
    pub wce: bool,
    /// Descriptor format sense data (control page).
    pub d_sense: bool,
    /// Software write protect (control page).
    pub swp: bool,
}

impl ModeParams {
    pub fn defaults(write_cache: bool) -> ModeParams {
        ModeParams {
            wce: write_cache,
            d_sense: false,
            swp: false,
        }
    }
}

/// Page control field of MODE SENSE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageControl {
    Current,
    Changeable,
    Default,
}

/// What MODE SENSE needs to know about the LU besides the parameters.
pub struct Medium {
    pub blocks: u64,
    pub block_size: u32,
    /// Hardware or configured write protection (WP is also set by SWP).
    pub read_only: bool,
    /// The Logical Block Provisioning subpage (thresholds.rs), current and
    /// changeable, for an LU that reports thresholds.
    pub provisioning: Option<(Vec<u8>, Vec<u8>)>,
}

/// SUBPAGE CODE of MODE SENSE asking for every subpage of a page.
const ALL_SUBPAGES: u8 = 0xFF;

/// One page in the requested form. Page byte 0 carries PS = 0: nothing is
/// saveable.
fn page(code: u8, p: &ModeParams, pc: PageControl) -> Vec<u8> {
    let changeable = pc == PageControl::Changeable;
    match code {
        PAGE_CACHING => {
            let mut pg = vec![0u8; 20];
            pg[0] = PAGE_CACHING;
            pg[1] = 18;
            if changeable || p.wce {
                pg[2] |= 0x04;
            }
            pg
        }
        PAGE_CONTROL => {
            let mut pg = vec![0u8; 12];
            pg[0] = PAGE_CONTROL;
            pg[1] = 10;
            if changeable {
                pg[2] = 0x04;
                pg[4] = 0x08;
                return pg;
            }
            // GLTSD: no log parameters are saved.
            pg[2] = 0x02;
            if p.d_sense {
                pg[2] |= 0x04;
            }
            // QUEUE ALGORITHM MODIFIER 1: unrestricted reordering.
            pg[3] = 0x10;
            if p.swp {
                pg[4] |= 0x08;
            }
            // BUSY TIMEOUT PERIOD: unlimited.
            put16(&mut pg, 8, 0xFFFF);
            pg
        }
        _ => {
            let mut pg = vec![0u8; 12];
            pg[0] = PAGE_INFORMATIONAL_EXCEPTIONS;
            pg[1] = 10;
            if !changeable {
                // DEXCPT: informational exception operations disabled.
                pg[2] = 0x08;
            }
            pg
        }
    }
}

/// Builds MODE SENSE parameter data. `ten` selects the 10-byte header.
pub fn mode_sense(
    cdb: &[u8],
    ten: bool,
    params: &ModeParams,
    defaults: &ModeParams,
    medium: &Medium,
) -> Result<Vec<u8>, Sense> {
    let dbd = u8_at(cdb, 1) & 0x08 != 0;
    let llbaa = ten && u8_at(cdb, 1) & 0x10 != 0;
    let pc = match u8_at(cdb, 2) >> 6 {
        0 => PageControl::Current,
        1 => PageControl::Changeable,
        2 => PageControl::Default,
        _ => return Err(Sense::illegal(asc::SAVING_PARAMETERS_NOT_SUPPORTED)),
    };
    let code = u8_at(cdb, 2) & 0x3F;
    let subpage = u8_at(cdb, 3);
    let lbp = medium.provisioning.as_ref();
    let lbp_wanted = match (code, subpage) {
        (ALL_PAGES | PAGE_PROVISIONING, ALL_SUBPAGES)
        | (PAGE_PROVISIONING, SUBPAGE_PROVISIONING) => lbp.is_some(),
        _ => false,
    };
    let codes: Vec<u8> = match (code, subpage) {
        (ALL_PAGES, 0x00 | ALL_SUBPAGES) => PAGES.to_vec(),
        (c, 0x00 | ALL_SUBPAGES) if PAGES.contains(&c) => vec![c],
        (c, 0x00 | ALL_SUBPAGES) if c != ALL_PAGES => return Err(Sense::invalid_cdb(2, Some(5))),
        _ if lbp_wanted => Vec::new(),
        _ => return Err(Sense::invalid_cdb(3, Some(7))),
    };
    let shown = match pc {
        PageControl::Default => defaults,
        _ => params,
    };

    let header_len = if ten { 8 } else { 4 };
    let mut data = vec![0u8; header_len];
    let wp = medium.read_only || params.swp;
    // WP and DPOFUA (DPO and FUA are supported).
    let device_specific = if wp { 0x90 } else { 0x10 };
    if !dbd {
        if llbaa {
            let mut bd = [0u8; 16];
            put64(&mut bd, 0, medium.blocks);
            put32(&mut bd, 12, medium.block_size);
            data.extend_from_slice(&bd);
        } else {
            let mut bd = [0u8; 8];
            put32(&mut bd, 0, u32::try_from(medium.blocks).unwrap_or(u32::MAX));
            put32(&mut bd, 4, medium.block_size & 0x00FF_FFFF);
            data.extend_from_slice(&bd);
        }
    }
    let bd_len = data.len() - header_len;
    for c in codes {
        data.extend_from_slice(&page(c, shown, pc));
    }
    if let Some((current, changeable)) = lbp.filter(|_| lbp_wanted) {
        let pg = if pc == PageControl::Changeable {
            changeable
        } else {
            current
        };
        data.extend_from_slice(pg);
    }
    if ten {
        let len = (data.len() - 2) as u16;
        put16(&mut data, 0, len);
        data[3] = device_specific;
        data[4] = u8::from(llbaa && !dbd);
        put16(&mut data, 6, bd_len as u16);
    } else {
        data[0] = (data.len() - 1).min(255) as u8;
        data[2] = device_specific;
        data[3] = bd_len as u8;
    }
    Ok(data)
}

/// Applies MODE SELECT parameter data `param` to `params`, validating the
/// whole list first. Returns the new parameters.
pub fn mode_select(
    cdb: &[u8],
    ten: bool,
    param: &[u8],
    params: &ModeParams,
    medium: &Medium,
) -> Result<ModeParams, Sense> {
    if u8_at(cdb, 1) & 0x01 != 0 {
        // SP: parameters cannot be saved.
        return Err(Sense::invalid_cdb(1, Some(0)));
    }
    let header_len = if ten { 8 } else { 4 };
    if param.is_empty() {
        return Ok(*params);
    }
    if param.len() < header_len {
        return Err(Sense::param_list_length());
    }
    let (bd_len, long) = if ten {
        (usize::from(be16(param, 6)), u8_at(param, 4) & 0x01 != 0)
    } else {
        (usize::from(u8_at(param, 3)), false)
    };
    let mut pos = header_len;
    if bd_len != 0 {
        let one = if long { 16 } else { 8 };
        if bd_len != one {
            return Err(Sense::invalid_param(if ten { 6 } else { 3 }, None));
        }
        if param.len() < pos + bd_len {
            return Err(Sense::param_list_length());
        }
        let bd = &param[pos..pos + bd_len];
        let (blocks, size, size_at) = if long {
            (be64(bd, 0), be32(bd, 12), 12)
        } else {
            (u64::from(be32(bd, 0)), be32(bd, 4) & 0x00FF_FFFF, 5)
        };
        // Capacity and block size cannot be changed: accept only the
        // current values (zero blocks means "no change").
        let short_max = u64::from(u32::MAX).min(medium.blocks);
        let unchanged = blocks == 0 || blocks == medium.blocks || (!long && blocks == short_max);
        if !unchanged {
            return Err(Sense::invalid_param(pos, None));
        }
        if size != medium.block_size {
            return Err(Sense::invalid_param(pos + size_at, None));
        }
        pos += bd_len;
    }

    let mut new = *params;
    while pos < param.len() {
        let code = param[pos] & 0x3F;
        if param[pos] & 0x40 != 0 {
            pos += same_subpage(param, pos, medium)?;
            continue;
        }
        if !PAGES.contains(&code) {
            return Err(Sense::invalid_param(pos, Some(5)));
        }
        let current = page(code, params, PageControl::Current);
        let changeable = page(code, params, PageControl::Changeable);
        let len = usize::from(u8_at(param, pos + 1)) + 2;
        if len != current.len() {
            return Err(Sense::invalid_param(pos + 1, None));
        }
        let Some(sent) = param.get(pos..pos + len) else {
            return Err(Sense::param_list_length());
        };
        unchanged(sent, &current, Some(&changeable), 2, pos)?;
        match code {
            PAGE_CACHING => new.wce = sent[2] & 0x04 != 0,
            PAGE_CONTROL => {
                new.d_sense = sent[2] & 0x04 != 0;
                new.swp = sent[4] & 0x08 != 0;
            }
            _ => {}
        }
        pos += len;
    }
    Ok(new)
}

/// A subpage sent by MODE SELECT: only the Logical Block Provisioning
/// one exists, and nothing in it is changeable, so it must come back as
/// it is. Returns its length.
fn same_subpage(param: &[u8], pos: usize, medium: &Medium) -> Result<usize, Sense> {
    let code = param[pos] & 0x3F;
    let subpage = u8_at(param, pos + 1);
    let current = match &medium.provisioning {
        Some((current, _)) if code == PAGE_PROVISIONING && subpage == SUBPAGE_PROVISIONING => {
            current
        }
        _ => return Err(Sense::invalid_param(pos, Some(5))),
    };
    let len = usize::from(be16(param, pos + 2)) + 4;
    if len != current.len() {
        return Err(Sense::invalid_param(pos + 2, None));
    }
    let Some(sent) = param.get(pos..pos + len) else {
        return Err(Sense::param_list_length());
    };
    unchanged(sent, current, None, 4, pos)?;
    Ok(len)
}

/// INVALID FIELD IN PARAMETER LIST at the first bit of the page `sent`
/// (at `pos` in the list), from byte `from` on, that differs from
/// `current` where `changeable` (nothing, when `None`) does not allow it.
fn unchanged(
    sent: &[u8],
    current: &[u8],
    changeable: Option<&[u8]>,
    from: usize,
    pos: usize,
) -> Result<(), Sense> {
    for i in from..sent.len() {
        let diff = (sent[i] ^ current[i]) & !changeable.map_or(0, |c| c[i]);
        if diff != 0 {
            let bit = 7 - diff.leading_zeros() as u8;
            return Err(Sense::invalid_param(pos + i, Some(bit)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEDIUM: Medium = Medium {
        blocks: 2048,
        block_size: 512,
        read_only: false,
        provisioning: None,
    };

    fn sense6(pc: u8, page: u8, dbd: bool) -> Vec<u8> {
        let p = ModeParams::defaults(true);
        let cdb = [
            0x1A,
            if dbd { 0x08 } else { 0 },
            (pc << 6) | page,
            0,
            255,
            0,
        ];
        mode_sense(&cdb, false, &p, &p, &MEDIUM).unwrap()
    }

    #[test]
    fn all_pages_with_block_descriptor() {
        let d = sense6(0, ALL_PAGES, false);
        assert_eq!(usize::from(d[0]) + 1, d.len());
        assert_eq!(d[2], 0x10, "DPOFUA set, not write protected");
        assert_eq!(d[3], 8);
        assert_eq!(&d[4..8], &2048u32.to_be_bytes());
        assert_eq!(&d[9..12], &[0, 2, 0]);
        let pages: Vec<u8> = {
            let mut v = Vec::new();
            let mut pos = 12;
            while pos < d.len() {
                v.push(d[pos]);
                pos += usize::from(d[pos + 1]) + 2;
            }
            v
        };
        assert_eq!(
            pages,
            vec![PAGE_CACHING, PAGE_CONTROL, PAGE_INFORMATIONAL_EXCEPTIONS]
        );
    }

    #[test]
    fn changeable_values_and_unknown_pages() {
        let d = sense6(1, PAGE_CONTROL, true);
        assert_eq!(d[3], 0);
        assert_eq!(&d[4..8], &[PAGE_CONTROL, 10, 0x04, 0]);
        assert_eq!(d[8], 0x08);
        let p = ModeParams::defaults(true);
        let cdb = [0x1A, 0, 0x01, 0, 255, 0];
        assert!(mode_sense(&cdb, false, &p, &p, &MEDIUM).is_err());
        let cdb = [0x1A, 0, 0xC8, 0, 255, 0];
        let e = mode_sense(&cdb, false, &p, &p, &MEDIUM).unwrap_err();
        assert_eq!((e.asc, e.ascq), asc::SAVING_PARAMETERS_NOT_SUPPORTED);
    }

    #[test]
    fn mode_sense_10_long_lba_descriptor() {
        let p = ModeParams::defaults(false);
        let cdb = [0x5A, 0x10, PAGE_CACHING, 0, 0, 0, 0, 1, 0, 0];
        let d = mode_sense(&cdb, true, &p, &p, &MEDIUM).unwrap();
        assert_eq!(usize::from(be16(&d, 0)) + 2, d.len());
        assert_eq!(d[4], 1);
        assert_eq!(be16(&d, 6), 16);
        assert_eq!(be64(&d, 8), 2048);
        assert_eq!(be32(&d, 20), 512);
        assert_eq!(d[24], PAGE_CACHING);
        assert_eq!(d[26] & 0x04, 0, "WCE clear");
    }

    #[test]
    fn select_changes_only_changeable_bits() {
        let p = ModeParams::defaults(true);
        let mut ctl = page(PAGE_CONTROL, &p, PageControl::Current);
        ctl[4] |= 0x08;
        ctl[2] |= 0x04;
        let mut param = vec![0u8; 4];
        param.extend_from_slice(&ctl);
        let cdb = [0x15, 0x10, 0, 0, param.len() as u8, 0];
        let new = mode_select(&cdb, false, &param, &p, &MEDIUM).unwrap();
        assert!(new.swp && new.d_sense && new.wce);

        // TST is not changeable.
        param[4 + 2] |= 0x20;
        let e = mode_select(&cdb, false, &param, &p, &MEDIUM).unwrap_err();
        assert_eq!((e.asc, e.ascq), asc::INVALID_FIELD_IN_PARAMETER_LIST);
        assert_eq!(e.specific, Some([0x80 | 0x08 | 5, 0, 6]));
    }

    #[test]
    fn select_rejects_save_truncation_and_wrong_block_size() {
        let p = ModeParams::defaults(true);
        let cdb = [0x15, 0x11, 0, 0, 4, 0];
        assert!(mode_select(&cdb, false, &[0; 4], &p, &MEDIUM).is_err());
        let cdb = [0x15, 0x10, 0, 0, 8, 0];
        let e = mode_select(
            &cdb,
            false,
            &[0, 0, 0, 0, PAGE_CACHING, 18, 0, 0],
            &p,
            &MEDIUM,
        )
        .unwrap_err();
        assert_eq!((e.asc, e.ascq), asc::PARAMETER_LIST_LENGTH_ERROR);
        let mut param = vec![0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0x10, 0];
        let e = mode_select(&cdb, false, &param, &p, &MEDIUM).unwrap_err();
        assert_eq!((e.asc, e.ascq), asc::INVALID_FIELD_IN_PARAMETER_LIST);
        param[10] = 0x02;
        assert_eq!(mode_select(&cdb, false, &param, &p, &MEDIUM).unwrap(), p);
    }
}
