//! A raw RAID5 LUN over four `faulty` members is cut at random points of
//! a workload of 4 KiB writes (some FUA) and SYNCHRONIZE CACHE: by SIGKILL
//! of the daemon, or by a power cut (every member fails and drops its
//! unflushed writes, then the kill). After each restart one member is
//! lost at once, before the bitmap resync can finish: every write
//! acknowledged before the last completed SYNCHRONIZE CACHE, or with FUA,
//! reads back exactly from the members left, and the array reports the
//! resync of the regions dirty at the cut. The lost member comes back at
//! the next restart, is rebuilt, and is lost again.
//!
//! `RAID_CRASH_SEED` replays a run; the seed is printed.
//! `RAID_CRASH_LOG_SLOTS=0` runs the array without its partial parity log,
//! the write hole open: the power-cut test then fails (docs/raid.md).
mod common;

use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::admin::AdminDaemon;
use common::crash_model::{self, content, login, seed, write_piece, Model, PIECE};
use common::free_port;
use common::iscsi::Session;
use common::rng::Rng;
use serde_json::Value;

const IQN: &str = "iqn.2026-11.org.openarray.test:raid-crash";
const MEMBERS: [&str; 4] = ["m0", "m1", "m2", "m3"];
const ROUNDS: usize = 50;
/// Each test stops starting rounds after this long.
const BUDGET: Duration = Duration::from_secs(25);
/// The two tests take turns: each restarts its daemon on a new free port
/// many times, and two at once could pick the same one.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
const BLOCK: u32 = 512;
/// The part of the LUN the workload writes.
const SPAN: usize = 8 << 20;
const PIECES: usize = SPAN / PIECE;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cut {
    Kill,
    Power,
}

fn config(dir: &Path) -> String {
    let mut text = String::new();
    for m in MEMBERS {
        text += &format!(
            "[[device]]\nname = \"{m}-disk\"\nkind = \"file\"\npath = \"{}/{m}.img\"\nsize = \"16M\"\n\
             [[device]]\nname = \"{m}\"\nkind = \"faulty\"\nover = \"{m}-disk\"\n",
            dir.display()
        );
    }
    text += "[[device]]\nname = \"r5\"\nkind = \"raid\"\nlevel = 5\n\
             members = [\"m0\", \"m1\", \"m2\", \"m3\"]\nchunk = \"64K\"\nbitmap_region = \"256K\"\n";
    if let Ok(slots) = std::env::var("RAID_CRASH_LOG_SLOTS") {
        text += &format!("log_slots = {}\n", slots.parse::<u32>().expect("a number"));
    }
    text += &format!("[[target]]\nname = \"{IQN}\"\n[[target.lun]]\nlun = 0\ndevice = \"r5\"\n");
    text
}

fn openarray(socket: &Path, args: &[&str]) -> (bool, String) {
    let socket = socket.to_str().expect("utf-8");
    let args: Vec<&str> = args.iter().copied().chain(["--socket", socket]).collect();
    crash_model::openarray(&args)
}

/// Reads the span with one member lost. A piece no write touched since
/// its durable tag must hold it exactly; one written since holds one of
/// its tags or, torn by the cut with parity stale, anything: it is
/// rewritten (FUA) so the model knows it again. Returns the torn count.
fn verify(
    daemon: &AdminDaemon,
    s: &mut Session,
    model: &mut Model,
    tag: &mut u64,
    round: usize,
) -> usize {
    let mut torn = 0;
    let per_read = (1 << 20) / PIECE;
    for mib in 0..SPAN >> 20 {
        let lba = ((mib << 20) / BLOCK as usize) as u32;
        let data = s
            .read10(0, lba, ((1 << 20) / BLOCK) as u16, BLOCK)
            .unwrap_or_else(|e| {
                panic!(
                    "round {round}: READ(10) with a member lost: {e}\n{}",
                    daemon.log()
                )
            });
        for (i, got) in data.chunks(PIECE).enumerate() {
            let piece = mib * per_read + i;
            let durable = model.durable[piece];
            if model.since[piece].is_empty() {
                assert!(
                    got == content(durable, piece),
                    "round {round}: piece {piece} lost durable tag {durable}; it starts {:02x?}",
                    &got[..16]
                );
                continue;
            }
            let found = std::iter::once(durable)
                .chain(model.since[piece].iter().copied())
                .find(|&t| content(t, piece) == got);
            match found {
                Some(t) => model.durable[piece] = t,
                None => {
                    torn += 1;
                    *tag += 1;
                    let lba = (piece * PIECE / BLOCK as usize) as u32;
                    let mut cdb =
                        common::iscsi::rw10_cdb(0x2a, lba, (PIECE / BLOCK as usize) as u16);
                    cdb[1] |= 0x08;
                    let c = s
                        .command(0, &cdb, &content(*tag, piece), 0)
                        .expect("rewrite");
                    assert_eq!(c.status, 0, "round {round}: FUA rewrite of piece {piece}");
                    model.durable[piece] = *tag;
                }
            }
            model.since[piece].clear();
            model.good[piece] = None;
        }
    }
    torn
}

/// Writes (1 in 8 FUA) and SYNCHRONIZE CACHE until the daemon dies; says
/// on `started` when the first command has been answered, so that the cut
/// always falls among writes (and leaves regions dirty for the resync).
fn workload(
    s: &mut Session,
    model: &mut Model,
    rng: &mut Rng,
    tag: &mut u64,
    started: mpsc::Sender<()>,
) {
    let mut started = Some(started);
    loop {
        let r = if rng.one_in(16) {
            let r = s.command(0, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0);
            if matches!(&r, Ok(c) if c.status == 0) {
                model.synced();
            }
            r
        } else {
            *tag += 1;
            let piece = rng.below(PIECES as u64) as usize;
            let fua = rng.one_in(8);
            write_piece(s, 0, model, (piece, *tag, fua), BLOCK as usize)
        };
        if r.is_err() {
            return;
        }
        if let Some(tell) = started.take() {
            let _ = tell.send(());
        }
    }
}

fn status(socket: &Path) -> Value {
    let (ok, text) = openarray(socket, &["raid", "status", "r5", "--json"]);
    assert!(ok, "raid status: {text}");
    serde_json::from_str(&text).expect("raid status --json")
}

fn rounds(cut: Cut) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let seed = seed("RAID_CRASH_SEED");
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("openarray.toml");
    std::fs::write(&cfg, config(dir.path())).expect("write config");
    let socket = dir.path().join("admin.sock");
    let mut model = Model::new(PIECES);
    let (mut tag, mut torn) = (0u64, 0);
    let start = Instant::now();
    let mut round = 0;
    while round < ROUNDS && start.elapsed() < BUDGET {
        let daemon = AdminDaemon::start_listening(&cfg, dir.path(), free_port());
        if round == 0 {
            // The array is new: its first resync covers every region.
            let s = status(&socket);
            assert!(s["state"] == "rebuilding" || s["state"] == "clean", "{s:#}");
        }
        // One member lost at once, before the resync can finish: always
        // the same one, which came back stale and is catching up (losing
        // another meanwhile would be a second failure).
        let lost = MEMBERS[3];
        let (ok, text) = openarray(&socket, &["device", "fault", lost, "fail"]);
        assert!(ok, "{text}");
        let mut s = login(daemon.addr(), IQN);
        torn += verify(&daemon, &mut s, &mut model, &mut tag, round);
        let pid = daemon.pid() as i32;
        let delay = Duration::from_millis(rng.range(5, 250));
        let (started, first_answer) = mpsc::channel();
        let killer = {
            let socket = socket.clone();
            std::thread::spawn(move || {
                // However slow the machine, the cut comes after a write.
                let _ = first_answer.recv_timeout(Duration::from_secs(30));
                std::thread::sleep(delay);
                if cut == Cut::Power {
                    for fault in ["fail", "drop-unflushed"] {
                        for m in MEMBERS {
                            let (ok, text) = openarray(&socket, &["device", "fault", m, fault]);
                            assert!(ok, "device fault {m} {fault}: {text}");
                        }
                    }
                }
                // SAFETY: kill(2) on our own child, still unreaped.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            })
        };
        workload(&mut s, &mut model, &mut rng, &mut tag, started);
        killer.join().expect("killer");
        drop(s);
        drop(daemon);
        round += 1;
    }
    // The last restart: the dirty regions are resynced and reported, the
    // member lost last is rebuilt (caught up when it was in sync when
    // lost; it was recovering); then it is lost once more.
    let daemon = AdminDaemon::start_listening(&cfg, dir.path(), free_port());
    let waited = Instant::now();
    let last = loop {
        let st = status(&socket);
        if st["sync"].is_null() && st["state"] == "clean" {
            break st;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "not clean: {st:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let resynced = last["bitmap"]["last_resync_bytes"].as_u64().unwrap_or(0);
    let caught_up = last["bitmap"]["last_catch_up_bytes"].as_u64().unwrap_or(0);
    let (ok, text) = openarray(&socket, &["device", "fault", MEMBERS[3], "fail"]);
    assert!(ok, "{text}");
    let mut s = login(daemon.addr(), IQN);
    torn += verify(&daemon, &mut s, &mut model, &mut tag, round);
    drop(s);
    daemon.terminate();
    eprintln!(
        "{cut:?}: {round} rounds, {tag} writes, {torn} pieces torn by a cut while written, \
         last restart: {resynced} bytes a member resynced, {caught_up} caught up, in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    assert!(round >= 10, "only {round} rounds fit in the time budget");
    assert!(resynced > 0, "the bitmap resync is not reported: {last:#}");
}

#[test]
fn sigkill_then_a_member_lost_keeps_every_acknowledged_write() {
    rounds(Cut::Kill);
}

#[test]
fn power_cut_then_a_member_lost_keeps_every_acknowledged_write() {
    rounds(Cut::Power);
}
