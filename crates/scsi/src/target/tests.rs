use super::*;
use crate::config::{naa_from_seed, LuConfig};
use crate::lu::test_support::{lu_with, nexus, sense_of};
use scsi_api::{status, TaskAttr};

fn target() -> Arc<Target> {
    let mut luns = BTreeMap::new();
    luns.insert(
        0,
        lu_with(
            1 << 20,
            LuConfig {
                naa: naa_from_seed("0"),
                ..LuConfig::default()
            },
        ),
    );
    luns.insert(
        201,
        lu_with(
            1 << 20,
            LuConfig {
                naa: naa_from_seed("201"),
                ..LuConfig::default()
            },
        ),
    );
    luns.insert(
        300,
        lu_with(
            1 << 20,
            LuConfig {
                naa: naa_from_seed("300"),
                ..LuConfig::default()
            },
        ),
    );
    Target::new("iqn.2026-11.org.openarray:t", luns, LuRegistry::new())
}

fn exec(t: &Target, n: &Nexus, lun: u64, cdb: &[u8], data: &[u8]) -> ScsiResponse {
    let mut full = cdb.to_vec();
    full.resize(16, 0);
    let cmd = ScsiCommand {
        lun,
        cdb: &full,
        data_out: data,
        data_in_len: 4096,
        data_out_len: data.len() as u32,
        task_attr: TaskAttr::Simple,
        tag: 7,
        zero_copy: false,
        data_out_parts: &[],
    };
    t.execute(n, &cmd)
}

/// PERSISTENT RESERVE OUT with a basic parameter list.
fn prout(t: &Target, n: &Nexus, lun: u64, action: u8, kind: u8, key: u64, sark: u64) {
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sark.to_be_bytes());
    for _ in 0..3 {
        // Past the power-on unit attention.
        if exec(t, n, lun, &[0x5F, action, kind, 0, 0, 0, 0, 0, 24, 0], &p).status == status::GOOD {
            return;
        }
    }
    panic!("PERSISTENT RESERVE OUT {action:#x} failed");
}

#[test]
fn nexus_luns_show_each_nexus_its_own_reservations() {
    let t = target();
    let (a, b) = (nexus("a"), nexus("b"));
    t.nexus_added(&a);
    t.nexus_added(&b);
    // a registers on LUN 201 and holds a write-exclusive reservation;
    // b registers there and on 300; b holds RESERVE(6) on LUN 0.
    prout(&t, &a, 201, 0, 0, 0, 0xaa);
    prout(&t, &a, 201, 1, 1, 0xaa, 0);
    prout(&t, &b, 201, 0, 0, 0, 0xbb);
    prout(&t, &b, 300, 0, 0, 0, 0xbc);
    for _ in 0..3 {
        exec(&t, &b, 0, &[0x16, 0, 0, 0, 0, 0], &[]);
    }
    let view = |n: &Nexus| -> Vec<(u64, Option<u64>, Option<u8>, bool)> {
        t.nexus_luns(n)
            .iter()
            .map(|l| (l.lun, l.registered_key, l.reservation_type, l.reserved))
            .collect()
    };
    assert_eq!(
        view(&a),
        vec![
            (0, None, None, false),
            (201, Some(0xaa), Some(1), false),
            (300, None, None, false)
        ]
    );
    assert_eq!(
        view(&b),
        vec![
            (0, None, None, true),
            (201, Some(0xbb), None, false),
            (300, Some(0xbc), None, false)
        ]
    );
}

#[test]
fn only_plain_writes_take_data_out_in_parts() {
    let t = target();
    for opcode in [op::WRITE_6, op::WRITE_10, op::WRITE_12, op::WRITE_16] {
        assert!(t.takes_data_out_in_parts(&[opcode, 0, 0, 0, 0, 0]));
    }
    for opcode in [
        op::COMPARE_AND_WRITE,
        op::WRITE_SAME_10,
        op::ORWRITE_16,
        op::READ_10,
    ] {
        assert!(!t.takes_data_out_in_parts(&[opcode, 0, 0, 0, 0, 0]));
    }
    assert!(!t.takes_data_out_in_parts(&[]));
}

#[test]
fn report_luns_encodes_high_luns_flat() {
    let t = target();
    let a = nexus("a");
    let r = exec(&t, &a, 0, &[0xA0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]);
    assert_eq!(r.status, status::GOOD);
    assert_eq!(be32(&r.data_in, 0), 24);
    assert_eq!(&r.data_in[8..10], &[0, 0]);
    assert_eq!(&r.data_in[16..18], &[0, 201]);
    assert_eq!(&r.data_in[24..26], &[0x41, 44]);
    // Well-known only: none. Invalid select: error. Unmapped LUN: works.
    let r = exec(&t, &a, 5, &[0xA0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]);
    assert_eq!(r.data_in, vec![0; 8]);
    let r = exec(&t, &a, 0, &[0xA0, 0, 3, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]);
    assert_eq!(sense_of(&r).1, 0x24);
}

#[test]
fn unmapped_luns() {
    let t = target();
    let a = nexus("a");
    let r = exec(&t, &a, 7, &[0x12, 0, 0, 0, 96, 0], &[]);
    assert_eq!(r.data_in[0], 0x7F);
    assert_eq!(sense_of(&exec(&t, &a, 7, &[0; 6], &[])), (5, 0x25, 0));
    let r = exec(&t, &a, 7, &[0x03, 0, 0, 0, 18, 0], &[]);
    assert_eq!((r.status, r.data_in[12]), (status::GOOD, 0x25));
    assert!(!t.lun_exists(&a, 7));
    assert!(t.lun_exists(&a, 201));
}

#[test]
fn nexus_events_and_resets() {
    let t = target();
    let a = nexus("a");
    t.nexus_added(&a);
    assert_eq!(sense_of(&exec(&t, &a, 201, &[0; 6], &[])), (6, 0x29, 0));
    assert_eq!(exec(&t, &a, 201, &[0; 6], &[]).status, status::GOOD);
    assert_eq!(
        t.task_management(&a, TaskManagement::LogicalUnitReset { lun: 201 }),
        TmfResult::Complete
    );
    assert_eq!(sense_of(&exec(&t, &a, 201, &[0; 6], &[])), (6, 0x29, 0));
    assert_eq!(
        t.task_management(&a, TaskManagement::LogicalUnitReset { lun: 9 }),
        TmfResult::LunDoesNotExist
    );
    // RESERVE(6) goes away with the nexus.
    let b = nexus("b");
    exec(&t, &a, 0, &[0; 6], &[]);
    exec(&t, &b, 0, &[0; 6], &[]);
    assert_eq!(
        exec(&t, &a, 0, &[0x16, 0, 0, 0, 0, 0], &[]).status,
        status::GOOD
    );
    assert_eq!(
        exec(&t, &b, 0, &[0x16, 0, 0, 0, 0, 0], &[]).status,
        status::RESERVATION_CONFLICT
    );
    t.nexus_lost(&a);
    assert_eq!(
        exec(&t, &b, 0, &[0x16, 0, 0, 0, 0, 0], &[]).status,
        status::GOOD
    );
}

#[test]
fn aborting_a_waiting_sanitize_releases_it_and_the_operation_goes_on() {
    let mut luns = BTreeMap::new();
    luns.insert(0, lu_with(64 << 20, LuConfig::default()));
    let t = Target::new("iqn.2026-11.org.openarray:s", luns, LuRegistry::new());
    let a = nexus("a");
    t.nexus_added(&a);
    exec(&t, &a, 0, &[0; 6], &[]);
    let worker = {
        let t = t.clone();
        std::thread::spawn(move || {
            let mut p = vec![0x01, 0, 0x02, 0];
            p.extend_from_slice(&[0; 512]);
            exec(
                &t,
                &nexus("a"),
                0,
                &[0x48, 0x01, 0, 0, 0, 0, 0, 0x02, 0x04, 0],
                &p,
            )
            .status
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    // Another tag: nothing happens. The sanitize's own tag (7): released.
    t.task_management(&a, TaskManagement::AbortTask { lun: 0, tag: 8 });
    assert!(!worker.is_finished());
    t.task_management(&a, TaskManagement::AbortTask { lun: 0, tag: 7 });
    assert_eq!(worker.join().unwrap(), status::TASK_ABORTED);
    assert_eq!(sense_of(&exec(&t, &a, 0, &[0; 6], &[])), (2, 0x04, 0x1B));
}

#[test]
fn read_only_mapping_shares_the_lu_and_refuses_writes() {
    let lu = lu_with(
        1 << 20,
        LuConfig {
            naa: naa_from_seed("shared"),
            ..LuConfig::default()
        },
    );
    let registry = LuRegistry::new();
    let mut rw = BTreeMap::new();
    rw.insert(0, Mapping::read_write(lu.clone()));
    let mut ro = BTreeMap::new();
    ro.insert(
        3,
        Mapping {
            lu: lu.clone(),
            read_only: true,
        },
    );
    let writer = Target::with_mappings("iqn.2026-11.org.openarray:rw", rw, registry.clone());
    let reader = Target::with_mappings("iqn.2026-11.org.openarray:ro", ro, registry);
    let (a, b) = (nexus("a"), nexus("b"));
    exec(&writer, &a, 0, &[0; 6], &[]);
    exec(&reader, &b, 3, &[0; 6], &[]);
    let write = [0x2A, 0, 0, 0, 0, 1, 0, 0, 1, 0];
    assert_eq!(exec(&writer, &a, 0, &write, &[9; 512]).status, status::GOOD);
    assert_eq!(
        sense_of(&exec(&reader, &b, 3, &write, &[9; 512])),
        (7, 0x27, 0x00)
    );
    let read = exec(&reader, &b, 3, &[0x28, 0, 0, 0, 0, 1, 0, 0, 1, 0], &[]);
    assert_eq!(read.data_in, vec![9; 512]);
    let ms = exec(&reader, &b, 3, &[0x1A, 0, 0x3F, 0, 255, 0], &[]);
    assert_eq!(ms.data_in[2] & 0x80, 0x80);
    // One LU: a reservation taken through one view is seen in the other.
    let mut p = vec![0u8; 24];
    p[15] = 5;
    assert_eq!(
        exec(&writer, &a, 0, &[0x5F, 6, 0, 0, 0, 0, 0, 0, 24, 0], &p).status,
        status::GOOD
    );
    let keys = exec(&reader, &b, 3, &[0x5E, 0, 0, 0, 0, 0, 0, 0, 255, 0], &[]);
    assert_eq!(be32(&keys.data_in, 4), 8);
    // EXTENDED COPY through the read-only view cannot write the LU.
    let mut list = vec![0u8; 16];
    list[3] = 32;
    list[11] = 28;
    let mut t = vec![0u8; 32];
    t[0] = 0xE4;
    t[4] = 1;
    t[5] = 3;
    t[7] = 16;
    t[8..24].copy_from_slice(&lu.naa());
    t[30] = 0x02;
    list.extend_from_slice(&t);
    let mut seg = vec![0u8; 28];
    seg[0] = 2;
    seg[3] = 0x18;
    seg[11] = 1;
    seg[27] = 8;
    list.extend_from_slice(&seg);
    let mut cdb = [0u8; 16];
    cdb[0] = 0x83;
    cdb[13] = list.len() as u8;
    assert_eq!(
        sense_of(&exec(&reader, &b, 3, &cdb, &list)),
        (0x0A, 0x27, 0x00)
    );
    assert_eq!(exec(&writer, &a, 0, &cdb, &list).status, status::GOOD);
}

#[test]
fn changing_luns_tells_live_nexuses() {
    let t = target();
    let a = nexus("a");
    t.nexus_added(&a);
    exec(&t, &a, 0, &[0; 6], &[]);
    let mut luns = t.luns();
    luns.remove(&300);
    t.set_luns(luns);
    assert_eq!(sense_of(&exec(&t, &a, 0, &[0; 6], &[])), (6, 0x3F, 0x0E));
    assert!(t.lu(300).is_none());
    assert!(t.command_may_block(0, &[0x48]));
    assert!(!t.command_may_block(0, &[0x28]));
}

#[test]
fn long_reads_leave_the_transport_thread_short_ones_and_writes_stay() {
    let t = target();
    let rw10 = |opcode: u8, blocks: u16| {
        let mut cdb = [0u8; 10];
        cdb[0] = opcode;
        cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
        cdb
    };
    // 512-byte blocks: 2048 of them are the 1 MiB threshold.
    assert!(!t.command_may_block(0, &rw10(0x28, 1024)));
    assert!(!t.command_may_block(0, &rw10(0x28, 2047)));
    assert!(t.command_may_block(0, &rw10(0x28, 2048)));
    assert!(!t.command_may_block(0, &rw10(0x2A, 2048)));
}
