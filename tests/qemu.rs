//! QEMU's iSCSI block driver (libiscsi inside qemu-img/qemu-io) against the
//! real daemon: a 256 MiB random image goes onto a LUN with `qemu-img
//! convert` and comes back byte-identical, and `qemu-img bench` reads and
//! writes run clean, the written pattern reading back intact.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::rng::Rng;
use common::{require_tool, run_with_timeout, Daemon};

const IQN: &str = "iqn.2024-01.org.openarray.test:qemu";
const IMAGE_SIZE: usize = 256 << 20;
const CLIENT_TIMEOUT: Duration = Duration::from_secs(300);

/// One target: LUN 0 is a RAM disk exactly the size of the image, LUN 1
/// a file of that size in `dir` opened with O_DIRECT (its reads go to the
/// device in batches).
fn config(dir: &Path) -> String {
    format!(
        r#"
[[device]]
name = "disk"
kind = "mem"
size = "256M"

[[device]]
name = "direct"
kind = "file"
path = "{}/direct.img"
size = "256M"
direct = true

[[target]]
name = "{IQN}"

[[target.lun]]
lun = 0
device = "disk"

[[target.lun]]
lun = 1
device = "direct"
"#,
        dir.display()
    )
}

/// Run a qemu tool and insist on exit status 0, showing its output if not.
fn run_ok(tool: &str, args: &[&str]) -> Output {
    require_tool(tool);
    let mut cmd = Command::new(tool);
    cmd.args(args);
    let out = run_with_timeout(cmd, CLIENT_TIMEOUT);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("Unable to load module iscsi"),
        "{tool} lacks iSCSI support: install qemu-block-extra matching qemu-utils (scripts/install-deps.sh does)"
    );
    assert!(
        out.status.success(),
        "{tool} {args:?} failed ({}):\nstdout:\n{}\nstderr:\n{stderr}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    out
}

fn write_random_image(path: &Path, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut buf = vec![0u8; 1 << 20];
    let mut image = Vec::with_capacity(IMAGE_SIZE);
    while image.len() < IMAGE_SIZE {
        rng.fill(&mut buf);
        image.extend_from_slice(&buf);
    }
    std::fs::write(path, &image).expect("write source image");
}

/// Compare two files chunk by chunk, naming the first differing offset.
fn assert_same_contents(a: &Path, b: &Path) {
    let (len_a, len_b) = (file_len(a), file_len(b));
    assert_eq!(
        len_a,
        len_b,
        "{} is {len_a} bytes, {} is {len_b}",
        a.display(),
        b.display()
    );
    let mut fa = std::fs::File::open(a).expect("open a");
    let mut fb = std::fs::File::open(b).expect("open b");
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut offset = 0u64;
    loop {
        let n = fa.read(&mut ba).expect("read a");
        if n == 0 {
            break;
        }
        fb.read_exact(&mut bb[..n]).expect("read b");
        if ba[..n] != bb[..n] {
            let at = ba[..n]
                .iter()
                .zip(&bb[..n])
                .position(|(x, y)| x != y)
                .unwrap_or(0);
            panic!("contents differ first at byte {}", offset + at as u64);
        }
        offset += n as u64;
    }
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p)
        .map(|m| m.len())
        .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
}

fn assert_daemon_healthy(daemon: &mut Daemon) {
    assert!(daemon.alive(), "daemon died:\n{}", daemon.log());
    assert!(
        !daemon.log().contains("panicked"),
        "daemon panicked:\n{}",
        daemon.log()
    );
}

#[test]
fn convert_onto_lun_and_back_is_byte_identical() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut daemon = Daemon::start_with_config(&config(dir.path()));
    let source = dir.path().join("source.raw");
    write_random_image(&source, 0x6f70_656e_6172_7261);
    for lun in [0, 1] {
        let url = daemon.url(IQN, lun);
        let back = dir.path().join(format!("back-{lun}.raw"));
        let info = run_ok("qemu-img", &["info", "--output=json", &url]);
        let info = String::from_utf8_lossy(&info.stdout);
        assert!(
            info.contains(&format!("\"virtual-size\": {IMAGE_SIZE}")),
            "LUN {lun} size per qemu-img info:\n{info}"
        );
        // -n: the LUN exists already, qemu-img must not try to create it.
        // -W -m 16: sixteen writers, completing out of order; reading back
        // with sixteen readers too.
        let (src, url_arg) = (source.to_str().unwrap(), url.as_str());
        run_ok(
            "qemu-img",
            &[
                "convert", "-n", "-W", "-m", "16", "-f", "raw", "-O", "raw", src, url_arg,
            ],
        );
        run_ok(
            "qemu-img",
            &[
                "convert",
                "-m",
                "16",
                "-f",
                "raw",
                "-O",
                "raw",
                url_arg,
                back.to_str().unwrap(),
            ],
        );
        assert_same_contents(&source, &back);
        run_ok(
            "qemu-img",
            &["compare", "-f", "raw", "-F", "raw", src, url_arg],
        );
    }
    assert_daemon_healthy(&mut daemon);
}

#[test]
fn bench_reads_and_writes_run_clean() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut daemon = Daemon::start_with_config(&config(dir.path()));
    let url = daemon.url(IQN, 0);
    const COUNT: usize = 20_000;
    let count = COUNT.to_string();

    // `qemu-img bench -f raw -t none` over the LUN with `args` added.
    let bench = |args: &[&str]| {
        let mut all = vec!["bench", "-f", "raw", "-t", "none"];
        all.extend_from_slice(args);
        all.push(&url);
        run_ok("qemu-img", &all);
    };
    // 32 writes in flight, 4 KiB each, sequentially from offset 0; one
    // pass with an explicit cache flush every 1000 requests.
    bench(&[
        "-w",
        "-c",
        &count,
        "-d",
        "32",
        "-s",
        "4k",
        "--pattern",
        "0xa5",
    ]);
    bench(&[
        "-w",
        "-c",
        &count,
        "-d",
        "32",
        "-s",
        "4k",
        "-o",
        "128M",
        "--pattern",
        "0x3c",
        "--flush-interval",
        "1000",
    ]);
    bench(&["-c", &count, "-d", "32", "-s", "4k"]);
    bench(&["-c", "2000", "-d", "8", "-s", "64k"]);

    // The patterns really landed, and nothing beyond them was touched.
    let written = (COUNT * 4096).to_string();
    let checks = [
        format!("read -P 0xa5 0 {written}"),
        format!("read -P 0x00 {written} {}", (128 << 20) - COUNT * 4096),
        format!("read -P 0x3c {} {written}", 128 << 20),
    ];
    for check in &checks {
        let out = run_ok("qemu-io", &["-f", "raw", "-c", check, &url]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            !text.contains("Pattern verification failed"),
            "qemu-io {check}:\n{text}"
        );
    }
    assert_daemon_healthy(&mut daemon);
}
