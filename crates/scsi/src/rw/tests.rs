use super::*;
use crate::lu::test_support::*;
use crate::sense::key;

/// A RAM disk that says it reads in batches and ends each batch's
/// reads last to first, as a device may.
struct Reversing;

impl block::Wrapper for Reversing {
    fn reads_in_batches(&self, _: &dyn block::BlockDevice) -> bool {
        true
    }
    fn read_batch(
        &self,
        child: &dyn block::BlockDevice,
        reads: &mut [BatchRead],
        done: &mut dyn FnMut(usize, &mut BatchRead),
    ) {
        for (i, r) in reads.iter_mut().enumerate().rev() {
            r.result = child.read_at(&mut r.buf, r.offset);
            done(i, r);
        }
    }
    fn describe(&self, _: &dyn block::BlockDevice) -> String {
        "reversing".into()
    }
}

#[test]
fn writes_in_parts_write_whole_blocks_as_one_piece_would() {
    let lu = lu();
    let n = nexus("a");
    ready(&lu, &n);
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 % 253) as u8).collect();
    let registry = crate::registry::LuRegistry::new();
    registry.add(lu.clone());
    let mut cdb = rw10(op::WRITE_10, 0, 10, 8);
    cdb.resize(16, 0);
    // 3000 bytes for 8 blocks: the five whole blocks are written, the
    // part of the sixth is not.
    let parts: [&[u8]; 3] = [&data[..700], &data[700..2600], &data[2600..]];
    let cmd = scsi_api::ScsiCommand {
        lun: 0,
        cdb: &cdb,
        data_out: &[],
        data_out_parts: &parts,
        data_in_len: 0,
        data_out_len: 4096,
        task_attr: scsi_api::TaskAttr::Simple,
        tag: 1,
        zero_copy: false,
    };
    let r = lu.execute(&Ctx {
        nexus: &n,
        cmd: &cmd,
        registry: &registry,
        read_only: false,
        protected: &[],
    });
    assert_eq!(r.status, 0);
    let back = run(&lu, &n, &rw10(op::READ_10, 0, 10, 6), &[]);
    assert_eq!(back.data_in[..2560], data[..2560]);
    assert!(
        back.data_in[2560..].iter().all(|&b| b == 0),
        "no partial block"
    );
}

#[test]
fn reads_of_a_memory_file_are_its_pages_or_regions_of_it() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = dir.path().join("lun.img");
    let opts = block::FileOptions {
        create_size: Some(1 << 20),
        ..Default::default()
    };
    let device = block::FileDevice::open(&path, opts).unwrap();
    assert!(
        block::BlockDevice::memory_file(&device).is_some(),
        "/dev/shm is tmpfs"
    );
    // Mapped now, so that the writes below mark their pages.
    assert!(block::BlockDevice::memory_map(&device).is_some());
    let lu = LogicalUnit::new(
        std::sync::Arc::new(device),
        crate::config::LuConfig::default(),
    )
    .unwrap();
    let n = nexus("a");
    ready(&lu, &n);
    let data: Vec<u8> = (0..64u32 << 10).map(|i| (i * 7 % 253) as u8).collect();
    assert_eq!(
        run(&lu, &n, &rw10(op::WRITE_10, 0, 3, 128), &data).status,
        0
    );

    let long = run_zero_copy(&lu, &n, &rw10(op::READ_10, 0, 3, 128));
    assert_eq!(long.status, 0);
    assert!(long.data_in.is_empty() && long.data_in_file.is_none());
    let pages = long.data_in_held.as_ref().expect("pages of the file");
    assert!(pages.file_pages);
    assert_eq!(pages.as_ref(), &data[..]);

    let short = run_zero_copy(&lu, &n, &rw10(op::READ_10, 0, 3, 8));
    assert!(short.data_in_file.is_none(), "short reads are mapped pages");
    let pages = short.data_in_held.as_ref().expect("pages of the file");
    assert!(pages.file_pages);
    assert_eq!(pages.as_ref(), &data[..4096]);
    let blocks = || std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&path).unwrap());
    let before = blocks();
    let hole = run_zero_copy(&lu, &n, &rw10(op::READ_10, 0, 1000, 8));
    assert!(hole.data_in_held.is_none(), "holes are read, not mapped");
    assert_eq!(hole.data_in, vec![0; 4096]);
    // A long READ of pages not known to exist: a region of the file.
    let gap = run_zero_copy(&lu, &n, &rw10(op::READ_10, 0, 1000, 128));
    let region = gap.data_in_file.expect("a region of the file");
    assert_eq!((region.offset, region.len), (1000 * 512, 64 << 10));
    assert_eq!(region.read().unwrap(), vec![0; 64 << 10]);
    assert_eq!(blocks(), before, "reading a hole allocates nothing");
    let copied = run(&lu, &n, &rw10(op::READ_10, 0, 3, 8), &[]);
    assert!(
        copied.data_in_held.is_none(),
        "only where the transport can"
    );
    let unasked = run(&lu, &n, &rw10(op::READ_10, 0, 3, 128), &[]);
    assert!(
        unasked.data_in_file.is_none(),
        "only where the transport can"
    );
    assert_eq!(unasked.data_in, data);
    let beyond = run_zero_copy(&lu, &n, &rw10(op::READ_10, 0, 2000, 128));
    assert!(beyond.data_in_file.is_none());
    assert_eq!(sense_of(&beyond).0, key::ILLEGAL_REQUEST);
}

#[test]
fn batched_reads_answer_as_single_commands_do() {
    let config = || crate::config::LuConfig {
        naa: crate::config::naa_from_seed("batch"),
        ..Default::default()
    };
    let alone = lu_with(1 << 20, config());
    let batched = LogicalUnit::new(
        std::sync::Arc::new(block::Wrapped::over(
            std::sync::Arc::new(block::MemDevice::new(1 << 20)),
            Reversing,
        )),
        config(),
    )
    .unwrap();
    assert!(batched.reads_in_batches());
    let n = nexus("a");
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 13 % 251) as u8).collect();
    for lu in [&alone, &batched] {
        ready(lu, &n);
        assert_eq!(run(lu, &n, &rw10(op::WRITE_10, 0, 4, 16), &data).status, 0);
    }
    let mut read16 = vec![op::READ_16, 0];
    read16.extend_from_slice(&2000u64.to_be_bytes());
    read16.extend_from_slice(&[0, 0, 0, 100, 0, 0]);
    let cdbs: Vec<Vec<u8>> = vec![
        rw10(op::READ_10, 0, 4, 16),
        read16,                          // beyond the end
        vec![0; 6],                      // TEST UNIT READY
        rw10(op::READ_10, 0, 8, 0),      // no blocks
        vec![op::READ_6, 0, 0, 6, 2, 0], // 6-byte form
        rw10(op::READ_10, 0, 7, 1),
    ];
    let registry = crate::registry::LuRegistry::new();
    let padded: Vec<Vec<u8>> = cdbs
        .iter()
        .map(|c| {
            let mut c = c.clone();
            c.resize(16, 0);
            c
        })
        .collect();
    let cmds: Vec<scsi_api::ScsiCommand<'_>> = padded
        .iter()
        .map(|cdb| scsi_api::ScsiCommand {
            lun: 0,
            cdb,
            data_out: &[],
            data_in_len: 1 << 24,
            data_out_len: 0,
            task_attr: scsi_api::TaskAttr::Simple,
            tag: 1,
            zero_copy: false,
            data_out_parts: &[],
        })
        .collect();
    let ctxs: Vec<Ctx<'_>> = cmds
        .iter()
        .map(|cmd| Ctx {
            nexus: &n,
            cmd,
            registry: &registry,
            read_only: false,
            protected: &[],
        })
        .collect();
    let mut answers: Vec<Option<ScsiResponse>> = (0..cdbs.len()).map(|_| None).collect();
    batched.read_batch(&ctxs, &mut |i, r| {
        assert!(
            answers[i].replace(r).is_none(),
            "command {i} answered twice"
        );
    });
    for (i, cdb) in cdbs.iter().enumerate() {
        let want = run(&alone, &n, cdb, &[]);
        let got = answers[i].take().expect("every command is answered");
        assert_eq!(
            (got.status, &got.sense, &got.data_in),
            (want.status, &want.sense, &want.data_in),
            "command {i}: {cdb:02x?}"
        );
    }
}

fn rw16(opcode: u8, flags: u8, lba: u64, blocks: u32) -> Vec<u8> {
    let mut c = vec![opcode, flags];
    c.extend_from_slice(&lba.to_be_bytes());
    c.extend_from_slice(&blocks.to_be_bytes());
    c.extend_from_slice(&[0, 0]);
    c
}

#[test]
fn write_then_read_back() {
    let lu = lu();
    let a = nexus("a");
    ready(&lu, &a);
    let data = vec![0xA5u8; 1024];
    let r = run(&lu, &a, &rw10(op::WRITE_10, 0x08, 3, 2), &data);
    assert_eq!(r.status, status::GOOD);
    assert_eq!(r.data_out_wanted, Some(1024));
    let r = run(&lu, &a, &rw16(op::READ_16, 0, 3, 2), &[]);
    assert_eq!(r.data_in, data);
    let r = run(&lu, &a, &[op::READ_6, 0, 0, 3, 1, 0], &[]);
    assert_eq!(r.data_in, vec![0xA5u8; 512]);
}

#[test]
fn out_of_range_and_zero_length() {
    let lu = lu();
    let a = nexus("a");
    ready(&lu, &a);
    let blocks = lu.blocks();
    let oob = (key::ILLEGAL_REQUEST, 0x21, 0);
    assert_eq!(
        sense_of(&run(&lu, &a, &rw16(op::READ_16, 0, blocks - 1, 2), &[])),
        oob
    );
    assert_eq!(
        sense_of(&run(&lu, &a, &rw16(op::READ_16, 0, u64::MAX, 1), &[])),
        oob
    );
    assert_eq!(
        sense_of(&run(&lu, &a, &rw16(op::READ_16, 0, blocks + 1, 0), &[])),
        oob
    );
    assert_eq!(
        run(&lu, &a, &rw16(op::READ_16, 0, blocks, 0), &[]).status,
        status::GOOD
    );
    assert_eq!(
        run(&lu, &a, &rw16(op::READ_16, 0, blocks - 1, 1), &[]).status,
        status::GOOD
    );
    // LBA so large that the byte offset would overflow.
    assert_eq!(
        sense_of(&run(&lu, &a, &rw16(op::READ_16, 0, 1 << 55, 1), &[])),
        oob
    );
}

#[test]
fn protection_fields_are_rejected() {
    let lu = lu();
    let a = nexus("a");
    ready(&lu, &a);
    for p in 1..8u8 {
        let r = run(&lu, &a, &rw10(op::WRITE_10, p << 5, 0, 1), &[0; 512]);
        assert_eq!(sense_of(&r), (key::ILLEGAL_REQUEST, 0x24, 0));
    }
}

#[test]
fn short_data_writes_whole_blocks_only() {
    let lu = lu();
    let a = nexus("a");
    ready(&lu, &a);
    run(&lu, &a, &rw10(op::WRITE_10, 0, 0, 2), &[b'a'; 1024]);
    // Two blocks announced, one sent: only the first is written.
    let r = run(&lu, &a, &rw10(op::WRITE_10, 0, 0, 2), &[b'b'; 512]);
    assert_eq!(r.status, status::GOOD);
    assert_eq!(r.data_out_wanted, Some(1024));
    let back = run(&lu, &a, &rw10(op::READ_10, 0, 0, 2), &[]).data_in;
    assert!(back[..512].iter().all(|&b| b == b'b') && back[512..].iter().all(|&b| b == b'a'));
    // Part of a block is not written.
    let r = run(&lu, &a, &rw10(op::WRITE_10, 0, 0, 1), &[0; 200]);
    assert_eq!(r.status, status::GOOD);
    let back = run(&lu, &a, &rw10(op::READ_10, 0, 0, 1), &[]).data_in;
    assert!(back.iter().all(|&b| b == b'b'));
    // Nothing sent at all: nothing written, GOOD.
    assert_eq!(
        run(&lu, &a, &rw10(op::WRITE_10, 0, 0, 1), &[]).status,
        status::GOOD
    );
}

#[test]
fn verify_compares_and_reports_offset() {
    let lu = lu();
    let a = nexus("a");
    ready(&lu, &a);
    run(&lu, &a, &rw10(op::WRITE_10, 0, 8, 2), &[7; 1024]);
    assert_eq!(
        run(&lu, &a, &rw10(op::VERIFY_10, 0x02, 8, 2), &[7; 1024]).status,
        status::GOOD
    );
    let mut bad = vec![7u8; 1024];
    bad[700] = 0;
    let r = run(&lu, &a, &rw10(op::VERIFY_10, 0x02, 8, 2), &bad);
    assert_eq!(sense_of(&r), (key::MISCOMPARE, 0x1D, 0));
    assert_eq!(&r.sense[3..7], &700u32.to_be_bytes());
    // BYTCHK 0: medium verification only.
    assert_eq!(
        run(&lu, &a, &rw10(op::VERIFY_10, 0, 8, 2), &[]).status,
        status::GOOD
    );
    // BYTCHK 11b: one block against every block.
    assert_eq!(
        run(&lu, &a, &rw10(op::VERIFY_10, 0x06, 8, 2), &[7; 512]).status,
        status::GOOD
    );
    assert_eq!(
        sense_of(&run(&lu, &a, &rw10(op::VERIFY_10, 0x04, 8, 2), &[])).2,
        0
    );
}

#[test]
fn compare_and_write() {
    let lu = lu();
    let a = nexus("a");
    ready(&lu, &a);
    let mut caw = rw16(op::COMPARE_AND_WRITE, 0, 5, 0);
    caw[13] = 1;
    caw[10..13].fill(0);
    let mut data = vec![0u8; 512];
    data.extend_from_slice(&[9u8; 512]);
    assert_eq!(run(&lu, &a, &caw, &data).status, status::GOOD);
    // Now the block holds 9s: comparing against zeros fails at byte 0.
    let r = run(&lu, &a, &caw, &data);
    assert_eq!(sense_of(&r), (key::MISCOMPARE, 0x1D, 0));
    assert_eq!(&r.sense[3..7], &[0, 0, 0, 0]);
    assert_eq!(
        run(&lu, &a, &rw10(op::READ_10, 0, 5, 1), &[]).data_in,
        vec![9u8; 512]
    );
    // Data-Out of the wrong size is refused.
    let r = run(&lu, &a, &caw, &data[..512]);
    assert_eq!(sense_of(&r).0, key::ILLEGAL_REQUEST);
    caw[13] = 0;
    let r = run(&lu, &a, &caw, &data);
    assert_eq!(sense_of(&r), (key::ILLEGAL_REQUEST, 0x24, 0));
}

#[test]
fn compare_and_write_is_atomic_across_nexuses() {
    // Two initiators increment a counter in block 9 with
    // read / COMPARE AND WRITE retry loops; no increment may be lost.
    let lu = lu();
    let rounds = 200u32;
    let workers: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|name| {
            let lu = lu.clone();
            std::thread::spawn(move || {
                let n = nexus(name);
                ready(&lu, &n);
                let mut caw = rw16(op::COMPARE_AND_WRITE, 0, 9, 0);
                caw[10..13].fill(0);
                caw[13] = 1;
                let mut done = 0;
                while done < rounds {
                    let cur = run(&lu, &n, &rw10(op::READ_10, 0, 9, 1), &[]).data_in;
                    let value = u32::from_be_bytes([cur[0], cur[1], cur[2], cur[3]]);
                    let mut data = cur.clone();
                    data.extend_from_slice(&cur);
                    data[512..516].copy_from_slice(&(value + 1).to_be_bytes());
                    if run(&lu, &n, &caw, &data).status == status::GOOD {
                        done += 1;
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let a = nexus("a");
    let cur = run(&lu, &a, &rw10(op::READ_10, 0, 9, 1), &[]).data_in;
    assert_eq!(
        u32::from_be_bytes([cur[0], cur[1], cur[2], cur[3]]),
        2 * rounds
    );
}

#[test]
fn orwrite_ors_into_the_medium() {
    let lu = lu();
    let a = nexus("a");
    ready(&lu, &a);
    run(&lu, &a, &rw10(op::WRITE_10, 0, 0, 1), &[0x0F; 512]);
    assert_eq!(
        run(&lu, &a, &rw16(op::ORWRITE_16, 0, 0, 1), &[0xF0; 512]).status,
        status::GOOD
    );
    assert_eq!(
        run(&lu, &a, &rw10(op::READ_10, 0, 0, 1), &[]).data_in,
        vec![0xFF; 512]
    );
}

#[test]
fn prefetch_and_sync_check_range() {
    let lu = lu();
    let a = nexus("a");
    ready(&lu, &a);
    let r = run(&lu, &a, &rw10(op::PRE_FETCH_10, 0, 0, 8), &[]);
    assert_eq!(r.status, status::CONDITION_MET);
    assert_eq!(
        run(&lu, &a, &rw10(op::PRE_FETCH_10, 0x02, 0, 8), &[]).status,
        status::GOOD
    );
    let blocks = lu.blocks() as u32;
    assert_eq!(
        sense_of(&run(&lu, &a, &rw10(op::PRE_FETCH_10, 0, blocks, 1), &[])).1,
        0x21
    );
    assert_eq!(
        run(&lu, &a, &rw10(op::SYNCHRONIZE_CACHE_10, 0, 0, 0), &[]).status,
        status::GOOD
    );
    assert_eq!(
        sense_of(&run(
            &lu,
            &a,
            &rw10(op::SYNCHRONIZE_CACHE_10, 0, blocks, 2),
            &[]
        ))
        .1,
        0x21
    );
}
