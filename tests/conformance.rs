//! libiscsi's SCSI/iSCSI conformance suite (`iscsi-test-cu`) against the
//! real daemon.
//!
//! Each scenario runs the whole suite and holds two bars, both committed
//! beside this file:
//! - `conformance/expected-failures.txt`: the only tests allowed to fail.
//!   A listed test that passes fails the run too, so the list only shrinks.
//! - `conformance/floor.txt`: the least number of tests that must really
//!   pass (skips do not count); it only rises.
//!
//! The full per-test report of each scenario lands in
//! `target/conformance/<scenario>.txt`.

mod common;
#[path = "conformance/outcome.rs"]
mod outcome;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use common::Daemon;
use outcome::{Outcome, Results};

fn spec_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance")
}

/// scenario -> tests allowed to fail in it.
fn expected_failures() -> BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string(spec_dir().join("expected-failures.txt"))
        .expect("read tests/conformance/expected-failures.txt");
    let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let (scenario, test) = line
            .split_once(char::is_whitespace)
            .unwrap_or_else(|| panic!("expected-failures.txt: `{line}` is not `SCENARIO TEST`"));
        map.entry(scenario.to_string())
            .or_default()
            .insert(test.trim().to_string());
    }
    map
}

/// scenario -> least number of really passing tests.
fn floor(scenario: &str) -> usize {
    let text = std::fs::read_to_string(spec_dir().join("floor.txt"))
        .expect("read tests/conformance/floor.txt");
    text.lines()
        .filter_map(|l| {
            let l = l.split('#').next()?.trim();
            let (s, n) = l.split_once(char::is_whitespace)?;
            (s == scenario).then(|| n.trim().parse::<usize>().expect("floor.txt: bad number"))
        })
        .next()
        .unwrap_or_else(|| panic!("floor.txt has no line for scenario `{scenario}`"))
}

/// Tests in the whole suite, and in its multipath family.
const ALL_TESTS: usize = 230;
const MULTIPATH_TESTS: usize = 4;

fn run_suite(scenario: &str, urls: &[String]) -> Results {
    outcome::run_suite(scenario, "ALL", urls)
}

fn check(scenario: &str, results: &Results) {
    check_count(scenario, results, ALL_TESTS)
}

fn check_count(scenario: &str, results: &Results, expected_tests: usize) {
    let allowed = expected_failures().remove(scenario).unwrap_or_default();
    let failed: BTreeSet<String> = results
        .names(Outcome::Failed)
        .into_iter()
        .map(String::from)
        .collect();
    let unexpected: Vec<_> = failed.difference(&allowed).collect();
    let now_passing: Vec<_> = allowed
        .iter()
        .filter(|t| results.outcomes.get(*t) == Some(&Outcome::Passed))
        .collect();
    let passed = results.count(Outcome::Passed);

    println!("conformance {scenario}: {}", results.summary_line());
    for name in results.names(Outcome::Skipped) {
        println!("  skipped {name}");
    }
    for name in &failed {
        println!(
            "  failed  {name}{}",
            if allowed.contains(name) {
                " (expected)"
            } else {
                ""
            }
        );
        for line in results.failure_details.get(name).into_iter().flatten() {
            println!("          {line}");
        }
    }

    let mut problems = Vec::new();
    if results.outcomes.len() < expected_tests {
        problems.push(format!(
            "only {} of {expected_tests} tests reported",
            results.outcomes.len()
        ));
    }
    if !unexpected.is_empty() {
        problems.push(format!("unexpected failures: {unexpected:?}"));
    }
    if !now_passing.is_empty() {
        problems.push(format!(
            "these now pass; remove them from tests/conformance/expected-failures.txt: {now_passing:?}"
        ));
    }
    let floor = floor(scenario);
    if passed < floor {
        problems.push(format!("{passed} tests passed, below the floor of {floor}"));
    }
    assert!(
        problems.is_empty(),
        "conformance {scenario}: {}",
        problems.join("; ")
    );
}

/// The whole suite as `scenario` against LUN `lun` of target `iqn`.
fn check_lun(scenario: &str, daemon: &Daemon, iqn: &str, lun: u64) {
    let url = format!("iscsi://127.0.0.1:{}/{iqn}/{lun}", daemon.port());
    check(scenario, &run_suite(scenario, &[url]));
}

/// The embedded default: 1 GiB RAM LUN 0 with 512-byte blocks.
#[test]
fn default_lun() {
    let daemon = Daemon::start();
    check_lun("default", &daemon, &daemon.first_target(), 0);
}

/// The multipath family against the default LUN through two portals of one
/// target. It runs apart from the whole suite because there the earlier
/// Sanitize.Reservations test leaves a RESERVE(6) held through the second
/// path, which (rightly) conflicts with Sanitize.Reset on the first.
#[test]
fn default_lun_multipath() {
    let daemon = Daemon::start_portals(None, 2);
    let iqn = daemon.first_target();
    let urls: Vec<String> = daemon
        .ports()
        .iter()
        .map(|p| format!("iscsi://127.0.0.1:{p}/{iqn}/0"))
        .collect();
    let results = outcome::run_suite("multipath", "ALL.MultipathIO", &urls);
    check_count("multipath", &results, MULTIPATH_TESTS);
}

const CONFORMANCE_IQN: &str = "iqn.2026-11.org.openarray:conformance";
const THIN_IQN: &str = "iqn.2026-11.org.openarray:thin";

const FILE_AND_HIGH_LUN_CONFIG: &str = r#"
[[device]]
name = "file4k"
kind = "file"
path = "@DIR@/file4k.img"
size = "1G"
block_size = 4096
# As on a real disk: past the page cache, reads in batches.
direct = true

[[device]]
name = "ram201"
kind = "mem"
size = "1G"

[[target]]
name = "iqn.2026-11.org.openarray:conformance"

[[target.lun]]
lun = 0
device = "file4k"

[[target.lun]]
lun = 201
device = "ram201"
"#;

/// A daemon on one portal serving `config`, whose `@DIR@` becomes a fresh
/// directory that lives as long as the returned handle.
fn daemon_in_tempdir(config: &str) -> (Daemon, tempfile::TempDir) {
    daemon_in(tempfile::tempdir().expect("tempdir"), config)
}

/// Like [`daemon_in_tempdir`], in the directory `dir`.
fn daemon_in(dir: tempfile::TempDir, config: &str) -> (Daemon, tempfile::TempDir) {
    let config = config.replace("@DIR@", dir.path().to_str().expect("utf-8"));
    let path = dir.path().join("openarray.toml");
    std::fs::write(&path, config).expect("write config");
    (Daemon::start_portals(Some(&path), 1), dir)
}

fn file_and_high_lun_daemon() -> (Daemon, tempfile::TempDir) {
    daemon_in_tempdir(FILE_AND_HIGH_LUN_CONFIG)
}

/// A file-backed LUN with 4096-byte blocks, opened with O_DIRECT.
#[test]
fn file_lun_4k_blocks() {
    let (daemon, _dir) = file_and_high_lun_daemon();
    check_lun("file4k", &daemon, CONFORMANCE_IQN, 0);
}

/// A LUN numbered 201, as ESXi deployments map them.
#[test]
fn lun_numbered_201() {
    let (daemon, _dir) = file_and_high_lun_daemon();
    check_lun("lun201", &daemon, CONFORMANCE_IQN, 201);
}

const SHM_IQN: &str = "iqn.2026-11.org.openarray:shm";

/// A file LUN on tmpfs without O_DIRECT: READs from 32 KiB on leave from
/// the file's pages (sendfile) instead of a buffer.
#[test]
fn file_lun_on_tmpfs() {
    let dir = tempfile::tempdir_in("/dev/shm").expect("tempdir on /dev/shm");
    let config = format!(
        r#"
[[device]]
name = "shm"
kind = "file"
path = "@DIR@/shm.img"
size = "1G"
block_size = 512

[[target]]
name = "{SHM_IQN}"

[[target.lun]]
lun = 0
device = "shm"
"#
    );
    let (daemon, _dir) = daemon_in(dir, &config);
    check_lun("shm", &daemon, SHM_IQN, 0);
}

const THIN_CONFIG: &str = r#"
[[pool]]
name = "tank"
devices = ["@DIR@/tank0.img", "@DIR@/tank1.img"]
device_size = "640M"

[[device]]
name = "thin0"
kind = "volume"
pool = "tank"
size = "1G"

[[target]]
name = "iqn.2026-11.org.openarray:thin"

[[target.lun]]
lun = 0
device = "thin0"
"#;

/// A 1 GiB thin volume (the size of the other scenarios' LUNs) of a pool
/// over two sparse files: UNMAP, WRITE SAME with UNMAP and GET LBA STATUS
/// run against real allocation.
#[test]
fn thin_volume_lun() {
    // On tmpfs, so that short READs leave from the pool file's pages; the
    // 4 KiB physical block scenario below keeps a pool on disk.
    let dir = tempfile::tempdir_in("/dev/shm").expect("tempdir on /dev/shm");
    let (daemon, _dir) = daemon_in(dir, THIN_CONFIG);
    check_lun("thin", &daemon, THIN_IQN, 0);
}

/// The tests that need more than one logical block per physical block and
/// skip elsewhere: unaligned WRITE SAME with UNMAP and the Data-Out size
/// checks that use a physical block.
const PHYSICAL_BLOCK_TESTS: &[&str] = &[
    "ALL.WriteSame10.UnmapUnaligned",
    "ALL.WriteSame16.UnmapUnaligned",
    "ALL.WriteSame10.InvalidDataOutSize",
    "ALL.WriteSame16.InvalidDataOutSize",
    "ALL.CompareAndWrite.InvalidDataOutSize",
];

/// The thin volume again, reporting 4 KiB physical blocks under its
/// 512-byte logical blocks ("512e"), for the tests in
/// `PHYSICAL_BLOCK_TESTS`. Only those run: with LBPPB > 1 libiscsi 1.19's
/// GetLBAStatus.UnmapSingle asks for the status of LBA n + 1 and requires
/// the answer to start at n + LBPPB, which no correct target gives (see
/// docs/pool.md, "Granularity").
#[test]
fn thin_volume_with_4k_physical_blocks() {
    let config = THIN_CONFIG.replace("size = \"1G\"", "size = \"1G\"\nphysical_block_size = 4096");
    let (daemon, _dir) = daemon_in_tempdir(&config);
    let url = format!("iscsi://127.0.0.1:{}/{THIN_IQN}/0", daemon.port());
    let results = outcome::run_suite("thin512e", &PHYSICAL_BLOCK_TESTS.join(","), &[url]);
    for name in PHYSICAL_BLOCK_TESTS {
        assert_eq!(
            results.outcomes.get(*name),
            Some(&Outcome::Passed),
            "thin512e: {name} did not pass (it must run, not skip)"
        );
    }
    check_count("thin512e", &results, PHYSICAL_BLOCK_TESTS.len());
}

const CACHE_IQN: &str = "iqn.2026-11.org.openarray:cache";

/// A 1 GiB RAM backing behind a 128 MiB RAM cache in `mode`, with 16 KiB
/// lines so that the suite's I/O both hits and evicts. Its floor is the
/// file LUN's: WRITE ATOMIC (6 tests) is offered only by devices that keep
/// nothing across a crash, like the default RAM LUN.
fn cache_config(mode: &str) -> String {
    format!(
        r#"
[[device]]
name = "ssd"
kind = "mem"
size = "128M"

[[device]]
name = "hdd"
kind = "mem"
size = "1G"

[[device]]
name = "hybrid"
kind = "cache"
cache = "ssd"
backing = "hdd"
mode = "{mode}"
block = "16K"

[[target]]
name = "{CACHE_IQN}"

[[target.lun]]
lun = 0
device = "hybrid"
"#
    )
}

/// The whole suite on a LUN over a write-through cache.
#[test]
fn cache_writethrough_lun() {
    let (daemon, _dir) = daemon_in_tempdir(&cache_config("writethrough"));
    check_lun("cache_writethrough", &daemon, CACHE_IQN, 0);
}

/// The whole suite on a LUN over a write-back cache.
#[test]
fn cache_writeback_lun() {
    let (daemon, _dir) = daemon_in_tempdir(&cache_config("writeback"));
    check_lun("cache_writeback", &daemon, CACHE_IQN, 0);
}
