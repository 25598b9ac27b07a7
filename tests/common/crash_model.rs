//! What a LUN under a crash test may hold, piece by piece: the tag that
//! is durable and the tags written since (acknowledged, refused, or in
//! flight when the kill came). Tag 0 is zeros. Shared by the pool, RAID
//! and cache crash tests.

/// Writes and the model work in 4 KiB pieces.
pub const PIECE: usize = 4096;

#[derive(Clone)]
pub struct Model {
    pub durable: Vec<u64>,
    pub since: Vec<Vec<u64>>,
    /// Per piece, where in `since` the last command answered with GOOD
    /// status is: the one a SYNCHRONIZE CACHE makes durable. A write
    /// answered with CHECK CONDITION stays a possible content but never
    /// becomes the durable one.
    pub good: Vec<Option<usize>>,
}

impl Model {
    /// `pieces` pieces, all zeros and durable.
    pub fn new(pieces: usize) -> Model {
        Model {
            durable: vec![0; pieces],
            since: vec![Vec::new(); pieces],
            good: vec![None; pieces],
        }
    }

    /// The command that last pushed a tag for `piece` completed with GOOD.
    pub fn acknowledged(&mut self, piece: usize) {
        self.good[piece] = self.since[piece].len().checked_sub(1);
    }

    /// SYNCHRONIZE CACHE completed: every write acknowledged before it is
    /// durable; writes refused after the last acknowledged one stay possible.
    pub fn synced(&mut self) {
        for ((d, s), g) in self
            .durable
            .iter_mut()
            .zip(&mut self.since)
            .zip(&mut self.good)
        {
            if let Some(i) = g.take() {
                *d = s[i];
                s.drain(..=i);
            }
        }
    }
}

/// A piece's content: its tag and its own index, repeated.
pub fn content(tag: u64, piece: usize) -> Vec<u8> {
    if tag == 0 {
        return vec![0; PIECE];
    }
    let mut out = Vec::with_capacity(PIECE);
    while out.len() < PIECE {
        out.extend_from_slice(&tag.to_be_bytes());
        out.extend_from_slice(&(piece as u64).to_be_bytes());
    }
    out
}

/// Runs `openarray ARGS`: whether it succeeded, and its stdout then stderr.
pub fn openarray(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_openarray"))
        .args(args)
        .output()
        .expect("run openarray");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Logs the test host in to `target` at `addr`.
pub fn login(addr: std::net::SocketAddr, target: &str) -> super::iscsi::Session {
    let params = super::iscsi::LoginParams::normal("iqn.2026-11.org.openarray.test:host", target);
    super::iscsi::Session::login(addr, &params, std::time::Duration::from_secs(10)).expect("login")
}

/// The seed of a randomised run: `$var` when set, else the clock. It is
/// printed so that a failing run can be replayed.
pub fn seed(var: &str) -> u64 {
    let seed = std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("{var}={seed}");
    seed
}

/// WRITE(10) of `piece` with `tag`'s content on `lun` (blocks of `block`
/// bytes), with FUA if asked, recorded in `model`: a possible content at
/// once; durable when acknowledged with FUA, else the one the next
/// SYNCHRONIZE CACHE makes durable.
pub fn write_piece(
    s: &mut super::iscsi::Session,
    lun: u64,
    model: &mut Model,
    (piece, tag, fua): (usize, u64, bool),
    block: usize,
) -> std::io::Result<super::iscsi::Completion> {
    model.since[piece].push(tag);
    let lba = (piece * PIECE / block) as u32;
    let mut cdb = super::iscsi::rw10_cdb(0x2a, lba, (PIECE / block) as u16);
    if fua {
        cdb[1] |= 0x08;
    }
    let r = s.command(lun, &cdb, &content(tag, piece), 0);
    if matches!(&r, Ok(c) if c.status == 0) {
        if fua {
            model.durable[piece] = tag;
            model.since[piece].clear();
            model.good[piece] = None;
        } else {
            model.acknowledged(piece);
        }
    }
    r
}
