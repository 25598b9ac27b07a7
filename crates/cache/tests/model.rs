//! Model-based test: random reads, writes (some FUA), flushes, mode
//! switches, detach/attach, write-back passes, clean restarts and power
//! cuts of both devices, on a cache a quarter the size of the backing,
//! against an in-memory model. Every read returns the model's data; after
//! a power cut every byte holds what was acknowledged before the last
//! flush (or with FUA), or one of the values written to it since. Power
//! cuts either lose every unflushed write (`FaultyDevice`) or keep a
//! random part of them, some torn (`Torn`), which exercises the table's
//! two copies and its commit order.

mod common;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use block::BlockDevice;
use cache::{CacheDevice, FormatPolicy, Mode};
use common::{options, pattern, read, Rig, Torn};
use proptest::prelude::*;

const SIZE: u64 = 32 * 4096;
/// Eight 4 KiB lines after the metadata.
const CACHE: u64 = 48 << 10;

#[derive(Clone, Debug)]
enum Op {
    Read {
        offset: u64,
        len: u64,
    },
    Write {
        offset: u64,
        len: u64,
        seed: u64,
        fua: bool,
    },
    Flush,
    SetMode(Mode),
    Detach,
    Attach,
    WriteBack(u64),
    PowerCut,
    CleanRestart,
    /// Power fails after this many more writes and flushes, in the middle
    /// of whichever operation reaches it.
    ArmPowerCut(i64),
}

/// The sizes a run works with.
#[derive(Clone, Copy)]
struct Shape {
    size: u64,
    cache: u64,
    line: u64,
}

/// 4 KiB lines (8 sub-blocks), eight of them for a backing of 32.
const SMALL_LINES: Shape = Shape {
    size: SIZE,
    cache: CACHE,
    line: 4096,
};

/// 16 KiB lines (32 sub-blocks), eight of them for a backing of 32.
const LARGE_LINES: Shape = Shape {
    size: 4 * SIZE,
    cache: (16 << 10) + 8 * (16 << 10),
    line: 16 << 10,
};

fn range(size: u64) -> impl Strategy<Value = (u64, u64)> {
    (0..size).prop_flat_map(move |o| (Just(o), 1..=(size - o).min(3 * size / 32)))
}

fn op(size: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => range(size).prop_map(|(offset, len)| Op::Read { offset, len }),
        8 => (range(size), any::<u64>(), prop::bool::weighted(0.15))
            .prop_map(|((offset, len), seed, fua)| Op::Write { offset, len, seed, fua }),
        2 => Just(Op::Flush),
        1 => prop::sample::select(Mode::ALL.to_vec()).prop_map(Op::SetMode),
        1 => Just(Op::Detach),
        1 => Just(Op::Attach),
        1 => (1u64..40_000).prop_map(Op::WriteBack),
        2 => Just(Op::PowerCut),
        1 => Just(Op::CleanRestart),
        2 => (0i64..12).prop_map(Op::ArmPowerCut),
    ]
}

/// What the device must hold.
struct Model {
    /// What reads return now.
    visible: Vec<u8>,
    /// What survives a power cut for sure.
    durable: Vec<u8>,
    /// Values written to each byte since it was last made durable; a
    /// power cut may leave any of them.
    since: Vec<Vec<u8>>,
}

impl Model {
    fn new(size: u64) -> Model {
        Model {
            visible: vec![0; size as usize],
            durable: vec![0; size as usize],
            since: vec![Vec::new(); size as usize],
        }
    }

    fn write(&mut self, offset: u64, data: &[u8], fua: bool) {
        for (i, &b) in data.iter().enumerate() {
            let at = offset as usize + i;
            self.visible[at] = b;
            if fua {
                self.durable[at] = b;
                self.since[at].clear();
            } else {
                self.since[at].push(b);
            }
        }
    }

    fn all_durable(&mut self) {
        self.durable.copy_from_slice(&self.visible);
        self.since.iter_mut().for_each(Vec::clear);
    }

    /// Checks what a power cut left and takes it as the new state.
    fn after_power_cut(&mut self, found: &[u8]) -> Result<(), TestCaseError> {
        for (i, &b) in found.iter().enumerate() {
            prop_assert!(
                b == self.durable[i] || self.since[i].contains(&b),
                "byte {} is {:#x}: durable {:#x}, written since {:?}",
                i,
                b,
                self.durable[i],
                self.since[i]
            );
        }
        self.visible.copy_from_slice(found);
        self.all_durable();
        Ok(())
    }
}

/// A cache device and a backing that a power cut can hit.
trait Devices {
    fn cache(&self) -> Arc<dyn BlockDevice>;
    fn backing(&self) -> Arc<dyn BlockDevice>;
    fn power_cut(&self, seed: &mut u64);
    /// Power fails after `n` more writes and flushes (negative: never).
    fn arm(&self, n: i64) {
        let _ = n;
    }
    /// Whether the power has failed.
    fn out(&self) -> bool {
        false
    }
}

/// Power cuts lose every unflushed write.
impl Devices for Rig {
    fn cache(&self) -> Arc<dyn BlockDevice> {
        self.cache.clone()
    }
    fn backing(&self) -> Arc<dyn BlockDevice> {
        self.backing.clone()
    }
    fn power_cut(&self, _: &mut u64) {
        Rig::power_cut(self)
    }
}

/// Power cuts keep a random part of the unflushed writes, some torn.
struct TornRig {
    cache: Arc<Torn>,
    backing: Arc<Torn>,
    power: Arc<AtomicI64>,
}

impl TornRig {
    fn new(shape: Shape) -> TornRig {
        let power = Arc::new(AtomicI64::new(-1));
        TornRig {
            cache: Arc::new(Torn::new(shape.cache, power.clone())),
            backing: Arc::new(Torn::new(
                shape.size + cache::BACKING_RESERVE,
                power.clone(),
            )),
            power,
        }
    }
}

impl Devices for TornRig {
    fn cache(&self) -> Arc<dyn BlockDevice> {
        self.cache.clone()
    }
    fn backing(&self) -> Arc<dyn BlockDevice> {
        self.backing.clone()
    }
    fn power_cut(&self, seed: &mut u64) {
        self.cache.power_cut(seed);
        self.backing.power_cut(seed);
        self.power.store(-1, Ordering::SeqCst);
    }
    fn arm(&self, n: i64) {
        self.power.store(n, Ordering::SeqCst);
    }
    fn out(&self) -> bool {
        self.power.load(Ordering::SeqCst) == 0
    }
}

fn open(rig: &dyn Devices, shape: Shape, mode: Mode, format: FormatPolicy) -> CacheDevice {
    let mut o = options(mode);
    o.line_size = shape.line;
    o.format = format;
    CacheDevice::open(rig.cache(), rig.backing(), o).expect("the cache opens")
}

/// A power cut takes the whole host down: whoever asked never hears of an
/// operation during which it happened, even one that seemed to succeed.
fn alive(rig: &dyn Devices) -> std::io::Result<()> {
    if rig.out() {
        Err(std::io::Error::other("power lost"))
    } else {
        Ok(())
    }
}

/// Cuts the power of both devices, reopens the cache, and checks what
/// survived against the model.
fn open_after_cut(
    rig: &dyn Devices,
    shape: Shape,
    mode: Mode,
    seed: &mut u64,
    model: &mut Model,
) -> Result<CacheDevice, TestCaseError> {
    rig.power_cut(seed);
    let dev = open(rig, shape, mode, FormatPolicy::Never);
    let found = read(&dev, 0, shape.size as usize);
    model.after_power_cut(&found)?;
    Ok(dev)
}

fn run(rig: &dyn Devices, shape: Shape, ops: Vec<Op>, mut seed: u64) -> Result<(), TestCaseError> {
    let mut mode = Mode::WriteBack;
    let mut dev = open(rig, shape, mode, FormatPolicy::IfBlank);
    prop_assert_eq!(dev.capacity_lines(), 8);
    let mut model = Model::new(shape.size);
    for op in ops {
        // Whether the power failed during the operation.
        let lost = match op {
            Op::Read { offset, len } => {
                let mut buf = vec![0; len as usize];
                let result = dev.read_at(&mut buf, offset);
                if result.is_ok() {
                    let want = &model.visible[offset as usize..(offset + len) as usize];
                    prop_assert_eq!(&buf[..], want);
                }
                result.is_err()
            }
            Op::Write {
                offset,
                len,
                seed,
                fua,
            } => {
                let data = pattern(seed, len as usize);
                match dev.write_at(&data, offset, fua).and_then(|()| alive(rig)) {
                    Ok(()) => {
                        model.write(offset, &data, fua);
                        false
                    }
                    Err(_) => {
                        // Not acknowledged: it may or may not be there.
                        model.write(offset, &data, false);
                        true
                    }
                }
            }
            Op::Flush => {
                let result = dev.flush().and_then(|()| alive(rig));
                if result.is_ok() {
                    model.all_durable();
                }
                result.is_err()
            }
            Op::SetMode(m) => match dev.set_mode(m, &mut |_| {}) {
                Ok(()) => {
                    prop_assert!(dev.status().dirty_bytes == 0 || m == Mode::WriteBack);
                    mode = m;
                    false
                }
                Err(_) => {
                    mode = m;
                    true
                }
            },
            Op::Detach => match dev.detach(&mut |_| {}) {
                Ok(()) => {
                    prop_assert_eq!(dev.status().dirty_bytes, 0);
                    false
                }
                Err(_) => true,
            },
            Op::Attach => dev.attach().is_err(),
            Op::WriteBack(budget) => dev.write_back(budget).is_err(),
            Op::PowerCut => true,
            Op::CleanRestart => match dev.close().and_then(|()| alive(rig)) {
                Ok(()) => {
                    model.all_durable();
                    rig.power_cut(&mut seed);
                    dev = open(rig, shape, mode, FormatPolicy::Never);
                    false
                }
                Err(_) => {
                    dev = open_after_cut(rig, shape, mode, &mut seed, &mut model)?;
                    false
                }
            },
            Op::ArmPowerCut(n) => {
                rig.arm(n);
                false
            }
        };
        // An operation may succeed while the power fails under it (a fill
        // of the cache that failed after the data was read).
        if lost || rig.out() {
            drop(dev);
            dev = open_after_cut(rig, shape, mode, &mut seed, &mut model)?;
        }
    }
    rig.arm(-1);
    prop_assert_eq!(&read(&dev, 0, shape.size as usize), &model.visible);
    // Detach leaves all of it on the backing.
    dev.detach(&mut |_| {}).unwrap();
    dev.flush().unwrap();
    prop_assert_eq!(
        &read(&*rig.backing(), 0, shape.size as usize),
        &model.visible
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("CACHE_MODEL_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(96)
    ))]

    #[test]
    fn the_cache_answers_as_the_model_does(ops in prop::collection::vec(op(SIZE), 1..60)) {
        run(&Rig::new(CACHE, SIZE), SMALL_LINES, ops, 0)?;
    }

    #[test]
    fn and_so_it_does_when_power_cuts_keep_some_unflushed_writes_torn(
        ops in prop::collection::vec(op(SIZE), 1..60),
        seed in any::<u64>(),
    ) {
        run(&TornRig::new(SMALL_LINES), SMALL_LINES, ops, seed)?;
    }

    #[test]
    fn and_with_lines_of_thirty_two_sub_blocks(
        ops in prop::collection::vec(op(LARGE_LINES.size), 1..60),
        seed in any::<u64>(),
    ) {
        run(&TornRig::new(LARGE_LINES), LARGE_LINES, ops, seed)?;
    }
}
