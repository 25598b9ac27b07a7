//! `openarray witness`: the third vote of an HA pair, a small process
//! that grants each mirror's ownership lease to one node at a time
//! (crate `ha`, module `witness`; docs/ha.md).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use tokio::signal::unix::{signal, SignalKind};

#[derive(Args)]
pub struct WitnessArgs {
    /// Address to listen on for the pairs' nodes.
    #[arg(long, value_name = "ADDR")]
    listen: SocketAddr,
    /// The pairs' shared secret (the `secret_file` of their `[ha]`), mode
    /// 0600 or stricter.
    #[arg(long, value_name = "FILE", default_value = "/etc/openarray/ha.secret")]
    secret_file: PathBuf,
    /// Where the grants are kept across restarts. Without it they are
    /// held in memory only, and a restarted witness could grant a node
    /// that missed writes.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
}

fn serve(args: WitnessArgs) -> anyhow::Result<()> {
    let secret = ha::secret::read_secret(&args.secret_file).map_err(anyhow::Error::msg)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    rt.block_on(async {
        let mut sigterm = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
        let mut sigint = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
        if args.state_dir.is_none() {
            tracing::warn!("no --state-dir: grants are forgotten when the witness restarts");
        }
        let witness = ha::witness::Witness::start(ha::witness::WitnessSettings {
            listen: args.listen,
            secret,
            state_dir: args.state_dir,
        })
        .await?;
        tracing::info!(addr = %witness.local_addr(), "witness listening");
        tokio::select! {
            _ = sigterm.recv() => {}
            _ = sigint.recv() => {}
        }
        tracing::info!("witness stopping");
        anyhow::Ok(())
    })
}

pub fn run(args: WitnessArgs) -> ExitCode {
    match serve(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => crate::output::fail(&e),
    }
}
