//! A LUN over a `cache` device, through the real daemon.
//!
//! - Crash rounds in write-back mode: the daemon is killed with SIGKILL at
//!   random points of a workload of writes (some FUA) and SYNCHRONIZE
//!   CACHE; in the power-cut rounds both the cache device and the backing
//!   are `faulty` devices that fail and lose their unflushed writes before
//!   the kill. After every restart each write acknowledged before the last
//!   completed SYNCHRONIZE CACHE, or with FUA, reads back exactly. At the
//!   end `cache detach` writes everything back and the backing, served
//!   alone, holds all of it.
//! - The cache device fails under I/O: write-through serves every block;
//!   write-back answers the blocks not yet written back with MEDIUM ERROR
//!   and every other block correctly.
//! - The cache device lost for good in write-back (a blank device in its
//!   place): the restart refuses to serve the backing, whose blocks are
//!   older than what was acknowledged, until those writes are given up.
//!
//! `CACHE_CRASH_SEED` replays a run; the seed is printed.
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::admin::{run_openarray, AdminDaemon};
use common::crash_model::{content, login, openarray, seed, write_piece, Model, PIECE};
use common::iscsi::{rw10_cdb, Session};
use common::rng::Rng;
use common::{free_port, serve_command};

const IQN: &str = "iqn.2026-11.org.openarray.test:cache";
const ROUNDS: usize = 50;
/// Each test stops starting rounds after this long.
const BUDGET: Duration = Duration::from_secs(40);
const BLOCK: u32 = 512;
/// Writes and the model work in 4 KiB pieces over the first 8 MiB.
const REGION: usize = 8 << 20;
const PIECES: usize = REGION / PIECE;

/// How a round ends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// SIGKILL: the process dies, the files keep what they were given.
    Kill,
    /// Both devices fail and lose their unflushed writes, then the kill.
    Power,
}

/// A 64 MiB backing behind a 6 MiB cache (smaller than the region written,
/// so lines are evicted and written back), both `faulty` devices over
/// files.
fn config(dir: &Path, mode: &str) -> String {
    let d = dir.display();
    format!(
        r#"
[[device]]
name = "ssd_file"
kind = "file"
path = "{d}/ssd.img"
size = "6M"
[[device]]
name = "ssd"
kind = "faulty"
over = "ssd_file"
[[device]]
name = "hdd_file"
kind = "file"
path = "{d}/hdd.img"
size = "64M"
[[device]]
name = "hdd"
kind = "faulty"
over = "hdd_file"
[[device]]
name = "hybrid"
kind = "cache"
cache = "ssd"
backing = "hdd"
mode = "{mode}"
block = "16K"
writeback_threshold = "20%"
[[target]]
name = "{IQN}"
[[target.lun]]
lun = 0
device = "hybrid"
"#
    )
}

/// The backing file alone as the LUN.
fn backing_config(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"
[[device]]
name = "hdd_file"
kind = "file"
path = "{d}/hdd.img"
size = "64M"
[[target]]
name = "{IQN}"
[[target.lun]]
lun = 0
device = "hdd_file"
"#
    )
}

/// Reads every piece and checks it against the model, then takes what
/// was read as the durable state. Returns how many pieces read an older
/// value than the last one written.
fn verify(s: &mut Session, model: &mut Model, round: usize) -> usize {
    let mut reverted = 0;
    let blocks_per_read = (1 << 20) / BLOCK as usize;
    for chunk in 0..REGION >> 20 {
        let lba = (chunk * blocks_per_read) as u32;
        let data = s
            .read10(0, lba, blocks_per_read as u16, BLOCK)
            .expect("READ(10) after restart");
        for (i, got) in data.chunks(PIECE).enumerate() {
            let piece = chunk * ((1 << 20) / PIECE) + i;
            let allowed: Vec<u64> = std::iter::once(model.durable[piece])
                .chain(model.since[piece].iter().copied())
                .collect();
            let Some(&tag) = allowed.iter().find(|&&t| content(t, piece) == got) else {
                panic!(
                    "round {round}: piece {piece} holds none of the tags {allowed:?} \
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
    reverted
}

/// Writes (some FUA) and SYNCHRONIZE CACHE until a command fails to
/// complete (the daemon died).
fn workload(s: &mut Session, model: &mut Model, rng: &mut Rng, tag: &mut u64) {
    loop {
        let done = if rng.below(16) == 0 {
            let r = s.command(0, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0);
            if matches!(&r, Ok(c) if c.status == 0) {
                model.synced();
            }
            r.map(|_| ())
        } else {
            *tag += 1;
            // Half the writes go to a hot eighth of the region, so lines
            // are rewritten while dirty.
            let piece = if rng.one_in(2) {
                rng.below(PIECES as u64 / 8) as usize
            } else {
                rng.below(PIECES as u64) as usize
            };
            let fua = rng.one_in(8);
            write_piece(s, 0, model, (piece, *tag, fua), BLOCK as usize).map(|_| ())
        };
        if done.is_err() {
            return;
        }
    }
}

fn crash_rounds(cut: Cut) {
    let mut rng = Rng::new(seed("CACHE_CRASH_SEED"));
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg_path = dir.path().join("openarray.toml");
    std::fs::write(&cfg_path, config(dir.path(), "writeback")).expect("write config");
    let sock = dir.path().join("admin.sock");
    let sock = sock.to_str().expect("utf-8").to_string();

    let mut model = Model::new(PIECES);
    let mut tag = 0u64;
    let mut reverted = 0;
    let mut dirty_at_start = 0;
    let start = Instant::now();
    let mut rounds = 0;
    while rounds < ROUNDS && start.elapsed() < BUDGET {
        let daemon = AdminDaemon::start_listening(&cfg_path, dir.path(), free_port());
        let mut s = login(daemon.addr(), IQN);
        reverted += verify(&mut s, &mut model, rounds);
        let pid = daemon.pid() as i32;
        let delay = Duration::from_millis(rng.range(5, 250));
        let killer = {
            let sock = sock.clone();
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                if cut == Cut::Power {
                    // The backing first: a write acknowledged by the
                    // backing alone while the cache's table could no
                    // longer be updated would be shadowed by that table.
                    for (device, fault) in [
                        ("hdd", "fail"),
                        ("ssd", "fail"),
                        ("ssd", "drop-unflushed"),
                        ("hdd", "drop-unflushed"),
                    ] {
                        let (ok, text) =
                            openarray(&["device", "fault", "--socket", &sock, device, fault]);
                        assert!(ok, "device fault {device} {fault}: {text}");
                    }
                }
                // SAFETY: kill(2) on our own child, still unreaped.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            })
        };
        workload(&mut s, &mut model, &mut rng, &mut tag);
        killer.join().expect("killer thread");
        drop(s);
        let log = daemon.log();
        assert!(!log.contains("panicked"), "round {rounds}: {log}");
        // The cache reopened holding data not yet written back.
        if log.contains("opened after an unclean stop") && !log.contains("(0 bytes to write back)")
        {
            dirty_at_start += 1;
        }
        drop(daemon);
        rounds += 1;
    }
    // The last restart: verify, then detach, which writes everything back.
    let daemon = AdminDaemon::start_listening(&cfg_path, dir.path(), free_port());
    let mut s = login(daemon.addr(), IQN);
    reverted += verify(&mut s, &mut model, rounds);
    let (ok, text) = openarray(&["cache", "status", "--socket", &sock, "hybrid"]);
    assert!(ok && text.contains("mode writeback"), "{text}");
    let (ok, text) = openarray(&["cache", "detach", "--socket", &sock, "hybrid"]);
    assert!(ok, "cache detach: {text}");
    let (ok, text) = openarray(&["cache", "status", "--json", "--socket", &sock, "hybrid"]);
    assert!(ok && text.contains("\"dirty_bytes\": 0"), "{text}");
    drop(s);
    assert!(
        daemon.terminate().success(),
        "the daemon stopped with an error"
    );
    // The backing alone holds every durable write.
    std::fs::write(&cfg_path, backing_config(dir.path())).expect("write config");
    let daemon = AdminDaemon::start_listening(&cfg_path, dir.path(), free_port());
    let mut s = login(daemon.addr(), IQN);
    let behind = verify(&mut s, &mut model, rounds + 1);
    assert_eq!(behind, 0, "the backing alone is behind the cache");
    eprintln!(
        "{rounds} rounds ({dirty_at_start} restarted with cached data to write back), \
         {tag} writes, {reverted} pieces back to an older unsynced value, in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    assert!(rounds >= 20, "only {rounds} rounds fit in the time budget");
    assert!(
        dirty_at_start > rounds / 2,
        "the cache rarely held data at a crash: the rounds prove little"
    );
}

#[test]
fn sigkill_in_write_back_loses_nothing_acknowledged() {
    crash_rounds(Cut::Kill);
}

#[test]
fn power_cut_of_cache_and_backing_loses_only_unflushed_writes() {
    crash_rounds(Cut::Power);
}

/// Writes pieces 0.. `count` with `tag`, then SYNCHRONIZE CACHE.
fn write_all(s: &mut Session, first: usize, count: usize, tag: u64) {
    for piece in first..first + count {
        let lba = (piece * PIECE) as u32 / BLOCK;
        s.write10(0, lba, &content(tag, piece), BLOCK)
            .expect("WRITE(10)");
    }
    let c = s
        .command(0, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0)
        .expect("SYNCHRONIZE CACHE");
    assert_eq!(c.status, 0, "SYNCHRONIZE CACHE failed");
}

/// What reading `piece` gives: its data, or the sense key of the error.
fn read_piece(s: &mut Session, piece: usize) -> Result<Vec<u8>, Option<u8>> {
    let lba = (piece * PIECE) as u32 / BLOCK;
    let cdb = rw10_cdb(0x28, lba, (PIECE / BLOCK as usize) as u16);
    let c = s.command(0, &cdb, &[], PIECE).expect("READ(10)");
    if c.status == 0 {
        Ok(c.data)
    } else {
        Err(c.sense_key())
    }
}

/// The cache device fails with `old` written back and `new` written after
/// (dirty in write-back); returns the pieces that answered MEDIUM ERROR.
fn cache_fails_under_io(mode: &str) -> usize {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg_path = dir.path().join("openarray.toml");
    let text = config(dir.path(), mode)
        .replace("writeback_threshold = \"20%\"", "writeback_threshold = 100");
    std::fs::write(&cfg_path, text).expect("write config");
    let sock = dir.path().join("admin.sock");
    let sock = sock.to_str().expect("utf-8").to_string();
    let daemon = AdminDaemon::start_listening(&cfg_path, dir.path(), free_port());
    let mut s = login(daemon.addr(), IQN);
    // 256 pieces written and written back, then 64 of them rewritten.
    write_all(&mut s, 0, 256, 1);
    let (ok, text) = openarray(&["cache", "flush", "--socket", &sock, "hybrid"]);
    assert!(ok, "cache flush: {text}");
    write_all(&mut s, 32, 64, 2);
    let (ok, text) = openarray(&["device", "fault", "--socket", &sock, "ssd", "fail"]);
    assert!(ok, "device fault ssd fail: {text}");
    let mut errors = 0;
    for piece in 0..256 {
        let tag = if (32..96).contains(&piece) { 2 } else { 1 };
        match read_piece(&mut s, piece) {
            Ok(data) => assert!(
                data == content(tag, piece),
                "{mode}: piece {piece} read stale or wrong data"
            ),
            Err(key) => {
                assert!(
                    mode == "writeback" && tag == 2,
                    "{mode}: piece {piece} (tag {tag}) failed with sense key {key:?}"
                );
                assert_eq!(key, Some(3), "{mode}: piece {piece}: not MEDIUM ERROR");
                errors += 1;
            }
        }
    }
    let (ok, status) = openarray(&["cache", "status", "--socket", &sock, "hybrid"]);
    assert!(ok && status.contains("health FAILED"), "{status}");
    let (ok, shown) = openarray(&["device", "show", "--socket", &sock, "hybrid"]);
    assert!(ok && shown.contains("health failed"), "{shown}");
    // `status` names the failed cache: degraded (1) while every block is
    // still served, failed (2) while writes are stranded on it.
    let out = run_openarray(["status", "--json", "--socket", &sock]);
    let page: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status --json");
    let want = if mode == "writeback" { 2 } else { 1 };
    assert_eq!(out.status.code(), Some(want), "{mode}: {page:#}");
    let cache = page["devices"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["name"] == "hybrid"))
        .unwrap_or_else(|| panic!("no cache in {page:#}"));
    let state = if mode == "writeback" {
        "failed"
    } else {
        "degraded"
    };
    assert_eq!(cache["state"], state, "{page:#}");
    assert!(
        cache["problem"]
            .as_str()
            .is_some_and(|p| p.contains("cache device failed")),
        "{page:#}"
    );
    // The daemon still serves, and stops without a panic.
    assert!(
        daemon.terminate().code().is_some(),
        "the daemon died of a signal"
    );
    let log = std::fs::read_dir(dir.path())
        .expect("read dir")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .collect::<String>();
    assert!(!log.contains("panicked"), "{log}");
    errors
}

#[test]
fn write_through_serves_every_block_when_the_cache_device_fails() {
    assert_eq!(cache_fails_under_io("writethrough"), 0);
}

#[test]
fn write_back_answers_only_blocks_not_written_back_with_medium_error() {
    let errors = cache_fails_under_io("writeback");
    assert!(
        errors > 0,
        "no dirty block was stranded: the test proves nothing"
    );
}

/// Starts the daemon on `cfg`, expecting it to refuse to start: its
/// output.
fn refused_start(cfg: &Path, dir: &Path) -> String {
    let mut child = serve_command()
        .arg("--config")
        .arg(cfg)
        .arg("--listen")
        .arg(format!("127.0.0.1:{}", free_port()))
        .arg("--admin-socket")
        .arg(dir.join("refused.sock"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn openarray serve");
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("the daemon started over a backing whose newest writes are lost");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    assert!(!out.status.success(), "the daemon exited successfully");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_lost_write_back_cache_device_is_not_replaced_by_stale_backing_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg_path = dir.path().join("openarray.toml");
    let text = config(dir.path(), "writeback")
        .replace("writeback_threshold = \"20%\"", "writeback_threshold = 100");
    std::fs::write(&cfg_path, &text).expect("write config");
    let sock = dir.path().join("admin.sock");
    let sock = sock.to_str().expect("utf-8").to_string();
    let daemon = AdminDaemon::start_listening(&cfg_path, dir.path(), free_port());
    let mut s = login(daemon.addr(), IQN);
    write_all(&mut s, 0, 64, 1);
    let (ok, text) = openarray(&["cache", "flush", "--socket", &sock, "hybrid"]);
    assert!(ok, "cache flush: {text}");
    write_all(&mut s, 16, 16, 2);
    let (ok, status) = openarray(&["cache", "status", "--socket", &sock, "hybrid"]);
    assert!(
        ok && status.contains("the backing is marked as needing this cache device"),
        "{status}"
    );
    // The host dies with the cache device: a blank one in its place.
    // SAFETY: kill(2) on our own child, still unreaped.
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGKILL) };
    drop(s);
    drop(daemon);
    let ssd = dir.path().join("ssd.img");
    let len = std::fs::metadata(&ssd).expect("ssd.img").len();
    std::fs::remove_file(&ssd).expect("remove ssd.img");
    std::fs::File::create(&ssd)
        .and_then(|f| f.set_len(len))
        .expect("a blank ssd.img");

    let out = refused_start(&cfg_path, dir.path());
    for words in [
        "ssd",
        "not yet written back",
        "is blank",
        "older than what was acknowledged",
        "accept_lost_writes",
    ] {
        assert!(out.contains(words), "{words:?} not in: {out}");
    }
    assert!(!out.contains("panicked"), "{out}");

    // Given up explicitly: the backing serves what it holds.
    let text = text_with(&cfg_path, "accept_lost_writes = true");
    std::fs::write(&cfg_path, text).expect("write config");
    let daemon = AdminDaemon::start_listening(&cfg_path, dir.path(), free_port());
    let mut s = login(daemon.addr(), IQN);
    for piece in 0..64 {
        assert!(
            read_whole(&mut s, piece) == content(1, piece),
            "piece {piece}: not what the backing holds"
        );
    }
    let (ok, status) = openarray(&["cache", "status", "--socket", &sock, "hybrid"]);
    assert!(ok && status.contains("gave up the writes"), "{status}");
    drop(s);
    assert!(daemon.terminate().success());
}

/// `piece`, read with READ(10) as a fresh session does (past the unit
/// attention of a new login).
fn read_whole(s: &mut Session, piece: usize) -> Vec<u8> {
    let lba = (piece * PIECE) as u32 / BLOCK;
    s.read10(0, lba, (PIECE / BLOCK as usize) as u16, BLOCK)
        .expect("READ(10)")
}

/// The configuration at `cfg` with `line` added to the cache device.
fn text_with(cfg: &Path, line: &str) -> String {
    std::fs::read_to_string(cfg)
        .expect("read config")
        .replace("block = \"16K\"", &format!("block = \"16K\"\n{line}"))
}

#[test]
fn a_live_change_of_the_line_size_is_refused_and_the_documented_way_works() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg_path = dir.path().join("openarray.toml");
    std::fs::write(&cfg_path, config(dir.path(), "writeback")).expect("write config");
    let sock = dir.path().join("admin.sock");
    let sock = sock.to_str().expect("utf-8").to_string();
    let daemon = AdminDaemon::start_listening(&cfg_path, dir.path(), free_port());
    let mut s = login(daemon.addr(), IQN);
    write_all(&mut s, 0, 32, 1);
    let wider = dir.path().join("wider.toml");
    let wider_text = std::fs::read_to_string(&cfg_path)
        .expect("read config")
        .replace("block = \"16K\"", "block = \"32K\"");
    std::fs::write(&wider, &wider_text).expect("write config");
    for force in [&[][..], &["--force"][..]] {
        let mut args = vec!["apply", wider.to_str().expect("utf-8")];
        args.extend(force);
        let out = daemon.config_cli(&args);
        assert_eq!(out.status.code(), Some(1), "{force:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        for words in [
            "wider.toml:",
            "device[4].block",
            "cache `hybrid` serves with 16K lines (asked: 32K)",
            "cannot change while it serves",
            "set mode = \"writethrough\"",
        ] {
            assert!(err.contains(words), "{force:?}: {words:?} not in {err}");
        }
    }
    let out = daemon.cli(&["device", "modify", "hybrid", "block=32K", "--force"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("device[4].block"), "{err}");
    for piece in 0..32 {
        assert!(read_whole(&mut s, piece) == content(1, piece));
    }
    // The documented way: write-through first, then the new line size
    // on a restart.
    let (ok, text) = openarray(&["cache", "mode", "--socket", &sock, "hybrid", "writethrough"]);
    assert!(ok, "cache mode: {text}");
    drop(s);
    assert!(daemon.terminate().success());
    let text = std::fs::read_to_string(&cfg_path)
        .expect("read config")
        .replace("block = \"16K\"", "block = \"32K\"");
    std::fs::write(&cfg_path, text).expect("write config");
    let daemon = AdminDaemon::start_listening(&cfg_path, dir.path(), free_port());
    let mut s = login(daemon.addr(), IQN);
    for piece in 0..32 {
        assert!(read_whole(&mut s, piece) == content(1, piece));
    }
    let (ok, status) = openarray(&["cache", "status", "--socket", &sock, "hybrid"]);
    assert!(ok && status.contains("lines of 32K"), "{status}");
    drop(s);
    assert!(daemon.terminate().success());
}

/// A cache device on tmpfs is read through its file's mapping on a hit:
/// every block reads back as last written, through evictions, refills
/// and overwrites.
#[test]
fn hits_from_a_cache_device_in_memory_read_back_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shm = tempfile::tempdir_in("/dev/shm").expect("tempdir on /dev/shm");
    let cfg_path = dir.path().join("openarray.toml");
    let (d, m) = (dir.path().display(), shm.path().display());
    let text = format!(
        r#"
[[device]]
name = "ssd"
kind = "file"
path = "{m}/ssd.img"
size = "6M"
[[device]]
name = "hdd"
kind = "file"
path = "{d}/hdd.img"
size = "64M"
[[device]]
name = "hybrid"
kind = "cache"
cache = "ssd"
backing = "hdd"
mode = "writeback"
block = "16K"
[[target]]
name = "{IQN}"
[[target.lun]]
lun = 0
device = "hybrid"
"#
    );
    std::fs::write(&cfg_path, text).expect("write config");
    let daemon = AdminDaemon::start_listening(&cfg_path, dir.path(), free_port());
    let mut s = login(daemon.addr(), IQN);
    write_all(&mut s, 0, PIECES, 1);
    write_all(&mut s, PIECES / 4, PIECES / 4, 2);
    let tag = |piece: usize| {
        if (PIECES / 4..PIECES / 2).contains(&piece) {
            2
        } else {
            1
        }
    };
    for pass in 0..2 {
        // The second pass over the last quarter reads lines the first
        // pass filled.
        for piece in (0..PIECES).rev() {
            assert!(
                read_whole(&mut s, piece) == content(tag(piece), piece),
                "pass {pass}: piece {piece}"
            );
        }
    }
}
