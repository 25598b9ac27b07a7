//! `openarray`: the storage array daemon and its command line.

mod admin_cli;
mod api_client;
mod bench_cli;
mod cache_cli;
mod check_config;
mod completions;
mod console_cli;
mod device_cli;
mod edit_cli;
mod export_cli;
mod ha_cli;
mod output;
mod pool_cli;
mod raid_cli;
mod session_cli;
mod stat_cli;
mod status_cli;
mod target_cli;
mod witness_cli;

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use daemon::serve;
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "openarray",
    version,
    about = "Software storage array: SCSI LUNs over iSCSI"
)]
struct Cli {
    /// Log filter such as `info`, `debug` or `iscsi=trace,info`.
    /// Without it, RUST_LOG is used, else `info`.
    #[arg(long, global = true, value_name = "FILTER")]
    log_level: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the configured targets until SIGTERM or SIGINT.
    Serve {
        /// Configuration file; without it, /etc/openarray/openarray.toml
        /// (or the file OPENARRAY_CONFIG names) when it exists, else the
        /// built-in default (one 1 GiB RAM LUN on 127.0.0.1:3260).
        #[arg(long, short, value_name = "FILE")]
        config: Option<PathBuf>,

        /// Listen here instead of the configured portals; repeatable.
        /// IPv6 as [::1]:3260.
        #[arg(long, value_name = "ADDR:PORT", value_parser = control::parse_listen)]
        listen: Vec<SocketAddr>,

        /// Serve NBD here instead of the configured `[nbd] listen`;
        /// repeatable. HOST:PORT, HOST (port 10809), [::1]:PORT or
        /// unix:/PATH.
        #[arg(long, value_name = "ADDR", value_parser = nbd::parse_listen)]
        nbd_listen: Vec<nbd::ListenAddr>,

        /// Serve NVMe/TCP here instead of the configured `[nvmf] listen`;
        /// repeatable. HOST:PORT or HOST (port 4420).
        #[arg(long, value_name = "ADDR", value_parser = nvmf::parse_listen)]
        nvmf_listen: Vec<SocketAddr>,

        /// Serve the administration API (`openarray config ...`) on this
        /// unix socket, usable by its owner only; `none` turns it off.
        /// Without it, /run/openarray.sock.
        #[arg(long, value_name = "PATH|none")]
        admin_socket: Option<PathBuf>,

        /// Also answer Prometheus scrapes (`GET /metrics`) on this TCP
        /// address; the administration socket serves `/metrics` as well.
        #[arg(long, value_name = "ADDR:PORT")]
        metrics_listen: Option<SocketAddr>,
    },
    /// Validate a configuration file and print every problem found (exit
    /// status 1 if any): the checks of `serve`, and whether the paths it
    /// writes can be created.
    CheckConfig {
        /// Without it, the file `serve` would use by default.
        #[arg(value_name = "FILE")]
        file: Option<PathBuf>,
    },
    /// Print the built-in default configuration.
    DefaultConfig,
    /// Storage pools: through a running daemon with --socket, or from the
    /// configuration file while it is stopped.
    #[command(subcommand)]
    Pool(pool_cli::PoolCommand),
    /// Thin volumes, snapshots and clones of a pool: through a running daemon
    /// with --socket, or from the configuration file while it is stopped.
    #[command(subcommand)]
    Volume(pool_cli::VolumeCommand),
    /// The running configuration of a daemon: show, diff, apply, save.
    Config {
        #[command(flatten)]
        api: api_client::ApiArgs,
        #[command(subcommand)]
        command: admin_cli::ConfigCommand,
    },
    #[command(flatten)]
    Edit(edit_cli::EditCommand),
    /// I/O per target, LUN and initiator of a running daemon, like iostat:
    /// IOPS, throughput, latency percentiles and queue depth per interval.
    Stat(stat_cli::StatArgs),
    /// Cache devices of a running daemon: status, flush, detach, attach,
    /// mode.
    Cache {
        #[command(flatten)]
        api: api_client::ApiArgs,
        #[command(subcommand)]
        command: cache_cli::CacheCommand,
    },
    /// The mirrors of a node of an HA pair: status, promote, demote.
    Ha {
        #[command(flatten)]
        api: api_client::ApiArgs,
        #[command(subcommand)]
        command: ha_cli::HaCommand,
    },
    /// The third vote of HA pairs: grant each mirror's ownership lease
    /// to one node at a time.
    Witness(witness_cli::WitnessArgs),
    /// Live iSCSI sessions of a running daemon: list, show, kill.
    Session {
        #[command(flatten)]
        api: api_client::ApiArgs,
        #[command(subcommand)]
        command: session_cli::SessionCommand,
    },
    /// RAID devices of a running daemon: status, members failed, removed,
    /// added or replaced by hand, scrub.
    Raid {
        #[command(flatten)]
        api: api_client::ApiArgs,
        #[command(subcommand)]
        command: raid_cli::RaidCommand,
    },
    /// Targets, portals, sessions, LUNs and pools of a running daemon and
    /// what is degraded; exit status 0 healthy, 1 degraded, 2 not reached.
    Status(status_cli::StatusArgs),
    /// The address of the running daemon's web console (served on its TCP
    /// API, `[daemon] api_listen`).
    Console(console_cli::ConsoleArgs),
    /// Benchmark an iSCSI LUN or NBD export (any array, local or remote):
    /// a fio-style matrix written up as a report folder.
    Bench(bench_cli::BenchArgs),
    /// Print the shell completion script for SHELL (bash, zsh, fish, ...).
    Completions {
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), or write one page per command to DIR.
    Man {
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

fn init_logging(level: Option<&str>) -> Result<(), String> {
    let filter = match level {
        Some(level) => {
            EnvFilter::try_new(level).map_err(|e| format!("bad --log-level `{level}`: {e}"))?
        }
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    let ansi = std::io::stderr().is_terminal();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
    Ok(())
}

fn main() -> ExitCode {
    daemon::register_builtins();
    let cli = Cli::parse();
    if let Err(e) = init_logging(cli.log_level.as_deref()) {
        eprintln!("openarray: {e}");
        return ExitCode::from(2);
    }
    match cli.command {
        Command::Serve {
            config,
            listen,
            nbd_listen,
            nvmf_listen,
            admin_socket,
            metrics_listen,
        } => match config
            .as_deref()
            .map_or(Ok(()), output::require_file)
            .and_then(|()| {
                serve::run(
                    config.as_deref(),
                    &listen,
                    &nbd_listen,
                    &nvmf_listen,
                    &serve::AdminSocket::from_arg(admin_socket),
                    metrics_listen,
                )
            }) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => match e.downcast_ref::<control::ConfigError>() {
                // Already one `file:line:col: field: reason` per line.
                Some(config_error) => {
                    eprintln!("{config_error}");
                    ExitCode::FAILURE
                }
                None => output::fail(&e),
            },
        },
        Command::CheckConfig { file } => {
            check_config::run(&file.unwrap_or_else(serve::default_config_path))
        }
        Command::Completions { shell } => completions::completions(shell),
        Command::Man { dir } => completions::man(dir.as_deref()),
        Command::Pool(cmd) => pool_cli::run_pool(cmd),
        Command::Volume(cmd) => pool_cli::run_volume(cmd),
        Command::Config { api, command } => admin_cli::run(&api, command),
        Command::Stat(args) => stat_cli::run(args),
        Command::Session { api, command } => session_cli::run(&api, command),
        Command::Cache { api, command } => cache_cli::run(&api, command),
        Command::Ha { api, command } => ha_cli::run(&api, command),
        Command::Witness(args) => witness_cli::run(args),
        Command::Status(args) => status_cli::run(args),
        Command::Console(args) => console_cli::run(args),
        Command::Bench(args) => bench_cli::run(args),
        Command::Raid { api, command } => raid_cli::run(&api, command),
        Command::Edit(cmd) => edit_cli::run(cmd),
        Command::DefaultConfig => {
            print!("{}", control::default_config_text());
            ExitCode::SUCCESS
        }
    }
}
