//! Text requests in the full feature phase: SendTargets and any other
//! keys, with requests and responses spanning several PDUs (C bit, TTT).

use bytes::Bytes;

use super::ffp::{Conn, Flow};
use super::io::{OutPdu, StatSn};
use crate::discovery;
use crate::negotiation::Stage;
use crate::pdu::initiator::TextRequest;
use crate::pdu::target::{self, reject_reason};
use crate::pdu::{Bhs, RESERVED_TAG};
use crate::text::{self, Accumulator};

/// Text request bytes accepted for one exchange.
const TEXT_LIMIT: usize = 64 * 1024;

/// A Text exchange in progress (request or response spanning PDUs).
pub(super) struct TextExchange {
    itt: u32,
    ttt: u32,
    lun: [u8; 8],
    request: Accumulator,
    /// Response bytes not sent yet.
    pending: Bytes,
}

impl Conn {
    pub(super) async fn on_text(&mut self, bhs: Bhs, t: TextRequest) -> Flow {
        if t.ttt != RESERVED_TAG {
            match &self.text {
                Some(x) if x.ttt == t.ttt && x.itt == t.itt => {
                    if !x.pending.is_empty() {
                        return self.send_text_chunk().await;
                    }
                }
                _ => {
                    return self
                        .reject(bhs, reject_reason::INVALID_PDU_FIELD, false)
                        .await
                }
            }
        } else {
            // A new exchange replaces any unfinished one.
            self.text = Some(TextExchange {
                itt: t.itt,
                ttt: RESERVED_TAG,
                lun: t.lun,
                request: Accumulator::default(),
                pending: Bytes::new(),
            });
        }
        let Some(x) = self.text.as_mut() else {
            return Flow::Continue;
        };
        if x.request.push(&t.data, TEXT_LIMIT).is_err() {
            self.text = None;
            return self.reject(bhs, reject_reason::PROTOCOL_ERROR, false).await;
        }
        if t.continue_ {
            // More request text follows: acknowledge with an empty response.
            let ttt = self.new_ttt();
            let Some(x) = self.text.as_mut() else {
                return Flow::Continue;
            };
            x.ttt = ttt;
            let bhs = target::text_response(x.lun, x.itt, ttt, false, false);
            return self
                .send_or_close(OutPdu::new(bhs, Bytes::new(), StatSn::Advance))
                .await;
        }
        let keys = match text::parse(&x.request.take()) {
            Ok(k) => k,
            Err(_) => {
                self.text = None;
                return self.reject(bhs, reject_reason::PROTOCOL_ERROR, false).await;
            }
        };
        let own_target = self.ctx.target.as_ref().map(|t| t.name.clone());
        let mut answers = Vec::new();
        let mut others = Vec::new();
        for (k, v) in keys {
            if k == "SendTargets" {
                let mut listings = self.server.listings(&self.ctx.initiator_name);
                // A session's own target stays reportable after a config change.
                if let Some(own) = &self.ctx.target {
                    if !listings.iter().any(|l| l.name == own.name) {
                        listings.push(discovery::Listing {
                            name: own.name.clone(),
                            portal_group: own.portal_group,
                            portals: own.portals.clone(),
                        });
                    }
                }
                answers.extend(discovery::send_targets(
                    &v,
                    &listings,
                    self.ctx.local,
                    own_target.as_deref(),
                ));
            } else {
                others.push((k, v));
            }
        }
        answers.extend(
            self.text_negotiator
                .negotiate(Stage::FullFeature, &others)
                .unwrap_or_default(),
        );
        if let Some(x) = self.text.as_mut() {
            x.pending = Bytes::from(text::encode(&answers));
        }
        self.send_text_chunk().await
    }

    /// Send the next part of a Text response, at most the initiator's
    /// MaxRecvDataSegmentLength; C bit and a TTT when more follows.
    async fn send_text_chunk(&mut self) -> Flow {
        let max = self.ctx.params.initiator_mrdsl as usize;
        let ttt = self.new_ttt();
        let Some(x) = self.text.as_mut() else {
            return Flow::Continue;
        };
        let chunk = x.pending.split_to(x.pending.len().min(max));
        let more = !x.pending.is_empty();
        x.ttt = if more { ttt } else { RESERVED_TAG };
        let bhs = target::text_response(x.lun, x.itt, x.ttt, !more, more);
        if !more {
            self.text = None;
        }
        self.send_or_close(OutPdu::new(bhs, chunk, StatSn::Advance))
            .await
    }
}
