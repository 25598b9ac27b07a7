//! Long WRITEs started from their command's header, so that their
//! immediate data too goes from the socket straight into the device
//! (placed.rs). The command itself is handled as usual once all of it is
//! in; only the SCSI layer's start comes early, and only for a command
//! whose turn it already is (next in CmdSN order, nothing held back).

use std::sync::Arc;

use super::ffp::{Conn, Flow, HeldScope};
use super::placed::{Placed, PlacedWrite};
use crate::cmdsn::Arrival;
use crate::lun;
use crate::pdu::initiator::Request;
use crate::pdu::{Bhs, Opcode, Pdu};

/// A WRITE started from its command's header, until the command is
/// handled.
pub(crate) struct Prestarted {
    pub itt: u32,
    lun: u64,
    pub placed: Placed,
    /// A reset or abort came while its immediate data arrived: the command
    /// is dropped when it is in, as a command held back would be.
    aborted: bool,
}

impl Conn {
    /// Where a SCSI Command's immediate data goes when its write can start
    /// now: at offset 0 of the started write.
    pub(super) fn place_command(
        &mut self,
        bhs: &Bhs,
        len: usize,
    ) -> Option<(Arc<PlacedWrite>, usize)> {
        let Ok(Request::ScsiCommand(c)) = Request::parse(Pdu::header_only(*bhs)) else {
            return None;
        };
        let params = &self.ctx.params;
        // What would stop the command before its write started goes the
        // usual way, which answers it.
        let plain = !c.immediate
            && params.immediate_data
            && c.write
            && !c.read
            && len <= params.first_burst_length as usize
            && len <= c.edtl as usize
            && c.edtl <= self.server.options.max_command_data
            && !self.tasks.contains_key(&c.itt)
            && self.held.is_empty()
            && self.window.lock().classify(c.cmdsn) == Arrival::InOrder;
        if !plain {
            return None;
        }
        let placed = self.start_placed(&c)?;
        let write = match &placed {
            Placed::Started(write) => Some((write.clone(), 0)),
            Placed::Answered(_) => None,
        };
        self.prestarted = Some(Prestarted {
            itt: c.itt,
            lun: lun::decode(c.lun),
            placed,
            aborted: false,
        });
        write
    }

    /// The write started for command `itt` from its header, if any.
    pub(super) fn take_prestarted(&mut self, itt: u32) -> Option<Placed> {
        self.prestarted
            .take_if(|p| p.itt == itt && !p.aborted)
            .map(|p| p.placed)
    }

    /// A command whose write started early and which an abort caught
    /// meanwhile is in: count its CmdSN as received and drop it. `None`
    /// for any other PDU.
    pub(super) async fn drop_if_aborted(&mut self, bhs: &Bhs) -> Option<Flow> {
        let aborted = bhs.opcode() == Some(Opcode::ScsiCommand)
            && self
                .prestarted
                .as_ref()
                .is_some_and(|p| p.aborted && p.itt == bhs.itt());
        if !aborted {
            return None;
        }
        self.prestarted = None;
        self.window.lock().accept(false);
        Some(self.release_held().await)
    }

    /// After the PDU a write was started for has been handled: a start it
    /// did not take (the command was refused) is undone.
    pub(super) fn drop_unused_prestart(&mut self) {
        if let Some(p) = self.prestarted.take() {
            if !p.aborted {
                self.forget_placed(Some(&p.placed));
            }
        }
    }

    /// An abort over `scope` also catches a write started from a header
    /// whose command is still arriving.
    pub(super) fn abort_prestart(&mut self, scope: HeldScope) {
        let Some(mut p) = self.prestarted.take() else {
            return;
        };
        if scope.covers(p.lun) && !p.aborted {
            p.aborted = true;
            self.forget_placed(Some(&p.placed));
        }
        self.prestarted = Some(p);
    }
}
