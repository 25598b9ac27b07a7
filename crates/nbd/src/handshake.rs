//! Fixed-newstyle negotiation: from the greeting to the export a client
//! transmits on, or to its leaving.

use std::io;

use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use peer_limits::EventLog;

use crate::exports::{ExportCounters, ExportTable, Served};
use crate::proto::*;
use crate::tls::TlsMode;
use crate::wire::{self, Agreed, DecodeError};
use export::Peer;

/// Longest option data read; every option this server knows fits in far
/// less (a name of 4096 bytes and a few short lists).
pub const MAX_OPTION_LEN: u32 = 64 * 1024;

/// The metadata context id of `base:allocation`, the only one served.
pub const ALLOCATION_CONTEXT: u32 = 1;

/// Why negotiation ended without an export.
#[derive(Debug, Error)]
pub enum HandshakeError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Decode(#[from] DecodeError),
    #[error("the client does not speak fixed newstyle (flags {0:#x})")]
    NotFixedNewstyle(u32),
    #[error("option {option} carries {len} bytes, more than any option needs")]
    OptionTooLong { option: u32, len: u32 },
    #[error("NBD_OPT_EXPORT_NAME for {0:?}, which this client may not have")]
    ExportNameRefused(String),
    #[error("NBD_OPT_EXPORT_NAME after extended headers were negotiated")]
    ExportNameWithExtendedHeaders,
    #[error("NBD_OPT_EXPORT_NAME without TLS, which this server requires")]
    TlsRequired,
    #[error("TLS handshake: {0}")]
    Tls(io::Error),
}

/// What the server offers in negotiation.
pub(crate) struct Offer<'a> {
    pub exports: &'a ExportTable,
    pub max_payload: u32,
    /// TLS the client may start, and whether it must.
    pub tls: Option<TlsMode>,
    /// Where refusals by an allow list are logged.
    pub refused: &'a EventLog,
}

/// Where negotiation ended.
pub(crate) enum Step {
    Transmit(Negotiated),
    /// The client left with NBD_OPT_ABORT.
    Leave,
    /// NBD_OPT_STARTTLS was accepted: the caller runs the TLS handshake
    /// and negotiation starts over inside it.
    StartTls,
}

/// A connection ready for transmission.
pub(crate) struct Negotiated {
    pub served: Served,
    pub agreed: Agreed,
}

/// State gathered option by option.
#[derive(Default)]
struct Options {
    structured: bool,
    extended: bool,
    /// The export `base:allocation` was selected for.
    allocation_for: Option<String>,
    in_tls: bool,
}

async fn reply<S: AsyncWrite + Unpin>(
    io: &mut S,
    option: u32,
    kind: u32,
    data: &[u8],
) -> io::Result<()> {
    io.write_all(&wire::option_reply(option, kind, data)).await
}

/// Transmission flags of an export, given what was negotiated.
pub(crate) fn transmission_flags(served: &Served, structured: bool) -> u16 {
    let caps = served.export.device().capabilities();
    let mut flags = FLAG_HAS_FLAGS
        | FLAG_SEND_FLUSH
        | FLAG_SEND_FUA
        | FLAG_SEND_WRITE_ZEROES
        | FLAG_SEND_FAST_ZERO
        | FLAG_SEND_CACHE
        // A flush flushes the device, whichever connection sent it.
        | FLAG_CAN_MULTI_CONN;
    if structured {
        flags |= FLAG_SEND_DF;
    }
    if caps.discard {
        flags |= FLAG_SEND_TRIM;
    }
    if served.export.read_only || caps.read_only {
        flags |= FLAG_READ_ONLY;
    }
    flags
}

/// Preferred block size: the device's granularity when it is a usable
/// power of two, else a page.
fn preferred_block(served: &Served, max_payload: u32) -> u32 {
    let g = served.export.device().granularity();
    if g.is_power_of_two() && (512..=max_payload as u64).contains(&g) {
        g as u32
    } else {
        4096.min(max_payload)
    }
}

/// Sends the greeting and reads the client's flags: whether the client
/// wants the 124 zeros after NBD_OPT_EXPORT_NAME's answer.
pub(crate) async fn greet<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
) -> Result<bool, HandshakeError> {
    io.write_all(&wire::greeting()).await?;
    io.flush().await?;
    let client_flags = io.read_u32().await?;
    if client_flags & FLAG_C_FIXED_NEWSTYLE == 0
        || client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0
    {
        return Err(HandshakeError::NotFixedNewstyle(client_flags));
    }
    Ok(client_flags & FLAG_C_NO_ZEROES == 0)
}

/// Answers options on `io` until the client goes to transmission, leaves,
/// or starts TLS. `in_tls`: this runs inside TLS already.
pub(crate) async fn negotiate<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    peer: Peer,
    offer: &Offer<'_>,
    zeroes: bool,
    in_tls: bool,
) -> Result<Step, HandshakeError> {
    // State negotiated before TLS does not carry into it.
    let mut state = Options {
        in_tls,
        ..Options::default()
    };
    loop {
        let mut header = [0; 16];
        io.read_exact(&mut header).await?;
        let h = wire::decode_option_header(&header)?;
        if h.len > MAX_OPTION_LEN {
            return Err(HandshakeError::OptionTooLong {
                option: h.option,
                len: h.len,
            });
        }
        let mut data = vec![0; h.len as usize];
        io.read_exact(&mut data).await?;
        let done = option(io, peer, offer, &mut state, h.option, &data, zeroes).await?;
        io.flush().await?;
        if let Some(outcome) = done {
            return Ok(outcome);
        }
    }
}

/// Answers one option; `Some` ends negotiation.
async fn option<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    peer: Peer,
    offer: &Offer<'_>,
    state: &mut Options,
    opt: u32,
    data: &[u8],
    zeroes: bool,
) -> Result<Option<Step>, HandshakeError> {
    let invalid = |why: &str| wire::option_reply(opt, REP_ERR_INVALID, why.as_bytes());
    let tls_missing = offer.tls == Some(TlsMode::Require) && !state.in_tls;
    match opt {
        OPT_ABORT => {
            // The client may already be gone; the ACK is a courtesy.
            let _ = reply(io, opt, REP_ACK, &[]).await;
            Ok(Some(Step::Leave))
        }
        OPT_STARTTLS => {
            if offer.tls.is_none() {
                reply(io, opt, REP_ERR_UNSUP, b"this server has no TLS configured").await?;
            } else if state.in_tls {
                io.write_all(&invalid("TLS is up already")).await?;
            } else if !data.is_empty() {
                io.write_all(&invalid("NBD_OPT_STARTTLS takes no data"))
                    .await?;
            } else {
                reply(io, opt, REP_ACK, &[]).await?;
                return Ok(Some(Step::StartTls));
            }
            Ok(None)
        }
        OPT_EXPORT_NAME if tls_missing => Err(HandshakeError::TlsRequired),
        _ if tls_missing => {
            let why = b"this server requires TLS: use NBD_OPT_STARTTLS first";
            reply(io, opt, REP_ERR_TLS_REQD, why).await?;
            Ok(None)
        }
        OPT_EXPORT_NAME => {
            if state.extended {
                return Err(HandshakeError::ExportNameWithExtendedHeaders);
            }
            // This option has no error reply: a name that is not served,
            // or not valid, closes the connection.
            let name = wire::parse_export_name(data).map_err(|_| {
                HandshakeError::ExportNameRefused(String::from_utf8_lossy(data).into())
            })?;
            let served = admit(offer, peer, &name)
                .map_err(|_| HandshakeError::ExportNameRefused(name.clone()))?;
            let flags = transmission_flags(&served, state.structured);
            let size = served.export.device().size();
            io.write_all(&wire::export_name_reply(size, flags, zeroes))
                .await?;
            Ok(Some(Step::Transmit(finish(served, state, offer))))
        }
        OPT_LIST => {
            if !data.is_empty() {
                io.write_all(&invalid("NBD_OPT_LIST takes no data")).await?;
                return Ok(None);
            }
            for (name, export) in offer.exports.list().iter() {
                if export.allow.admits(peer) {
                    let entry = wire::server_entry(name, &export.description);
                    reply(io, opt, REP_SERVER, &entry).await?;
                }
            }
            reply(io, opt, REP_ACK, &[]).await?;
            Ok(None)
        }
        OPT_INFO | OPT_GO => {
            let req = match wire::parse_info_request(data) {
                Ok(r) => r,
                Err(e) => {
                    io.write_all(&invalid(e.0)).await?;
                    return Ok(None);
                }
            };
            let served = match admit(offer, peer, &req.name) {
                Ok(s) => s,
                Err((kind, why)) => {
                    reply(io, opt, kind, why.as_bytes()).await?;
                    return Ok(None);
                }
            };
            let flags = transmission_flags(&served, state.structured);
            let export = &served.export;
            reply(
                io,
                opt,
                REP_INFO,
                &wire::info_export(export.device().size(), flags),
            )
            .await?;
            if req.infos.contains(&INFO_NAME) {
                reply(io, opt, REP_INFO, &wire::info_text(INFO_NAME, &served.name)).await?;
            }
            if req.infos.contains(&INFO_DESCRIPTION) && !export.description.is_empty() {
                let d = wire::info_text(INFO_DESCRIPTION, &export.description);
                reply(io, opt, REP_INFO, &d).await?;
            }
            let preferred = preferred_block(&served, offer.max_payload);
            let sizes = wire::info_block_size(1, preferred, offer.max_payload);
            reply(io, opt, REP_INFO, &sizes).await?;
            reply(io, opt, REP_ACK, &[]).await?;
            if opt == OPT_GO {
                return Ok(Some(Step::Transmit(finish(served, state, offer))));
            }
            Ok(None)
        }
        OPT_STRUCTURED_REPLY | OPT_EXTENDED_HEADERS => {
            if !data.is_empty() {
                io.write_all(&invalid("the option takes no data")).await?;
            } else if opt == OPT_STRUCTURED_REPLY && state.extended {
                let why = b"extended headers are in use already";
                reply(io, opt, REP_ERR_EXT_HEADER_REQD, why).await?;
            } else {
                state.structured = true;
                state.extended |= opt == OPT_EXTENDED_HEADERS;
                reply(io, opt, REP_ACK, &[]).await?;
            }
            Ok(None)
        }
        OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
            meta_context(io, peer, offer, state, opt, data).await?;
            Ok(None)
        }
        _ => {
            reply(io, opt, REP_ERR_UNSUP, b"unknown option").await?;
            Ok(None)
        }
    }
}

/// The export `name` if it exists and admits `peer`; otherwise the error
/// reply for it. An export the client may not use is answered exactly as
/// a name that does not exist, so its existence cannot be probed; the
/// refusal is counted, and logged at most once per interval.
fn admit(offer: &Offer<'_>, peer: Peer, name: &str) -> Result<Served, (u32, String)> {
    let unknown = || (REP_ERR_UNKNOWN, format!("no export named {name:?}"));
    let served = offer.exports.find(name).ok_or_else(unknown)?;
    if !served.export.allow.admits(peer) {
        ExportCounters::add(&served.counters.refused, 1);
        offer.refused.record(|held_back| {
            tracing::warn!(export = %served.name, %peer, held_back, "nbd: client refused by the export's allow list");
        });
        return Err(unknown());
    }
    Ok(served)
}

fn finish(served: Served, state: &Options, offer: &Offer<'_>) -> Negotiated {
    // Contexts chosen for another export do not carry over.
    let block_status = state.allocation_for.as_deref() == Some(served.name.as_str());
    let caps = served.export.device().capabilities();
    let agreed = Agreed {
        size: served.export.device().size(),
        read_only: served.export.read_only || caps.read_only,
        structured: state.structured,
        extended: state.extended,
        block_status,
        max_payload: offer.max_payload as u64,
    };
    Negotiated { served, agreed }
}

/// Whether a metadata query names `base:allocation`, for listing (where
/// a namespace alone matches too) or for selecting.
fn selects_allocation(query: &str, listing: bool) -> bool {
    query == BASE_ALLOCATION || (listing && query == "base:")
}

async fn meta_context<S: AsyncWrite + Unpin>(
    io: &mut S,
    peer: Peer,
    offer: &Offer<'_>,
    state: &mut Options,
    opt: u32,
    data: &[u8],
) -> io::Result<()> {
    if !state.structured {
        let why = b"metadata contexts need structured replies first";
        return reply(io, opt, REP_ERR_INVALID, why).await;
    }
    let req = match wire::parse_meta_request(data) {
        Ok(r) => r,
        Err(e) => return reply(io, opt, REP_ERR_INVALID, e.0.as_bytes()).await,
    };
    let served = match admit(offer, peer, &req.export) {
        Ok(s) => s,
        Err((kind, why)) => return reply(io, opt, kind, why.as_bytes()).await,
    };
    let listing = opt == OPT_LIST_META_CONTEXT;
    let chosen = if listing && req.queries.is_empty() {
        true
    } else {
        req.queries.iter().any(|q| selects_allocation(q, listing))
    };
    if !listing {
        state.allocation_for = chosen.then(|| served.name.clone());
    }
    if chosen {
        let m = wire::meta_context(ALLOCATION_CONTEXT, BASE_ALLOCATION);
        reply(io, opt, REP_META_CONTEXT, &m).await?;
    }
    reply(io, opt, REP_ACK, &[]).await
}
