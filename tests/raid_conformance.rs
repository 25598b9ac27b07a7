//! libiscsi's conformance suite (`iscsi-test-cu --dataloss
//! --allow-sanitize --test=ALL`) against LUNs on RAID: a thin volume of a
//! pool on RAID5 over four file members, and a raw RAID6 LUN over six.
//! Members live on tmpfs. Each run must fail nothing and pass at least its
//! scenario's floor in `conformance/floor.txt`, which only rises. The
//! array is thick (it does not take UNMAP: a pool above it frees units
//! with discards, which on RAID would cost writes), so a raw array LUN
//! skips the logical block provisioning tests that the default RAM LUN
//! runs; a thin volume over it runs them.
//! Reports land in `target/conformance/<scenario>.txt`.

mod common;
#[path = "conformance/outcome.rs"]
mod outcome;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::Daemon;
use outcome::Outcome;

const SUITE_TIMEOUT: Duration = Duration::from_secs(900);
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
    let url = format!("iscsi://127.0.0.1:{}/{IQN}/0", daemon.port());
    let started = Instant::now();
    let mut cmd = Command::new("iscsi-test-cu");
    cmd.args(["--dataloss", "--allow-sanitize", "--test=ALL", &url]);
    let output = common::run_with_timeout(cmd, SUITE_TIMEOUT);
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    let results = outcome::parse(&text);
    let report_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/conformance");
    std::fs::create_dir_all(&report_dir).expect("create target/conformance");
    let mut report = format!("scenario {scenario}: {}\n\n", results.summary_line());
    for (name, outcome) in &results.outcomes {
        report.push_str(&format!("{outcome:8} {name}\n"));
    }
    std::fs::write(report_dir.join(format!("{scenario}.txt")), report).expect("write report");
    std::fs::write(report_dir.join(format!("{scenario}.log")), &text).expect("write log");
    println!(
        "conformance {scenario}: {} in {:.0} s",
        results.summary_line(),
        started.elapsed().as_secs_f64()
    );
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
    daemon.terminate();
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
