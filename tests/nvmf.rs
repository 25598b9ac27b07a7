//! The daemon's NVMe/TCP transport, driven by the nvmf crate's host over
//! real sockets: `[nvmf]` served beside iSCSI and NBD over one device (a
//! write on one transport reads back on the others), sessions listed
//! with the others', the section changed live through `config apply`
//! (a bad change refused with its line and field, nothing moved), and
//! the built-in default serving its RAM disk on NVMe/TCP too.

mod common;
// The nbd crate's raw client; this file uses part of it.
#[allow(dead_code)]
#[path = "../crates/nbd/tests/common/raw.rs"]
mod raw;

use std::net::SocketAddr;

use common::admin::{http_exchange, AdminDaemon};
use common::iscsi::{LoginParams, Session};
use common::{free_port, retrying_taken_ports};
use nvmf::initiator::{expect_success, nvm, Host, Options, Who};
use raw::Raw;

const IQN: &str = "iqn.2026-11.org.openarray.test:nvmf";
const INITIATOR: &str = "iqn.2026-11.org.openarray.test:host";
const NQN: &str = "nqn.2026-11.org.openarray.test:vm";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0b5c2e3e-6f1c-4c33-9d5f-00000000a001";
const BS: usize = 512;

struct Served {
    daemon: AdminDaemon,
    nvmf: SocketAddr,
    nbd: SocketAddr,
    dir: tempfile::TempDir,
    text: String,
}

/// A 16 MiB file device `vm` as LUN 0, NBD export `vm` and namespace 1.
fn serve() -> Served {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let (daemon, nvmf, nbd, text) = retrying_taken_ports(|| {
        let (port, nvmf, nbd) = (free_port(), free_port(), free_port());
        let text = format!(
            r#"[[portal]]
listen = "127.0.0.1:{port}"

[[device]]
name = "vm"
kind = "file"
path = "{d}/vm.img"
size = "16M"

[[target]]
name = "{IQN}"

[[target.lun]]
lun = 0
device = "vm"

[nbd]
listen = ["127.0.0.1:{nbd}"]

[[nbd.export]]
name = "vm"
device = "vm"

[nvmf]
listen = ["127.0.0.1:{nvmf}"]

[[nvmf.subsystem]]
nqn = "{NQN}"
allow_hosts = ["nqn.2014-08.org.nvmexpress:uuid:*"]

[[nvmf.subsystem.namespace]]
nsid = 1
device = "vm"
"#
        );
        let cfg = dir.path().join("openarray.toml");
        std::fs::write(&cfg, &text).unwrap();
        let daemon = AdminDaemon::try_start(&cfg, dir.path(), port)?;
        Ok((
            daemon,
            SocketAddr::from(([127, 0, 0, 1], nvmf)),
            SocketAddr::from(([127, 0, 0, 1], nbd)),
            text,
        ))
    });
    Served {
        daemon,
        nvmf,
        nbd,
        dir,
        text,
    }
}

fn who(subnqn: &str) -> Who {
    Who {
        host_nqn: HOSTNQN.into(),
        host_id: *b"openarray-test-1",
        subnqn: subnqn.into(),
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed.wrapping_add((i >> 9) as u8))
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn connect(addr: SocketAddr, subnqn: &str) -> std::io::Result<Host> {
    let opts = Options {
        io_queues: 4,
        ..Options::default()
    };
    Host::connect(addr, who(subnqn), opts).await
}

#[test]
fn one_device_reads_alike_over_iscsi_nvme_tcp_and_nbd() {
    let s = serve();
    let written = pattern(1, 64 << 10);
    let mut iscsi = Session::login(
        s.daemon.addr(),
        &LoginParams::normal(INITIATOR, IQN),
        std::time::Duration::from_secs(10),
    )
    .unwrap();
    iscsi.write10(0, 128, &written, BS as u32).unwrap();

    let rt = runtime();
    let mut host = rt.block_on(connect(s.nvmf, NQN)).unwrap();
    assert_eq!(host.io.len(), 4);
    let read = rt
        .block_on(host.io[2].one(nvm::read(1, 128, (written.len() / BS) as u32, BS)))
        .unwrap();
    expect_success(&read, "Read").unwrap();
    assert!(read.data == written, "NVMe/TCP reads what iSCSI wrote");

    // And the other way, through a different queue, with FUA.
    let back = pattern(2, 8192);
    let w = rt
        .block_on(host.io[1].one(nvm::write(1, 4096, back.clone(), BS, true)))
        .unwrap();
    expect_success(&w, "Write").unwrap();
    assert_eq!(iscsi.read10(0, 4096, 16, BS as u32).unwrap(), back);
    let mut nbd = Raw::connect(s.nbd).unwrap();
    nbd.go("vm", true, false, false).unwrap();
    assert_eq!(nbd.read(1, 4096 * BS as u64, 8192).unwrap(), back);

    // Its controller is a session beside the iSCSI one.
    let sessions = get(&s, "/v1/sessions");
    assert!(
        sessions.contains("\"transport\":\"nvme-tcp\""),
        "{sessions}"
    );
    assert!(sessions.contains(HOSTNQN), "{sessions}");
    assert!(sessions.contains("\"transport\":\"iscsi\""), "{sessions}");

    // And status tells the subsystem with its namespace and controller.
    let status: serde_json::Value = serde_json::from_str(&get(&s, "/v1/status")).unwrap();
    let sub = &status["transports"]["nvme-tcp"]["subsystems"][0];
    assert_eq!(sub["nqn"], NQN);
    assert_eq!(sub["controllers"], 1);
    assert_eq!(sub["namespaces"][0]["state"], "ok");
    assert_eq!(status["healthy"], true, "{status:#}");
    let text = s.daemon.ok(&["status"]);
    assert!(
        text.contains(&format!("  {NQN} namespaces 1=vm (1 controller(s))")),
        "{text}"
    );
}

fn get(s: &Served, path: &str) -> String {
    let stream = std::os::unix::net::UnixStream::connect(&s.daemon.socket).unwrap();
    let (status, body) = http_exchange(
        stream,
        &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(status, 200, "{body}");
    body
}

#[test]
fn subsystems_and_listeners_change_live() {
    let s = serve();
    let cfg = s.dir.path().join("openarray.toml");
    let apply = |text: &str| {
        std::fs::write(&cfg, text).unwrap();
        s.daemon.config_cli(&["apply", &cfg.display().to_string()])
    };
    let rt = runtime();
    let mut old = rt.block_on(connect(s.nvmf, NQN)).unwrap();

    // A namespace naming no device is refused with its line and field,
    // and the running target is untouched.
    let bad = s.text.replace(
        "nsid = 1\ndevice = \"vm\"",
        "nsid = 1\ndevice = \"vm\"\n\n[[nvmf.subsystem.namespace]]\nnsid = 2\ndevice = \"nope\"",
    );
    let out = apply(&bad);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(":37:1: nvmf.subsystem[0].namespace[1].device: no device is named \"nope\""),
        "{err}"
    );

    // A second subsystem on a new address: served at once, the first
    // address stops accepting and its controller goes on.
    let moved = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let second = "nqn.2026-11.org.openarray.test:second";
    let text = s
        .text
        .replace(&s.nvmf.to_string(), &moved.to_string())
        .replace(
            "[[nvmf.subsystem.namespace]]",
            &format!(
                "[[nvmf.subsystem.namespace]]\nnsid = 1\ndevice = \"vm\"\n\n[[nvmf.subsystem]]\nnqn = \"{second}\"\nallow_hosts = [\"*\"]\n\n[[nvmf.subsystem.namespace]]"
            ),
        );
    let out = apply(&text);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let changes = String::from_utf8_lossy(&out.stdout);
    assert!(changes.contains("~ nvmf listen"), "{changes}");
    let mut new = rt.block_on(connect(moved, second)).unwrap();
    let c = rt.block_on(new.io[0].one(nvm::read(1, 0, 8, BS))).unwrap();
    expect_success(&c, "Read on the new subsystem").unwrap();
    assert!(rt.block_on(connect(s.nvmf, NQN)).is_err());
    let c = rt.block_on(old.io[0].one(nvm::read(1, 0, 8, BS))).unwrap();
    expect_success(&c, "Read on the first controller").unwrap();

    // A taken address refuses the whole change, naming it.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().map(|a| (a, taken)).unwrap();
    let out = apply(&text.replace(&moved.to_string(), &taken.0.to_string()));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("nvmf.listen: cannot listen on {}", taken.0)),
        "{err}"
    );
    assert!(rt.block_on(connect(moved, second)).is_ok());

    // Without the section nothing listens, and the config says so.
    let start = text.find("[nvmf]").unwrap();
    let out = apply(&text[..start]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("- nvmf"));
    assert!(rt.block_on(connect(moved, second)).is_err());
}

#[test]
fn the_built_in_default_serves_its_ram_disk_on_nvme_tcp() {
    let port = free_port();
    let (mut child, log, _dir) = retrying_taken_ports(|| {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let nvmf = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let logfile = std::fs::File::create(&log).unwrap();
        let mut child = common::serve_command()
            .args(["--admin-socket", "none", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--nvmf-listen")
            .arg(nvmf.to_string())
            .arg("--nbd-listen")
            .arg(format!("127.0.0.1:{}", free_port()))
            .stdout(logfile.try_clone().unwrap())
            .stderr(logfile)
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(&format!("nvmf: listening on {nvmf}"))
        {
            if started.elapsed() > std::time::Duration::from_secs(20) {
                let _ = child.kill();
                let _ = child.wait();
                return Err(std::fs::read_to_string(&log).unwrap_or_default());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Ok((child, (log, nvmf), dir))
    });
    let (log, nvmf) = log;
    let rt = runtime();
    let mut host = rt
        .block_on(connect(nvmf, "nqn.2026-11.org.openarray:default"))
        .unwrap_or_else(|e| panic!("{e}\n{}", std::fs::read_to_string(&log).unwrap()));
    let id = rt.block_on(host.identify(0, 1)).unwrap();
    expect_success(&id, "Identify namespace").unwrap();
    let blocks = u64::from_le_bytes(id.data[0..8].try_into().unwrap());
    assert_eq!(blocks * BS as u64, 1 << 30, "the 1 GiB RAM disk");
    let _ = child.kill();
    let _ = child.wait();
}
