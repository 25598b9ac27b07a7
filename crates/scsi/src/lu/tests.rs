use super::test_support::*;
use super::*;
use crate::sense::key;

#[test]
fn first_contact_gets_power_on_unit_attention_once() {
    let lu = lu();
    let a = nexus("a");
    let r = run(&lu, &a, &[0; 6], &[]);
    assert_eq!(sense_of(&r), (key::UNIT_ATTENTION, 0x29, 0x00));
    assert_eq!(r.data_out_wanted, None);
    assert_eq!(run(&lu, &a, &[0; 6], &[]).status, status::GOOD);
}

#[test]
fn power_on_unit_attention_goes_to_the_first_nexus_of_each_initiator() {
    let lu = lu();
    let a1 = nexus("a");
    let a2 = Nexus {
        isid: [0x80, 0, 0, 0, 0, 2],
        ..nexus("a")
    };
    lu.nexus_added(&a1);
    assert_eq!(
        sense_of(&run(&lu, &a1, &[0; 6], &[])).0,
        key::UNIT_ATTENTION
    );
    lu.nexus_lost(&a1);
    lu.nexus_added(&a2);
    assert_eq!(run(&lu, &a2, &[0; 6], &[]).status, status::GOOD);
    assert_eq!(
        sense_of(&run(&lu, &nexus("b"), &[0; 6], &[])).0,
        key::UNIT_ATTENTION
    );
}

#[test]
fn inquiry_ignores_unit_attention_without_clearing_it() {
    let lu = lu();
    let a = nexus("a");
    let r = run(&lu, &a, &[0x12, 0, 0, 0, 96, 0], &[]);
    assert_eq!(r.status, status::GOOD);
    assert_eq!(sense_of(&run(&lu, &a, &[0; 6], &[])).0, key::UNIT_ATTENTION);
}

#[test]
fn unknown_opcode_and_service_action() {
    let lu = lu();
    let a = nexus("a");
    ready(&lu, &a);
    assert_eq!(
        sense_of(&run(&lu, &a, &[0xC0, 0, 0, 0, 0, 0], &[])),
        (key::ILLEGAL_REQUEST, 0x20, 0)
    );
    assert_eq!(
        sense_of(&run(&lu, &a, &[0x9E, 0x1F], &[])),
        (key::ILLEGAL_REQUEST, 0x24, 0)
    );
}

#[test]
fn lu_reset_reaches_every_nexus_and_keeps_persistent_state() {
    let lu = lu();
    let (a, b) = (nexus("a"), nexus("b"));
    ready(&lu, &a);
    ready(&lu, &b);
    lu.reset();
    assert_eq!(
        sense_of(&run(&lu, &a, &[0; 6], &[])),
        (key::UNIT_ATTENTION, 0x29, 0)
    );
    assert_eq!(
        sense_of(&run(&lu, &b, &[0; 6], &[])),
        (key::UNIT_ATTENTION, 0x29, 0)
    );
}

#[test]
fn descriptor_sense_follows_d_sense() {
    let lu = lu();
    let a = nexus("a");
    ready(&lu, &a);
    lu.mode.lock().d_sense = true;
    let r = run(&lu, &a, &[0xC0, 0, 0, 0, 0, 0], &[]);
    assert_eq!(r.sense[0], 0x72);
    assert_eq!((r.sense[1], r.sense[2]), (key::ILLEGAL_REQUEST, 0x20));
}

/// A RAM device whose size can change under the LU.
struct Resizable {
    size: AtomicU64,
}

impl block::Wrapper for Resizable {
    fn size(&self, _: &dyn BlockDevice) -> u64 {
        self.size.load(Ordering::Relaxed)
    }
    fn describe(&self, _: &dyn BlockDevice) -> String {
        "resizable".into()
    }
}

#[test]
fn resizing_the_device_tells_every_nexus() {
    let dev = Arc::new(block::Wrapped::over(
        Arc::new(block::MemDevice::new(1 << 20)),
        Resizable {
            size: AtomicU64::new(1 << 19),
        },
    ));
    let lu = LogicalUnit::new(dev.clone(), LuConfig::default()).unwrap();
    let (a, b) = (nexus("a"), nexus("b"));
    ready(&lu, &a);
    ready(&lu, &b);
    assert_eq!(lu.blocks(), 1024);
    dev.size.store(1 << 20, Ordering::Relaxed);
    assert_eq!(
        sense_of(&run(&lu, &a, &[0; 6], &[])),
        (key::UNIT_ATTENTION, 0x2A, 0x09)
    );
    assert_eq!(
        sense_of(&run(&lu, &b, &[0; 6], &[])),
        (key::UNIT_ATTENTION, 0x2A, 0x09)
    );
    let r = run(&lu, &a, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
    assert_eq!(&r.data_in[..4], &2047u32.to_be_bytes());
}

#[test]
fn rejects_bad_block_sizes_and_tiny_devices() {
    let dev = Arc::new(block::MemDevice::new(1 << 20));
    assert!(LogicalUnit::new(
        dev.clone(),
        LuConfig {
            block_size: 1000,
            ..LuConfig::default()
        }
    )
    .is_err());
    let tiny = Arc::new(block::MemDevice::new(100));
    assert!(LogicalUnit::new(tiny, LuConfig::default()).is_err());
    let a = LogicalUnit::new(dev.clone(), LuConfig::default()).unwrap();
    let b = LogicalUnit::new(dev, LuConfig::default()).unwrap();
    assert_ne!(a.naa(), b.naa(), "anonymous LUs get distinct designators");
}

#[test]
fn the_backing_carries_the_designator_the_unit_reports() {
    let backing = export::Backing::new(Arc::new(block::MemDevice::new(1 << 20)), true);
    let naa = crate::naa_from_seed("shared-identity");
    let lu = LogicalUnit::over(
        backing.clone(),
        LuConfig {
            naa,
            ..LuConfig::default()
        },
    )
    .unwrap();
    assert_eq!(lu.naa(), naa);
    assert_eq!(backing.naa(), Some(naa));
    assert_eq!(
        backing.namespace_ids("ignored").nguid,
        naa,
        "other transports name the device by the unit's designator"
    );
}
