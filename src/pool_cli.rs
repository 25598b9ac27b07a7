//! `openarray pool ...` and `openarray volume ...`: administration of the
//! pools a configuration file declares, while the daemon is stopped (the
//! metadata store admits one process at a time).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{anyhow, Context};
use clap::Subcommand;
use pool::{Pool, VolumeInfo, VolumeKind};

#[derive(Subcommand)]
pub enum PoolCommand {
    /// Size, use and volumes of every pool (or one).
    Status {
        #[arg(long, short, value_name = "FILE")]
        config: PathBuf,
        pool: Option<String>,
    },
    /// Verify that every unit is owned exactly as its reference count says.
    Check {
        #[arg(long, short, value_name = "FILE")]
        config: PathBuf,
        pool: Option<String>,
    },
}

#[derive(Subcommand)]
pub enum VolumeCommand {
    /// Volumes and snapshots of a pool.
    List {
        #[command(flatten)]
        at: PoolArg,
    },
    /// A new volume; SIZE as bytes or e.g. 10G.
    Create {
        #[command(flatten)]
        at: PoolArg,
        name: String,
        size: String,
    },
    /// A read-only snapshot of VOLUME named NAME.
    Snapshot {
        #[command(flatten)]
        at: PoolArg,
        volume: String,
        name: String,
    },
    /// A writable clone NAME of SNAPSHOT.
    Clone {
        #[command(flatten)]
        at: PoolArg,
        snapshot: String,
        name: String,
    },
    /// Make VOLUME read as its SNAPSHOT again.
    Rollback {
        #[command(flatten)]
        at: PoolArg,
        volume: String,
        snapshot: String,
    },
    /// Swap the lineage of a clone and its origin.
    Promote {
        #[command(flatten)]
        at: PoolArg,
        clone: String,
    },
    /// Grow a volume to SIZE.
    Resize {
        #[command(flatten)]
        at: PoolArg,
        name: String,
        size: String,
    },
    /// Delete a volume or snapshot, freeing units no one else maps.
    Delete {
        #[command(flatten)]
        at: PoolArg,
        name: String,
    },
}

#[derive(clap::Args)]
pub struct PoolArg {
    #[arg(long, short, value_name = "FILE")]
    config: PathBuf,
    #[arg(long, value_name = "POOL")]
    pool: String,
}

fn open(config: &Path, only: Option<&str>) -> anyhow::Result<Vec<Arc<Pool>>> {
    let cfg = control::load_config(config).map_err(|e| anyhow!("{e}"))?;
    let chosen: Vec<_> = cfg
        .pools
        .iter()
        .filter(|p| only.is_none_or(|n| p.name == n))
        .collect();
    if chosen.is_empty() {
        return Err(anyhow!(
            "{}: no [[pool]]{}",
            config.display(),
            only.map(|n| format!(" named {n}")).unwrap_or_default()
        ));
    }
    chosen
        .into_iter()
        .map(|p| control::open_pool(p).with_context(|| format!("pool {}", p.name)))
        .collect()
}

fn size(text: &str) -> anyhow::Result<u64> {
    control::parse_size(text).map_err(|e| anyhow!(e))
}

fn print_volumes(volumes: &[VolumeInfo], unit: u64) {
    for v in volumes {
        let kind = match v.kind {
            VolumeKind::Volume => "volume",
            VolumeKind::Snapshot => "snapshot",
        };
        println!(
            "  {kind:8} {:24} size {:>14}  mapped {:>14}  own {:>14}{}",
            v.name,
            v.size,
            v.mapped_units * unit,
            v.exclusive_units * unit,
            v.parent
                .as_deref()
                .map(|p| format!("  parent {p}"))
                .unwrap_or_default()
        );
    }
}

fn pool_command(cmd: PoolCommand) -> anyhow::Result<bool> {
    match cmd {
        PoolCommand::Status { config, pool } => {
            for p in open(&config, pool.as_deref())? {
                let s = p.space();
                println!(
                    "pool {}: size {} used {} free {} (unit {})",
                    p.name(),
                    s.size(),
                    s.used(),
                    s.free(),
                    s.unit_size
                );
                print_volumes(&p.volumes(), s.unit_size);
            }
            Ok(true)
        }
        PoolCommand::Check { config, pool } => {
            let mut clean = true;
            for p in open(&config, pool.as_deref())? {
                let r = p.check()?;
                println!(
                    "pool {}: {} units, {} used, {} volumes, {} mappings: {}",
                    p.name(),
                    r.total_units,
                    r.used_units,
                    r.volumes,
                    r.mappings,
                    if r.is_clean() { "clean" } else { "PROBLEMS" }
                );
                for problem in &r.problems {
                    println!("  {problem}");
                }
                clean &= r.is_clean();
            }
            Ok(clean)
        }
    }
}

fn volume_command(cmd: VolumeCommand) -> anyhow::Result<()> {
    let one = |at: &PoolArg| -> anyhow::Result<Arc<Pool>> {
        open(&at.config, Some(&at.pool))?
            .pop()
            .ok_or_else(|| anyhow!("no pool {}", at.pool))
    };
    match cmd {
        VolumeCommand::List { at } => {
            let p = one(&at)?;
            print_volumes(&p.volumes(), p.unit_size());
        }
        VolumeCommand::Create { at, name, size: s } => {
            one(&at)?.create_volume(&name, size(&s)?)?;
        }
        VolumeCommand::Snapshot { at, volume, name } => {
            one(&at)?.snapshot(&volume, &name)?;
        }
        VolumeCommand::Clone { at, snapshot, name } => {
            one(&at)?.clone_snapshot(&snapshot, &name)?;
        }
        VolumeCommand::Rollback {
            at,
            volume,
            snapshot,
        } => one(&at)?.rollback(&volume, &snapshot)?,
        VolumeCommand::Promote { at, clone } => one(&at)?.promote(&clone)?,
        VolumeCommand::Resize { at, name, size: s } => one(&at)?.resize(&name, size(&s)?)?,
        VolumeCommand::Delete { at, name } => one(&at)?.delete(&name)?,
    }
    Ok(())
}

pub fn run_pool(cmd: PoolCommand) -> ExitCode {
    match pool_command(cmd) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("openarray: {e:#}");
            ExitCode::FAILURE
        }
    }
}

pub fn run_volume(cmd: VolumeCommand) -> ExitCode {
    match volume_command(cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("openarray: {e:#}");
            ExitCode::FAILURE
        }
    }
}
