//! One TCP connection: login, then the full feature phase.

mod command;
mod exec;
mod ffp;
mod gate;
mod io;
mod login_phase;
mod placed;
mod pool;
mod prestart;
mod ring;
mod sink;
mod spin;
mod tasks;
mod text;
mod tmf;
mod upkeep;
mod write_data;
mod writer;

use std::net::SocketAddr;
use std::sync::Arc;

use peer_limits::PreLoginTicket;
use scsi_api::Nexus;
use tokio::net::TcpStream;

use crate::negotiation::SessionParams;
use crate::server::{PortalCount, Server, Target};
use crate::session_info::SessionUsage;

/// What a logged-in connection knows about its session.
pub(crate) struct SessionCtx {
    pub id: u64,
    pub tsih: u16,
    pub cid: u16,
    pub initiator_name: Arc<str>,
    pub isid: [u8; 6],
    /// `None` for a discovery session.
    pub target: Option<Arc<Target>>,
    pub nexus: Option<Nexus>,
    pub params: SessionParams,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    /// InitiatorAlias from the login, if given.
    pub initiator_alias: Option<String>,
    pub usage: SessionUsage,
}

/// Serve one accepted connection until it ends. `ticket` holds its place
/// among the connections logging in, until it has.
pub(crate) async fn run(
    server: Arc<Server>,
    mut stream: TcpStream,
    peer: SocketAddr,
    ticket: PreLoginTicket,
    portal: &PortalCount,
) {
    let local = match stream.local_addr() {
        Ok(a) => a,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "connection without local address");
            return;
        }
    };
    // Responses are small and latency-bound.
    let _ = stream.set_nodelay(true);
    let established = login_phase::login(&server, &mut stream, peer, local, &ticket, portal).await;
    drop(ticket);
    let Some(established) = established else {
        return;
    };
    server.registry.lock().describe(established.ctx.clone());
    ffp::run(server, stream, established).await;
}
