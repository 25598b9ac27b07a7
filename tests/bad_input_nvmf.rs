//! Hostile and malformed NVMe/TCP input against the real daemon while a
//! verified host keeps doing real I/O over NVMe/TCP, the corpus of
//! tests/bad_input.rs for the third transport.
//!
//! Attackers open many connections to a second subsystem (a null
//! namespace) and send: noise before initialization, bit-flipped and
//! truncated ICReqs, huge PDU lengths left unsent, Connect capsules with
//! flipped bytes, and, on properly connected queues, NVM and admin
//! capsules with random bytes flipped (opcodes, lengths, SGLs, data
//! offsets), H2CData for tags never given, and pipelined bursts never
//! read. Asserted: the verified host never sees an error or a miscompare,
//! the daemon stays up and never logs a panic, and new hosts still
//! connect. OPENARRAY_FUZZ_SEED=<n> replays a run.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::admin::AdminDaemon;
use common::{free_port, retrying_taken_ports};
use nvmf::initiator::{expect_success, nvm, Host, Options, Queue, Who};
use nvmf::wire::{self, Digests, IcReq};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const VERIFIED: &str = "nqn.2026-11.org.openarray.test:verified";
const FUZZ: &str = "nqn.2026-11.org.openarray.test:fuzz";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0b5c2e3e-6f1c-4c33-9d5f-00000000b001";
const BS: usize = 512;
const DEVICE_BLOCKS: u64 = (8 << 20) / BS as u64;
const RUN: Duration = Duration::from_secs(15);
const ATTACKERS: u64 = 4;

fn start(dir: &std::path::Path) -> (AdminDaemon, SocketAddr) {
    let d = dir.display();
    retrying_taken_ports(|| {
        let (port, nvmf) = (free_port(), free_port());
        let text = format!(
            r#"[[portal]]
listen = "127.0.0.1:{port}"

[[device]]
name = "verified"
kind = "file"
path = "{d}/verified.img"
size = "8M"

[[device]]
name = "fuzz"
kind = "null"
size = "1G"

[nvmf]
listen = ["127.0.0.1:{nvmf}"]

[[nvmf.subsystem]]
nqn = "{VERIFIED}"
allow_hosts = ["*"]

[[nvmf.subsystem.namespace]]
nsid = 1
device = "verified"

[[nvmf.subsystem]]
nqn = "{FUZZ}"
allow_hosts = ["*"]

[[nvmf.subsystem.namespace]]
nsid = 1
device = "fuzz"
"#
        );
        let cfg = dir.join("openarray.toml");
        std::fs::write(&cfg, text).unwrap();
        AdminDaemon::try_start(&cfg, dir, port)
            .map(|d| (d, SocketAddr::from(([127, 0, 0, 1], nvmf))))
    })
}

fn who(subnqn: &str) -> Who {
    Who {
        host_nqn: HOSTNQN.into(),
        host_id: *b"openarray-fuzz-1",
        subnqn: subnqn.into(),
    }
}

/// Writes random data at random places and reads each back against a
/// shadow copy until `stop`; the number of verified commands.
async fn verified_io(addr: SocketAddr, seed: u64, stop: Arc<AtomicBool>) -> u64 {
    let opts = Options {
        io_queues: 2,
        ..Options::default()
    };
    let mut host = Host::connect(addr, who(VERIFIED), opts).await.unwrap();
    let mut shadow = vec![0u8; (DEVICE_BLOCKS as usize) * BS];
    let mut rng = StdRng::seed_from_u64(seed);
    let mut done = 0;
    while !stop.load(Relaxed) {
        let blocks = rng.gen_range(1..=64u64);
        let lba = rng.gen_range(0..DEVICE_BLOCKS - blocks);
        let range = lba as usize * BS..(lba + blocks) as usize * BS;
        let q = rng.gen_range(0..2);
        if rng.gen_bool(0.5) {
            let data: Vec<u8> = (0..range.len()).map(|_| rng.gen()).collect();
            let c = host.io[q]
                .one(nvm::write(1, lba, data.clone(), BS, rng.gen_bool(0.2)))
                .await
                .unwrap();
            expect_success(&c, "verified write").unwrap();
            shadow[range].copy_from_slice(&data);
        } else {
            let c = host.io[q]
                .one(nvm::read(1, lba, blocks as u32, BS))
                .await
                .unwrap();
            expect_success(&c, "verified read").unwrap();
            assert!(c.data == shadow[range], "miscompare at LBA {lba}");
        }
        done += 1;
    }
    // The whole namespace reads back right at the end.
    for lba in (0..DEVICE_BLOCKS).step_by(128) {
        let c = host.io[0].one(nvm::read(1, lba, 128, BS)).await.unwrap();
        expect_success(&c, "final read").unwrap();
        let at = lba as usize * BS;
        assert!(
            c.data == shadow[at..at + 128 * BS],
            "final miscompare at {lba}"
        );
    }
    done
}

/// Flips one to `most - 1` random bits of `bytes`.
fn flip(rng: &mut StdRng, bytes: &mut [u8], most: usize) {
    for _ in 0..rng.gen_range(1..most) {
        let i = rng.gen_range(0..bytes.len());
        bytes[i] ^= 1 << rng.gen_range(0..8);
    }
}

fn ic_req(rng: &mut StdRng) -> Vec<u8> {
    wire::encode_ic_req(&IcReq {
        pfv: 0,
        hpda: 0,
        digests: Digests {
            header: rng.gen_bool(0.5),
            data: rng.gen_bool(0.5),
        },
        maxr2t: 0,
    })
}

/// One attack over one or a few connections; the bytes sent.
async fn attack(addr: SocketAddr, rng: &mut StdRng) -> std::io::Result<u64> {
    let mut sent = Vec::new();
    let mut s = match rng.gen_range(0..6) {
        // Noise before initialization.
        0 => {
            let mut s = TcpStream::connect(addr).await?;
            sent = (0..rng.gen_range(1..4096)).map(|_| rng.gen()).collect();
            s.write_all(&sent).await?;
            s
        }
        // A mangled or truncated ICReq.
        1 => {
            let mut s = TcpStream::connect(addr).await?;
            sent = ic_req(rng);
            flip(rng, &mut sent, 4);
            sent.truncate(rng.gen_range(1..=sent.len()));
            s.write_all(&sent).await?;
            s
        }
        // A header announcing far more than it sends.
        2 => {
            let mut s = TcpStream::connect(addr).await?;
            let mut ic = ic_req(rng);
            wire::put32(&mut ic, 4, rng.gen_range(129..u32::MAX));
            s.write_all(&ic).await?;
            sent = ic;
            s
        }
        // A Connect with flipped bytes.
        3 => {
            let mut q = Queue::open(addr, Digests::default()).await?;
            let mut data = vec![0u8; 1024];
            data[256..256 + FUZZ.len()].copy_from_slice(FUZZ.as_bytes());
            data[512..512 + HOSTNQN.len()].copy_from_slice(HOSTNQN.as_bytes());
            let mut sqe = [0u8; 64];
            sqe[0] = 0x7F;
            sqe[4] = 0x01;
            wire::put16(&mut sqe, 44, 31);
            let mut pdu = wire::encode_command(&sqe, &data, q.digests);
            flip(rng, &mut pdu, 6);
            q.stream.write_all(&pdu).await?;
            sent = pdu;
            q.stream
        }
        // Connected queues of a real controller, then capsules with
        // flipped bytes, pipelined, answers never read.
        _ => {
            let host = Host::connect(addr, who(FUZZ), Options::default()).await?;
            let mut q = host.io.into_iter().next().expect("one I/O queue");
            for _ in 0..rng.gen_range(1..32) {
                let lba = rng.gen_range(0..1u64 << 20);
                let cmd = match rng.gen_range(0..4) {
                    0 => nvm::read(1, lba, rng.gen_range(1..64), BS),
                    1 => nvm::write(1, lba, vec![0xA5; BS * 4], BS, false),
                    2 => nvm::write_zeroes(1, lba, 8, rng.gen_bool(0.5)),
                    _ => nvm::flush(1),
                };
                let mut pdu = wire::encode_command(&cmd.sqe.0, &cmd.data_out, q.digests);
                if rng.gen_bool(0.7) {
                    flip(rng, &mut pdu, 4);
                }
                q.stream.write_all(&pdu).await?;
                sent.extend_from_slice(&pdu);
            }
            q.stream
        }
    };
    // Read what comes back for a moment, or nothing at all.
    if rng.gen_bool(0.7) {
        let mut buf = vec![0u8; 64 << 10];
        let _ = tokio::time::timeout(Duration::from_millis(50), s.read(&mut buf)).await;
    }
    Ok(sent.len() as u64)
}

#[test]
fn hostile_nvme_tcp_input_leaves_a_verified_host_serving() {
    let seed = std::env::var("OPENARRAY_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("OPENARRAY_FUZZ_SEED={seed}");
    let dir = tempfile::tempdir().unwrap();
    let (daemon, addr) = start(dir.path());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (attacks, bytes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let verified = rt.spawn(verified_io(addr, seed, stop.clone()));
    let attackers: Vec<_> = (0..ATTACKERS)
        .map(|i| {
            let (stop, attacks, bytes) = (stop.clone(), attacks.clone(), bytes.clone());
            rt.spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed ^ (i + 1).wrapping_mul(0x9E37_79B9));
                while !stop.load(Relaxed) {
                    if let Ok(n) = attack(addr, &mut rng).await {
                        bytes.fetch_add(n, Relaxed);
                    }
                    attacks.fetch_add(1, Relaxed);
                }
            })
        })
        .collect();
    let started = Instant::now();
    std::thread::sleep(RUN);
    stop.store(true, Relaxed);
    for a in attackers {
        rt.block_on(a).unwrap();
    }
    let done = rt
        .block_on(verified)
        .unwrap_or_else(|e| panic!("{e}\n{}", daemon.log()));
    let (attacks, bytes) = (attacks.load(Relaxed), bytes.load(Relaxed));
    println!(
        "{attacks} attacks ({bytes} bytes) over {:?} beside {done} verified commands",
        started.elapsed()
    );
    assert!(attacks > 500, "only {attacks} attacks ran");
    assert!(done > 100, "only {done} verified commands ran");
    let log = daemon.log();
    assert!(!log.contains("panicked"), "{log}");
    // A new host connects and reads.
    let mut host = rt
        .block_on(Host::connect(addr, who(VERIFIED), Options::default()))
        .unwrap();
    let c = rt.block_on(host.io[0].one(nvm::read(1, 0, 8, BS))).unwrap();
    expect_success(&c, "a read after the attacks").unwrap();
    let status = daemon.terminate();
    assert!(status.success(), "{status}");
}
