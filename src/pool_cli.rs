//! `openarray pool ...` and `openarray volume ...`: administration of
//! storage pools and their volumes. With `--socket` the running daemon does
//! the work (its pools stay open under the LUNs it serves); with `--config`
//! and no daemon answering, this process opens the pools of the
//! configuration file itself (the metadata store admits one process at a
//! time). Both paths give the same answers: those of `volume_api`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::Subcommand;
use serde_json::{json, Value};

use crate::output::{fail, print_json, Format, EXIT_PROBLEM};
use daemon::volume_api::{self, percent_encode, Offline};

/// How often a long operation's progress is asked for.
const POLL: Duration = Duration::from_millis(200);

#[derive(Subcommand)]
pub enum PoolCommand {
    /// Every pool of the configuration: size, use, volumes.
    List {
        #[command(flatten)]
        at: Where,
        #[command(flatten)]
        format: Format,
    },
    /// One pool and its volumes.
    Show {
        #[command(flatten)]
        at: Where,
        pool: String,
        #[command(flatten)]
        format: Format,
    },
    /// Size, use and volumes of every pool (or one).
    Status {
        #[command(flatten)]
        at: Where,
        pool: Option<String>,
        #[command(flatten)]
        format: Format,
    },
    /// Format the devices of a pool the configuration declares (nothing
    /// happens to a pool that exists).
    Create {
        #[command(flatten)]
        at: Where,
        pool: String,
        #[command(flatten)]
        format: Format,
    },
    /// Verify that every unit is owned exactly as its reference count says
    /// (exit status 1 on any problem).
    Check {
        #[command(flatten)]
        at: Where,
        pool: Option<String>,
    },
    /// Remove a pool's metadata and the superblocks of its devices, while
    /// the daemon is stopped. A pool that holds volumes needs --force.
    Destroy {
        #[arg(long, short, value_name = "FILE")]
        config: PathBuf,
        pool: String,
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand)]
pub enum VolumeCommand {
    /// Volumes and snapshots of a pool.
    List {
        #[command(flatten)]
        at: PoolArg,
        #[command(flatten)]
        format: Format,
    },
    /// One volume or snapshot.
    Show {
        #[command(flatten)]
        at: PoolArg,
        name: String,
        #[command(flatten)]
        format: Format,
    },
    /// A new volume; SIZE as bytes or e.g. 10G. --thick allocates all of it
    /// now (zeros), reporting progress.
    Create {
        #[command(flatten)]
        at: PoolArg,
        name: String,
        size: String,
        #[arg(long)]
        thick: bool,
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
    /// Grow a volume to SIZE, or shrink one no LUN serves to a whole
    /// number of allocation units.
    Resize {
        #[command(flatten)]
        at: PoolArg,
        name: String,
        size: String,
    },
    /// Delete a volume or snapshot, freeing units no one else maps
    /// (reporting progress).
    Delete {
        #[command(flatten)]
        at: PoolArg,
        name: String,
    },
}

/// Where the pools are: the daemon's socket, or a configuration file.
#[derive(clap::Args)]
pub struct Where {
    /// The configuration file, used when no daemon answers on --socket.
    #[arg(long, short, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The running daemon's administration socket (without --config:
    /// /run/openarray.sock).
    #[arg(long, value_name = "PATH", env = crate::api_client::SOCKET_ENV)]
    socket: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct PoolArg {
    #[command(flatten)]
    at: Where,
    /// The pool; may be left out when there is only one.
    #[arg(long, value_name = "POOL")]
    pool: Option<String>,
}

impl PoolArg {
    /// The pool named, or the only one there is.
    fn name(&self) -> anyhow::Result<String> {
        if let Some(p) = &self.pool {
            return Ok(p.clone());
        }
        let answer = Via::choose(&self.at)?.call("GET", "/v1/pools", Value::Null)?;
        let names: Vec<&str> = answer["pools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["name"].as_str())
            .collect();
        match names.as_slice() {
            [one] => Ok(one.to_string()),
            [] => anyhow::bail!("no pool is configured"),
            many => anyhow::bail!(
                "--pool is needed: there are {} pools ({})",
                many.len(),
                many.join(", ")
            ),
        }
    }
}

/// Who answers the requests.
enum Via {
    Daemon(PathBuf),
    Here(Box<Offline>),
}

impl Via {
    /// The daemon when one answers on the socket given; the configuration
    /// file otherwise; the default socket when neither is given.
    fn choose(at: &Where) -> anyhow::Result<Via> {
        let reachable = |s: &Path| std::os::unix::net::UnixStream::connect(s).is_ok();
        match (&at.socket, &at.config) {
            (Some(socket), _) if reachable(socket) => Ok(Via::Daemon(socket.clone())),
            (_, Some(config)) => {
                let cfg = crate::output::load_config(config)?;
                Ok(Via::Here(Box::new(Offline::new(cfg))))
            }
            (Some(socket), None) => Ok(Via::Daemon(socket.clone())),
            (None, None) => Ok(Via::Daemon(crate::admin_cli::DEFAULT_SOCKET.into())),
        }
    }

    /// One request; an error status becomes an error with its message.
    fn call(&self, method: &str, path: &str, body: Value) -> anyhow::Result<Value> {
        let bytes = if body.is_null() {
            Vec::new()
        } else {
            body.to_string().into_bytes()
        };
        let (status, answer) = match self {
            Via::Daemon(socket) => crate::admin_cli::request(socket, method, path, &bytes, None)?,
            Via::Here(offline) => volume_api::answer(&**offline, method, path, &bytes)
                .ok_or_else(|| anyhow!("no such resource {path}"))?,
        };
        if status >= 400 {
            let why = answer["error"].as_str().unwrap_or("failed");
            if why.contains("already open") {
                bail!("{why} (is the daemon serving this pool? pass --socket)");
            }
            bail!("{why}");
        }
        Ok(answer)
    }

    /// Follows a long operation to its end, printing its progress.
    fn follow(&self, job: &Value) -> anyhow::Result<()> {
        let pool = job["pool"].as_str().unwrap_or_default();
        let path = format!("/v1/pools/{}/jobs/{}", percent_encode(pool), job["id"]);
        let mut shown = None;
        loop {
            let j = self.call("GET", &path, Value::Null)?;
            let percent = j["percent"].as_u64();
            if percent != shown {
                println!(
                    "{} {}: {}% ({} of {} units)",
                    j["operation"].as_str().unwrap_or("job"),
                    j["volume"].as_str().unwrap_or(""),
                    percent.unwrap_or(0),
                    j["done"],
                    j["total"]
                );
                shown = percent;
            }
            match j["state"].as_str() {
                Some("running") => std::thread::sleep(POLL),
                Some("done") => return Ok(()),
                _ => bail!("{}", j["error"].as_str().unwrap_or("the operation failed")),
            }
        }
    }
}

fn print_volumes(volumes: &Value, f: &Format) {
    for v in volumes.as_array().into_iter().flatten() {
        println!(
            "  {:8} {:24} size {:>14}  mapped {:>14}  own {:>14}{}{}",
            v["kind"].as_str().unwrap_or(""),
            v["name"].as_str().unwrap_or(""),
            f.size_of(&v["size"]),
            f.size_of(&v["mapped"]),
            f.size_of(&v["own"]),
            v["parent"]
                .as_str()
                .map(|p| format!("  parent {p}"))
                .unwrap_or_default(),
            v["device"]
                .as_str()
                .map(|d| format!("  served by {d}"))
                .unwrap_or_default(),
        );
    }
}

fn print_pool(p: &Value, f: &Format) {
    if let Some(e) = p["error"].as_str() {
        println!("pool {}: {e}", p["name"].as_str().unwrap_or(""));
        return;
    }
    println!(
        "pool {}: size {} used {} free {} (unit {})",
        p["name"].as_str().unwrap_or(""),
        f.size_of(&p["size"]),
        f.size_of(&p["used"]),
        f.size_of(&p["free"]),
        f.size_of(&p["unit_size"]),
    );
    println!("  {}", space_line(p, f));
    print_volumes(&p["volumes"], f);
}

/// The pools as text, or as one JSON array.
fn print_pools(pools: &[Value], f: &Format) {
    if f.json {
        print_json(&Value::Array(pools.to_vec()));
    } else {
        pools.iter().for_each(|p| print_pool(p, f));
    }
}

/// How far the pool is over-committed, its soft threshold and the writes
/// it refused.
fn space_line(p: &Value, f: &Format) -> String {
    let mut line = format!(
        "provisioned {} ({:.2}× the pool{})",
        f.size_of(&p["provisioned"]),
        p["overcommit"].as_f64().unwrap_or(0.0),
        p["max_overcommit"]
            .as_f64()
            .map(|m| format!(", at most {m}×"))
            .unwrap_or_default()
    );
    match p["soft_threshold"].as_u64() {
        Some(_) => line.push_str(&format!(
            "; soft threshold {} (reached {} times)",
            f.size_of(&p["soft_threshold"]),
            p["soft_threshold_reached"]
        )),
        None => line.push_str("; no soft threshold"),
    }
    line.push_str(&format!(
        "; {} writes refused for want of space",
        p["allocation_failures"]
    ));
    line
}

/// After a volume is created, cloned or grown: how far its pool is
/// over-committed now.
fn print_overcommit(v: &Value) {
    let Some(ratio) = v["pool_overcommit"].as_f64() else {
        return;
    };
    let how = if ratio > 1.0 {
        "over-committed"
    } else {
        "not over-committed"
    };
    println!(
        "pool {}: volumes of {} bytes on {} bytes, {how} ({ratio:.2}×)",
        v["pool"].as_str().unwrap_or(""),
        v["pool_provisioned"],
        v["pool_size"],
    );
}

/// The pools named, or every pool.
fn pools(via: &Via, only: Option<&str>) -> anyhow::Result<Vec<Value>> {
    match only {
        Some(name) => Ok(vec![via.call(
            "GET",
            &format!("/v1/pools/{}", percent_encode(name)),
            Value::Null,
        )?]),
        None => {
            let all = via.call("GET", "/v1/pools", Value::Null)?;
            let mut out = Vec::new();
            for p in all["pools"].as_array().into_iter().flatten() {
                match p["name"].as_str() {
                    Some(name) if p["error"].is_null() => {
                        out.extend(pools(via, Some(name))?);
                    }
                    _ => out.push(p.clone()),
                }
            }
            Ok(out)
        }
    }
}

fn pool_command(cmd: PoolCommand) -> anyhow::Result<bool> {
    match cmd {
        PoolCommand::List { at, format } => print_pools(&pools(&Via::choose(&at)?, None)?, &format),
        PoolCommand::Show { at, pool, format } => {
            print_pools(&pools(&Via::choose(&at)?, Some(&pool))?, &format);
        }
        PoolCommand::Status { at, pool, format } => {
            print_pools(&pools(&Via::choose(&at)?, pool.as_deref())?, &format);
        }
        PoolCommand::Create { at, pool, format } => {
            let p = Via::choose(&at)?.call(
                "POST",
                &format!("/v1/pools/{}", percent_encode(&pool)),
                Value::Null,
            )?;
            print_pools(&[p], &format);
        }
        PoolCommand::Check { at, pool } => {
            let via = Via::choose(&at)?;
            let names: Vec<String> = match pool {
                Some(p) => vec![p],
                None => pools(&via, None)?
                    .iter()
                    .filter_map(|p| p["name"].as_str().map(String::from))
                    .collect(),
            };
            let mut clean = true;
            for name in names {
                let path = format!("/v1/pools/{}/check", percent_encode(&name));
                let r = via.call("POST", &path, Value::Null)?;
                let ok = r["clean"].as_bool() == Some(true);
                println!(
                    "pool {name}: {} units, {} used, {} volumes, {} mappings: {}",
                    r["total_units"],
                    r["used_units"],
                    r["volumes"],
                    r["mappings"],
                    if ok { "clean" } else { "PROBLEMS" }
                );
                for problem in r["problems"].as_array().into_iter().flatten() {
                    println!("  {}", problem.as_str().unwrap_or(""));
                }
                clean &= ok;
            }
            return Ok(clean);
        }
        PoolCommand::Destroy {
            config,
            pool,
            force,
        } => destroy(&config, &pool, force)?,
    }
    Ok(true)
}

/// Removes a pool while no daemon has it open: its metadata, and the
/// superblock at the start of each device (so the devices are not taken
/// for the pool's again). The data files themselves stay.
fn destroy(config: &Path, name: &str, force: bool) -> anyhow::Result<()> {
    let cfg = crate::output::load_config(config)?;
    let p = cfg
        .pools
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| anyhow!("{}: no [[pool]] named {name}", config.display()))?;
    if !p.metadata.exists() {
        bail!(
            "pool {name} does not exist ({} is missing)",
            p.metadata.display()
        );
    }
    {
        let open = control::open_pool(&cfg, p).with_context(|| format!("pool {name}"))?;
        let volumes = open.volumes();
        if !volumes.is_empty() && !force {
            let names: Vec<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
            bail!(
                "pool {name} holds {} (pass --force to destroy it anyway)",
                names.join(", ")
            );
        }
    }
    for member in &p.devices {
        let device = match member {
            control::PoolMember::Path(path) => {
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(path)
                    .with_context(|| format!("{}", path.display()))?;
                use std::io::Write;
                f.write_all(&[0u8; 4096])?;
                f.sync_all()?;
                continue;
            }
            control::PoolMember::Device(name) => {
                control::open_device(&cfg, name).with_context(|| format!("device {name}"))?
            }
        };
        device.write_at(&[0u8; 4096], 0, true)?;
        device.flush()?;
    }
    std::fs::remove_file(&p.metadata)
        .with_context(|| format!("cannot remove {}", p.metadata.display()))?;
    println!("pool {name} destroyed");
    Ok(())
}

fn volume_command(cmd: VolumeCommand) -> anyhow::Result<()> {
    let base = |at: &PoolArg| -> anyhow::Result<String> {
        Ok(format!("/v1/volumes/{}", percent_encode(&at.name()?)))
    };
    let one = |at: &PoolArg, name: &str| -> anyhow::Result<String> {
        Ok(format!("{}/{}", base(at)?, percent_encode(name)))
    };
    let (at, method, path, body) = match cmd {
        VolumeCommand::List { at, format } => {
            let path = base(&at)?;
            let answer = Via::choose(&at.at)?.call("GET", &path, Value::Null)?;
            if format.json {
                print_json(&answer["volumes"]);
            } else {
                print_volumes(&answer["volumes"], &format);
            }
            return Ok(());
        }
        VolumeCommand::Show { at, name, format } => {
            let path = one(&at, &name)?;
            let answer = Via::choose(&at.at)?.call("GET", &path, Value::Null)?;
            if format.json {
                print_json(&answer);
            } else {
                print_volumes(&json!([answer]), &format);
            }
            return Ok(());
        }
        VolumeCommand::Create {
            at,
            name,
            size,
            thick,
        } => {
            let path = base(&at)?;
            let body = json!({ "name": name, "size": size, "thick": thick });
            (at, "POST", path, body)
        }
        VolumeCommand::Snapshot { at, volume, name } => {
            let path = format!("{}/snapshot", one(&at, &volume)?);
            (at, "POST", path, json!({ "name": name }))
        }
        VolumeCommand::Clone { at, snapshot, name } => {
            let path = format!("{}/clone", one(&at, &snapshot)?);
            (at, "POST", path, json!({ "name": name }))
        }
        VolumeCommand::Rollback {
            at,
            volume,
            snapshot,
        } => {
            let path = format!("{}/rollback", one(&at, &volume)?);
            (at, "POST", path, json!({ "snapshot": snapshot }))
        }
        VolumeCommand::Promote { at, clone } => {
            let path = format!("{}/promote", one(&at, &clone)?);
            (at, "POST", path, Value::Null)
        }
        VolumeCommand::Resize { at, name, size } => {
            let path = format!("{}/resize", one(&at, &name)?);
            (at, "POST", path, json!({ "size": size }))
        }
        VolumeCommand::Delete { at, name } => {
            let path = one(&at, &name)?;
            (at, "DELETE", path, Value::Null)
        }
    };
    let via = Via::choose(&at.at)?;
    let answer = via.call(method, &path, body)?;
    print_overcommit(&answer);
    print_overcommit(&answer["volume"]);
    if !answer["job"].is_null() {
        via.follow(&answer["job"])?;
    }
    Ok(())
}

pub fn run_pool(cmd: PoolCommand) -> ExitCode {
    match pool_command(cmd) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(EXIT_PROBLEM),
        Err(e) => fail(&e),
    }
}

pub fn run_volume(cmd: VolumeCommand) -> ExitCode {
    match volume_command(cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}
