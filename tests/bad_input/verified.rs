//! The verified session: our own initiator writes random data and reads it
//! back, compared against a shadow copy of the LUN, while the attack runs.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc;
use std::time::Duration;

use crate::common::iscsi::{LoginParams, Session};
use crate::common::rng::Rng;
use crate::{MAX_VERIFIED_BLOCKS, VERIFIED_IQN, VERIFIED_LUN};

/// What the verified session did; `error` is the first thing that went wrong.
pub(crate) struct Verified {
    pub(crate) ios: u64,
    pub(crate) error: Option<String>,
    /// What the LUN should hold now.
    pub(crate) shadow: Vec<u8>,
    pub(crate) block_size: u32,
}

pub(crate) fn verified_params() -> LoginParams {
    LoginParams::normal("iqn.2024-01.org.openarray.test:verifier", VERIFIED_IQN)
}

/// Fill the LUN, report readiness, then write/read-compare random extents
/// until `stop`.
pub(crate) fn verified_io(
    addr: SocketAddr,
    seed: u64,
    stop: &AtomicBool,
    ready: mpsc::Sender<()>,
) -> Verified {
    let mut v = Verified {
        ios: 0,
        error: None,
        shadow: Vec::new(),
        block_size: 512,
    };
    if let Err(e) = verified_loop(addr, seed, stop, ready, &mut v) {
        v.error = Some(e);
    }
    v
}

fn verified_loop(
    addr: SocketAddr,
    seed: u64,
    stop: &AtomicBool,
    ready: mpsc::Sender<()>,
    v: &mut Verified,
) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let mut s = Session::login(addr, &verified_params(), Duration::from_secs(30))
        .map_err(|e| format!("login: {e}"))?;
    let (blocks, bs) = s
        .read_capacity(VERIFIED_LUN)
        .map_err(|e| format!("READ CAPACITY: {e}"))?;
    v.block_size = bs;
    let bsz = bs as usize;
    v.shadow = vec![0; blocks as usize * bsz];

    // Commit the whole RAM disk before the attack so RSS has its baseline.
    for lba in (0..blocks).step_by(MAX_VERIFIED_BLOCKS as usize) {
        let n = MAX_VERIFIED_BLOCKS.min(blocks - lba) as usize;
        let at = lba as usize * bsz;
        rng.fill(&mut v.shadow[at..at + n * bsz]);
        s.write10(VERIFIED_LUN, lba as u32, &v.shadow[at..at + n * bsz], bs)
            .map_err(|e| format!("prefill at LBA {lba}: {e}"))?;
        v.ios += 1;
    }
    let _ = ready.send(());

    while !stop.load(Relaxed) {
        let n = rng.range(1, MAX_VERIFIED_BLOCKS);
        let lba = rng.below(blocks - n + 1);
        let (at, len) = (lba as usize * bsz, n as usize * bsz);
        if rng.one_in(2) {
            rng.fill(&mut v.shadow[at..at + len]);
            s.write10(VERIFIED_LUN, lba as u32, &v.shadow[at..at + len], bs)
                .map_err(|e| format!("WRITE(10) LBA {lba}+{n}: {e}"))?;
            v.ios += 1;
        }
        let n = rng.range(1, MAX_VERIFIED_BLOCKS);
        let lba = rng.below(blocks - n + 1);
        let (at, len) = (lba as usize * bsz, n as usize * bsz);
        let got = s
            .read10(VERIFIED_LUN, lba as u32, n as u16, bs)
            .map_err(|e| format!("READ(10) LBA {lba}+{n}: {e}"))?;
        v.ios += 1;
        if got != v.shadow[at..at + len] {
            let first = got
                .iter()
                .zip(&v.shadow[at..at + len])
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Err(format!(
                "miscompare reading LBA {lba}+{n}: first wrong byte at offset {first}"
            ));
        }
    }
    s.logout().map_err(|e| format!("logout: {e}"))
}
