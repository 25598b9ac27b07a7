use std::sync::Arc;
use std::time::Duration;

use block::{BlockDevice, Capabilities, ErrorClass, MemDevice};
use export::Backing;

use super::*;
use crate::capsule::{Fuse, SqeBuilder, SGL_TRANSPORT};

const BS: usize = 512;

fn ns_over(device: Arc<dyn BlockDevice>) -> Namespace {
    Namespace {
        backing: Backing::new(device, true),
        block_size: BS as u32,
        ids: export::NamespaceIds::from_naa([0; 16]),
    }
}

fn mem_ns() -> Namespace {
    ns_over(Arc::new(MemDevice::new(1 << 20)))
}

fn rw(op: u8, slba: u64, blocks: u32, extra: u32) -> Sqe {
    SqeBuilder::new(op, 1)
        .nsid(1)
        .cdw(10, slba as u32)
        .cdw(11, (slba >> 32) as u32)
        .cdw(12, (blocks - 1) | extra)
        .sgl(SGL_TRANSPORT, 0, blocks * BS as u32)
        .build()
}

fn read_back(ns: &Namespace, slba: u64, blocks: u32) -> Vec<u8> {
    let d = run(ns, &rw(OP_READ, slba, blocks, 0), &[], &Counters::default());
    assert_eq!(d.status, Status::SUCCESS);
    d.data
}

#[test]
fn write_read_compare_and_zero() {
    let ns = mem_ns();
    let c = Counters::default();
    let data: Vec<u8> = (0..4 * BS).map(|i| i as u8).collect();
    assert_eq!(
        run(&ns, &rw(OP_WRITE, 8, 4, 0), &data, &c).status,
        Status::SUCCESS
    );
    assert_eq!(read_back(&ns, 8, 4), data);
    assert_eq!(
        run(&ns, &rw(OP_COMPARE, 8, 4, 0), &data, &c).status,
        Status::SUCCESS
    );
    let mut other = data.clone();
    other[100] ^= 1;
    let d = run(&ns, &rw(OP_COMPARE, 8, 4, 0), &other, &c);
    assert_eq!((d.status, d.lba), (Status::COMPARE_FAILURE, 8));
    assert_eq!(
        run(&ns, &rw(OP_WRITE_ZEROES, 9, 1, DEALLOCATE), &[], &c).status,
        Status::SUCCESS
    );
    let back = read_back(&ns, 8, 4);
    assert_eq!(&back[BS..2 * BS], &[0; BS][..]);
    assert_eq!(&back[..BS], &data[..BS]);
    assert_eq!(c.writes.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[test]
fn deallocated_ranges_read_back_as_zeros() {
    let ns = mem_ns();
    let c = Counters::default();
    run(&ns, &rw(OP_WRITE, 0, 8, 0), &[7; 8 * BS], &c);
    let mut ranges = vec![0u8; 32];
    crate::wire::put32(&mut ranges, 4, 2);
    crate::wire::put64(&mut ranges, 8, 1);
    crate::wire::put32(&mut ranges, 20, 1);
    crate::wire::put64(&mut ranges, 24, 6);
    let dsm = SqeBuilder::new(OP_DSM, 1)
        .nsid(1)
        .cdw(10, 1)
        .cdw(11, DSM_DEALLOCATE)
        .sgl(SGL_TRANSPORT, 0, 32)
        .build();
    assert_eq!(
        transfer(Some(&ns), &dsm, 1 << 20),
        Ok(Transfer::ToTarget(32))
    );
    assert_eq!(run(&ns, &dsm, &ranges, &c).status, Status::SUCCESS);
    let back = read_back(&ns, 0, 8);
    for (block, want) in [(0, 7), (1, 0), (2, 0), (3, 7), (6, 0), (7, 7)] {
        assert!(
            back[block * BS..(block + 1) * BS]
                .iter()
                .all(|b| *b == want),
            "block {block}"
        );
    }
    // A range past the end fails the command.
    crate::wire::put64(&mut ranges, 24, 4096);
    assert_eq!(run(&ns, &dsm, &ranges, &c).status, Status::LBA_OUT_OF_RANGE);
}

#[test]
fn commands_are_checked_before_any_data_moves() {
    let ns = mem_ns();
    let blocks = ns.blocks();
    assert_eq!(
        transfer(Some(&ns), &rw(OP_READ, blocks - 1, 2, 0), 1 << 20),
        Err(Status::LBA_OUT_OF_RANGE)
    );
    assert_eq!(
        transfer(Some(&ns), &rw(OP_READ, u64::MAX, 2, 0), 1 << 20),
        Err(Status::LBA_OUT_OF_RANGE)
    );
    assert_eq!(
        transfer(None, &rw(OP_READ, 0, 1, 0), 1 << 20),
        Err(Status::INVALID_NAMESPACE)
    );
    assert_eq!(
        transfer(Some(&ns), &rw(OP_READ, 0, 16, 0), 4096),
        Err(Status::INVALID_FIELD)
    );
    let short = SqeBuilder(rw(OP_WRITE, 0, 2, 0).0)
        .sgl(SGL_TRANSPORT, 0, 512)
        .build();
    assert_eq!(
        transfer(Some(&ns), &short, 1 << 20),
        Err(Status::SGL_LENGTH_INVALID)
    );
    assert_eq!(
        transfer(Some(&ns), &rw(0x7E, 0, 1, 0), 1 << 20),
        Err(Status::INVALID_OPCODE)
    );
    assert_eq!(
        transfer(Some(&ns), &rw(OP_READ, 0, 2, 0), 1 << 20),
        Ok(Transfer::ToHost(1024))
    );
    assert_eq!(
        transfer(Some(&ns), &rw(OP_WRITE_ZEROES, 0, 2, 0), 1 << 20),
        Ok(Transfer::None)
    );
}

/// A device that fails every call with one class, or refuses writes as
/// read-only media.
struct Refusing {
    class: Option<ErrorClass>,
}

impl BlockDevice for Refusing {
    fn size(&self) -> u64 {
        1 << 20
    }
    fn read_at(&self, _: &mut [u8], _: u64) -> std::io::Result<()> {
        self.fail()
    }
    fn write_at(&self, _: &[u8], _: u64, _: bool) -> std::io::Result<()> {
        self.fail()
    }
    fn flush(&self) -> std::io::Result<()> {
        self.fail()
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            read_only: self.class.is_none(),
            ..Capabilities::default()
        }
    }
    fn describe(&self) -> String {
        "refusing".into()
    }
}

impl Refusing {
    fn fail(&self) -> std::io::Result<()> {
        let class = self.class.unwrap_or(ErrorClass::ReadOnly);
        Err(block::DeviceError::new(class, "refused").into())
    }
}

#[test]
fn device_errors_end_commands_with_their_class_status() {
    let c = Counters::default();
    let full = ns_over(Arc::new(Refusing {
        class: Some(ErrorClass::SpaceExhausted),
    }));
    assert_eq!(
        run(&full, &rw(OP_WRITE, 0, 1, 0), &[0; BS], &c).status,
        Status::CAPACITY_EXCEEDED
    );
    let bad = ns_over(Arc::new(Refusing {
        class: Some(ErrorClass::Medium),
    }));
    let d = run(&bad, &rw(OP_READ, 3, 1, 0), &[], &c);
    assert_eq!((d.status, d.lba), (Status::UNRECOVERED_READ, 3));
    assert_eq!(
        run(&bad, &rw(OP_WRITE, 0, 1, 0), &[0; BS], &c).status,
        Status::WRITE_FAULT
    );
    assert_eq!(c.media_errors.load(std::sync::atomic::Ordering::Relaxed), 2);
    // Read-only media refuse a write before its data is asked for.
    let ro = ns_over(Arc::new(Refusing { class: None }));
    assert_eq!(
        transfer(Some(&ro), &rw(OP_WRITE, 0, 1, 0), 1 << 20),
        Err(Status::WRITE_PROTECTED)
    );
    assert_eq!(
        transfer(Some(&ro), &rw(OP_READ, 0, 1, 0), 1 << 20),
        Ok(Transfer::ToHost(BS))
    );
}

#[test]
fn a_write_obeys_fua_and_the_shared_write_cache() {
    let faulty = Arc::new(block::FaultyDevice::new(Arc::new(MemDevice::new(1 << 20))));
    let ns = ns_over(faulty.clone());
    let c = Counters::default();
    run(&ns, &rw(OP_WRITE, 0, 1, 0), &[5; BS], &c);
    faulty.drop_unflushed();
    assert_eq!(read_back(&ns, 0, 1), vec![0; BS], "cached and lost");
    run(&ns, &rw(OP_WRITE, 0, 1, FUA), &[6; BS], &c);
    faulty.drop_unflushed();
    assert_eq!(read_back(&ns, 0, 1), vec![6; BS], "FUA: stable");
    ns.backing.set_write_cache(false);
    run(&ns, &rw(OP_WRITE, 0, 1, 0), &[7; BS], &c);
    faulty.drop_unflushed();
    assert_eq!(read_back(&ns, 0, 1), vec![7; BS], "cache off: stable");
}

fn fused(op: u8, fuse: Fuse, slba: u64) -> Sqe {
    SqeBuilder(rw(op, slba, 2, 0).0).fuse(fuse).build()
}

#[test]
fn compare_and_write_writes_only_on_a_match() {
    let ns = mem_ns();
    let c = Counters::default();
    let old = vec![1u8; 2 * BS];
    let new = vec![2u8; 2 * BS];
    run(&ns, &rw(OP_WRITE, 4, 2, 0), &old, &c);
    let (cmp, wr) = (
        fused(OP_COMPARE, Fuse::First, 4),
        fused(OP_WRITE, Fuse::Second, 4),
    );
    assert_eq!(
        compare_and_write(&ns, (&cmp, &new), (&wr, &new), &c),
        (Status::COMPARE_FAILURE, Status::FUSED_FAILED)
    );
    assert_eq!(read_back(&ns, 4, 2), old);
    assert_eq!(
        compare_and_write(&ns, (&cmp, &old), (&wr, &new), &c),
        (Status::SUCCESS, Status::SUCCESS)
    );
    assert_eq!(read_back(&ns, 4, 2), new);
    let elsewhere = fused(OP_WRITE, Fuse::Second, 6);
    assert_eq!(
        compare_and_write(&ns, (&cmp, &new), (&elsewhere, &new), &c),
        (Status::INVALID_FIELD, Status::INVALID_FIELD)
    );
}

#[test]
fn compare_and_write_excludes_a_write_through_the_same_backing() {
    let slow = Arc::new(block::FaultyDevice::new(Arc::new(MemDevice::new(1 << 20))));
    let ns = Arc::new(ns_over(slow.clone()));
    let c = Counters::default();
    run(&ns, &rw(OP_WRITE, 0, 2, 0), &[1; 2 * BS], &c);
    // A write of another transport holds the range: the fused pair waits.
    let held = ns.backing.locks.lock(0, BS as u64, false);
    let t = {
        let ns = ns.clone();
        std::thread::spawn(move || {
            let (cmp, wr) = (
                fused(OP_COMPARE, Fuse::First, 0),
                fused(OP_WRITE, Fuse::Second, 0),
            );
            compare_and_write(
                &ns,
                (&cmp, &[1; 2 * BS]),
                (&wr, &[3; 2 * BS]),
                &Counters::default(),
            )
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !t.is_finished(),
        "compare and write waits for the overlapping holder"
    );
    drop(held);
    assert_eq!(t.join().unwrap(), (Status::SUCCESS, Status::SUCCESS));
    // While the pair holds the range, a plain write of it waits.
    slow.set_delay(Some(Duration::from_millis(200)));
    let t = {
        let ns = ns.clone();
        std::thread::spawn(move || {
            let (cmp, wr) = (
                fused(OP_COMPARE, Fuse::First, 0),
                fused(OP_WRITE, Fuse::Second, 0),
            );
            compare_and_write(
                &ns,
                (&cmp, &[3; 2 * BS]),
                (&wr, &[4; 2 * BS]),
                &Counters::default(),
            )
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    slow.set_delay(None);
    let w = run(&ns, &rw(OP_WRITE, 1, 1, 0), &[9; BS], &c);
    assert_eq!(w.status, Status::SUCCESS);
    assert_eq!(t.join().unwrap(), (Status::SUCCESS, Status::SUCCESS));
    // The plain write came after the pair's: its bytes are the last.
    let back = read_back(&ns, 0, 2);
    assert_eq!(&back[..BS], &[4; BS][..]);
    assert_eq!(&back[BS..], &[9; BS][..]);
}
