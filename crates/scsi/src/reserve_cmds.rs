//! RESERVE/RELEASE(6/10) and PERSISTENT RESERVE IN/OUT: the LU side of
//! [`crate::reservations`] (locking, unit attentions, APTPL persistence).

use scsi_api::{status, ScsiResponse};

use crate::cdb::{be16, be32, truncate, u8_at};
use crate::lu::{Ctx, LogicalUnit, Outcome};
use crate::pr_file;
use crate::sense::{Failure, Sense};

impl LogicalUnit {
    pub(crate) fn reserve(&self, ctx: &Ctx<'_>) -> Outcome {
        let mut st = self.state.lock();
        // A persistent reservation excludes the older kind (SPC-4 5.13.3).
        if st.pr.reservation.is_some() {
            return Err(Failure::Status(status::RESERVATION_CONFLICT));
        }
        match &st.spc2 {
            Some(holder) if holder != ctx.nexus => {
                Err(Failure::Status(status::RESERVATION_CONFLICT))
            }
            _ => {
                st.spc2 = Some(ctx.nexus.clone());
                Ok(ScsiResponse::good())
            }
        }
    }

    /// RELEASE by anyone but the holder is a no-op that succeeds.
    pub(crate) fn release(&self, ctx: &Ctx<'_>) -> Outcome {
        let mut st = self.state.lock();
        if st.spc2.as_ref() == Some(ctx.nexus) {
            st.spc2 = None;
        }
        Ok(ScsiResponse::good())
    }

    pub(crate) fn persistent_reserve_in(&self, ctx: &Ctx<'_>) -> Outcome {
        let cdb = ctx.cdb();
        let alloc = usize::from(be16(cdb, 7));
        let data = self
            .state
            .lock()
            .pr
            .prin(u8_at(cdb, 1) & 0x1F, self.config().pr_state_file.is_some())?;
        Ok(ScsiResponse::with_data(truncate(data, alloc)))
    }

    pub(crate) fn persistent_reserve_out(&self, ctx: &Ctx<'_>) -> Outcome {
        let cdb = ctx.cdb();
        let param = ctx.param(be32(cdb, 5) as usize)?;
        let file = self.config().pr_state_file.as_deref();
        let mut st = self.state.lock();
        let before = st.pr.clone();
        let notices = st.pr.prout(ctx.nexus, cdb, param, file.is_some())?;
        if let Some(path) = file {
            if notices.changed && (before.aptpl || st.pr.aptpl) {
                if let Err(e) = pr_file::store(path, &st.pr) {
                    tracing::error!("storing persistent reservations in {}: {e}", path.display());
                    st.pr = before;
                    return Err(Sense::internal_failure().into());
                }
            }
        }
        for (port, code) in notices.to {
            st.notify_port(&port, code);
        }
        Ok(ScsiResponse::good())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::LuConfig;
    use crate::lu::test_support::*;
    use scsi_api::{status, Nexus};

    fn prout(
        lu: &crate::LogicalUnit,
        n: &Nexus,
        action: u8,
        kind: u8,
        key: u64,
        sark: u64,
        aptpl: bool,
    ) -> u8 {
        let mut p = vec![0u8; 24];
        p[0..8].copy_from_slice(&key.to_be_bytes());
        p[8..16].copy_from_slice(&sark.to_be_bytes());
        p[20] = u8::from(aptpl);
        run(lu, n, &[0x5F, action, kind, 0, 0, 0, 0, 0, 24, 0], &p).status
    }

    #[test]
    fn spc2_reservation_blocks_others_until_released_or_lost() {
        let lu = lu();
        let (a, b) = (nexus("a"), nexus("b"));
        ready(&lu, &a);
        ready(&lu, &b);
        assert_eq!(
            run(&lu, &a, &[0x16, 0, 0, 0, 0, 0], &[]).status,
            status::GOOD
        );
        assert_eq!(
            run(&lu, &a, &[0x16, 0, 0, 0, 0, 0], &[]).status,
            status::GOOD
        );
        assert_eq!(
            run(&lu, &b, &[0x16, 0, 0, 0, 0, 0], &[]).status,
            status::RESERVATION_CONFLICT
        );
        // Release by another is a no-op; MODE SENSE and TUR conflict;
        // INQUIRY does not.
        assert_eq!(
            run(&lu, &b, &[0x17, 0, 0, 0, 0, 0], &[]).status,
            status::GOOD
        );
        assert_eq!(
            run(&lu, &b, &[0x1A, 0, 0x3F, 0, 255, 0], &[]).status,
            status::RESERVATION_CONFLICT
        );
        assert_eq!(
            run(&lu, &b, &[0; 6], &[]).status,
            status::RESERVATION_CONFLICT
        );
        assert_eq!(
            run(&lu, &b, &[0x12, 0, 0, 0, 36, 0], &[]).status,
            status::GOOD
        );
        assert_eq!(
            run(&lu, &a, &[0x1A, 0, 0x3F, 0, 255, 0], &[]).status,
            status::GOOD
        );
        lu.nexus_lost(&a);
        assert_eq!(
            run(&lu, &b, &[0x16, 0, 0, 0, 0, 0], &[]).status,
            status::GOOD
        );
        lu.reset();
        ready(&lu, &a);
        assert_eq!(
            run(&lu, &a, &[0x16, 0, 0, 0, 0, 0], &[]).status,
            status::GOOD
        );
    }

    #[test]
    fn persistent_reservation_blocks_io_and_notifies_preempted() {
        let lu = lu();
        let (a, b) = (nexus("a"), nexus("b"));
        ready(&lu, &a);
        ready(&lu, &b);
        assert_eq!(prout(&lu, &a, 6, 0, 0, 1, false), status::GOOD);
        assert_eq!(prout(&lu, &b, 6, 0, 0, 2, false), status::GOOD);
        assert_eq!(prout(&lu, &a, 1, 3, 1, 0, false), status::GOOD);
        let read = [0x28, 0, 0, 0, 0, 1, 0, 0, 1, 0];
        assert_eq!(
            run(&lu, &b, &read, &[]).status,
            status::RESERVATION_CONFLICT
        );
        assert_eq!(run(&lu, &a, &read, &[]).status, status::GOOD);
        // Preempt a's registration: a gets REGISTRATIONS PREEMPTED.
        assert_eq!(prout(&lu, &b, 4, 3, 2, 1, false), status::GOOD);
        assert_eq!(sense_of(&run(&lu, &a, &[0; 6], &[])), (6, 0x2A, 0x05));
        assert_eq!(run(&lu, &b, &read, &[]).status, status::GOOD);
        assert_eq!(
            run(&lu, &a, &read, &[]).status,
            status::RESERVATION_CONFLICT
        );
        // PRIN READ RESERVATION shows b's key.
        let r = run(&lu, &a, &[0x5E, 1, 0, 0, 0, 0, 0, 0, 255, 0], &[]);
        assert_eq!(&r.data_in[8..16], &2u64.to_be_bytes());
        // Service actions beyond READ FULL STATUS are invalid.
        assert_eq!(
            sense_of(&run(&lu, &a, &[0x5E, 4, 0, 0, 0, 0, 0, 0, 255, 0], &[])).1,
            0x24
        );
    }

    #[test]
    fn aptpl_state_survives_a_new_lu() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pr");
        let config = LuConfig {
            pr_state_file: Some(file.clone()),
            ..LuConfig::default()
        };
        let dev = std::sync::Arc::new(block::MemDevice::new(1 << 20));
        let lu = crate::LogicalUnit::new(dev.clone(), config.clone()).unwrap();
        let a = nexus("a");
        ready(&lu, &a);
        assert_eq!(prout(&lu, &a, 6, 0, 0, 0xAB, true), status::GOOD);
        assert_eq!(prout(&lu, &a, 1, 1, 0xAB, 0, false), status::GOOD);
        assert!(file.exists());
        let again = crate::LogicalUnit::new(dev, config).unwrap();
        let st = again.state.lock();
        assert_eq!(st.pr.registrations.len(), 1);
        assert!(st.pr.reservation.is_some());
        drop(st);
        // Registering with APTPL = 0 turns persistence off.
        ready(&again, &a);
        assert_eq!(prout(&again, &a, 0, 0, 0xAB, 0xAC, false), status::GOOD);
        assert!(!file.exists());
    }
}
