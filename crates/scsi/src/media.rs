//! LU state commands: REQUEST SENSE, START STOP UNIT, PREVENT ALLOW MEDIUM
//! REMOVAL, READ DEFECT DATA, MODE SENSE and MODE SELECT.

use scsi_api::ScsiResponse;

use crate::cdb::{be16, be32, truncate, u8_at};
use crate::commands::op;
use crate::lu::{Ctx, LogicalUnit, Outcome};
use crate::mode::{self, Medium, PageControl};
use crate::sense::{asc, io_sense, Sense};

impl LogicalUnit {
    fn medium(&self, ctx: &Ctx<'_>) -> Medium {
        Medium {
            blocks: self.blocks(),
            block_size: self.block_size,
            read_only: self.read_only() || ctx.read_only,
            provisioning: self
                .provisioning_page(PageControl::Current)
                .zip(self.provisioning_page(PageControl::Changeable)),
        }
    }

    /// REQUEST SENSE: the sanitize progress, else a pending unit attention
    /// (which this clears), else NO SENSE.
    pub(crate) fn request_sense(&self, ctx: &Ctx<'_>) -> Outcome {
        let cdb = ctx.cdb();
        let descriptor = u8_at(cdb, 1) & 0x01 != 0;
        let alloc = usize::from(u8_at(cdb, 4));
        let sense = {
            let mut st = self.state.lock();
            if let Some(s) = st.sanitize.progress_sense() {
                s
            } else if let Some(code) = st.nexus(ctx.nexus).take_unit_attention() {
                Sense::unit_attention(code)
            } else if let Some(state) = self.access.restriction(ctx.nexus.portal_group) {
                // Why media access through this port fails now.
                crate::alua::not_accessible(state)
            } else {
                Sense::new(crate::sense::key::NO_SENSE, asc::NO_ADDITIONAL)
            }
        };
        Ok(ScsiResponse::with_data(truncate(
            sense.encode(descriptor),
            alloc,
        )))
    }

    /// START STOP UNIT. The medium is not removable and the LU is shared by
    /// every initiator, so stopping is reduced to what must not be lost:
    /// with START = 0 and NO_FLUSH = 0 the cache is written out. Power
    /// conditions are accepted and have no effect.
    pub(crate) fn start_stop_unit(&self, ctx: &Ctx<'_>) -> Outcome {
        let b4 = u8_at(ctx.cdb(), 4);
        let power_condition = b4 >> 4;
        let no_flush = b4 & 0x04 != 0;
        let start = b4 & 0x01 != 0;
        if power_condition == 0 && !start && !no_flush {
            self.device.flush().map_err(|e| io_sense(&e, true))?;
        }
        Ok(ScsiResponse::good())
    }

    pub(crate) fn prevent_allow(&self, ctx: &Ctx<'_>) -> Outcome {
        let prevent = u8_at(ctx.cdb(), 4) & 0x03;
        if prevent > 1 {
            return Err(Sense::invalid_cdb(4, Some(1)).into());
        }
        self.state.lock().nexus(ctx.nexus).prevent = prevent == 1;
        Ok(ScsiResponse::good())
    }

    /// READ DEFECT DATA: a virtual medium has no defects; the (empty) lists
    /// are returned in the requested format.
    pub(crate) fn read_defect_data(&self, ctx: &Ctx<'_>) -> Outcome {
        let cdb = ctx.cdb();
        if u8_at(cdb, 0) == op::READ_DEFECT_DATA_10 {
            let flags = u8_at(cdb, 2) & 0x1F;
            let alloc = usize::from(be16(cdb, 7));
            Ok(ScsiResponse::with_data(truncate(
                vec![0, flags, 0, 0],
                alloc,
            )))
        } else {
            let flags = u8_at(cdb, 1) & 0x1F;
            let alloc = be32(cdb, 6) as usize;
            Ok(ScsiResponse::with_data(truncate(
                vec![0, flags, 0, 0, 0, 0, 0, 0],
                alloc,
            )))
        }
    }

    pub(crate) fn mode_sense(&self, ctx: &Ctx<'_>) -> Outcome {
        let cdb = ctx.cdb();
        let ten = u8_at(cdb, 0) == op::MODE_SENSE_10;
        let alloc = if ten {
            usize::from(be16(cdb, 7))
        } else {
            usize::from(u8_at(cdb, 4))
        };
        let data = mode::mode_sense(
            cdb,
            ten,
            &self.mode_params(),
            &self.default_mode,
            &self.medium(ctx),
        )?;
        Ok(ScsiResponse::with_data(truncate(data, alloc)))
    }

    pub(crate) fn mode_select(&self, ctx: &Ctx<'_>) -> Outcome {
        let cdb = ctx.cdb();
        let ten = u8_at(cdb, 0) == op::MODE_SELECT_10;
        let len = if ten {
            usize::from(be16(cdb, 7))
        } else {
            usize::from(u8_at(cdb, 4))
        };
        let param = ctx.param(len)?;
        let mut current = self.mode.lock();
        let new = mode::mode_select(cdb, ten, param, &current, &self.medium(ctx))?;
        if new == *current {
            return Ok(ScsiResponse::good());
        }
        if current.wce && !new.wce {
            // Turning the write cache off: what it holds must be stable first.
            self.device.flush().map_err(|e| io_sense(&e, true))?;
        }
        *current = new;
        self.backing().set_write_cache(new.wce);
        drop(current);
        self.state
            .lock()
            .notify_all(asc::MODE_PARAMETERS_CHANGED, Some(ctx.nexus));
        Ok(ScsiResponse::good())
    }
}

/// MODE SENSE(10) header field, for tests elsewhere.
#[cfg(test)]
pub fn mode_data_length(d: &[u8], ten: bool) -> usize {
    if ten {
        usize::from(be16(d, 0)) + 2
    } else {
        usize::from(u8_at(d, 0)) + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lu::test_support::*;
    use crate::sense::key;
    use scsi_api::status;

    #[test]
    fn request_sense_reports_and_clears_unit_attention() {
        let lu = lu();
        let a = nexus("a");
        let r = run(&lu, &a, &[0x03, 0, 0, 0, 252, 0], &[]);
        assert_eq!(r.status, status::GOOD);
        assert_eq!(
            (r.data_in[2], r.data_in[12], r.data_in[13]),
            (key::UNIT_ATTENTION, 0x29, 0)
        );
        let r = run(&lu, &a, &[0x03, 0x01, 0, 0, 252, 0], &[]);
        assert_eq!(r.data_in[0], 0x72);
        assert_eq!((r.data_in[1], r.data_in[2]), (key::NO_SENSE, 0));
        assert_eq!(run(&lu, &a, &[0; 6], &[]).status, status::GOOD);
    }

    #[test]
    fn mode_select_changes_wce_and_tells_other_nexuses() {
        let lu = lu();
        let (a, b) = (nexus("a"), nexus("b"));
        ready(&lu, &a);
        ready(&lu, &b);
        let sense = run(&lu, &a, &[0x1A, 0x08, 0x08, 0, 255, 0], &[]).data_in;
        assert_eq!(mode_data_length(&sense, false), sense.len());
        let mut param = vec![0u8; 4];
        param.extend_from_slice(&sense[4..]);
        param[4 + 2] &= !0x04;
        let r = run(&lu, &a, &[0x15, 0x10, 0, 0, param.len() as u8, 0], &param);
        assert_eq!(r.status, status::GOOD);
        assert!(!lu.mode_params().wce);
        // Every transport over the device now writes through.
        assert!(lu.backing().force_unit_access(false));
        assert_eq!(run(&lu, &a, &[0; 6], &[]).status, status::GOOD);
        assert_eq!(
            sense_of(&run(&lu, &b, &[0; 6], &[])),
            (key::UNIT_ATTENTION, 0x2A, 0x01)
        );
        // LU reset brings the default back.
        lu.reset();
        assert!(lu.mode_params().wce);
        assert!(!lu.backing().force_unit_access(false));
    }

    #[test]
    fn software_write_protect_blocks_writes() {
        let lu = lu();
        let a = nexus("a");
        ready(&lu, &a);
        lu.mode.lock().swp = true;
        let r = run(&lu, &a, &[0x2A, 0, 0, 0, 0, 0, 0, 0, 1, 0], &[0; 512]);
        assert_eq!(sense_of(&r), (key::DATA_PROTECT, 0x27, 0x02));
        assert_eq!(
            run(&lu, &a, &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], &[]).status,
            status::GOOD
        );
        let d = run(&lu, &a, &[0x1A, 0, 0x3F, 0, 255, 0], &[]).data_in;
        assert_eq!(d[2] & 0x80, 0x80);
    }

    #[test]
    fn small_commands() {
        let lu = lu();
        let a = nexus("a");
        ready(&lu, &a);
        assert_eq!(
            run(&lu, &a, &[0x1B, 0, 0, 0, 0x00, 0], &[]).status,
            status::GOOD
        );
        assert_eq!(
            run(&lu, &a, &[0x1B, 0x01, 0, 0, 0x31, 0], &[]).status,
            status::GOOD
        );
        assert_eq!(
            run(&lu, &a, &[0x1E, 0, 0, 0, 1, 0], &[]).status,
            status::GOOD
        );
        assert_eq!(sense_of(&run(&lu, &a, &[0x1E, 0, 0, 0, 2, 0], &[])).1, 0x24);
        let r = run(&lu, &a, &[0x37, 0, 0x18, 0, 0, 0, 0, 0, 32, 0], &[]);
        assert_eq!(r.data_in, vec![0, 0x18, 0, 0]);
        let r = run(&lu, &a, &[0xB7, 0x0D, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0], &[]);
        assert_eq!(r.data_in, vec![0, 0x0D, 0, 0, 0, 0, 0, 0]);
    }
}
