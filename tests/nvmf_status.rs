//! How NVMe/TCP commands fail, through the real daemon: a table of
//! failures, each row the command sent, the status (type, code and Do
//! Not Retry bit) it must end with, and where the NVMe specifications
//! define that status. Statuses are those of NVM Express Base
//! Specification 2.2: section 4.2.3.1 (Figure 102, generic), 4.2.3.2
//! (Figures 103 and 105, command specific and fabrics) and 4.2.3.3
//! (Figure 106, media and data integrity).
//!
//! The namespace that is not ready is a RAID5 that refused to assemble
//! (one member failed, another missed the update of taking it out): its
//! device answers ENXIO until `openarray raid assemble --force`.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use common::admin::AdminDaemon;
use common::{free_port, retrying_taken_ports};
use nvmf::capsule::{Fuse, SqeBuilder};
use nvmf::initiator::{expect_success, nvm, Command, Host, Options, Queue, Who};
use nvmf::status::Status;
use nvmf::wire::Digests;

const NQN: &str = "nqn.2026-11.org.openarray.test:status";
const OTHER_NQN: &str = "nqn.2026-11.org.openarray.test:other";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0b5c2e3e-6f1c-4c33-9d5f-00000000e001";
const STRANGER: &str = "nqn.2014-08.org.nvmexpress:uuid:0b5c2e3e-6f1c-4c33-9d5f-00000000e002";
const BS: usize = 512;
/// Namespace 1: a 4 MiB file.
const FILE_BLOCKS: u64 = (4 << 20) / BS as u64;
/// Namespace 2: the RAID5 that did not assemble.
const NOT_READY: u32 = 2;

const GENERIC: &str = "Base 2.2, 4.2.3.1, Figure 102 (Generic Command Status)";
const SPECIFIC: &str = "Base 2.2, 4.2.3.2, Figure 103 (Command Specific Status)";
const FABRICS: &str = "Base 2.2, 4.2.3.2, Figure 105 (Command Specific Status, Fabrics Commands)";
const MEDIA: &str = "Base 2.2, 4.2.3.3, Figure 106 (Media and Data Integrity Errors)";

fn config(dir: &Path, port: u16, nvmf: SocketAddr, allowed: &str) -> String {
    let d = dir.display();
    let mut text = format!("[[portal]]\nlisten = \"127.0.0.1:{port}\"\n");
    for m in ["b0", "b1", "b2"] {
        text += &format!(
            "\n[[device]]\nname = \"{m}-disk\"\nkind = \"file\"\npath = \"{d}/{m}.img\"\nsize = \"16M\"\n\
             [[device]]\nname = \"{m}\"\nkind = \"faulty\"\nover = \"{m}-disk\"\n"
        );
    }
    text += &format!(
        r#"
[[device]]
name = "r5"
kind = "raid"
level = 5
members = ["b0", "b1", "b2"]
chunk = "64K"

[[device]]
name = "f"
kind = "file"
path = "{d}/f.img"
size = "4M"

[nvmf]
listen = ["{nvmf}"]

[[nvmf.subsystem]]
nqn = "{NQN}"
allow_hosts = [{allowed}]

[[nvmf.subsystem.namespace]]
nsid = 1
device = "f"

[[nvmf.subsystem.namespace]]
nsid = 2
device = "r5"

[[nvmf.subsystem]]
nqn = "{OTHER_NQN}"
allow_hosts = ["nqn.2026-11.org.example:only-this-host"]

[[nvmf.subsystem.namespace]]
nsid = 1
device = "f"
"#
    );
    text
}

struct Served {
    daemon: AdminDaemon,
    nvmf: SocketAddr,
    cfg: std::path::PathBuf,
    port: u16,
}

fn start(dir: &Path) -> Served {
    let cfg = dir.join("openarray.toml");
    let (daemon, nvmf, port) = retrying_taken_ports(|| {
        let (port, nvmf) = (free_port(), SocketAddr::from(([127, 0, 0, 1], free_port())));
        let allowed = format!("\"{HOSTNQN}\"");
        std::fs::write(&cfg, config(dir, port, nvmf, &allowed)).unwrap();
        Ok((AdminDaemon::try_start(&cfg, dir, port)?, nvmf, port))
    });
    Served {
        daemon,
        nvmf,
        cfg,
        port,
    }
}

fn raid_state(daemon: &AdminDaemon) -> serde_json::Value {
    serde_json::from_str(&daemon.ok(&["raid", "status", "r5", "--json"])).unwrap()
}

/// Leaves r5's members so that the next start refuses to assemble it.
fn break_the_array(dir: &Path) {
    let s = start(dir);
    let started = Instant::now();
    while !(raid_state(&s.daemon)["sync"].is_null() && raid_state(&s.daemon)["state"] == "clean") {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "r5 never clean"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    s.daemon.ok(&["raid", "fail", "r5", "b0"]);
    s.daemon.ok(&["device", "fault", "b1", "fail"]);
    s.daemon.ok(&["raid", "remove", "r5", "b0"]);
    assert_eq!(raid_state(&s.daemon)["state"], "failed");
    s.daemon.terminate();
}

fn who(host: &str, subnqn: &str) -> Who {
    Who {
        host_nqn: host.into(),
        host_id: *b"openarray-stat-1",
        subnqn: subnqn.into(),
    }
}

/// What a row sends.
enum Send {
    /// Commands on an I/O queue, sent back to back.
    Io(Vec<Command>),
    /// A command on the admin queue.
    Admin(Command),
    /// A Connect of a new admin queue as `host` to subsystem `nqn`.
    Connect(&'static str, &'static str),
}

struct Row {
    /// The spec's status table and the status's name there.
    spec: String,
    /// What is wrong with what is sent.
    case: &'static str,
    send: Send,
    /// The status of each command, in order.
    want: Vec<Status>,
}

fn row(table: &str, status: &str, case: &'static str, send: Send, want: &[Status]) -> Row {
    Row {
        spec: format!("{table}: {status}"),
        case,
        send,
        want: want.to_vec(),
    }
}

fn fused(mut first: Command, mut second: Command) -> Vec<Command> {
    first.sqe = first.sqe.fuse(Fuse::First);
    second.sqe = second.sqe.fuse(Fuse::Second);
    vec![first, second]
}

fn table() -> Vec<Row> {
    let end = FILE_BLOCKS;
    let lone_second = {
        let mut w = nvm::write(1, 0, vec![0; BS], BS, false);
        w.sqe = w.sqe.fuse(Fuse::Second);
        w
    };
    let lone_first = {
        let mut c = nvm::compare(1, 0, vec![0; BS], BS);
        c.sqe = c.sqe.fuse(Fuse::First);
        c
    };
    let mut out_of_range_pair = nvm::compare_and_write(1, end, vec![0; BS], vec![1; BS], BS);
    // Only the first names a range past the end.
    out_of_range_pair[1].sqe = out_of_range_pair[1].sqe.cdw(10, 0);
    vec![
        row(
            GENERIC,
            "02h Invalid Field in Command",
            "a Read longer than MDTS (2 MiB of 1 MiB)",
            Send::Io(vec![nvm::read(1, 0, 4096, BS)]),
            &[Status::INVALID_FIELD],
        ),
        row(
            GENERIC,
            "02h Invalid Field in Command",
            "Identify of a CNS value the controller does not support",
            Send::Admin(Command::new(SqeBuilder::new(0x06, 0).cdw(10, 0x55)).reading(4096)),
            &[Status::INVALID_FIELD],
        ),
        row(
            GENERIC,
            "02h Invalid Field in Command",
            "Set Features of an unknown feature",
            Send::Admin(Command::new(SqeBuilder::new(0x09, 0).cdw(10, 0x7E))),
            &[Status::INVALID_FIELD],
        ),
        row(
            GENERIC,
            "01h Invalid Command Opcode",
            "an I/O opcode the NVM command set does not define",
            Send::Io(vec![Command::new(SqeBuilder::new(0x7D, 0).nsid(1))]),
            &[Status::INVALID_OPCODE],
        ),
        row(
            GENERIC,
            "0Bh Invalid Namespace or Format",
            "a Read of a namespace id the subsystem does not have",
            Send::Io(vec![nvm::read(9, 0, 1, BS)]),
            &[Status::INVALID_NAMESPACE],
        ),
        row(
            GENERIC,
            "0Bh Invalid Namespace or Format",
            "a Flush of a namespace id the subsystem does not have",
            Send::Io(vec![nvm::flush(9)]),
            &[Status::INVALID_NAMESPACE],
        ),
        row(
            GENERIC,
            "80h LBA Out of Range",
            "a Read of the last block and one past it",
            Send::Io(vec![nvm::read(1, end - 1, 2, BS)]),
            &[Status::LBA_OUT_OF_RANGE],
        ),
        row(
            GENERIC,
            "80h LBA Out of Range",
            "a Write past the end",
            Send::Io(vec![nvm::write(1, end, vec![7; BS], BS, false)]),
            &[Status::LBA_OUT_OF_RANGE],
        ),
        row(
            GENERIC,
            "80h LBA Out of Range",
            "a Write Zeroes past the end",
            Send::Io(vec![nvm::write_zeroes(1, end, 1, false)]),
            &[Status::LBA_OUT_OF_RANGE],
        ),
        row(
            GENERIC,
            "80h LBA Out of Range",
            "a Dataset Management deallocation of a range past the end",
            Send::Io(vec![nvm::deallocate(1, &[(0, 1), (end - 1, 2)])]),
            &[Status::LBA_OUT_OF_RANGE],
        ),
        row(
            GENERIC,
            "82h Namespace Not Ready (Do Not Retry clear)",
            "a Read of a namespace whose RAID5 did not assemble",
            Send::Io(vec![nvm::read(NOT_READY, 0, 8, BS)]),
            &[Status::NAMESPACE_NOT_READY],
        ),
        row(
            GENERIC,
            "82h Namespace Not Ready (Do Not Retry clear)",
            "a Write to a namespace whose RAID5 did not assemble",
            Send::Io(vec![nvm::write(NOT_READY, 0, vec![1; BS], BS, true)]),
            &[Status::NAMESPACE_NOT_READY],
        ),
        row(
            MEDIA,
            "85h Compare Failure",
            "a Compare with data the blocks do not hold",
            Send::Io(vec![nvm::compare(1, 0, vec![0xEE; BS], BS)]),
            &[Status::COMPARE_FAILURE],
        ),
        row(
            GENERIC,
            "0Ah Command Aborted due to Missing Fused Command",
            "the second command of a fused operation alone",
            Send::Io(vec![lone_second]),
            &[Status::FUSED_MISSING],
        ),
        row(
            GENERIC,
            "0Ah Command Aborted due to Missing Fused Command",
            "a first fused command followed by a plain Read (which runs)",
            Send::Io(vec![lone_first, nvm::read(1, 0, 1, BS)]),
            &[Status::FUSED_MISSING, Status::SUCCESS],
        ),
        row(
            GENERIC,
            "09h Command Aborted due to Failed Fused Command",
            "Compare and Write whose Compare misses: the Write is not done",
            Send::Io(nvm::compare_and_write(
                1,
                0,
                vec![0xEE; BS],
                vec![0xAB; BS],
                BS,
            )),
            &[Status::COMPARE_FAILURE, Status::FUSED_FAILED],
        ),
        row(
            GENERIC,
            "09h Command Aborted due to Failed Fused Command",
            "Compare and Write whose Compare names a range past the end",
            Send::Io(out_of_range_pair),
            &[Status::LBA_OUT_OF_RANGE, Status::FUSED_FAILED],
        ),
        row(
            GENERIC,
            "09h Command Aborted due to Failed Fused Command",
            "Compare and Write on the namespace that is not ready",
            Send::Io(nvm::compare_and_write(
                NOT_READY,
                0,
                vec![0; BS],
                vec![1; BS],
                BS,
            )),
            &[Status::NAMESPACE_NOT_READY, Status::FUSED_FAILED],
        ),
        row(
            GENERIC,
            "02h Invalid Field in Command",
            "a fused pair that is not a Compare then a Write of one range",
            Send::Io(fused(
                nvm::compare(1, 0, vec![0; BS], BS),
                nvm::write(1, 1, vec![0; BS], BS, false),
            )),
            &[Status::INVALID_FIELD, Status::INVALID_FIELD],
        ),
        row(
            SPECIFIC,
            "09h Invalid Log Page",
            "Get Log Page of a log the controller does not keep",
            Send::Admin(
                Command::new(
                    SqeBuilder::new(0x02, 0)
                        .nsid(0xFFFF_FFFF)
                        .cdw(10, 0x7F | 15 << 16),
                )
                .reading(64),
            ),
            &[Status::INVALID_LOG_PAGE],
        ),
        row(
            FABRICS,
            "84h Connect Invalid Host",
            "a Connect from a host the subsystem's allow_hosts does not admit",
            Send::Connect(STRANGER, NQN),
            &[Status::CONNECT_INVALID_HOST],
        ),
        row(
            FABRICS,
            "84h Connect Invalid Host",
            "a Connect to a subsystem that admits one other host only",
            Send::Connect(HOSTNQN, OTHER_NQN),
            &[Status::CONNECT_INVALID_HOST],
        ),
        row(
            FABRICS,
            "82h Connect Invalid Parameters",
            "a Connect to a subsystem NQN that is not served",
            Send::Connect(HOSTNQN, "nqn.2026-11.org.openarray.test:none"),
            &[Status::CONNECT_INVALID_PARAMETERS],
        ),
    ]
}

#[test]
fn failed_commands_end_with_the_status_the_specification_names() {
    let dir = tempfile::tempdir().unwrap();
    break_the_array(dir.path());
    let s = start(dir.path());
    assert!(
        s.daemon.log().contains("RAID array not assembled"),
        "{}",
        s.daemon.log()
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut host = rt
        .block_on(Host::connect(s.nvmf, who(HOSTNQN, NQN), Options::default()))
        .unwrap_or_else(|e| panic!("{e}\n{}", s.daemon.log()));
    // Block 0 holds what the compares above do not expect.
    let w = rt
        .block_on(host.io[0].one(nvm::write(1, 0, vec![0x5A; BS], BS, false)))
        .unwrap();
    expect_success(&w, "Write").unwrap();

    let mut wrong = Vec::new();
    let mut io_failures = 0;
    for r in table() {
        // Fused companions are answered without an entry of their own.
        if let Send::Io(_) = r.send {
            if r.want.len() == 1 && r.want[0] != Status::FUSED_MISSING {
                io_failures += 1;
            }
        }
        let got: Vec<Status> = match r.send {
            Send::Io(cmds) => rt.block_on(host.io[0].run(cmds)),
            Send::Admin(cmd) => rt.block_on(host.admin.run(vec![cmd])),
            Send::Connect(hostnqn, subnqn) => rt.block_on(async {
                let mut q = Queue::open(s.nvmf, Digests::default()).await?;
                let c = q
                    .connect(0, 32, 0xFFFF, &who(hostnqn, subnqn), 0, false)
                    .await?;
                Ok(vec![c])
            }),
        }
        .unwrap_or_else(|e| panic!("{}: {e}", r.case))
        .iter()
        .map(|c| c.status())
        .collect();
        let line = format!("{} -> {:04x?}, {}", r.case, got, r.spec);
        eprintln!("{line}");
        if got != r.want {
            wrong.push(format!("{line}; wanted {:04x?}", r.want));
        }
    }
    assert!(wrong.is_empty(), "wrong statuses:\n{}", wrong.join("\n"));

    // Nothing a failed command was sent with was written.
    let back = rt.block_on(host.io[0].one(nvm::read(1, 0, 1, BS))).unwrap();
    assert!(back.data == vec![0x5A; BS], "block 0 as written first");
    // Each failed I/O command that is not half of a fused pair has its
    // entry in the error log.
    let log = rt.block_on(host.get_log(0x01, 64, false)).unwrap();
    expect_success(&log, "Get Log Page, errors").unwrap();
    let count = nvmf::wire::le64(&log.data, 0);
    assert!(
        count >= io_failures as u64,
        "error count {count}, {io_failures} failed"
    );

    // Not ready is not for ever: assembled by force, the namespace serves.
    s.daemon.ok(&["raid", "assemble", "r5", "--force"]);
    let c = rt
        .block_on(host.io[0].one(nvm::read(NOT_READY, 0, 8, BS)))
        .unwrap();
    expect_success(&c, "Read after the assembly").unwrap();

    // A host the allow list stops admitting loses its controller, and
    // its next Connect is refused as Connect Invalid Host.
    let text = config(dir.path(), s.port, s.nvmf, &format!("\"{STRANGER}\""));
    std::fs::write(&s.cfg, text).unwrap();
    let out = s
        .daemon
        .config_cli(&["apply", &s.cfg.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        rt.block_on(host.io[0].one(nvm::read(1, 0, 1, BS))).is_err(),
        "the controller of a host no longer admitted is ended"
    );
    let c = rt
        .block_on(async {
            let mut q = Queue::open(s.nvmf, Digests::default()).await?;
            q.connect(0, 32, 0xFFFF, &who(HOSTNQN, NQN), 0, false).await
        })
        .unwrap();
    assert_eq!(c.status(), Status::CONNECT_INVALID_HOST, "{FABRICS}: 84h");
    s.daemon.terminate();
}
