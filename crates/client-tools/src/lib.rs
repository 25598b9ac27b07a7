//! Real client tools as the tests drive them. The daemon's integration
//! tests and the NBD crate's own tests run the same tools against an
//! export and read their output the same way, so both take it from here.
//!
//! Every function fails the calling test (it panics) with the tool's
//! output when the tool fails, and a tool that is not installed is a
//! failure too: the suite never skips a real client.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long one client run may take.
const CLIENT_LIMIT: Duration = Duration::from_secs(120);

/// The path of `name` on PATH; a missing tool fails the test, naming the
/// script that installs it.
pub fn tool(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| panic!("`{name}` is not installed; run scripts/install-deps.sh"))
}

/// Runs a command, killing it if it outlives `limit` (its output so far
/// is still returned, so a hang shows where it hung).
pub fn run_with_timeout(mut cmd: Command, limit: Duration) -> Output {
    let dir = tempfile::tempdir().expect("tempdir for client output");
    let out_path = dir.path().join("stdout");
    let err_path = dir.path().join("stderr");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for client") {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            break child.wait().expect("reap client");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    Output {
        status,
        stdout: std::fs::read(&out_path).unwrap_or_default(),
        stderr: std::fs::read(&err_path).unwrap_or_default(),
    }
}

/// Runs a client tool given two minutes; its failure fails the test with
/// its output.
pub fn run(name: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(tool(name));
    cmd.args(args);
    let out = run_with_timeout(cmd, CLIENT_LIMIT);
    assert!(
        out.status.success(),
        "{name} {args:?} failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// One run of a map: (offset, length, data?), data meaning not a hole.
pub type Run = (u64, u64, bool);

/// Appends `run` to `runs`, merged into the last one when it is of the
/// same kind and follows it.
fn push_merged(runs: &mut Vec<Run>, run: Run) {
    match runs.last_mut() {
        Some(last) if last.2 == run.2 && last.0 + last.1 == run.0 => last.1 += run.1,
        _ => runs.push(run),
    }
}

/// `nbdinfo --map`: its runs, neighbours of the same kind merged, and its
/// text for messages (each line is "offset length type description").
pub fn nbdinfo_map(uri: &str) -> (Vec<Run>, String) {
    let out = run("nbdinfo", &["--map", uri]);
    let text = String::from_utf8(out.stdout).expect("nbdinfo prints text");
    let mut runs = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let kind: u32 = f[2].parse().expect("a map entry's type");
        // Bit 0 of the type: a hole.
        let run = (
            f[0].parse().expect("offset"),
            f[1].parse().expect("length"),
            kind & 1 == 0,
        );
        push_merged(&mut runs, run);
    }
    (runs, text)
}

/// `qemu-img map --output=json` of a raw image at `uri`: its runs, with
/// neighbours of the same kind merged, and its text.
pub fn qemu_img_map(uri: &str) -> (Vec<Run>, String) {
    let out = run("qemu-img", &["map", "--output=json", "-f", "raw", uri]);
    let text = String::from_utf8(out.stdout).expect("qemu-img prints text");
    let mut runs: Vec<Run> = Vec::new();
    for entry in text.split('{').skip(1) {
        let field = |name: &str| -> &str {
            let at = entry
                .find(&format!("\"{name}\":"))
                .unwrap_or_else(|| panic!("no {name} in a qemu-img map entry: {entry}"))
                + name.len()
                + 3;
            entry[at..].split([',', '}']).next().unwrap_or("").trim()
        };
        let run = (
            field("start").parse().expect("start"),
            field("length").parse().expect("length"),
            field("data") == "true",
        );
        push_merged(&mut runs, run);
    }
    (runs, text)
}

/// fio's nbd engine writes `size` of random 4K blocks at `depth` and reads
/// every one back verified, failing the test on any mismatch; the KiB it
/// wrote, which it also verified.
pub fn fio_verified_writes(uri: &str, size: &str, depth: u32) -> u64 {
    let out = run(
        "fio",
        &[
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=4k",
            &format!("--size={size}"),
            &format!("--iodepth={depth}"),
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--output-format=terse",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // Terse field 6 is the read KiB (the verify pass), 47 the write KiB.
    let fields: Vec<&str> = text.trim().split(';').collect();
    assert!(fields.len() > 46, "fio's terse output: {text}");
    let (read_kb, write_kb) = (fields[5], fields[46]);
    assert_eq!(read_kb, write_kb, "fio verified less than it wrote: {text}");
    let written: u64 = write_kb.parse().expect("fio's write KiB");
    assert_ne!(written, 0, "fio wrote nothing: {text}");
    written
}

/// qemu-io on two connections at once, 16 asynchronous 1 MiB writes in
/// flight on each, flushed and read back: connection `c` writes its own
/// 32 MiB from `c * 32 MiB` on, MiB `i` of it filled with `0x10 + c * 16 +
/// i`. Fails the test on any failed or short request.
pub fn qemu_io_two_connections(uri: &str) {
    const MIB: u64 = 1 << 20;
    let writers: Vec<_> = (0..2u64)
        .map(|c| {
            let uri = uri.to_string();
            std::thread::spawn(move || {
                let base = c * 32 * MIB;
                let mut args = vec!["-f".to_string(), "raw".into(), uri];
                for op in ["aio_write", "aio_read"] {
                    for i in 0..16u64 {
                        let pattern = 0x10 + c * 16 + i;
                        args.push("-c".into());
                        args.push(format!("{op} -P {pattern} {} 1M", base + i * MIB));
                    }
                    args.push("-c".into());
                    args.push("aio_flush".into());
                }
                let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
                let out = run("qemu-io", &refs);
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                assert!(!text.contains("fail"), "qemu-io: {text}");
                assert_eq!(text.matches("read 1048576/1048576").count(), 16, "{text}");
            })
        })
        .collect();
    for w in writers {
        w.join().expect("a qemu-io connection failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_that_outlives_its_limit_is_killed_with_its_output_kept() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo started; sleep 30"]);
        let start = Instant::now();
        let out = run_with_timeout(cmd, Duration::from_millis(300));
        assert!(start.elapsed() < Duration::from_secs(10));
        assert!(!out.status.success());
        assert_eq!(out.stdout, b"started\n");
    }

    #[test]
    #[should_panic(expected = "is not installed")]
    fn a_missing_tool_fails_the_test() {
        tool("no-such-client-tool-anywhere");
    }
}
