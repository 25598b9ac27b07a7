//! Tests of the raid kind: assembly, stale and superseded members,
//! forced assembly, live settings.

use block::MemDevice;

use super::*;

fn spec(level: u32, members: usize, spares: usize) -> RaidSpec {
    RaidSpec {
        level,
        members: (0..members).map(|i| format!("m{i}")).collect(),
        spares: (0..spares).map(|i| format!("s{i}")).collect(),
        chunk: 64 << 10,
        bitmap_region: None,
        sync_speed_min: None,
        sync_speed_max: None,
        member_timeout: None,
        log_slots: None,
        scrub_every: None,
        assemble: Assembly::Normal,
    }
}

fn devices(spec: &RaidSpec) -> Vec<(Arc<dyn BlockDevice>, String)> {
    spec.names()
        .map(|n| {
            (
                Arc::new(MemDevice::new(16 << 20)) as Arc<dyn BlockDevice>,
                n.clone(),
            )
        })
        .collect()
}

#[test]
fn blank_members_create_and_carrying_ones_assemble_with_their_names() {
    let spec = spec(5, 3, 1);
    let named = devices(&spec);
    let size = {
        let array = spec.open_array(&named).unwrap();
        array.write_at(&[7; 4096], 8192, true).unwrap();
        array.wait_idle(Duration::from_secs(30));
        array.size()
    };
    let array = spec.open_array(&named).unwrap();
    array.name_members(&named);
    assert_eq!(array.size(), size);
    let mut buf = [0; 4096];
    array.read_at(&mut buf, 8192).unwrap();
    assert_eq!(buf, [7; 4096]);
    let names: Vec<_> = array
        .status()
        .members
        .iter()
        .filter_map(|m| m.name.clone())
        .collect();
    assert_eq!(names, ["m0", "m1", "m2", "s0"]);
    let state = spec.state(&array);
    assert_eq!(state[0], ("array", "clean".to_string()));
}

#[test]
fn a_blank_member_among_carrying_ones_is_refused_by_name() {
    let spec = spec(1, 2, 0);
    let mut named = devices(&spec);
    drop(spec.open_array(&named).unwrap());
    named[1].0 = Arc::new(MemDevice::new(16 << 20));
    let err = spec.open_array(&named).err().unwrap().to_string();
    assert!(err.contains("`m1` carries no RAID superblock"), "{err}");
    assert!(err.contains("`m0`"), "{err}");
}

#[test]
fn a_member_that_missed_events_is_put_back_and_catches_up() {
    let spec = spec(1, 2, 0);
    let named = devices(&spec);
    let old_m1 = MemDevice::new(16 << 20);
    {
        let array = spec.open_array(&named).unwrap();
        array.wait_idle(Duration::from_secs(30));
        let mut image = vec![0; 16 << 20];
        named[1].0.read_at(&mut image, 0).unwrap();
        old_m1.write_at(&image, 0, false).unwrap();
        array.fail(1).unwrap();
        array.write_at(&[9; 4096], 0, true).unwrap();
    }
    let mut named = named;
    named[1].0 = Arc::new(old_m1);
    let array = spec.open_array(&named).unwrap();
    assert!(array.wait_idle(Duration::from_secs(30)));
    array.fail(0).unwrap();
    let mut buf = [0; 4096];
    array.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [9; 4096]);
}

/// A member a spare was rebuilt in place of, at the next start: left
/// out (not caught up from bits that no longer cover its absence)
/// when listed as a member, a spare again when listed as one.
#[test]
fn a_superseded_member_is_left_out_or_made_a_spare_as_listed() {
    let spec = spec(1, 2, 0);
    let named = devices(&spec);
    let new: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(16 << 20));
    let expect = {
        let array = spec.open_array(&named).unwrap();
        array.wait_idle(Duration::from_secs(30));
        array.fail(0).unwrap();
        array.write_at(&[9; 8192], 65536, true).unwrap();
        array.add(new.clone()).unwrap();
        assert!(array.wait_idle(Duration::from_secs(30)));
        let mut data = vec![0; array.size() as usize];
        array.read_at(&mut data, 0).unwrap();
        data
    };
    // Listed as a member, the new device not listed: left out.
    let array = spec.open_array(&named).unwrap();
    array.name_members(&named);
    let st = array.status();
    assert_eq!(st.state, raid::ArrayState::Degraded);
    assert_eq!(st.members[0].state, raid::MemberState::Missing);
    drop(array);
    // Listed as a spare beside the new member: a spare.
    let swapped = RaidSpec {
        members: vec!["n0".into(), "m1".into()],
        spares: vec!["m0".into()],
        ..spec.clone()
    };
    let named = vec![(new, "n0".to_string()), named[1].clone(), named[0].clone()];
    let array = swapped.open_array(&named).unwrap();
    array.name_members(&named);
    // n0 missed the degraded start: it catches up first.
    assert!(array.wait_idle(Duration::from_secs(30)));
    let st = array.status();
    assert_eq!(st.state, raid::ArrayState::Clean);
    let spare = st.members.iter().find(|m| m.name.as_deref() == Some("m0"));
    assert_eq!(spare.map(|m| m.state), Some(raid::MemberState::Spare));
    let mut got = vec![0; expect.len()];
    array.read_at(&mut got, 0).unwrap();
    assert!(got == expect);
}

/// Forced assembly's case: slot 0 failed, then slot 1 missed the
/// update of taking slot 0 out (its image from before it).
fn members_stale_one_by_one(spec: &RaidSpec) -> (Vec<Named>, Vec<u8>) {
    let mut named = devices(spec);
    let old_m1 = MemDevice::new(16 << 20);
    let data = {
        let array = spec.open_array(&named).unwrap();
        array.wait_idle(Duration::from_secs(30));
        array.write_at(&[5; 8192], 0, true).unwrap();
        array.fail(0).unwrap();
        array.write_at(&[6; 4096], 65536, true).unwrap();
        array.flush().unwrap();
        let mut image = vec![0; 16 << 20];
        named[1].0.read_at(&mut image, 0).unwrap();
        old_m1.write_at(&image, 0, false).unwrap();
        array.remove(0).unwrap();
        let mut data = vec![0; array.size() as usize];
        array.read_at(&mut data, 0).unwrap();
        data
    };
    named[1].0 = Arc::new(old_m1);
    (named, data)
}

#[test]
fn too_few_current_members_are_refused_unless_assembly_is_forced() {
    let normal = spec(5, 4, 0);
    let (named, data) = members_stale_one_by_one(&normal);
    let err = normal.open_array(&named).err().unwrap().to_string();
    assert!(err.contains("too few members"), "{err}");
    let forced = RaidSpec {
        assemble: Assembly::Force,
        ..normal
    };
    let array = forced.open_array(&named).unwrap();
    array.name_members(&named);
    let shown = forced.state(&array);
    assert!(
        shown.contains(&("assembled_by_force", "m1 (1 events behind)".into())),
        "{shown:?}"
    );
    let st = array.status();
    assert_eq!(st.forced.len(), 1);
    assert_eq!((st.forced[0].slot, st.forced[0].gap), (1, 1));
    assert!(array.wait_idle(Duration::from_secs(30)));
    assert_eq!(array.status().state, raid::ArrayState::Clean);
    let mut got = vec![0; array.size() as usize];
    array.read_at(&mut got, 0).unwrap();
    assert!(got == data);
}

fn config(assemble: &str) -> String {
    let mut text = String::from("[[portal]]\nlisten = \"127.0.0.1:3260\"\n");
    for i in 0..3 {
        text += &format!("[[device]]\nname = \"m{i}\"\nkind = \"mem\"\n");
    }
    text += "[[device]]\nname = \"r\"\nkind = \"raid\"\nlevel = 5\n\
             members = [\"m0\", \"m1\", \"m2\"]\n";
    text + assemble
}

#[test]
fn assemble_force_parses_and_a_bad_value_is_named() {
    let raid_of = |text: &str| {
        let c = crate::parse_config(text, "raid.toml").unwrap();
        let d = c.devices.iter().find(|d| d.name == "r").unwrap();
        d.spec.as_kind::<RaidSpec>().unwrap().assemble
    };
    assert_eq!(raid_of(&config("")), Assembly::Normal);
    assert_eq!(
        raid_of(&config("assemble = \"normal\"\n")),
        Assembly::Normal
    );
    assert_eq!(raid_of(&config("assemble = \"force\"\n")), Assembly::Force);
    for bad in ["assemble = \"forced\"\n", "assemble = true\n"] {
        let err = crate::parse_config(&config(bad), "raid.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("raid.toml:"), "{err}");
        assert!(err.contains("device[3].assemble"), "{err}");
        assert!(err.contains("expected \"normal\" or \"force\""), "{err}");
    }
}

#[test]
fn a_change_of_geometry_or_any_setting_of_a_live_array_is_named() {
    let old = spec(5, 4, 1);
    let change = |new: &RaidSpec| {
        let c = Change {
            name: "r5",
            new,
            old_block_size: 512,
            new_block_size: 512,
            same_pool: true,
        };
        old.replaces_data(&c).map(|(field, _)| field)
    };
    assert_eq!(change(&old.clone()), None);
    assert_eq!(
        change(&RaidSpec {
            level: 6,
            ..old.clone()
        }),
        Some("level")
    );
    assert_eq!(
        change(&RaidSpec {
            chunk: 128 << 10,
            ..old.clone()
        }),
        Some("chunk")
    );
    let mut fewer = old.clone();
    fewer.members.pop();
    assert_eq!(change(&fewer), Some("members"));
    assert_eq!(
        change(&RaidSpec {
            spares: vec![],
            ..old.clone()
        }),
        Some("spares")
    );
    let forced = RaidSpec {
        assemble: Assembly::Force,
        ..old.clone()
    };
    assert_eq!(change(&forced), None, "it counts at the next assembly");
    let mut more = old.clone();
    more.spares.push("s9".into());
    assert_eq!(change(&more), None, "a spare added is taken live");
    assert!(old.applies_live(&more));
    more.chunk = 128 << 10;
    assert!(!old.applies_live(&more), "nothing else is");
}
