//! libiscsi's conformance suite (`iscsi-test-cu --dataloss
//! --allow-sanitize --test=ALL`) against LUNs on RAID: a thin volume of a
//! pool on RAID5 over four file members, and a raw RAID6 LUN over six.
//! Members live on tmpfs. Each run must fail nothing and pass at least its
//! scenario's floor in `conformance/floor.txt`, which only rises. File
//! members on tmpfs discard to zeros, so the array is thin and a raw array
//! LUN runs the logical block provisioning tests too. A third run fails a
//! member of a raw RAID5 LUN and has a hot spare rebuild under the suite.
//! Reports land in `target/conformance/<scenario>.txt`.

mod common;
#[path = "conformance/outcome.rs"]
mod outcome;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::admin::AdminDaemon;
use common::Daemon;
use outcome::Outcome;
use serde_json::Value;

const IQN: &str = "iqn.2026-11.org.openarray:raid";
/// Tests in the whole suite.
const ALL_TESTS: usize = 230;

fn floor(scenario: &str) -> usize {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/floor.txt");
    let text = std::fs::read_to_string(path).expect("read floor.txt");
    text.lines()
        .filter_map(|l| {
            let (s, n) = l
                .split('#')
                .next()?
                .trim()
                .split_once(char::is_whitespace)?;
            (s == scenario).then(|| n.trim().parse().expect("a number"))
        })
        .next()
        .unwrap_or_else(|| panic!("floor.txt has no line for `{scenario}`"))
}

fn members(dir: &Path, names: &[String], size: &str) -> String {
    names
        .iter()
        .map(|n| {
            format!(
                "[[device]]\nname = \"{n}\"\nkind = \"file\"\npath = \"{}/{n}.img\"\nsize = \"{size}\"\n",
                dir.display()
            )
        })
        .collect()
}

fn list(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

fn run(scenario: &str, config: &str, dir: &Path) {
    let path = dir.join("openarray.toml");
    std::fs::write(&path, config).expect("write config");
    let daemon = Daemon::start_portals(Some(&path), 1);
    let results = run_suite(scenario, daemon.port());
    check_suite(scenario, &results);
    daemon.terminate();
}

/// Runs the whole suite against LUN 0 of the target on `port` and writes
/// its report.
fn run_suite(scenario: &str, port: u16) -> outcome::Results {
    let url = format!("iscsi://127.0.0.1:{port}/{IQN}/0");
    let started = Instant::now();
    let results = outcome::run_suite(scenario, "ALL", &[url]);
    println!(
        "conformance {scenario}: {} in {:.0} s",
        results.summary_line(),
        started.elapsed().as_secs_f64()
    );
    results
}

/// Nothing failed, and at least the scenario's floor passed.
fn check_suite(scenario: &str, results: &outcome::Results) {
    let failed = results.names(Outcome::Failed);
    for name in &failed {
        println!("  failed  {name}");
        for line in results.failure_details.get(*name).into_iter().flatten() {
            println!("          {line}");
        }
    }
    let passed = results.count(Outcome::Passed);
    let floor = floor(scenario);
    assert!(
        results.outcomes.len() >= ALL_TESTS,
        "{scenario}: only {} of {ALL_TESTS} tests reported",
        results.outcomes.len()
    );
    assert!(failed.is_empty(), "{scenario}: failed {failed:?}");
    assert!(
        passed >= floor,
        "{scenario}: {passed} tests passed, below the floor of {floor}"
    );
}

/// A 1 GiB thin volume of a pool on RAID5 over four file members.
#[test]
fn thin_volume_on_raid5() {
    let dir = tempfile::tempdir_in("/dev/shm").expect("tempdir on /dev/shm");
    let names: Vec<String> = (0..4).map(|i| format!("m{i}")).collect();
    let config = format!(
        "{}[[device]]\nname = \"r5\"\nkind = \"raid\"\nlevel = 5\nmembers = [{}]\n\
         [[pool]]\nname = \"tank\"\ndevices = [\"r5\"]\nmetadata = \"{}/tank.meta\"\n\
         [[device]]\nname = \"thin0\"\nkind = \"volume\"\npool = \"tank\"\nsize = \"1G\"\n\
         [[target]]\nname = \"{IQN}\"\n[[target.lun]]\nlun = 0\ndevice = \"thin0\"\n",
        members(dir.path(), &names, "400M"),
        list(&names),
        dir.path().display()
    );
    run("raid5-thin", &config, dir.path());
}

/// A raw RAID6 LUN over six file members: four data columns, about 1 GiB.
#[test]
fn raw_raid6_lun() {
    let dir = tempfile::tempdir_in("/dev/shm").expect("tempdir on /dev/shm");
    let names: Vec<String> = (0..6).map(|i| format!("m{i}")).collect();
    let config = format!(
        "{}[[device]]\nname = \"r6\"\nkind = \"raid\"\nlevel = 6\nmembers = [{}]\n\
         [[target]]\nname = \"{IQN}\"\n[[target.lun]]\nlun = 0\ndevice = \"r6\"\n",
        members(dir.path(), &names, "272M"),
        list(&names)
    );
    run("raid6", &config, dir.path());
}

/// `openarray raid status NAME --json` of the daemon behind `socket`.
fn raid_status(daemon: &AdminDaemon, name: &str) -> Value {
    serde_json::from_str(&daemon.ok(&["raid", "status", name, "--json"])).expect("status --json")
}

/// Waits until `name` is clean with nothing syncing; its status.
fn wait_clean(daemon: &AdminDaemon, name: &str, limit: Duration) -> Value {
    let start = Instant::now();
    loop {
        let s = raid_status(daemon, name);
        if s["sync"].is_null() && s["state"] == "clean" {
            return s;
        }
        assert!(start.elapsed() < limit, "not clean after {limit:?}: {s:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Clears its flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

/// A raw RAID5 LUN of 1 GiB over four file members while one of them is
/// failed and the hot spare rebuilds in its place. The rebuild is held at
/// 1 MiB/s (`openarray raid speed`) so that it spans the whole suite:
/// status, polled meanwhile, must show it rebuilding and making progress
/// throughout; then, at full speed, it finishes, and a scrub finds parity
/// right everywhere.
#[test]
fn raw_raid5_while_a_spare_rebuilds() {
    let dir = tempfile::tempdir_in("/dev/shm").expect("tempdir on /dev/shm");
    let names: Vec<String> = ["m0", "m1", "m2", "m3", "s0"].map(String::from).to_vec();
    let config = format!(
        "{}[[device]]\nname = \"r5\"\nkind = \"raid\"\nlevel = 5\nmembers = [{}]\n\
         spares = [\"s0\"]\n\
         [[target]]\nname = \"{IQN}\"\n[[target.lun]]\nlun = 0\ndevice = \"r5\"\n",
        members(dir.path(), &names, "350M"),
        list(&names[..4]),
    );
    let path = dir.path().join("openarray.toml");
    std::fs::write(&path, config).expect("write config");
    let daemon = AdminDaemon::start_listening(&path, dir.path(), common::free_port());
    wait_clean(&daemon, "r5", Duration::from_secs(120));
    daemon.ok(&["raid", "speed", "r5", "--min", "1M", "--max", "1M"]);
    daemon.ok(&["raid", "fail", "r5", "m1"]);
    let start = Instant::now();
    while raid_status(&daemon, "r5")["members"][1]["name"] != "s0" {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no rebuild began"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let running = AtomicBool::new(true);
    // (seconds into the suite, array state, rebuilt bytes)
    let (samples, results) = std::thread::scope(|scope| {
        let started = Instant::now();
        let (running, daemon) = (&running, &daemon);
        // The poller stops however the suite ends, a panic included.
        let _stop = StopOnDrop(running);
        let poller = scope.spawn(move || {
            let mut samples = Vec::new();
            while running.load(Ordering::Relaxed) {
                let s = raid_status(daemon, "r5");
                samples.push((
                    started.elapsed().as_secs_f64(),
                    s["state"].as_str().unwrap_or("?").to_string(),
                    s["sync"]["done_bytes"].as_u64().unwrap_or(0),
                ));
                std::thread::sleep(Duration::from_millis(500));
            }
            samples
        });
        let results = run_suite("raid5-rebuild", daemon.port);
        running.store(false, Ordering::Relaxed);
        (poller.join().expect("status poller"), results)
    });
    let (first, last) = (samples.first().unwrap(), samples.last().unwrap());
    println!(
        "{} status samples over {:.0} s: rebuilt {} to {} bytes",
        samples.len(),
        last.0,
        first.2,
        last.2
    );
    assert!(
        samples.iter().all(|s| s.1 == "rebuilding"),
        "not rebuilding throughout the suite: {samples:?}"
    );
    assert!(
        last.2 > first.2,
        "the rebuild made no progress: {samples:?}"
    );
    check_suite("raid5-rebuild", &results);

    daemon.ok(&["raid", "speed", "r5", "--min", "2G", "--max", "2G"]);
    let done = wait_clean(&daemon, "r5", Duration::from_secs(120));
    assert_eq!(done["members"][1]["name"], "s0", "{done:#}");
    assert_eq!(done["members"][1]["state"], "in-sync", "{done:#}");
    // Parity agrees with the data everywhere, the rebuilt member's too.
    let scrub: Value =
        serde_json::from_str(&daemon.ok(&["raid", "scrub", "r5", "--json"])).expect("scrub --json");
    assert_eq!(scrub["report"]["mismatches"], 0, "{scrub:#}");
    assert!(
        scrub["report"]["stripes_checked"].as_u64() > Some(0),
        "{scrub:#}"
    );
    daemon.terminate();
}
