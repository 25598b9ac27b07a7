//! Reservations: SPC-2 RESERVE/RELEASE and SPC-4 persistent reservations.
//!
//! This module is pure state: it decides conflicts and applies PERSISTENT
//! RESERVE OUT service actions, and reports which I_T nexuses must receive
//! a unit attention. The LU applies those and persists APTPL state.

use std::sync::Arc;

use scsi_api::{status, Nexus};

use crate::cdb::{be16, be32, be64, put16, put32, put64, u8_at};
use crate::commands::{sa, Access};
use crate::sense::{asc, Failure, Sense};

/// Persistent reservation types (SPC-4 table 188).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrType {
    WriteExclusive = 1,
    ExclusiveAccess = 3,
    WriteExclusiveRegistrantsOnly = 5,
    ExclusiveAccessRegistrantsOnly = 6,
    WriteExclusiveAllRegistrants = 7,
    ExclusiveAccessAllRegistrants = 8,
}

impl PrType {
    pub fn from_code(code: u8) -> Option<PrType> {
        Some(match code {
            1 => PrType::WriteExclusive,
            3 => PrType::ExclusiveAccess,
            5 => PrType::WriteExclusiveRegistrantsOnly,
            6 => PrType::ExclusiveAccessRegistrantsOnly,
            7 => PrType::WriteExclusiveAllRegistrants,
            8 => PrType::ExclusiveAccessAllRegistrants,
            _ => return None,
        })
    }

    /// Every registrant holds an all-registrants reservation.
    pub fn all_registrants(self) -> bool {
        matches!(
            self,
            PrType::WriteExclusiveAllRegistrants | PrType::ExclusiveAccessAllRegistrants
        )
    }

    fn registrants_only(self) -> bool {
        matches!(
            self,
            PrType::WriteExclusiveRegistrantsOnly | PrType::ExclusiveAccessRegistrantsOnly
        )
    }

    fn exclusive_access(self) -> bool {
        matches!(
            self,
            PrType::ExclusiveAccess
                | PrType::ExclusiveAccessRegistrantsOnly
                | PrType::ExclusiveAccessAllRegistrants
        )
    }
}

/// The I_T nexus identity a registration belongs to. The portal group tag
/// is not part of it: a registration follows the relative target port.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PortPair {
    pub initiator: Arc<str>,
    pub isid: [u8; 6],
    pub target: Arc<str>,
    pub relative_port: u16,
}

impl PortPair {
    pub fn of(n: &Nexus) -> PortPair {
        PortPair {
            initiator: n.initiator_name.clone(),
            isid: n.isid,
            target: n.target_name.clone(),
            relative_port: n.relative_port,
        }
    }

    /// SCSI initiator port name, `<name>,i,0x<isid>`.
    pub fn initiator_port_name(&self) -> String {
        let mut s = format!("{},i,0x", self.initiator);
        for b in self.isid {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    pub port: PortPair,
    pub key: u64,
    /// Registered with ALL_TG_PT: applies through every target port.
    pub all_tg_pt: bool,
}

impl Registration {
    fn covers(&self, n: &Nexus) -> bool {
        *self.port.initiator == *n.initiator_name
            && self.port.isid == n.isid
            && *self.port.target == *n.target_name
            && (self.all_tg_pt || self.port.relative_port == n.relative_port)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub kind: PrType,
    /// The holding registration for types that have a single holder.
    pub holder: Option<PortPair>,
}

/// Unit attentions a reservation change establishes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Notices {
    /// (registration, additional sense code) pairs.
    pub to: Vec<(PortPair, (u8, u8))>,
    /// Persistent state changed (store it if APTPL is active).
    pub changed: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrState {
    pub generation: u32,
    pub registrations: Vec<Registration>,
    pub reservation: Option<Reservation>,
    /// Activate persist through power loss.
    pub aptpl: bool,
}

/// The 24-byte basic PERSISTENT RESERVE OUT parameter list.
struct ProutParams {
    key: u64,
    sark: u64,
    spec_i_pt: bool,
    all_tg_pt: bool,
    aptpl: bool,
}

fn conflict() -> Failure {
    Failure::Status(status::RESERVATION_CONFLICT)
}

impl PrState {
    pub fn registration(&self, n: &Nexus) -> Option<&Registration> {
        self.registrations.iter().find(|r| r.covers(n))
    }

    fn registration_index(&self, n: &Nexus) -> Option<usize> {
        self.registrations.iter().position(|r| r.covers(n))
    }

    /// Whether `n` holds the persistent reservation.
    pub fn is_holder(&self, n: &Nexus) -> bool {
        match &self.reservation {
            None => false,
            Some(r) if r.kind.all_registrants() => self.registration(n).is_some(),
            Some(r) => match (&r.holder, self.registration(n)) {
                (Some(h), Some(reg)) => *h == reg.port,
                _ => false,
            },
        }
    }

    /// Whether a command of class `access` from `n` conflicts with the
    /// persistent reservation (SPC-4 5.13.1, SBC-3 table 13).
    pub fn conflicts(&self, n: &Nexus, access: Access) -> bool {
        let Some(res) = &self.reservation else {
            return false;
        };
        if !matches!(access, Access::Read | Access::Write) || self.is_holder(n) {
            return false;
        }
        let blocked = access == Access::Write || res.kind.exclusive_access();
        if !blocked {
            return false;
        }
        if res.kind.registrants_only() || res.kind.all_registrants() {
            self.registration(n).is_none()
        } else {
            true
        }
    }

    fn registered_except(&self, n: &Nexus) -> Vec<PortPair> {
        self.registrations
            .iter()
            .filter(|r| !r.covers(n))
            .map(|r| r.port.clone())
            .collect()
    }

    /// Runs one PERSISTENT RESERVE OUT service action. `can_persist` says
    /// whether APTPL can be honoured (a state file is configured).
    pub fn prout(
        &mut self,
        n: &Nexus,
        cdb: &[u8],
        param: &[u8],
        can_persist: bool,
    ) -> Result<Notices, Failure> {
        let action = u8_at(cdb, 1) & 0x1F;
        let scope = u8_at(cdb, 2) >> 4;
        let kind_code = u8_at(cdb, 2) & 0x0F;
        if action == sa::PROUT_REGISTER_AND_MOVE {
            return self.register_and_move(n, cdb, param, can_persist);
        }
        if param.len() != 24 {
            return Err(Sense::param_list_length().into());
        }
        let p = ProutParams {
            key: be64(param, 0),
            sark: be64(param, 8),
            spec_i_pt: param[20] & 0x08 != 0,
            all_tg_pt: param[20] & 0x04 != 0,
            aptpl: param[20] & 0x01 != 0,
        };
        let typed = matches!(
            action,
            sa::PROUT_RESERVE | sa::PROUT_RELEASE | sa::PROUT_PREEMPT | sa::PROUT_PREEMPT_AND_ABORT
        );
        let kind = if typed {
            if scope != 0 {
                return Err(Sense::invalid_cdb(2, Some(7)).into());
            }
            Some(PrType::from_code(kind_code).ok_or_else(|| Sense::invalid_cdb(2, Some(3)))?)
        } else {
            None
        };
        if p.aptpl && !can_persist {
            return Err(Sense::invalid_param(20, Some(0)).into());
        }
        match action {
            sa::PROUT_REGISTER => self.register(n, &p, false),
            sa::PROUT_REGISTER_AND_IGNORE => self.register(n, &p, true),
            sa::PROUT_RESERVE => self.reserve(n, &p, kind.unwrap_or(PrType::WriteExclusive)),
            sa::PROUT_RELEASE => self.release(n, &p, kind.unwrap_or(PrType::WriteExclusive)),
            sa::PROUT_CLEAR => self.clear(n, &p),
            _ => self.preempt(n, &p, kind.unwrap_or(PrType::WriteExclusive)),
        }
    }

    fn check_key(&self, n: &Nexus, key: u64) -> Result<usize, Failure> {
        match self.registration_index(n) {
            Some(i) if self.registrations[i].key == key => Ok(i),
            _ => Err(conflict()),
        }
    }

    fn register(&mut self, n: &Nexus, p: &ProutParams, ignore: bool) -> Result<Notices, Failure> {
        if p.spec_i_pt {
            // Registering other initiator ports is not supported (SIP_C = 0).
            return Err(Sense::invalid_param(20, Some(3)).into());
        }
        let mut notices = Notices::default();
        match self.registration_index(n) {
            None => {
                if !ignore && p.key != 0 {
                    return Err(conflict());
                }
                if p.sark == 0 {
                    return Ok(notices);
                }
                self.registrations.push(Registration {
                    port: PortPair::of(n),
                    key: p.sark,
                    all_tg_pt: p.all_tg_pt,
                });
            }
            Some(i) => {
                if !ignore && self.registrations[i].key != p.key {
                    return Err(conflict());
                }
                if p.sark == 0 {
                    self.unregister(i, &mut notices);
                } else {
                    self.registrations[i].key = p.sark;
                }
            }
        }
        self.aptpl = p.aptpl;
        self.generation = self.generation.wrapping_add(1);
        notices.changed = true;
        Ok(notices)
    }

    /// Removes registration `i`, releasing the reservation it holds.
    fn unregister(&mut self, i: usize, notices: &mut Notices) {
        let reg = self.registrations.remove(i);
        let Some(res) = &self.reservation else { return };
        if res.kind.all_registrants() {
            if self.registrations.is_empty() {
                self.reservation = None;
            }
            return;
        }
        if res.holder.as_ref() == Some(&reg.port) {
            let kind = res.kind;
            self.reservation = None;
            if kind.registrants_only() {
                for r in &self.registrations {
                    notices
                        .to
                        .push((r.port.clone(), asc::RESERVATIONS_RELEASED));
                }
            }
        }
    }

    fn reserve(&mut self, n: &Nexus, p: &ProutParams, kind: PrType) -> Result<Notices, Failure> {
        let i = self.check_key(n, p.key)?;
        if let Some(res) = &self.reservation {
            // Re-reserving what one holds is a no-op; anything else conflicts.
            return if self.is_holder(n) && res.kind == kind {
                Ok(Notices::default())
            } else {
                Err(conflict())
            };
        }
        let holder = (!kind.all_registrants()).then(|| self.registrations[i].port.clone());
        self.reservation = Some(Reservation { kind, holder });
        Ok(Notices {
            changed: true,
            ..Default::default()
        })
    }

    fn release(&mut self, n: &Nexus, p: &ProutParams, kind: PrType) -> Result<Notices, Failure> {
        self.check_key(n, p.key)?;
        let Some(res) = &self.reservation else {
            return Ok(Notices::default());
        };
        if !self.is_holder(n) {
            return Ok(Notices::default());
        }
        if res.kind != kind {
            return Err(Sense::illegal(asc::INVALID_RELEASE_OF_PERSISTENT_RESERVATION).into());
        }
        let notify = res.kind.registrants_only() || res.kind.all_registrants();
        self.reservation = None;
        let mut notices = Notices {
            changed: true,
            ..Default::default()
        };
        if notify {
            for port in self.registered_except(n) {
                notices.to.push((port, asc::RESERVATIONS_RELEASED));
            }
        }
        Ok(notices)
    }

    fn clear(&mut self, n: &Nexus, p: &ProutParams) -> Result<Notices, Failure> {
        self.check_key(n, p.key)?;
        let mut notices = Notices {
            changed: true,
            ..Default::default()
        };
        for port in self.registered_except(n) {
            notices.to.push((port, asc::RESERVATIONS_PREEMPTED));
        }
        self.registrations.clear();
        self.reservation = None;
        self.generation = self.generation.wrapping_add(1);
        Ok(notices)
    }

    fn preempt(&mut self, n: &Nexus, p: &ProutParams, kind: PrType) -> Result<Notices, Failure> {
        let me = self.check_key(n, p.key)?;
        let my_port = self.registrations[me].port.clone();
        let mut notices = Notices {
            changed: true,
            ..Default::default()
        };
        let removes =
            |regs: &[Registration], pred: &dyn Fn(&Registration) -> bool| -> Vec<PortPair> {
                regs.iter()
                    .filter(|r| r.port != my_port && pred(r))
                    .map(|r| r.port.clone())
                    .collect()
            };

        let (victims, new_reservation) = match self.reservation.clone() {
            None => {
                if p.sark == 0 {
                    return Err(Sense::invalid_param(8, None).into());
                }
                if !self.registrations.iter().any(|r| r.key == p.sark) {
                    return Err(conflict());
                }
                (removes(&self.registrations, &|r| r.key == p.sark), None)
            }
            Some(res) if res.kind.all_registrants() => {
                if p.sark == 0 {
                    let victims = removes(&self.registrations, &|_| true);
                    let holder = (!kind.all_registrants()).then(|| my_port.clone());
                    (victims, Some(Reservation { kind, holder }))
                } else {
                    if !self.registrations.iter().any(|r| r.key == p.sark) {
                        return Err(conflict());
                    }
                    (
                        removes(&self.registrations, &|r| r.key == p.sark),
                        Some(res),
                    )
                }
            }
            Some(res) => {
                let holder_key = res
                    .holder
                    .as_ref()
                    .and_then(|h| self.registrations.iter().find(|r| r.port == *h))
                    .map(|r| r.key);
                if holder_key == Some(p.sark) {
                    let victims = removes(&self.registrations, &|r| r.key == p.sark);
                    let holder = (!kind.all_registrants()).then(|| my_port.clone());
                    // Registrants that keep their registration learn that the
                    // reservation they lived under is gone.
                    for r in &self.registrations {
                        if r.port != my_port && r.key != p.sark {
                            notices
                                .to
                                .push((r.port.clone(), asc::RESERVATIONS_RELEASED));
                        }
                    }
                    (victims, Some(Reservation { kind, holder }))
                } else {
                    if p.sark == 0 {
                        return Err(Sense::invalid_param(8, None).into());
                    }
                    if !self.registrations.iter().any(|r| r.key == p.sark) {
                        return Err(conflict());
                    }
                    (
                        removes(&self.registrations, &|r| r.key == p.sark),
                        Some(res),
                    )
                }
            }
        };
        self.registrations.retain(|r| !victims.contains(&r.port));
        self.reservation = new_reservation;
        for port in victims {
            notices.to.push((port, asc::REGISTRATIONS_PREEMPTED));
        }
        self.generation = self.generation.wrapping_add(1);
        Ok(notices)
    }

    fn register_and_move(
        &mut self,
        n: &Nexus,
        cdb: &[u8],
        param: &[u8],
        can_persist: bool,
    ) -> Result<Notices, Failure> {
        if u8_at(cdb, 2) >> 4 != 0 {
            return Err(Sense::invalid_cdb(2, Some(7)).into());
        }
        if param.len() < 24 {
            return Err(Sense::param_list_length().into());
        }
        let key = be64(param, 0);
        let sark = be64(param, 8);
        let unreg = param[17] & 0x02 != 0;
        let aptpl = param[17] & 0x01 != 0;
        let relative_port = be16(param, 18);
        let tid_len = be32(param, 20) as usize;
        if aptpl && !can_persist {
            return Err(Sense::invalid_param(17, Some(0)).into());
        }
        let Some(tid) = param.get(24..24usize.saturating_add(tid_len)) else {
            return Err(Sense::param_list_length().into());
        };
        let me = self.check_key(n, key)?;
        let Some(res) = self.reservation.clone() else {
            return Err(conflict());
        };
        if res.kind.all_registrants() || !self.is_holder(n) {
            return Err(conflict());
        }
        if sark == 0 {
            return Err(Sense::invalid_param(8, None).into());
        }
        let (initiator, isid) =
            parse_iscsi_transport_id(tid).ok_or_else(|| Sense::invalid_param(24, None))?;
        let dest = PortPair {
            initiator: initiator.into(),
            isid,
            target: n.target_name.clone(),
            relative_port,
        };
        if dest == self.registrations[me].port {
            return Err(Sense::invalid_param(18, None).into());
        }
        match self.registrations.iter_mut().find(|r| r.port == dest) {
            Some(r) => r.key = sark,
            None => self.registrations.push(Registration {
                port: dest.clone(),
                key: sark,
                all_tg_pt: false,
            }),
        }
        self.reservation = Some(Reservation {
            kind: res.kind,
            holder: Some(dest),
        });
        if unreg {
            if let Some(i) = self.registration_index(n) {
                self.registrations.remove(i);
            }
        }
        self.aptpl = aptpl;
        self.generation = self.generation.wrapping_add(1);
        Ok(Notices {
            changed: true,
            ..Default::default()
        })
    }

    /// PERSISTENT RESERVE IN parameter data for service action `action`.
    pub fn prin(&self, action: u8, can_persist: bool) -> Result<Vec<u8>, Sense> {
        let mut d = vec![0u8; 8];
        put32(&mut d, 0, self.generation);
        match action {
            sa::PRIN_READ_KEYS => {
                for r in &self.registrations {
                    d.extend_from_slice(&r.key.to_be_bytes());
                }
            }
            sa::PRIN_READ_RESERVATION => {
                if let Some(res) = &self.reservation {
                    let key = if res.kind.all_registrants() {
                        0
                    } else {
                        res.holder
                            .as_ref()
                            .and_then(|h| self.registrations.iter().find(|r| r.port == *h))
                            .map_or(0, |r| r.key)
                    };
                    let mut desc = [0u8; 16];
                    put64(&mut desc, 0, key);
                    desc[13] = res.kind as u8;
                    d.extend_from_slice(&desc);
                }
            }
            sa::PRIN_REPORT_CAPABILITIES => {
                let mut c = vec![0u8; 8];
                put16(&mut c, 0, 8);
                // CRH | ATP_C | PTPL_C
                c[2] = 0x10 | 0x04 | u8::from(can_persist);
                // TMV, ALLOW COMMANDS 001b, PTPL_A
                c[3] = 0x80 | 0x10 | u8::from(self.aptpl);
                // Type mask: WR_EX_AR EX_AC_RO WR_EX_RO EX_AC WR_EX / EX_AC_AR
                c[4] = 0x80 | 0x40 | 0x20 | 0x08 | 0x02;
                c[5] = 0x01;
                return Ok(c);
            }
            sa::PRIN_READ_FULL_STATUS => {
                for r in &self.registrations {
                    let holder = match &self.reservation {
                        Some(res) if res.kind.all_registrants() => true,
                        Some(res) => res.holder.as_ref() == Some(&r.port),
                        None => false,
                    };
                    let tid = iscsi_transport_id(&r.port);
                    let mut desc = vec![0u8; 24];
                    put64(&mut desc, 0, r.key);
                    desc[12] = (u8::from(r.all_tg_pt) << 1) | u8::from(holder);
                    if holder {
                        desc[13] = self.reservation.as_ref().map_or(0, |res| res.kind as u8);
                    }
                    if !r.all_tg_pt {
                        put16(&mut desc, 18, r.port.relative_port);
                    }
                    put32(&mut desc, 20, tid.len() as u32);
                    d.extend_from_slice(&desc);
                    d.extend_from_slice(&tid);
                }
            }
            _ => return Err(Sense::invalid_cdb(1, Some(4))),
        }
        let additional = (d.len() - 8) as u32;
        put32(&mut d, 4, additional);
        Ok(d)
    }
}

/// iSCSI TransportID, format 01b (initiator port name with ISID), padded to
/// a multiple of four bytes (SPC-4 7.6.4.6).
pub fn iscsi_transport_id(port: &PortPair) -> Vec<u8> {
    let name = port.initiator_port_name();
    let mut t = vec![0x40 | 0x05, 0, 0, 0];
    t.extend_from_slice(name.as_bytes());
    t.push(0);
    while t.len() % 4 != 0 {
        t.push(0);
    }
    let additional = (t.len() - 4) as u16;
    put16(&mut t, 2, additional);
    t
}

/// Parses an iSCSI TransportID in format 01b into (name, ISID).
pub fn parse_iscsi_transport_id(t: &[u8]) -> Option<(String, [u8; 6])> {
    if u8_at(t, 0) != 0x45 {
        return None;
    }
    let len = usize::from(be16(t, 2));
    let body = t.get(4..4 + len)?;
    let text = body.split(|&b| b == 0).next()?;
    let text = std::str::from_utf8(text).ok()?;
    let (name, isid) = text
        .split_once(",i,0x")
        .or_else(|| text.split_once(",I,0X"))?;
    if isid.len() != 12 {
        return None;
    }
    let mut out = [0u8; 6];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(isid.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some((name.to_string(), out))
}

#[cfg(test)]
mod tests;
