//! WRITE ATOMIC(16) survives power cuts whole or not at all, on a thin
//! volume, on a write-back cache and on a raw RAID5 array. Their disks are
//! `faulty` devices (a disk with a volatile write cache) over `delay`
//! devices over files, so that every write reaching a disk takes a while
//! and a cut lands in the middle of atomic writes: at a random moment the
//! test cuts the power live (`device fault NAME fail`, then
//! `drop-unflushed`), then kills the daemon with SIGKILL and restarts it.
//! On RAID5 one member is then lost too (failed once the restart has
//! replayed the journal and caught up), and the check reads from the
//! members left.
//!
//! Within a round the atomic writes never overlap, so each one's range
//! must read back afterwards either entirely as before the write or
//! entirely as written, never a mix; one acknowledged with FUA, or before
//! an acknowledged SYNCHRONIZE CACHE, entirely as written. Ranges span pool
//! units and cache lines and start inside them, so the device merges old
//! bytes around them. `openarray pool check` is clean after every cut.
//!
//! `ATOMIC_CRASH_SEED` replays a run; the seed is printed.
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::admin::AdminDaemon;
use common::crash_model::{content, login, openarray, seed, PIECE};
use common::free_port;
use common::iscsi::Session;
use common::rng::Rng;

const IQN: &str = "iqn.2026-11.org.openarray.test:atomic";
const ROUNDS: usize = 30;
const BLOCK: usize = 512;
const VOLUME_BYTES: usize = 8 << 20;
const PIECES: usize = VOLUME_BYTES / PIECE;
/// The longest atomic write, in pieces: up to five 64 KiB pool units, or
/// 17 cache lines of 16 KiB.
const MAX_PIECES: u64 = 64;
/// RAID's journal takes atomic writes of up to 128 KiB.
const RAID_MAX_PIECES: u64 = 32;

/// The LUN under test and how to cut its power.
struct Lun {
    config: fn(&Path) -> String,
    /// `device fault` commands of a cut, in order.
    cut: &'static [(&'static str, &'static str)],
    /// The test stops starting rounds after this long.
    budget: Duration,
    /// The pool to check after every cut.
    pool: Option<&'static str>,
    /// WRITE ATOMIC may be refused (ILLEGAL REQUEST) after the cut: a
    /// cache whose device failed serves from its backing, a plain file.
    refusal_after_cut: bool,
    /// The longest atomic write, in pieces.
    max_pieces: u64,
    raid: Option<RaidLoss>,
}

/// A RAID LUN, and its members: one is lost after each restart, in
/// turn, before the check. It stays failed while the round's writes run,
/// so that the cut, failing the members one by one, fails the array at
/// the first (failed members keep the superblocks of the last state that
/// served, as in `raid_crash.rs`); it comes back stale at the next
/// restart and catches up before the next member is lost, which held
/// its share of the data at the cut.
#[derive(Clone, Copy)]
struct RaidLoss {
    array: &'static str,
    members: &'static [&'static str],
}

/// An 8 MiB thin volume of a pool on faulty(delay(file)).
fn pool_config(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"
[[device]]
name = "disk"
kind = "file"
path = "{d}/tank.img"
size = "64M"
[[device]]
name = "slow"
kind = "delay"
over = "disk"
latency = "1ms"
[[device]]
name = "f0"
kind = "faulty"
over = "slow"
[[pool]]
name = "tank"
devices = ["f0"]
metadata = "{d}/tank.meta"
unit_size = "64K"
[[device]]
name = "v"
kind = "volume"
pool = "tank"
size = "8M"
[[target]]
name = "{IQN}"
[[target.lun]]
lun = 0
device = "v"
"#
    )
}

/// An 8 MiB LUN over a write-back cache with 16 KiB lines, both devices
/// faulty(delay(file)); the cache holds the whole LUN, so an atomic write
/// always finds clean lines to evict or free slots.
fn cache_config(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"
[[device]]
name = "ssd_file"
kind = "file"
path = "{d}/ssd.img"
size = "16M"
[[device]]
name = "ssd_slow"
kind = "delay"
over = "ssd_file"
latency = "1ms"
[[device]]
name = "fc"
kind = "faulty"
over = "ssd_slow"
[[device]]
name = "hdd_file"
kind = "file"
path = "{d}/hdd.img"
size = "9M"
[[device]]
name = "hdd_slow"
kind = "delay"
over = "hdd_file"
latency = "1ms"
[[device]]
name = "fb"
kind = "faulty"
over = "hdd_slow"
[[device]]
name = "hybrid"
kind = "cache"
cache = "fc"
backing = "fb"
mode = "writeback"
block = "16K"
[[target]]
name = "{IQN}"
[[target.lun]]
lun = 0
device = "hybrid"
"#
    )
}

/// One atomic write of a round: `pieces` pieces from `first`, all `tag`.
struct Written {
    first: usize,
    pieces: usize,
    tag: u64,
    /// Acknowledged with FUA, or before an acknowledged SYNCHRONIZE CACHE.
    durable: bool,
    /// Answered GOOD (not yet covered by a flush).
    acknowledged: bool,
}

fn write_atomic_16(lba: u64, blocks: u16, fua: bool) -> [u8; 16] {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x9C;
    if fua {
        cdb[1] = 0x08;
    }
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[12..14].copy_from_slice(&blocks.to_be_bytes());
    cdb
}

/// Atomic writes of ranges no other write of the round touches, and now
/// and then a SYNCHRONIZE CACHE, until the daemon dies.
fn workload(s: &mut Session, rng: &mut Rng, tag: &mut u64, lun: &Lun) -> Vec<Written> {
    let mut taken = vec![false; PIECES];
    let mut writes: Vec<Written> = Vec::new();
    loop {
        let free_range = (0..20).find_map(|_| {
            let pieces = rng.range(1, lun.max_pieces) as usize;
            let first = rng.below((PIECES - pieces) as u64) as usize;
            (!taken[first..first + pieces].iter().any(|&t| t)).then_some((first, pieces))
        });
        let done = match free_range {
            Some((first, pieces)) if !rng.one_in(10) => {
                *tag += 1;
                let fua = rng.one_in(2);
                taken[first..first + pieces].fill(true);
                let data: Vec<u8> = (first..first + pieces)
                    .flat_map(|p| content(*tag, p))
                    .collect();
                let lba = (first * PIECE / BLOCK) as u64;
                let blocks = (pieces * PIECE / BLOCK) as u16;
                let r = s.command(0, &write_atomic_16(lba, blocks, fua), &data, 0);
                let good = matches!(&r, Ok(c) if c.status == 0);
                if let Ok(c) = &r {
                    // GOOD, or the disk failing under the cut, or refused
                    // where the LUN may lose its atomic writes in the cut.
                    assert!(
                        c.status == 0
                            || c.sense_key() == Some(0x03)
                            || (lun.refusal_after_cut && c.sense_key() == Some(0x05)),
                        "WRITE ATOMIC of {blocks} blocks at {lba}: status {} sense {:02x?}",
                        c.status,
                        c.sense
                    );
                }
                writes.push(Written {
                    first,
                    pieces,
                    tag: *tag,
                    durable: good && fua,
                    acknowledged: good,
                });
                r.map(|_| ())
            }
            _ => {
                let r = s.command(0, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0);
                if matches!(&r, Ok(c) if c.status == 0) {
                    for w in &mut writes {
                        w.durable |= w.acknowledged;
                    }
                }
                r.map(|_| ())
            }
        };
        if done.is_err() {
            return writes;
        }
    }
}

/// Reads the volume and checks every write of the last round was kept
/// whole or not at all, and everything else is as it was; takes what was
/// read as the durable state. Returns how many writes answered GOOD were
/// kept whole and how many lost whole (those not yet flushed), and how
/// many writes of any outcome were lost whole.
fn verify(
    s: &mut Session,
    durable: &mut [u64],
    writes: &[Written],
    round: usize,
) -> (usize, usize, usize) {
    let mut volume = Vec::with_capacity(VOLUME_BYTES);
    let blocks_per_read = (1 << 20) / BLOCK;
    for chunk in 0..VOLUME_BYTES >> 20 {
        let lba = (chunk * blocks_per_read) as u32;
        let data = s
            .read10(0, lba, blocks_per_read as u16, BLOCK as u32)
            .expect("READ(10) after restart");
        volume.extend_from_slice(&data);
    }
    let piece = |p: usize| &volume[p * PIECE..(p + 1) * PIECE];
    let mut written = vec![false; PIECES];
    let (mut kept, mut lost, mut lost_any) = (0, 0, 0);
    for w in writes {
        let range = w.first..w.first + w.pieces;
        let new = range
            .clone()
            .filter(|&p| piece(p) == content(w.tag, p))
            .count();
        let old = range
            .clone()
            .filter(|&p| piece(p) == content(durable[p], p))
            .count();
        assert!(
            new == w.pieces || old == w.pieces,
            "round {round}: the atomic write of pieces {range:?} (tag {}) is torn: \
             {new} pieces new, {old} old",
            w.tag
        );
        assert!(
            !w.durable || new == w.pieces,
            "round {round}: the acknowledged, flushed atomic write of pieces {range:?} is lost"
        );
        if w.acknowledged {
            if new == w.pieces {
                kept += 1;
            } else {
                lost += 1;
            }
        }
        if new == w.pieces {
            for p in range {
                durable[p] = w.tag;
                written[p] = true;
            }
        } else {
            lost_any += 1;
            range.for_each(|p| written[p] = true);
        }
    }
    for p in (0..PIECES).filter(|&p| !written[p]) {
        assert!(
            piece(p) == content(durable[p], p),
            "round {round}: piece {p}, which no write of the round touched, changed"
        );
    }
    (kept, lost, lost_any)
}

/// Every piece written with a plain WRITE and flushed: the old bytes that
/// atomic writes must not tear into.
fn fill(s: &mut Session, durable: &mut [u64], tag: &mut u64) {
    let per_write = (256 << 10) / PIECE;
    for first in (0..PIECES).step_by(per_write) {
        *tag += 1;
        let data: Vec<u8> = (first..first + per_write)
            .flat_map(|p| content(*tag, p))
            .collect();
        s.write10(0, (first * PIECE / BLOCK) as u32, &data, BLOCK as u32)
            .expect("fill");
        durable[first..first + per_write].fill(*tag);
    }
    s.command_good(0, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0)
        .expect("SYNCHRONIZE CACHE");
}

/// Rounds of atomic writes, each ended by a power cut and SIGKILL, each
/// checked after the restart.
fn power_cuts(lun: &Lun) {
    let mut rng = Rng::new(seed("ATOMIC_CRASH_SEED"));
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg_path = dir.path().join("openarray.toml");
    std::fs::write(&cfg_path, (lun.config)(dir.path())).expect("write config");
    let cfg = cfg_path.to_str().expect("utf-8").to_string();
    let sock = dir.path().join("admin.sock");
    let sock = sock.to_str().expect("utf-8").to_string();

    let mut durable = vec![0u64; PIECES];
    let mut writes = Vec::new();
    let mut tag = 0u64;
    let (mut kept, mut lost, mut lost_any, mut issued) = (0, 0, 0, 0);
    let start = Instant::now();
    let mut rounds = 0;
    loop {
        let daemon = AdminDaemon::start_listening(&cfg_path, dir.path(), free_port());
        if let Some(raid) = lun.raid {
            wait_clean(&daemon, raid.array);
            let lost = raid.members[rounds % raid.members.len()];
            daemon.ok(&["device", "fault", lost, "fail"]);
        }
        let mut s = login(daemon.addr(), IQN);
        let (k, l, a) = verify(&mut s, &mut durable, &writes, rounds);
        (kept, lost, lost_any) = (kept + k, lost + l, lost_any + a);
        if rounds == ROUNDS || start.elapsed() >= lun.budget {
            break;
        }
        if rounds == 0 {
            fill(&mut s, &mut durable, &mut tag);
        }
        let pid = daemon.pid() as i32;
        let delay = Duration::from_millis(rng.range(5, 200));
        let cut = lun.cut;
        let killer = {
            let sock = sock.clone();
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                for (dev, fault) in cut {
                    let (ok, text) = openarray(&["device", "fault", "--socket", &sock, dev, fault]);
                    assert!(ok, "device fault {dev} {fault}: {text}");
                }
                // SAFETY: kill(2) on our own child, still unreaped.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            })
        };
        writes = workload(&mut s, &mut rng, &mut tag, lun);
        issued += writes.len();
        killer.join().expect("killer thread");
        drop(s);
        drop(daemon);
        if let Some(pool) = lun.pool {
            let (ok, text) = openarray(&["pool", "check", "-c", &cfg, pool]);
            assert!(ok, "round {rounds}: pool check:\n{text}");
        }
        rounds += 1;
    }
    eprintln!(
        "{rounds} power cuts, {issued} atomic writes sent, {lost_any} lost whole; of those \
         answered GOOD, {kept} kept whole and {lost} (not yet flushed) lost whole; none torn, \
         in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    assert!(rounds >= 10, "only {rounds} rounds fit in the time budget");
    assert!(
        lost_any > 0,
        "no cut ever caught a write before it was durable"
    );
}

/// Waits until RAID `array` has nothing to resync or catch up.
fn wait_clean(daemon: &AdminDaemon, array: &str) {
    let start = Instant::now();
    loop {
        let text = daemon.ok(&["raid", "status", array, "--json"]);
        let st: serde_json::Value = serde_json::from_str(&text).expect("raid status --json");
        if st["sync"].is_null() && st["state"] == "clean" {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{array} not clean: {st:#}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A raw RAID5 LUN over four faulty(delay(file)) members, 8 MiB of it
/// written.
fn raid_config(dir: &Path) -> String {
    let d = dir.display();
    let mut text = String::new();
    for m in RAID_MEMBERS {
        text += &format!(
            "[[device]]\nname = \"{m}-file\"\nkind = \"file\"\npath = \"{d}/{m}.img\"\nsize = \"16M\"\n\
             [[device]]\nname = \"{m}-slow\"\nkind = \"delay\"\nover = \"{m}-file\"\nlatency = \"1ms\"\n\
             [[device]]\nname = \"{m}\"\nkind = \"faulty\"\nover = \"{m}-slow\"\n"
        );
    }
    text += &format!(
        "[[device]]\nname = \"r5\"\nkind = \"raid\"\nlevel = 5\n\
         members = [\"m0\", \"m1\", \"m2\", \"m3\"]\nchunk = \"64K\"\nbitmap_region = \"256K\"\nlog_slots = 16\n\
         [[target]]\nname = \"{IQN}\"\n[[target.lun]]\nlun = 0\ndevice = \"r5\"\n"
    );
    text
}

const RAID_MEMBERS: [&str; 4] = ["m0", "m1", "m2", "m3"];

#[test]
fn power_cuts_during_atomic_writes_to_a_thin_volume_leave_each_whole_or_untouched() {
    power_cuts(&Lun {
        config: pool_config,
        cut: &[("f0", "fail"), ("f0", "drop-unflushed")],
        budget: Duration::from_secs(30),
        pool: Some("tank"),
        refusal_after_cut: false,
        max_pieces: MAX_PIECES,
        raid: None,
    });
}

/// The backing fails first, so that the cache cannot record its own
/// failure there.
#[test]
fn power_cuts_during_atomic_writes_to_a_write_back_cache_leave_each_whole_or_untouched() {
    power_cuts(&Lun {
        config: cache_config,
        cut: &[
            ("fb", "fail"),
            ("fc", "fail"),
            ("fb", "drop-unflushed"),
            ("fc", "drop-unflushed"),
        ],
        budget: Duration::from_secs(20),
        pool: None,
        refusal_after_cut: true,
        max_pieces: MAX_PIECES,
        raid: None,
    });
}

/// Every member fails first, then each drops what it had not flushed; the
/// restart replays the journal, then a member is lost.
#[test]
fn power_cuts_during_atomic_writes_to_a_raid5_lun_then_a_lost_member_leave_each_whole_or_untouched()
{
    power_cuts(&Lun {
        config: raid_config,
        cut: &[
            ("m0", "fail"),
            ("m1", "fail"),
            ("m2", "fail"),
            ("m3", "fail"),
            ("m0", "drop-unflushed"),
            ("m1", "drop-unflushed"),
            ("m2", "drop-unflushed"),
            ("m3", "drop-unflushed"),
        ],
        budget: Duration::from_secs(40),
        pool: None,
        refusal_after_cut: false,
        max_pieces: RAID_MAX_PIECES,
        raid: Some(RaidLoss {
            array: "r5",
            members: &RAID_MEMBERS,
        }),
    });
}
