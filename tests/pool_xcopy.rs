//! EXTENDED COPY of 1 GiB between thin volumes: within one pool the
//! volume shares the source's units (nothing is copied or allocated),
//! across pools the data is moved. Both copies must read back exactly; the
//! test prints both durations and holds the shared copy well under the
//! data copy.
mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::iscsi::{LoginParams, Session};
use common::xcopy;
use common::Daemon;

const IQN: &str = "iqn.2026-11.org.openarray.test:xcopy";
const SIZE: u64 = 1 << 30;
const BLOCK: u64 = 512;
/// Blocks per WRITE(10) while filling the source.
const WRITE_BLOCKS: u64 = 2048;
/// Blocks per EXTENDED COPY segment (one segment per command).
const SEGMENT_BLOCKS: u64 = 32768;

fn config(dir: &Path) -> String {
    format!(
        r#"
[[pool]]
name = "tank"
devices = ["{d}/tank.img"]
device_size = "2200M"

[[pool]]
name = "other"
devices = ["{d}/other.img"]
device_size = "1100M"

[[device]]
name = "a"
kind = "volume"
pool = "tank"
size = "1G"

[[device]]
name = "b"
kind = "volume"
pool = "tank"
size = "1G"

[[device]]
name = "c"
kind = "volume"
pool = "other"
size = "1G"

[[target]]
name = "{IQN}"

[[target.lun]]
lun = 0
device = "a"

[[target.lun]]
lun = 1
device = "b"

[[target.lun]]
lun = 2
device = "c"
"#,
        d = dir.display()
    )
}

/// The content of the source block `lba`: its number, then a byte pattern.
fn pattern(first_lba: u64, blocks: u64) -> Vec<u8> {
    let mut out = vec![0u8; (blocks * BLOCK) as usize];
    for (i, block) in out.chunks_mut(BLOCK as usize).enumerate() {
        let lba = first_lba + i as u64;
        block[..8].copy_from_slice(&lba.to_be_bytes());
        for (j, b) in block[8..].iter_mut().enumerate() {
            *b = (lba as usize * 7 + j) as u8;
        }
    }
    out
}

/// The LU's NAA designator from the Device Identification VPD page.
/// Copies the whole of LUN `from` to LUN `to`, one segment per command.
fn xcopy_all(s: &mut Session, from: u64, to: u64) -> Duration {
    let targets = [
        xcopy::target_descriptor(&xcopy::naa(s, from), BLOCK as u32),
        xcopy::target_descriptor(&xcopy::naa(s, to), BLOCK as u32),
    ]
    .concat();
    let start = Instant::now();
    let mut lba = 0;
    while lba < SIZE / BLOCK {
        xcopy::block_to_block(s, to, &targets, lba, lba, SEGMENT_BLOCKS as u16);
        lba += SEGMENT_BLOCKS;
    }
    sync(s, to);
    start.elapsed()
}

fn sync(s: &mut Session, lun: u64) {
    s.command_good(lun, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0)
        .expect("SYNCHRONIZE CACHE");
}

/// Reads LUN `lun` in 1 MiB steps, every 16th MiB, against the pattern.
fn verify(s: &mut Session, lun: u64) {
    for mib in (0..SIZE >> 20).step_by(16).chain([(SIZE >> 20) - 1]) {
        let lba = mib * 2048;
        let data = s
            .read10(lun, lba as u32, WRITE_BLOCKS as u16, BLOCK as u32)
            .expect("READ(10)");
        assert!(
            data == pattern(lba, WRITE_BLOCKS),
            "LUN {lun} MiB {mib} differs"
        );
    }
}

fn openarray(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_openarray"))
        .args(args)
        .output()
        .expect("run openarray");
    assert!(
        out.status.success(),
        "openarray {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Used bytes of a pool, from `openarray pool status`.
fn used(config: &str, pool: &str) -> u64 {
    let status = openarray(&["pool", "status", "--bytes", "-c", config, pool]);
    let line = status.lines().next().expect("status line");
    let after = line.split(" used ").nth(1).expect("used field");
    after
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no used bytes in `{line}`"))
}

#[test]
fn xcopy_within_a_pool_shares_and_across_pools_copies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg_path = dir.path().join("openarray.toml");
    std::fs::write(&cfg_path, config(dir.path())).expect("write config");
    let cfg = cfg_path.to_str().expect("utf-8");
    let daemon = Daemon::start_portals(Some(&cfg_path), 1);
    let params = LoginParams::normal("iqn.2026-11.org.openarray.test:host", IQN);
    let mut s = Session::login(daemon.addr(), &params, Duration::from_secs(60)).expect("login");

    let start = Instant::now();
    let mut lba = 0;
    while lba < SIZE / BLOCK {
        s.write10(0, lba as u32, &pattern(lba, WRITE_BLOCKS), BLOCK as u32)
            .expect("WRITE(10)");
        lba += WRITE_BLOCKS;
    }
    sync(&mut s, 0);
    let fill = start.elapsed();

    let shared = xcopy_all(&mut s, 0, 1);
    let copied = xcopy_all(&mut s, 0, 2);
    eprintln!(
        "1 GiB: write {:.2} s; EXTENDED COPY within the pool {:.3} s, to another pool {:.2} s",
        fill.as_secs_f64(),
        shared.as_secs_f64(),
        copied.as_secs_f64()
    );
    verify(&mut s, 1);
    verify(&mut s, 2);
    // The copies are independent: a write to the shared copy leaves the
    // source alone.
    s.write10(1, 0, &vec![0x5A; 4096], BLOCK as u32)
        .expect("WRITE(10)");
    assert!(s.read10(0, 0, 8, BLOCK as u32).expect("READ(10)") == pattern(0, 8));
    sync(&mut s, 1);
    s.logout().expect("logout");
    assert!(daemon.terminate().success());

    let (tank, other) = (used(cfg, "tank"), used(cfg, "other"));
    eprintln!("used after the copies: tank {tank} bytes, other {other} bytes");
    // The source's 1 GiB plus the one unit the write above copied.
    assert_eq!(tank, SIZE + (64 << 10), "the shared copy allocated nothing");
    assert_eq!(other, SIZE);
    openarray(&["pool", "check", "-c", cfg, "tank"]);
    openarray(&["pool", "check", "-c", cfg, "other"]);
    assert!(
        shared * 4 < copied,
        "sharing ({shared:?}) should take a fraction of copying ({copied:?})"
    );
}
