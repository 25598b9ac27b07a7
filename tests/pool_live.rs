//! A live configuration change that adds a thin volume LUN to a pool the
//! daemon already serves from: the running pool is reused, both volumes
//! take I/O, and the pool checks clean after shutdown.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, require_tool, run_with_timeout};

const IQN: &str = "iqn.2026-11.org.openarray.test:live";

fn config(dir: &str, second: bool) -> String {
    let mut text = format!(
        r#"
[[pool]]
name = "tank"
devices = ["{dir}/tank0.img"]
device_size = "256M"

[[device]]
name = "thin0"
kind = "volume"
pool = "tank"
size = "64M"
"#
    );
    if second {
        text +=
            "\n[[device]]\nname = \"thin1\"\nkind = \"volume\"\npool = \"tank\"\nsize = \"32M\"\n";
    }
    text +=
        &format!("\n[[target]]\nname = \"{IQN}\"\n[[target.lun]]\nlun = 0\ndevice = \"thin0\"\n");
    if second {
        text += "[[target.lun]]\nlun = 1\ndevice = \"thin1\"\n";
    }
    text
}

struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn qemu_io(url: &str, command: &str) {
    require_tool("qemu-io");
    let mut cmd = Command::new("qemu-io");
    cmd.args(["-f", "raw", "-c", command, url]);
    let out = run_with_timeout(cmd, Duration::from_secs(120));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !text.contains("verification failed"),
        "qemu-io {command} {url}:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn openarray(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_openarray"))
        .args(args)
        .output()
        .expect("run openarray");
    assert!(
        out.status.success(),
        "openarray {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_volume_lun_added_live_shares_the_open_pool() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_str().expect("utf-8");
    let first = dir.path().join("a.toml");
    let second = dir.path().join("b.toml");
    std::fs::write(&first, config(d, false)).unwrap();
    std::fs::write(&second, config(d, true)).unwrap();
    let socket = dir.path().join("admin.sock");
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_openarray"))
        .arg("serve")
        .arg("--config")
        .arg(&first)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--admin-socket")
        .arg(&socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn openarray serve");
    let mut served = Served(child);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let start = Instant::now();
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() || !socket.exists()
    {
        assert!(start.elapsed() < Duration::from_secs(20), "daemon not up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let url = |lun: u64| format!("iscsi://127.0.0.1:{port}/{IQN}/{lun}");

    qemu_io(&url(0), "write -P 7 0 1M");
    let sock = socket.to_str().expect("utf-8");
    let applied = openarray(&[
        "config",
        "--socket",
        sock,
        "apply",
        second.to_str().unwrap(),
    ]);
    assert!(applied.contains("thin1"), "{applied}");
    qemu_io(&url(1), "write -P 9 0 1M");
    qemu_io(&url(0), "read -P 7 0 1M");
    qemu_io(&url(1), "read -P 9 0 1M");

    // SIGTERM: sessions end, every device is flushed.
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe { libc::kill(served.0.id() as i32, libc::SIGTERM) };
    let status = served.0.wait().expect("wait for daemon");
    assert!(status.success(), "daemon exited with {status}");

    let cfg = second.to_str().unwrap();
    let status = openarray(&["pool", "status", "-c", cfg, "tank"]);
    assert!(status.contains("used 2097152 "), "{status}");
    let check = openarray(&["pool", "check", "-c", cfg, "tank"]);
    assert!(check.contains(": clean"), "{check}");
}
