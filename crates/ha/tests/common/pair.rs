//! Two mirrors of one name on two links in one process, over devices
//! that lose unflushed writes at a "power cut".

use std::sync::Arc;
use std::time::{Duration, Instant};

use block::{BlockDevice, FaultyDevice, MemDevice};
use ha::link::Link;
use ha::{Connection, Mirror, MirrorOptions, MirrorStatus};

use super::{Proxy, SECRET};

pub const DEVICE: u64 = 8 << 20;
pub const NAME: &str = "vol0";

pub struct Node {
    pub link: Arc<Link>,
    pub disk: Arc<FaultyDevice>,
    pub mirror: Option<Mirror>,
}

impl Node {
    pub fn m(&self) -> &Mirror {
        self.mirror.as_ref().expect("open")
    }

    pub fn status(&self) -> MirrorStatus {
        self.m().status()
    }

    /// Closes the mirror and loses what its disk had not flushed.
    pub fn power_cut(&mut self) {
        self.mirror = None;
        self.disk.drop_unflushed();
    }

    pub fn reopen(&mut self, options: MirrorOptions) {
        let disk: Arc<dyn BlockDevice> = self.disk.clone();
        self.mirror = Some(Mirror::open(NAME, disk, self.link.clone(), options).unwrap());
    }

    /// The replica's data area as stored on its disk.
    pub fn data(&self) -> Vec<u8> {
        let size = ha::mirror::Layout::for_device(DEVICE).unwrap().data_size;
        let mut b = vec![0u8; size as usize];
        self.disk.read_at(&mut b, 0).unwrap();
        b
    }
}

pub struct Pair {
    pub a: Node,
    pub b: Node,
    pub proxy: Proxy,
    pub rt: tokio::runtime::Runtime,
}

pub fn options() -> MirrorOptions {
    MirrorOptions {
        resync_rate: 0,
        peer_timeout: Duration::from_secs(3),
        failover: None,
    }
}

fn node(link: Arc<Link>, options: MirrorOptions) -> Node {
    let disk = Arc::new(FaultyDevice::new(Arc::new(MemDevice::new(DEVICE))));
    let mut n = Node {
        link,
        disk,
        mirror: None,
    };
    n.reopen(options);
    n
}

/// A pair with `a` primary, connected and in sync.
pub fn primary_a(options: MirrorOptions) -> Pair {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (la, lb, proxy) = rt.block_on(super::pair(SECRET));
    let p = Pair {
        a: node(la, options.clone()),
        b: node(lb, options),
        proxy,
        rt,
    };
    p.wait_both(Connection::Connected);
    p.a.m().promote().unwrap();
    // A new pair copies the first primary's replica whole.
    p.wait_both(Connection::Connected);
    p
}

impl Pair {
    pub fn wait_both(&self, c: Connection) {
        wait("both mirrors", || {
            self.a.status().connection == c && self.b.status().connection == c
        });
    }
}

pub fn wait(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `len` bytes of a pattern no other write in a test repeats.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}
