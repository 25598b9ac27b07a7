//! The daemon serving two thin volumes is killed with SIGKILL at random
//! points of a workload of writes (some FUA), UNMAPs and SYNCHRONIZE CACHE,
//! while snapshots, clones and deletes of other volumes of the same pool go
//! through the administration API. One test kills the process only; the
//! other runs the pool over a `faulty` device, a disk with a volatile write
//! cache, and cuts the power live: `device fault f0 fail` (the disk is
//! gone), `device fault f0 drop-unflushed` (its cache is lost), then the
//! kill. A third kills the process over a pool too small for what is
//! written, so that some writes are refused.
//!
//! After every kill `openarray pool check` is clean (no unit leaked or
//! owned twice); after every restart each write acknowledged before the
//! last completed SYNCHRONIZE CACHE, or with FUA, reads back exactly (later
//! ones, and refused ones, read as one of the values the block had since), every volume
//! operation the API acknowledged is there, and every acknowledged delete
//! is gone.
//!
//! `POOL_CRASH_SEED` replays a run; the seed is printed.
mod common;

use std::collections::BTreeSet;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::admin::AdminDaemon;
use common::crash_model::{content, login, openarray, seed, write_piece, Model, PIECE};
use common::free_port;
use common::iscsi::Session;
use common::rng::Rng;

const IQN: &str = "iqn.2026-11.org.openarray.test:crash";
const ROUNDS: usize = 50;
/// Each test stops starting rounds after this long.
const BUDGET: Duration = Duration::from_secs(40);
const BLOCK: u32 = 512;
const VOLUME_BYTES: usize = 8 << 20;
const PIECES: usize = VOLUME_BYTES / PIECE;
const UNIT: usize = 64 << 10;
/// LUN 0 is the volume `v`, LUN 1 the volume `c`.
const LUNS: [u64; 2] = [0, 1];
/// Snapshots and clones made through the API, at most.
const MAX_EXTRA: usize = 8;

/// How a round ends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// SIGKILL: the process dies, the disk keeps what it was given.
    Kill,
    /// The pool's disk is a `faulty` device: it fails and loses its
    /// unflushed writes, then the process dies.
    Power,
}

/// Two 8 MiB thin volumes in a pool of one device of `device_size`.
fn config(dir: &Path, device_size: &str, cut: Cut) -> String {
    let d = dir.display();
    let mut text = match cut {
        Cut::Kill => format!(
            r#"
[[pool]]
name = "tank"
devices = ["{d}/tank.img"]
device_size = "{device_size}"
unit_size = "64K"
"#
        ),
        Cut::Power => format!(
            r#"
[[device]]
name = "disk"
kind = "file"
path = "{d}/tank.img"
size = "{device_size}"
[[device]]
name = "f0"
kind = "faulty"
over = "disk"
[[pool]]
name = "tank"
devices = ["f0"]
metadata = "{d}/tank.meta"
unit_size = "64K"
"#
        ),
    };
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

/// A volume operation through the running daemon.
fn volume(socket: &str, args: &[&str]) -> (bool, String) {
    let mut all = vec!["volume", args[0], "--socket", socket, "--pool", "tank"];
    all.extend_from_slice(&args[1..]);
    openarray(&all)
}

/// The snapshots and clones the API made: those it acknowledged, those it
/// acknowledged deleting, and those whose operation the kill interrupted.
#[derive(Default)]
struct Lineage {
    present: BTreeSet<String>,
    absent: BTreeSet<String>,
    unsure: BTreeSet<String>,
    next: u64,
}

impl Lineage {
    /// Compares with what the restarted daemon lists; settles the unsure.
    fn verify(&mut self, listed: &BTreeSet<String>, round: usize) {
        for name in &self.present {
            assert!(
                listed.contains(name),
                "round {round}: acknowledged {name} is missing; listed {listed:?}"
            );
        }
        for name in &self.absent {
            assert!(
                !listed.contains(name),
                "round {round}: {name} was deleted but is listed"
            );
        }
        for name in std::mem::take(&mut self.unsure) {
            if listed.contains(&name) {
                self.present.insert(name);
            }
        }
        self.absent.clear();
    }
}

/// Names of the volumes and snapshots the daemon lists.
fn listed(socket: &str, round: usize) -> BTreeSet<String> {
    let (ok, text) = volume(socket, &["list"]);
    assert!(ok, "round {round}: volume list: {text}");
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(1).map(String::from))
        .collect()
}

/// Snapshots of `v`, clones of them and deletes through the API until the
/// daemon stops answering.
fn operations(socket: &str, lineage: &Mutex<Lineage>, rng: &mut Rng, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        let mut l = lineage.lock().unwrap();
        let snapshots: Vec<String> = l
            .present
            .iter()
            .filter(|n| n.starts_with('s'))
            .cloned()
            .collect();
        let all: Vec<String> = l.present.iter().cloned().collect();
        let n = l.next;
        l.next += 1;
        let (args, made, gone): (Vec<String>, Option<String>, Option<String>) = match rng.below(3) {
            0 if all.len() < MAX_EXTRA => {
                let name = format!("s{n}");
                (
                    vec!["snapshot".into(), "v".into(), name.clone()],
                    Some(name),
                    None,
                )
            }
            1 if !snapshots.is_empty() && all.len() < MAX_EXTRA => {
                let from = &snapshots[rng.below(snapshots.len() as u64) as usize];
                let name = format!("x{n}");
                (
                    vec!["clone".into(), from.clone(), name.clone()],
                    Some(name),
                    None,
                )
            }
            _ if !all.is_empty() => {
                let name = all[rng.below(all.len() as u64) as usize].clone();
                (vec!["delete".into(), name.clone()], None, Some(name))
            }
            _ => continue,
        };
        if let Some(name) = made.as_ref().or(gone.as_ref()) {
            l.present.remove(name);
            l.unsure.insert(name.clone());
        }
        drop(l);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, text) = volume(socket, &args);
        let mut l = lineage.lock().unwrap();
        if ok {
            if let Some(name) = made {
                l.unsure.remove(&name);
                l.present.insert(name);
            }
            if let Some(name) = gone {
                l.unsure.remove(&name);
                l.absent.insert(name);
            }
        } else if !text.contains("cannot reach")
            && !text.contains("connection")
            && !text.contains("Connection")
            // The disk failing as the power goes, before the kill.
            && !text.contains("faulty device: injected")
        {
            // Anything but the daemon's death is a failure of the API.
            if UnixStream::connect(socket).is_ok() {
                panic!("openarray volume {args:?}: {text}");
            }
        }
    }
}

/// Reads every piece of every LUN and checks it against the model, then
/// takes what was read as the durable state. Returns how many pieces
/// read an older value than the last one written.
fn verify(s: &mut Session, models: &mut [Model; 2], round: usize) -> usize {
    let mut reverted = 0;
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
                if model.since[piece].last().is_some_and(|&last| last != tag) {
                    reverted += 1;
                }
                model.durable[piece] = tag;
                model.since[piece].clear();
                model.good[piece] = None;
            }
        }
    }
    reverted
}

/// Writes, UNMAPs and flushes until the connection dies under the kill.
/// Runs until a command fails to complete (the daemon died); counts the
/// writes refused because the pool had no space in `refused`.
fn workload(
    s: &mut Session,
    models: &mut [Model; 2],
    rng: &mut Rng,
    tag: &mut u64,
    refused: &mut usize,
) {
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
                let r = s.command(lun, &cdb, &list, 0);
                if matches!(&r, Ok(c) if c.status == 0) {
                    for p in first..first + UNIT / PIECE {
                        model.acknowledged(p);
                    }
                }
                r.map(|_| ())
            }
            _ => {
                *tag += 1;
                let piece = rng.below(PIECES as u64) as usize;
                let fua = rng.one_in(8);
                let r = write_piece(s, lun, model, (piece, *tag, fua), BLOCK as usize);
                if matches!(&r, Ok(c) if out_of_space(c)) {
                    *refused += 1;
                }
                r.map(|_| ())
            }
        };
        if done.is_err() {
            return;
        }
    }
}

/// CHECK CONDITION, DATA PROTECT, SPACE ALLOCATION FAILED WRITE PROTECT.
fn out_of_space(c: &common::iscsi::Completion) -> bool {
    c.status == 2 && c.sense_key() == Some(0x07) && c.sense.get(12..14) == Some(&[0x27, 0x07])
}

fn check_clean(cfg: &str, round: usize) {
    let (ok, text) = openarray(&["pool", "check", "-c", cfg, "tank"]);
    assert!(ok, "round {round}: pool check:\n{text}");
}

/// Rounds of workload, live volume operations and SIGKILL; returns the
/// rounds run.
/// Returns how many writes were refused for want of space.
fn crash_rounds(cut: Cut, device_size: &str) -> usize {
    let seed = seed("POOL_CRASH_SEED");
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg_path = dir.path().join("openarray.toml");
    std::fs::write(&cfg_path, config(dir.path(), device_size, cut)).expect("write config");
    let cfg = cfg_path.to_str().expect("utf-8");
    let socket: PathBuf = dir.path().join("admin.sock");
    let sock = socket.to_str().expect("utf-8").to_string();

    let mut models = [Model::new(PIECES), Model::new(PIECES)];
    let mut tag = 0u64;
    let lineage = Arc::new(Mutex::new(Lineage::default()));
    let mut lost = 0;
    let mut refused = 0;
    let start = Instant::now();
    let mut rounds = 0;
    while rounds < ROUNDS && start.elapsed() < BUDGET {
        let daemon = AdminDaemon::start_listening(&cfg_path, dir.path(), free_port());
        if rounds == 0 && cut == Cut::Power {
            let (_, shown) = openarray(&["device", "show", "--socket", &sock, "v"]);
            assert!(shown.contains("└─ f0 (faulty"), "{shown}");
        }
        let mut s = login(daemon.addr(), IQN);
        lost += verify(&mut s, &mut models, rounds);
        lineage
            .lock()
            .unwrap()
            .verify(&listed(&sock, rounds), rounds);
        let pid = daemon.pid() as i32;
        let delay = Duration::from_millis(rng.range(5, 250));
        let killer = {
            let sock = sock.clone();
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                if cut == Cut::Power {
                    for fault in ["fail", "drop-unflushed"] {
                        let (ok, text) =
                            openarray(&["device", "fault", "--socket", &sock, "f0", fault]);
                        assert!(ok, "device fault f0 {fault}: {text}");
                    }
                }
                // SAFETY: kill(2) on our own child, still unreaped.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            })
        };
        let stop = Arc::new(AtomicBool::new(false));
        let ops = {
            let (lineage, stop, sock) = (lineage.clone(), stop.clone(), sock.clone());
            let mut rng = Rng::new(rng.next_u64());
            std::thread::spawn(move || operations(&sock, &lineage, &mut rng, &stop))
        };
        workload(&mut s, &mut models, &mut rng, &mut tag, &mut refused);
        killer.join().expect("killer thread");
        stop.store(true, Ordering::SeqCst);
        ops.join().expect("operations thread");
        drop(s);
        drop(daemon);
        check_clean(cfg, rounds);
        rounds += 1;
    }
    let daemon = AdminDaemon::start_listening(&cfg_path, dir.path(), free_port());
    let mut s = login(daemon.addr(), IQN);
    lost += verify(&mut s, &mut models, rounds);
    lineage
        .lock()
        .unwrap()
        .verify(&listed(&sock, rounds), rounds);
    drop(s);
    drop(daemon);
    check_clean(cfg, rounds);
    let made = lineage.lock().unwrap().next;
    eprintln!(
        "{rounds} SIGKILL rounds, {tag} writes ({refused} refused for space), \
         {made} volume operations, {lost} pieces back to an older value, in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    assert!(rounds >= 20, "only {rounds} rounds fit in the time budget");
    refused
}

#[test]
fn sigkill_at_random_points_loses_nothing_acknowledged() {
    crash_rounds(Cut::Kill, "64M");
}

#[test]
fn power_cut_with_a_volatile_cache_loses_only_unflushed_writes() {
    crash_rounds(Cut::Power, "64M");
}

/// A pool too small for the volumes and their snapshots: writes that need
/// a new unit are refused (DATA PROTECT, space allocation failed) while
/// others succeed, and a refused write never counts as written.
#[test]
fn sigkill_with_the_pool_running_full_loses_nothing_acknowledged() {
    let refused = crash_rounds(Cut::Kill, "20M");
    assert!(refused > 0, "the pool never ran full");
}
