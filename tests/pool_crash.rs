//! The daemon serving thin volumes is killed with SIGKILL at random points
//! of a workload of writes (some FUA), UNMAPs and SYNCHRONIZE CACHE; between
//! runs the offline CLI snapshots, clones and deletes. After every restart
//! each write acknowledged before the last completed SYNCHRONIZE CACHE, or
//! with FUA, reads back exactly (later ones read as one of the values the
//! block had since), and `openarray pool check` finds nothing wrong.
//!
//! `POOL_CRASH_SEED` replays a run; the seed is printed.
mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::iscsi::{LoginParams, Session};
use common::rng::Rng;
use common::Daemon;

const IQN: &str = "iqn.2026-11.org.openarray.test:crash";
const ROUNDS: usize = 50;
/// The whole test stops starting rounds after this long.
const BUDGET: Duration = Duration::from_secs(60);
const BLOCK: u32 = 512;
/// Writes and the model work in 4 KiB pieces.
const PIECE: usize = 4096;
const VOLUME_BYTES: usize = 8 << 20;
const PIECES: usize = VOLUME_BYTES / PIECE;
const UNIT: usize = 64 << 10;
/// LUN 0 is the volume `v`; LUN 1 the volume `c`, a clone of a snapshot of
/// `v` once the CLI made one.
const LUNS: [u64; 2] = [0, 1];

fn config(dir: &Path) -> String {
    let mut text = format!(
        r#"
[[pool]]
name = "tank"
devices = ["{d}/tank.img"]
device_size = "64M"
unit_size = "64K"
"#,
        d = dir.display()
    );
    for name in ["v", "c"] {
        text += &format!(
            "\n[[device]]\nname = \"{name}\"\nkind = \"volume\"\npool = \"tank\"\nsize = \"8M\"\n"
        );
    }
    text += &format!(
        "\n[[target]]\nname = \"{IQN}\"\n[[target.lun]]\nlun = 0\ndevice = \"v\"\n\
         [[target.lun]]\nlun = 1\ndevice = \"c\"\n"
    );
    text
}

/// What one LUN may hold: per 4 KiB piece, the tag that is durable and
/// the tags written since (acknowledged or in flight when the kill came).
/// Tag 0 is zeros.
#[derive(Clone)]
struct Model {
    durable: Vec<u64>,
    since: Vec<Vec<u64>>,
}

impl Model {
    fn new() -> Model {
        Model {
            durable: vec![0; PIECES],
            since: vec![Vec::new(); PIECES],
        }
    }

    /// SYNCHRONIZE CACHE completed: every write before it is durable.
    fn synced(&mut self) {
        for (d, s) in self.durable.iter_mut().zip(&mut self.since) {
            if let Some(&last) = s.last() {
                *d = last;
            }
            s.clear();
        }
    }
}

/// A piece's content: its tag and its own index, repeated.
fn content(tag: u64, piece: usize) -> Vec<u8> {
    if tag == 0 {
        return vec![0; PIECE];
    }
    let mut out = Vec::with_capacity(PIECE);
    while out.len() < PIECE {
        out.extend_from_slice(&tag.to_be_bytes());
        out.extend_from_slice(&(piece as u64).to_be_bytes());
    }
    out
}

fn openarray(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_openarray"))
        .args(args)
        .output()
        .expect("run openarray");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn volume(cfg: &str, args: &[&str]) {
    let mut all = vec!["volume", args[0], "-c", cfg, "--pool", "tank"];
    all.extend_from_slice(&args[1..]);
    let (ok, text) = openarray(&all);
    assert!(ok, "openarray {all:?}: {text}");
}

fn login(daemon: &Daemon) -> Session {
    let params = LoginParams::normal("iqn.2026-11.org.openarray.test:host", IQN);
    Session::login(daemon.addr(), &params, Duration::from_secs(10)).expect("login")
}

/// Reads every piece of every LUN and checks it against the model, then
/// takes what was read as the durable state.
fn verify(s: &mut Session, models: &mut [Model; 2], round: usize) {
    for (lun, model) in LUNS.iter().zip(models.iter_mut()) {
        let blocks_per_read = (1 << 20) / BLOCK as usize;
        for chunk in 0..VOLUME_BYTES >> 20 {
            let lba = (chunk * blocks_per_read) as u32;
            let data = s
                .read10(*lun, lba, blocks_per_read as u16, BLOCK)
                .expect("READ(10) after restart");
            for (i, got) in data.chunks(PIECE).enumerate() {
                let piece = chunk * ((1 << 20) / PIECE) + i;
                let allowed: Vec<u64> = std::iter::once(model.durable[piece])
                    .chain(model.since[piece].iter().copied())
                    .collect();
                let found = allowed.iter().find(|&&t| content(t, piece) == got);
                let Some(&tag) = found else {
                    panic!(
                        "round {round}: LUN {lun} piece {piece} holds none of the tags {allowed:?} \
                         (durable first); it starts {:02x?}",
                        &got[..16]
                    );
                };
                model.durable[piece] = tag;
                model.since[piece].clear();
            }
        }
    }
}

/// Writes, UNMAPs and flushes until the connection dies under the kill.
fn workload(s: &mut Session, models: &mut [Model; 2], rng: &mut Rng, tag: &mut u64) {
    loop {
        let l = rng.below(2) as usize;
        let lun = LUNS[l];
        let model = &mut models[l];
        let done = match rng.below(20) {
            0 => {
                let r = s.command(lun, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0);
                if matches!(&r, Ok(c) if c.status == 0) {
                    model.synced();
                }
                r.map(|_| ())
            }
            1 => {
                // UNMAP of one whole unit.
                let unit = rng.below((VOLUME_BYTES / UNIT) as u64) as usize;
                let first = unit * UNIT / PIECE;
                for p in first..first + UNIT / PIECE {
                    model.since[p].push(0);
                }
                let lba = (unit * UNIT) as u64 / u64::from(BLOCK);
                let blocks = (UNIT as u32) / BLOCK;
                let mut list = vec![0u8; 24];
                list[0..2].copy_from_slice(&22u16.to_be_bytes());
                list[2..4].copy_from_slice(&16u16.to_be_bytes());
                list[8..16].copy_from_slice(&lba.to_be_bytes());
                list[16..20].copy_from_slice(&blocks.to_be_bytes());
                let cdb = [0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0];
                s.command(lun, &cdb, &list, 0).map(|_| ())
            }
            _ => {
                *tag += 1;
                let piece = rng.below(PIECES as u64) as usize;
                let fua = rng.one_in(8);
                model.since[piece].push(*tag);
                let blocks = (PIECE / BLOCK as usize) as u16;
                let lba = (piece * PIECE) as u32 / BLOCK;
                let mut cdb = common::iscsi::rw10_cdb(0x2a, lba, blocks);
                if fua {
                    cdb[1] |= 0x08;
                }
                let r = s.command(lun, &cdb, &content(*tag, piece), 0);
                if fua && matches!(&r, Ok(c) if c.status == 0) {
                    model.durable[piece] = *tag;
                    model.since[piece].clear();
                }
                r.map(|_| ())
            }
        };
        if done.is_err() {
            return;
        }
    }
}

fn check_clean(cfg: &str, round: usize) {
    let (ok, text) = openarray(&["pool", "check", "-c", cfg, "tank"]);
    assert!(ok, "round {round}: pool check:\n{text}");
}

#[test]
fn sigkill_at_random_points_loses_nothing_acknowledged() {
    let seed = std::env::var("POOL_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("POOL_CRASH_SEED={seed}");
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg_path = dir.path().join("openarray.toml");
    std::fs::write(&cfg_path, config(dir.path())).expect("write config");
    let cfg = cfg_path.to_str().expect("utf-8");

    let mut models = [Model::new(), Model::new()];
    let mut tag = 0u64;
    let mut has_snapshot = false;
    let start = Instant::now();
    let mut rounds = 0;
    while rounds < ROUNDS && start.elapsed() < BUDGET {
        let daemon = Daemon::start_portals(Some(&cfg_path), 1);
        let mut s = login(&daemon);
        verify(&mut s, &mut models, rounds);
        let pid = daemon.pid() as i32;
        let delay = Duration::from_millis(rng.range(5, 250));
        let killer = std::thread::spawn(move || {
            std::thread::sleep(delay);
            // SAFETY: kill(2) on our own child, still unreaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        });
        workload(&mut s, &mut models, &mut rng, &mut tag);
        killer.join().expect("killer thread");
        drop(s);
        drop(daemon);
        check_clean(cfg, rounds);

        // Offline volume operations between runs.
        match rng.below(3) {
            0 => {
                // `c` becomes a clone of a fresh snapshot of `v`: what `v`
                // recovered to, which the model bounds the same way.
                volume(cfg, &["delete", "c"]);
                if has_snapshot {
                    volume(cfg, &["delete", "s"]);
                }
                volume(cfg, &["snapshot", "v", "s"]);
                volume(cfg, &["clone", "s", "c"]);
                models[1] = models[0].clone();
                has_snapshot = true;
                if rng.one_in(2) {
                    // The clone keeps its data without its snapshot.
                    volume(cfg, &["delete", "s"]);
                    has_snapshot = false;
                }
                check_clean(cfg, rounds);
            }
            1 => {
                // Another snapshot beside the first, deleted right away:
                // frees nothing the others use.
                volume(cfg, &["snapshot", "c", "t"]);
                volume(cfg, &["delete", "t"]);
                check_clean(cfg, rounds);
            }
            _ => {}
        }
        rounds += 1;
    }
    let daemon = Daemon::start_portals(Some(&cfg_path), 1);
    let mut s = login(&daemon);
    verify(&mut s, &mut models, rounds);
    drop(s);
    assert!(daemon.terminate().success());
    check_clean(cfg, rounds);
    eprintln!(
        "{rounds} SIGKILL rounds, {tag} writes, in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    assert!(rounds >= 20, "only {rounds} rounds fit in the time budget");
}
