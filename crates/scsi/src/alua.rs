//! Asymmetric logical unit access (SPC-4 5.15): REPORT TARGET PORT GROUPS,
//! SET TARGET PORT GROUPS, what each access state lets through, and the
//! unit attention every state change raises.
//!
//! The states themselves live in the device's [`export::AccessStates`],
//! shared with the other transports; the HA pair changes them there.

use std::collections::BTreeMap;

use export::{AccessChange, AccessState, AccessWatcher, Cause, MoveRefused};
use scsi_api::ScsiResponse;

use crate::cdb::{be16, be32, put16, put32, truncate, u8_at};
use crate::commands::{op, sa, Command};
use crate::lu::{Ctx, LogicalUnit, Outcome};
use crate::sense::{asc, key, Sense};

/// Length of one SET TARGET PORT GROUPS descriptor and of the list header.
const STPG_DESCRIPTOR: usize = 4;

/// NOT READY, LOGICAL UNIT NOT ACCESSIBLE for a group in `state`.
pub(crate) fn not_accessible(state: AccessState) -> Sense {
    let code = match state {
        AccessState::Standby => asc::NOT_ACCESSIBLE_TARGET_PORT_STANDBY,
        AccessState::Transitioning => asc::NOT_ACCESSIBLE_TRANSITIONING,
        _ => asc::NOT_ACCESSIBLE_TARGET_PORT_UNAVAILABLE,
    };
    Sense::new(key::NOT_READY, code)
}

/// Whether `c` runs through a target port group in `state` (SPC-4
/// 5.15.2.4.4 to 5.15.2.5). REPORT LUNS is answered by the target before
/// any LU. READ CAPACITY also runs in standby, as LIO's does: a host
/// that finds the LU first through a standby path would otherwise see an
/// empty disk.
pub(crate) fn allowed_in(state: AccessState, c: &Command) -> bool {
    let rtpg =
        c.opcode == op::MAINTENANCE_IN && c.service_action == Some(sa::REPORT_TARGET_PORT_GROUPS);
    let stpg = c.opcode == op::MAINTENANCE_OUT;
    let always = matches!(c.opcode, op::INQUIRY | op::REQUEST_SENSE | op::REPORT_LUNS) || rtpg;
    match state {
        AccessState::ActiveOptimized | AccessState::ActiveNonOptimized => true,
        AccessState::Transitioning => always,
        AccessState::Unavailable => always || stpg,
        AccessState::Standby => {
            always
                || stpg
                || matches!(
                    c.opcode,
                    op::MODE_SELECT_6
                        | op::MODE_SELECT_10
                        | op::MODE_SENSE_6
                        | op::MODE_SENSE_10
                        | op::PERSISTENT_RESERVE_IN
                        | op::PERSISTENT_RESERVE_OUT
                        | op::READ_CAPACITY_10
                )
                || (c.opcode == op::SERVICE_ACTION_IN_16
                    && c.service_action == Some(sa::READ_CAPACITY_16))
        }
    }
}

impl LogicalUnit {
    /// NOT READY when the group `ctx` came through may not run `c`.
    pub(crate) fn check_access(&self, ctx: &Ctx<'_>, c: &Command) -> Result<(), Sense> {
        match self.access.restriction(ctx.nexus.portal_group) {
            Some(state) if !allowed_in(state, c) => Err(not_accessible(state)),
            _ => Ok(()),
        }
    }

    /// TPGS of standard INQUIRY data: implicit ALUA always, explicit too
    /// while someone makes explicit moves.
    pub(crate) fn tpgs(&self) -> u8 {
        if self.access.explicit().is_some() {
            0x30
        } else {
            0x10
        }
    }

    /// REPORT TARGET PORT GROUPS (SPC-4 6.36): every group the model
    /// names and every group a session came through, with their ports.
    pub(crate) fn report_target_port_groups(&self, ctx: &Ctx<'_>) -> Outcome {
        let cdb = ctx.cdb();
        let extended = match u8_at(cdb, 1) >> 5 {
            0 => false,
            1 => true,
            _ => return Err(Sense::invalid_cdb(1, Some(7)).into()),
        };
        let alloc = be32(cdb, 6) as usize;
        let access = &self.access;
        let mut groups: BTreeMap<u16, Descriptor> = access
            .groups()
            .into_iter()
            .map(|g| {
                let d = Descriptor {
                    state: g.state,
                    preferred: g.preferred,
                    status: g.cause.status_code(),
                    ports: g.ports,
                };
                (g.id, d)
            })
            .collect();
        let others = access.others();
        let unnamed = || Descriptor {
            state: others,
            preferred: false,
            status: 0,
            ports: Vec::new(),
        };
        {
            let st = self.state.lock();
            let seen = st.ports.iter().copied();
            let own = (ctx.nexus.portal_group, ctx.nexus.relative_port);
            for (group, port) in seen.chain(std::iter::once(own)) {
                let d = groups.entry(group).or_insert_with(unnamed);
                if !d.ports.contains(&port) {
                    d.ports.push(port);
                }
            }
        }
        let supported = access.supported();
        let mut d = vec![0u8; if extended { 8 } else { 4 }];
        if extended {
            d[4] = 0x10; // FORMAT TYPE 001b
            d[5] = access.transition_secs();
        }
        for (id, g) in &mut groups {
            g.ports.sort_unstable();
            let mut desc = [0u8; 8];
            desc[0] = (u8::from(g.preferred) << 7) | g.state.code();
            desc[1] = supported;
            put16(&mut desc, 2, *id);
            desc[5] = g.status;
            desc[7] = g.ports.len().min(255) as u8;
            d.extend_from_slice(&desc);
            for &p in g.ports.iter().take(255) {
                d.extend_from_slice(&[0, 0]);
                d.extend_from_slice(&p.to_be_bytes());
            }
        }
        let len = (d.len() - 4) as u32;
        put32(&mut d, 0, len);
        Ok(ScsiResponse::with_data(truncate(d, alloc)))
    }

    /// SET TARGET PORT GROUPS (SPC-4 6.42): the moves are checked here,
    /// then made by the hook the pair gave the model. Offered only while
    /// there is one (the command is unsupported otherwise).
    pub(crate) fn set_target_port_groups(&self, ctx: &Ctx<'_>) -> Outcome {
        let len = be32(ctx.cdb(), 6) as usize;
        if len == 0 {
            return Ok(ScsiResponse::good());
        }
        if len < STPG_DESCRIPTOR || !len.is_multiple_of(STPG_DESCRIPTOR) {
            return Err(Sense::param_list_length().into());
        }
        let param = ctx.param(len)?;
        let Some(hook) = self.access.explicit() else {
            return Err(Sense::invalid_opcode().into());
        };
        let supported = self.access.supported();
        let known: Vec<u16> = {
            let st = self.state.lock();
            let mut known: Vec<u16> = st.ports.iter().map(|&(g, _)| g).collect();
            known.push(ctx.nexus.portal_group);
            known
        };
        let named = self.access.groups();
        let mut moves = Vec::with_capacity(len / STPG_DESCRIPTOR - 1);
        for (i, desc) in param[STPG_DESCRIPTOR..]
            .chunks_exact(STPG_DESCRIPTOR)
            .enumerate()
        {
            let at = STPG_DESCRIPTOR * (i + 1);
            // Only primary states may be asked for; transitioning is the
            // target's own.
            let state = AccessState::from_code(desc[0] & 0x0F)
                .filter(|s| *s != AccessState::Transitioning)
                .filter(|s| supported & s.support_bit() != 0)
                .ok_or_else(|| Sense::invalid_param(at, Some(3)))?;
            let group = be16(desc, 2);
            if !named.iter().any(|g| g.id == group) && !known.contains(&group) {
                return Err(Sense::invalid_param(at + 2, None).into());
            }
            moves.push((group, state));
        }
        // The state lock is not held over the hook: the changes it makes
        // come back through `access_changed`.
        self.state.lock().stpg_from.push(ctx.nexus.clone());
        let result = hook.request(&self.access, &moves);
        {
            let mut st = self.state.lock();
            if let Some(i) = st.stpg_from.iter().position(|n| n == ctx.nexus) {
                st.stpg_from.swap_remove(i);
            }
        }
        match result {
            Ok(()) => Ok(ScsiResponse::good()),
            Err(MoveRefused::Invalid(i)) => {
                Err(Sense::invalid_param(STPG_DESCRIPTOR * (i + 1), None).into())
            }
            Err(MoveRefused::Failed(why)) => {
                tracing::warn!(lu = %self.serial, %why, "SET TARGET PORT GROUPS failed");
                Err(Sense::new(key::HARDWARE_ERROR, asc::SET_TARGET_PORT_GROUPS_FAILED).into())
            }
        }
    }
}

/// A target port group descriptor being built.
struct Descriptor {
    state: AccessState,
    preferred: bool,
    status: u8,
    ports: Vec<u16>,
}

impl AccessWatcher for LogicalUnit {
    /// Every state change is ASYMMETRIC ACCESS STATE CHANGED on every I_T
    /// nexus, except, for an explicit one, the nexus whose SET TARGET
    /// PORT GROUPS made it (SPC-4 5.15.2.2).
    fn access_changed(&self, change: &AccessChange) {
        let mut st = self.state.lock();
        let st = &mut *st;
        for (n, s) in st.nexuses.iter_mut() {
            if change.cause == Cause::Explicit && st.stpg_from.contains(n) {
                continue;
            }
            s.add_unit_attention(asc::ASYMMETRIC_ACCESS_STATE_CHANGED);
        }
    }

    /// TPGS of the standard INQUIRY data changed.
    fn explicit_changed(&self, _: bool) {
        self.state
            .lock()
            .notify_all(asc::INQUIRY_DATA_CHANGED, None);
    }
}

#[cfg(test)]
mod tests;
