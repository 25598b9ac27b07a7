//! Model-based test: random reads, writes (some FUA), flushes, mode
//! switches, detach/attach, write-back passes, clean restarts and power
//! cuts of both devices, on a cache a quarter the size of the backing,
//! against an in-memory model. Every read returns the model's data; after
//! a power cut every byte holds what was acknowledged before the last
//! flush (or with FUA), or one of the values written to it since.

mod common;

use block::BlockDevice;
use cache::{CacheDevice, FormatPolicy, Mode};
use common::{options, pattern, read, Rig};
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
}

fn range() -> impl Strategy<Value = (u64, u64)> {
    (0..SIZE).prop_flat_map(|o| (Just(o), 1..=(SIZE - o).min(3 * 4096)))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => range().prop_map(|(offset, len)| Op::Read { offset, len }),
        8 => (range(), any::<u64>(), prop::bool::weighted(0.15))
            .prop_map(|((offset, len), seed, fua)| Op::Write { offset, len, seed, fua }),
        2 => Just(Op::Flush),
        1 => prop::sample::select(Mode::ALL.to_vec()).prop_map(Op::SetMode),
        1 => Just(Op::Detach),
        1 => Just(Op::Attach),
        1 => (1u64..40_000).prop_map(Op::WriteBack),
        2 => Just(Op::PowerCut),
        1 => Just(Op::CleanRestart),
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
    fn new() -> Model {
        Model {
            visible: vec![0; SIZE as usize],
            durable: vec![0; SIZE as usize],
            since: vec![Vec::new(); SIZE as usize],
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

fn open(rig: &Rig, mode: Mode) -> CacheDevice {
    let mut o = options(mode);
    o.format = FormatPolicy::Never;
    rig.open(o).expect("the cache reopens")
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let rig = Rig::new(CACHE, SIZE);
    let mut mode = Mode::WriteBack;
    let mut dev = rig.open(options(mode)).unwrap();
    prop_assert_eq!(dev.capacity_lines(), 8);
    let mut model = Model::new();
    for op in ops {
        match op {
            Op::Read { offset, len } => {
                let want = &model.visible[offset as usize..(offset + len) as usize];
                prop_assert_eq!(&read(&dev, offset, len as usize)[..], want);
            }
            Op::Write {
                offset,
                len,
                seed,
                fua,
            } => {
                let data = pattern(seed, len as usize);
                dev.write_at(&data, offset, fua).unwrap();
                model.write(offset, &data, fua);
            }
            Op::Flush => {
                dev.flush().unwrap();
                model.all_durable();
            }
            Op::SetMode(m) => {
                dev.set_mode(m, &mut |_| {}).unwrap();
                prop_assert_eq!(dev.status().dirty_bytes == 0 || m == Mode::WriteBack, true);
                mode = m;
            }
            Op::Detach => {
                dev.detach(&mut |_| {}).unwrap();
                prop_assert_eq!(dev.status().dirty_bytes, 0);
            }
            Op::Attach => dev.attach().unwrap(),
            Op::WriteBack(budget) => {
                dev.write_back(budget).unwrap();
            }
            Op::PowerCut => {
                drop(dev);
                rig.power_cut();
                dev = open(&rig, mode);
                let found = read(&dev, 0, SIZE as usize);
                model.after_power_cut(&found)?;
            }
            Op::CleanRestart => {
                dev.close().unwrap();
                model.all_durable();
                rig.power_cut();
                dev = open(&rig, mode);
            }
        }
    }
    prop_assert_eq!(&read(&dev, 0, SIZE as usize), &model.visible);
    // Detach leaves all of it on the backing.
    dev.detach(&mut |_| {}).unwrap();
    dev.flush().unwrap();
    prop_assert_eq!(&read(&*rig.backing, 0, SIZE as usize), &model.visible);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("CACHE_MODEL_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(96)
    ))]

    #[test]
    fn the_cache_answers_as_the_model_does(ops in prop::collection::vec(op(), 1..60)) {
        run(ops)?;
    }
}
