//! A thin pool that fills up speaks up. Our initiator fills a 16 MiB pool
//! through a 64 MiB volume, one 64 KiB unit per WRITE, while another
//! session keeps writing and reading a volume of another pool:
//!
//! - the pool's soft threshold (50%) shows in the Logical Block
//!   Provisioning VPD page (as libiscsi's `iscsi-inq` reads it too) and
//!   mode page; the write that brings the pool
//!   to it completes, and then every I_T nexus of the volume (two
//!   initiators) is told THIN PROVISIONING SOFT THRESHOLD REACHED once,
//!   the other pool's LUN nothing; the daemon logs a warning and
//!   `/metrics` counts it;
//! - the first write past the last free unit gets DATA PROTECT, SPACE
//!   ALLOCATION FAILED WRITE PROTECT, a rewrite of a written unit still
//!   succeeds, and fifty more refused writes make one log line but fifty
//!   more in `/metrics`;
//! - `pool status` reports the over-commit, and `max_overcommit` refuses a
//!   volume beyond it.
//!
//! The same run without a threshold gets no unit attention at all, which
//! is what the first test would see if the threshold were not delivered;
//! a threshold applied live to the full pool is then reached at once.

mod common;

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::admin::AdminDaemon;
use common::iscsi::{rw10_cdb, Completion, LoginParams, Session, STATUS_GOOD};
use common::{free_port, http_get, prometheus_sample, require_tool, run_with_timeout};

const IQN: &str = "iqn.2026-11.org.openarray.test:alerts";
const UNIT: usize = 64 << 10;
const BLOCK: usize = 512;
/// Units of a 16 MiB data file: one holds the superblock.
const POOL_UNITS: u32 = 255;
/// 50% of them, rounded up.
const THRESHOLD_UNITS: u32 = 128;
const CHECK_CONDITION: u8 = 0x02;

fn config(dir: &Path, port: u16, threshold: bool) -> String {
    let d = dir.display();
    let threshold = if threshold {
        "soft_threshold = \"50%\"\n"
    } else {
        ""
    };
    format!(
        r#"
[[portal]]
listen = "127.0.0.1:{port}"

[[pool]]
name = "tank"
devices = ["{d}/tank0.img"]
device_size = "16M"
{threshold}max_overcommit = 5.0

[[pool]]
name = "other"
devices = ["{d}/other0.img"]
device_size = "16M"

[[device]]
name = "thin"
kind = "volume"
pool = "tank"
size = "64M"

[[device]]
name = "elsewhere"
kind = "volume"
pool = "other"
size = "8M"

[[target]]
name = "{IQN}"
[[target.lun]]
lun = 0
device = "thin"
[[target.lun]]
lun = 1
device = "elsewhere"
"#
    )
}

fn login(port: u16, initiator: &str) -> Session {
    let addr = ([127, 0, 0, 1], port).into();
    let params = LoginParams::normal(&format!("iqn.2026-11.org.test:{initiator}"), IQN);
    let mut s = Session::login(addr, &params, Duration::from_secs(30)).expect("login");
    for lun in [0, 1] {
        s.command_good(lun, &[0; 6], &[], 0)
            .expect("power-on unit attention");
    }
    s
}

/// (sense key, ASC, ASCQ) of a CHECK CONDITION.
fn sense(c: &Completion) -> (u8, u8, u8) {
    assert_eq!(c.status, CHECK_CONDITION, "expected CHECK CONDITION: {c:?}");
    let s = &c.sense;
    match s[0] & 0x7F {
        0x72 | 0x73 => (s[1] & 0x0F, s[2], s[3]),
        _ => (s[2] & 0x0F, s[12], s[13]),
    }
}

fn test_unit_ready(s: &mut Session, lun: u64) -> Completion {
    s.command(lun, &[0; 6], &[], 0).expect("TEST UNIT READY")
}

fn write_unit(s: &mut Session, unit: u32, fill: u8) -> Completion {
    let per_unit = (UNIT / BLOCK) as u32;
    let cdb = rw10_cdb(0x2A, unit * per_unit, per_unit as u16);
    s.command(0, &cdb, &vec![fill; UNIT], 0).expect("WRITE(10)")
}

/// `GET /metrics` on the administration socket.
fn metrics(socket: &Path) -> String {
    let stream = UnixStream::connect(socket).expect("admin socket");
    http_get(stream, "/metrics").1
}

/// An integer sample of `/metrics`.
fn sample(text: &str, name: &str, labels: &str) -> Option<u64> {
    prometheus_sample(text, name, labels).map(|v| v as u64)
}

/// The daemon serving [`config`] from a new directory, kept with it.
fn start(threshold: bool) -> (tempfile::TempDir, u16, AdminDaemon) {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let path = dir.path().join("openarray.toml");
    std::fs::write(&path, config(dir.path(), port, threshold)).unwrap();
    let daemon = AdminDaemon::start(&path, dir.path(), port);
    (dir, port, daemon)
}

/// Writes and reads back the other pool's volume until told to stop;
/// returns how many rounds went through.
fn other_pool_io(port: u16, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut s = login(port, "elsewhere");
        let mut rounds = 0u64;
        while !stop.load(Ordering::Relaxed) || rounds == 0 {
            let lba = (rounds % 64) as u32 * 256;
            let data = vec![(rounds % 251) as u8; 128 << 10];
            s.write10(1, lba, &data, BLOCK as u32)
                .expect("write to the other pool");
            let back = s.read10(1, lba, 256, BLOCK as u32).expect("read it back");
            assert!(back == data, "the other pool's volume read back wrong");
            rounds += 1;
        }
        rounds
    })
}

#[test]
fn a_pool_past_its_soft_threshold_tells_every_nexus_then_refuses_writes_when_full() {
    let (_dir, port, daemon) = start(true);
    let mut a = login(port, "a");
    let mut b = login(port, "b");
    let stop = Arc::new(AtomicBool::new(false));
    let elsewhere = other_pool_io(port, stop.clone());

    // THRESHOLD EXPONENT: a 64 KiB unit is 2^7 blocks; the mode page's
    // descriptor counts the threshold in those sets.
    let vpd = a
        .command_good(0, &[0x12, 1, 0xB2, 0, 64, 0], &[], 64)
        .unwrap();
    assert_eq!(vpd[4], 7, "THRESHOLD EXPONENT in {vpd:02x?}");
    let page = a
        .command_good(0, &[0x5A, 0x08, 0x1C, 0x02, 0, 0, 0, 0, 255, 0], &[], 255)
        .unwrap();
    let lbp = &page[8..];
    assert_eq!(&lbp[..4], &[0x5C, 0x02, 0, 20], "page {page:02x?}");
    assert_eq!(lbp[16], 0x81, "enabled soft threshold, armed increasing");
    assert_eq!(lbp[17], 0x02, "used LBA mapping resources");
    assert_eq!(
        u32::from_be_bytes(lbp[20..24].try_into().unwrap()),
        THRESHOLD_UNITS
    );

    // libiscsi reads the same exponent.
    require_tool("iscsi-inq");
    let mut inq = Command::new("iscsi-inq");
    inq.args(["-e", "1", "-c", "178"])
        .arg(format!("iscsi://127.0.0.1:{port}/{IQN}/0"));
    let out = run_with_timeout(inq, Duration::from_secs(60));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Threshold Exponent:7"), "iscsi-inq: {text}");

    for unit in 0..THRESHOLD_UNITS - 1 {
        assert_eq!(write_unit(&mut a, unit, 1).status, STATUS_GOOD);
    }
    assert_eq!(test_unit_ready(&mut a, 0).status, STATUS_GOOD, "too early");
    assert!(!daemon.log().contains("soft threshold"));
    // The write that reaches the threshold completes; the next command of
    // each nexus of the volume meets the unit attention, once.
    let reaching = write_unit(&mut a, THRESHOLD_UNITS - 1, 1);
    assert_eq!(reaching.status, STATUS_GOOD);
    let reached = (0x06, 0x38, 0x07);
    assert_eq!(sense(&test_unit_ready(&mut a, 0)), reached);
    assert_eq!(test_unit_ready(&mut a, 0).status, STATUS_GOOD);
    assert_eq!(sense(&test_unit_ready(&mut b, 0)), reached);
    assert_eq!(test_unit_ready(&mut b, 0).status, STATUS_GOOD);
    assert_eq!(
        test_unit_ready(&mut a, 1).status,
        STATUS_GOOD,
        "the other pool's LUN has nothing to say"
    );
    let log = daemon.log();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("pool reached its soft threshold")
            && l.contains("pool=tank")),
        "{log}"
    );
    let m = metrics(&daemon.socket);
    let tank = "pool=\"tank\"";
    assert_eq!(
        sample(&m, "openarray_pool_soft_threshold_reached_total", tank),
        Some(1)
    );
    assert_eq!(
        sample(&m, "openarray_pool_soft_threshold_bytes", tank),
        Some(u64::from(THRESHOLD_UNITS) * UNIT as u64)
    );
    assert_eq!(
        sample(&m, "openarray_pool_used_bytes", tank),
        Some(u64::from(THRESHOLD_UNITS) * UNIT as u64)
    );
    assert_eq!(
        sample(
            &m,
            "openarray_pool_soft_threshold_reached_total",
            "pool=\"other\""
        ),
        Some(0)
    );

    // Fill the rest; nothing more is said on the way.
    for unit in THRESHOLD_UNITS..POOL_UNITS {
        assert_eq!(
            write_unit(&mut a, unit, 2).status,
            STATUS_GOOD,
            "unit {unit}"
        );
    }
    assert_eq!(test_unit_ready(&mut b, 0).status, STATUS_GOOD);
    let full = write_unit(&mut a, POOL_UNITS, 3);
    assert_eq!(sense(&full), (0x07, 0x27, 0x07), "SPACE ALLOCATION FAILED");
    // A unit already written is rewritten in place.
    assert_eq!(write_unit(&mut a, 0, 4).status, STATUS_GOOD);
    for unit in POOL_UNITS + 1..POOL_UNITS + 51 {
        assert_eq!(sense(&write_unit(&mut a, unit, 3)).2, 0x07);
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = elsewhere.join().expect("the other pool's I/O");
    assert!(rounds > 0);
    eprintln!("the other pool's volume took {rounds} verified 128 KiB writes meanwhile");

    let log = daemon.log();
    let full_lines: Vec<&str> = log.lines().filter(|l| l.contains("pool is full")).collect();
    assert_eq!(
        full_lines.len(),
        1,
        "one line for 51 refusals: {full_lines:?}"
    );
    assert!(
        full_lines[0].contains("pool=tank") && full_lines[0].contains("volume=thin"),
        "{}",
        full_lines[0]
    );
    let m = metrics(&daemon.socket);
    assert_eq!(
        sample(&m, "openarray_pool_allocation_failures_total", tank),
        Some(51)
    );
    assert_eq!(sample(&m, "openarray_pool_free_bytes", tank), Some(0));
    assert_eq!(
        sample(&m, "openarray_pool_provisioned_bytes", tank),
        Some(64 << 20)
    );
    assert_eq!(
        sample(
            &m,
            "openarray_volume_mapped_bytes",
            "pool=\"tank\",volume=\"thin\",kind=\"volume\""
        ),
        Some(u64::from(POOL_UNITS) * UNIT as u64)
    );

    // 64 MiB of volumes on 255 units: over-committed about 4×, under the
    // limit of 5; a volume that would pass it is refused, naming it.
    let status = daemon.ok(&["pool", "status", "tank"]);
    assert!(
        status.contains("provisioned 64M (4.02× the pool, at most 5×)"),
        "{status}"
    );
    assert!(status.contains("51 writes refused"), "{status}");
    let created = daemon.ok(&["volume", "create", "--pool", "tank", "small", "4M"]);
    assert!(created.contains("over-committed (4.27×)"), "{created}");
    let refused = daemon.cli(&["volume", "create", "--pool", "tank", "big", "16M"]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(err.contains("beyond its max_overcommit of 5"), "{err}");
    drop(daemon);
}

#[test]
fn without_a_threshold_filling_the_pool_says_nothing_until_one_is_applied() {
    let (dir, port, daemon) = start(false);
    let mut a = login(port, "a");
    let vpd = a
        .command_good(0, &[0x12, 1, 0xB2, 0, 64, 0], &[], 64)
        .unwrap();
    assert_eq!(vpd[4], 7, "thresholds are supported, none is set");
    for unit in 0..POOL_UNITS {
        let w = write_unit(&mut a, unit, 1);
        assert_eq!(w.status, STATUS_GOOD, "unit {unit}: {w:?}");
    }
    assert_eq!(test_unit_ready(&mut a, 0).status, STATUS_GOOD);
    assert_eq!(
        sense(&write_unit(&mut a, POOL_UNITS, 3)),
        (0x07, 0x27, 0x07)
    );
    assert!(!daemon.log().contains("soft threshold"));
    let m = metrics(&daemon.socket);
    assert_eq!(
        sample(
            &m,
            "openarray_pool_soft_threshold_reached_total",
            "pool=\"tank\""
        ),
        Some(0)
    );
    assert_eq!(
        sample(&m, "openarray_pool_soft_threshold_bytes", "pool=\"tank\""),
        None
    );

    // A threshold applied to the running daemon below the space in use is
    // reached at once, and the volume's LU (kept across the change) tells
    // its nexus.
    let limited = dir.path().join("limited.toml");
    std::fs::write(&limited, config(dir.path(), port, true)).unwrap();
    let applied = daemon.config_cli(&["apply", limited.to_str().unwrap()]);
    assert!(applied.status.success(), "config apply failed");
    assert_eq!(sense(&test_unit_ready(&mut a, 0)), (0x06, 0x38, 0x07));
    assert!(daemon.log().contains("pool reached its soft threshold"));
    let page = a
        .command_good(0, &[0x5A, 0x08, 0x1C, 0x02, 0, 0, 0, 0, 255, 0], &[], 255)
        .unwrap();
    assert_eq!(page[8 + 16], 0x81, "enabled now");
}
