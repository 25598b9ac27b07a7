//! Reading iscsi-test-cu's verbose output into one outcome per test.
//!
//! libiscsi reports a skipped test as a CUnit *pass* whose output carries
//! "[SKIPPED]", so the CUnit summary line overstates what really ran; we
//! classify every test ourselves.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// How long one run of the whole suite may take.
const SUITE_TIMEOUT: Duration = Duration::from_secs(900);

/// Runs the `selection` of libiscsi's suite (`ALL` for all of it) against
/// `urls`, and writes the outcome of every test and the suite's whole
/// output to target/conformance/`scenario`.{txt,log}.
pub fn run_suite(scenario: &str, selection: &str, urls: &[String]) -> Results {
    let mut cmd = Command::new("iscsi-test-cu");
    cmd.args(["--dataloss", "--allow-sanitize"])
        .arg(format!("--test={selection}"))
        .args(urls);
    let output = crate::common::run_with_timeout(cmd, SUITE_TIMEOUT);
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    let results = parse(&text);
    let report_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/conformance");
    std::fs::create_dir_all(&report_dir).expect("create target/conformance");
    let mut report = format!("scenario {scenario}: {}\n\n", results.summary_line());
    for (name, outcome) in &results.outcomes {
        report.push_str(&format!("{outcome:8} {name}\n"));
    }
    std::fs::write(report_dir.join(format!("{scenario}.txt")), report).expect("write report");
    std::fs::write(report_dir.join(format!("{scenario}.log")), &text).expect("write log");
    results
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    Skipped,
    Failed,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outcome::Passed => "passed",
            Outcome::Skipped => "skipped",
            Outcome::Failed => "FAILED",
        })
    }
}

/// Test name ("ALL.Suite.Test") -> outcome, plus the output lines of each
/// failed test for the report.
#[derive(Debug, Default)]
pub struct Results {
    pub outcomes: BTreeMap<String, Outcome>,
    pub failure_details: BTreeMap<String, Vec<String>>,
}

impl Results {
    pub fn count(&self, which: Outcome) -> usize {
        self.outcomes.values().filter(|o| **o == which).count()
    }

    pub fn names(&self, which: Outcome) -> Vec<&str> {
        self.outcomes
            .iter()
            .filter(|(_, o)| **o == which)
            .map(|(n, _)| n.as_str())
            .collect()
    }

    pub fn summary_line(&self) -> String {
        format!(
            "{} tests: {} passed, {} failed, {} skipped",
            self.outcomes.len(),
            self.count(Outcome::Passed),
            self.count(Outcome::Failed),
            self.count(Outcome::Skipped)
        )
    }
}

struct Open {
    name: String,
    skipped: bool,
    lines: Vec<String>,
}

/// Parse the verbose (default mode) output of `iscsi-test-cu`.
pub fn parse(output: &str) -> Results {
    let mut results = Results::default();
    let mut suite = String::new();
    let mut open: Option<Open> = None;

    for line in output.lines() {
        if let Some(rest) = line.strip_prefix("Suite: ") {
            suite = rest.trim().to_string();
            continue;
        }
        let body = if let Some(rest) = line.trim_start().strip_prefix("Test: ") {
            let (name, tail) = rest.split_once(" ...").unwrap_or((rest, ""));
            open = Some(Open {
                name: format!("ALL.{suite}.{}", name.trim()),
                skipped: false,
                lines: Vec::new(),
            });
            tail
        } else {
            line
        };
        let Some(test) = open.as_mut() else { continue };
        if body.contains("[SKIPPED]") {
            test.skipped = true;
        }
        if !body.trim().is_empty() {
            test.lines.push(body.trim().to_string());
        }
        // CUnit prints the verdict the moment the test body returns, so
        // output after it on the same line belongs to the suite teardown.
        let verdict = body.trim();
        let outcome = if verdict == "FAILED" || verdict.ends_with(" FAILED") {
            Outcome::Failed
        } else if verdict.starts_with("passed") || verdict.ends_with("passed") {
            if test.skipped {
                Outcome::Skipped
            } else {
                Outcome::Passed
            }
        } else {
            continue;
        };
        let test = open.take().expect("checked above");
        if outcome == Outcome::Failed {
            results
                .failure_details
                .insert(test.name.clone(), test.lines);
        }
        results.outcomes.insert(test.name, outcome);
    }
    // A test that never printed its verdict (the tool died or hung there)
    // counts as failed.
    if let Some(test) = open {
        results
            .failure_details
            .insert(test.name.clone(), test.lines);
        results.outcomes.insert(test.name, Outcome::Failed);
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
Suite: GetLBAStatus
  Test: Simple ...passed
  Test: BeyondEol ...    [FAILED] GET_LBA_STATUS successful but should have failed
FAILED
    1. test_get_lba_status_beyond_eol.c:38  - CU_ASSERT_EQUAL(_r,0)
  Test: UnmapSingle ...    [SKIPPED] Logical unit is fully provisioned. Skipping test
passed
Suite: Reserve6
  Test: Logout ...    Take out a RESERVE6 from the first initiator
    RESERVE6 from the second initiator should work now
passed
  Test: Residuals ...passed    [FAILED] PRIN command: failed with sense.
  Test: Hang ...    started
";

    #[test]
    fn classifies_each_test() {
        let r = parse(SAMPLE);
        assert_eq!(r.outcomes["ALL.GetLBAStatus.Simple"], Outcome::Passed);
        assert_eq!(r.outcomes["ALL.GetLBAStatus.BeyondEol"], Outcome::Failed);
        assert_eq!(r.outcomes["ALL.GetLBAStatus.UnmapSingle"], Outcome::Skipped);
        assert_eq!(r.outcomes["ALL.Reserve6.Logout"], Outcome::Passed);
        assert_eq!(r.outcomes["ALL.Reserve6.Residuals"], Outcome::Passed);
        assert_eq!(r.outcomes["ALL.Reserve6.Hang"], Outcome::Failed);
        assert_eq!(r.summary_line(), "6 tests: 3 passed, 2 failed, 1 skipped");
        assert!(r.failure_details["ALL.GetLBAStatus.BeyondEol"][0].contains("[FAILED]"));
    }
}
