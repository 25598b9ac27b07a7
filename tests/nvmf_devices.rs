//! NVMe/TCP over every kind of device the daemon serves: the project's
//! host connects an admin queue and four I/O queues (digests on) to the
//! real `openarray serve`, reads Identify, and runs verified reads,
//! writes, flushes, write zeroes, deallocations (read back as zeros) and
//! fused compare-and-writes (a match and a miscompare) on a file device,
//! a thin volume of a pool and a RAID5 array, one namespace each.

mod common;

use std::net::SocketAddr;

use common::admin::AdminDaemon;
use common::{free_port, retrying_taken_ports};
use nvmf::initiator::{expect_success, verified_io, Host, Options, Who};
use nvmf::wire::{le16, le32, le64, Digests};

const NQN: &str = "nqn.2026-11.org.openarray.test:devices";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0b5c2e3e-6f1c-4c33-9d5f-00000000d001";

/// Namespace 1: a 16 MiB file; 2: a 32 MiB thin volume of a pool, in
/// 4 KiB blocks; 3: a RAID5 of three 16 MiB file members.
fn config(dir: &std::path::Path, port: u16, nvmf: SocketAddr) -> String {
    let d = dir.display();
    let mut text = format!(
        r#"[[portal]]
listen = "127.0.0.1:{port}"

[[device]]
name = "file"
kind = "file"
path = "{d}/file.img"
size = "16M"

[[pool]]
name = "tank"
devices = ["{d}/tank0.img"]
device_size = "128M"

[[device]]
name = "thin"
kind = "volume"
pool = "tank"
size = "32M"
"#
    );
    for m in ["m0", "m1", "m2"] {
        text += &format!(
            "\n[[device]]\nname = \"{m}\"\nkind = \"file\"\npath = \"{d}/{m}.img\"\nsize = \"16M\"\n"
        );
    }
    text += &format!(
        r#"
[[device]]
name = "r5"
kind = "raid"
level = 5
members = ["m0", "m1", "m2"]
chunk = "64K"

[nvmf]
listen = ["{nvmf}"]

[[nvmf.subsystem]]
nqn = "{NQN}"
allow_hosts = ["{HOSTNQN}"]

[[nvmf.subsystem.namespace]]
nsid = 1
device = "file"

[[nvmf.subsystem.namespace]]
nsid = 2
device = "thin"
block_size = 4096

[[nvmf.subsystem.namespace]]
nsid = 3
device = "r5"
"#
    );
    text
}

#[test]
fn four_io_queues_do_verified_io_on_a_file_a_thin_volume_and_a_raid5() {
    let dir = tempfile::tempdir().unwrap();
    let (daemon, nvmf) = retrying_taken_ports(|| {
        let (port, nvmf) = (free_port(), SocketAddr::from(([127, 0, 0, 1], free_port())));
        let cfg = dir.path().join("openarray.toml");
        std::fs::write(&cfg, config(dir.path(), port, nvmf)).unwrap();
        Ok((AdminDaemon::try_start(&cfg, dir.path(), port)?, nvmf))
    });
    let raid: serde_json::Value =
        serde_json::from_str(&daemon.ok(&["raid", "status", "r5", "--json"])).unwrap();
    let raid_bytes = raid["size_bytes"].as_u64().unwrap();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let who = Who {
        host_nqn: HOSTNQN.into(),
        host_id: *b"openarray-dev-01",
        subnqn: NQN.into(),
    };
    let opts = Options {
        io_queues: 4,
        digests: Digests {
            header: true,
            data: true,
        },
        ..Options::default()
    };
    let mut host = rt
        .block_on(Host::connect(nvmf, who, opts))
        .unwrap_or_else(|e| panic!("{e}\n{}", daemon.log()));
    assert_eq!(host.io.len(), 4);

    let ctrl = rt.block_on(host.identify(1, 0)).unwrap();
    expect_success(&ctrl, "Identify controller").unwrap();
    assert_eq!(le16(&ctrl.data, 78), host.cntlid, "CNTLID");
    assert_eq!(le32(&ctrl.data, 516), 1024, "NN");
    assert_eq!(&ctrl.data[768..768 + NQN.len()], NQN.as_bytes(), "SUBNQN");
    let list = rt.block_on(host.identify(2, 0)).unwrap().data;
    let active: Vec<u32> = (0..4).map(|i| le32(&list, i * 4)).collect();
    assert_eq!(active, [1, 2, 3, 0], "the active namespace list");

    for (nsid, bytes, bs) in [
        (1, 16u64 << 20, 512usize),
        (2, 32 << 20, 4096),
        (3, raid_bytes, 512),
    ] {
        let id = rt.block_on(host.identify(0, nsid)).unwrap();
        expect_success(&id, "Identify namespace").unwrap();
        assert_eq!(
            le64(&id.data, 0),
            bytes / bs as u64,
            "namespace {nsid}: NSZE"
        );
        assert_eq!(
            1usize << id.data[130],
            bs,
            "namespace {nsid}: the block size of LBA format 0"
        );
        rt.block_on(verified_io(&mut host, nsid, bs));
    }
    daemon.terminate();
}
