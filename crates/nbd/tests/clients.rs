//! Real NBD clients (qemu-img, qemu-io, nbdinfo, nbdcopy, fio) against an
//! in-process server.

mod common;

use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use block::{BlockDevice, FileDevice, FileOptions, MemDevice};
use common::{export, random_bytes, run, Running};

const MIB: u64 = 1 << 20;

#[test]
fn qemu_img_convert_to_and_from_nbd_is_byte_identical() {
    let size = 256 * MIB;
    let dev = Arc::new(MemDevice::new(size));
    let srv = Running::start(vec![("vm", export(dev.clone()))]);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.img");
    let back = dir.path().join("back.img");
    let data = random_bytes(size as usize, 1);
    std::fs::write(&src, &data).unwrap();
    let uri = srv.uri("vm");
    run(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            src.to_str().unwrap(),
            &uri,
        ],
    );
    // What arrived on the device is the image.
    let mut on_device = vec![0; size as usize];
    dev.read_at(&mut on_device, 0).unwrap();
    assert!(
        on_device == data,
        "the device differs from the image written to it"
    );
    run(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &uri,
            back.to_str().unwrap(),
        ],
    );
    assert!(
        std::fs::read(&back).unwrap() == data,
        "the image read back differs"
    );
    let stats = srv.server.stats().exports;
    assert_eq!(stats[0].write_bytes, size);
    assert!(stats[0].read_bytes >= size);
}

/// A sparse file of 64 MiB with data at two known places, served as a
/// file device: (device, data ranges).
fn sparse_file(dir: &std::path::Path) -> (Arc<FileDevice>, Vec<(u64, u64)>) {
    let path = dir.join("sparse.img");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(64 * MIB).unwrap();
    drop(f);
    let dev = FileDevice::open(&path, FileOptions::default()).unwrap();
    let ranges = vec![(4 * MIB, MIB), (20 * MIB, 64 * 1024)];
    for (i, (off, len)) in ranges.iter().enumerate() {
        dev.write_at(&random_bytes(*len as usize, i as u64 + 10), *off, false)
            .unwrap();
    }
    dev.flush().unwrap();
    (Arc::new(dev), ranges)
}

/// Expected (offset, length, allocated) runs of a 64 MiB device.
fn expected_runs(data: &[(u64, u64)]) -> Vec<(u64, u64, bool)> {
    let mut runs = Vec::new();
    let mut at = 0;
    for (off, len) in data {
        if *off > at {
            runs.push((at, off - at, false));
        }
        runs.push((*off, *len, true));
        at = off + len;
    }
    if at < 64 * MIB {
        runs.push((at, 64 * MIB - at, false));
    }
    runs
}

#[test]
fn nbdinfo_and_qemu_img_map_show_exactly_the_allocated_extents() {
    let dir = tempfile::tempdir().unwrap();
    let (dev, data) = sparse_file(dir.path());
    let srv = Running::start(vec![("thin", export(dev))]);
    let uri = srv.uri("thin");
    let want = expected_runs(&data);

    let (got, text) = client_tools::nbdinfo_map(&uri);
    assert_eq!(got, want, "nbdinfo --map:\n{text}");
    assert!(text.contains("hole,zero"), "{text}");
    let (got, text) = client_tools::qemu_img_map(&uri);
    assert_eq!(got, want, "qemu-img map:\n{text}");
}

#[test]
fn nbdcopy_of_a_sparse_export_copies_data_and_skips_holes() {
    let dir = tempfile::tempdir().unwrap();
    let (dev, data) = sparse_file(dir.path());
    let srv = Running::start(vec![("thin", export(dev.clone()))]);
    let out = dir.path().join("copy.img");
    std::fs::File::create(&out)
        .unwrap()
        .set_len(64 * MIB)
        .unwrap();
    run("nbdcopy", &[&srv.uri("thin"), out.to_str().unwrap()]);
    let copy = std::fs::read(&out).unwrap();
    let mut original = vec![0; 64 * MIB as usize];
    dev.read_at(&mut original, 0).unwrap();
    assert!(copy == original, "the copy differs from the export");
    // Only the data was written: the copy stays as sparse as the source.
    let allocated = std::fs::metadata(&out).unwrap().blocks() * 512;
    let data_bytes: u64 = data.iter().map(|(_, l)| l).sum();
    assert!(
        allocated <= data_bytes + MIB,
        "the copy allocates {allocated} bytes for {data_bytes} bytes of data"
    );
    let stats = &srv.server.stats().exports[0];
    assert!(stats.block_status > 0);
    // CAN_MULTI_CONN is advertised: nbdcopy reads over several connections.
    assert!(stats.connections >= 2, "{stats:?}");
}

#[test]
fn qemu_io_with_requests_in_flight_on_two_connections() {
    let dev = Arc::new(MemDevice::new(64 * MIB));
    let srv = Running::start(vec![("vm", export(dev.clone()))]);
    client_tools::qemu_io_two_connections(&srv.uri("vm"));
    let mut b = vec![0; MIB as usize];
    dev.read_at(&mut b, 33 * MIB).unwrap();
    assert!(b.iter().all(|&x| x == 0x21));
}

#[test]
fn fio_nbd_engine_verified_random_writes() {
    let dev = Arc::new(MemDevice::new(64 * MIB));
    let srv = Running::start(vec![("vm", export(dev))]);
    let uri = srv.uri("vm");
    assert_eq!(
        client_tools::fio_verified_writes(&uri, "32M", 32),
        32 * 1024
    );
    assert_eq!(srv.server.stats().exports[0].errors, 0);
}
