//! Quick figures: CPU cost of parity per write size, and RAID0 over
//! bandwidth-capped members next to one member's own speed, with one
//! member at half speed named by the weakest-link finding.
//!
//! `cargo run --release -p raid --example raid_speed`

use std::sync::Arc;
use std::time::{Duration, Instant};

use block::{BlockDevice, DelayDevice, DelayLimits, MemDevice};
use raid::{gf, Level, RaidArray, RaidOptions};

/// Bytes per read of the throughput figures.
const IO: usize = 4 << 20;

fn parity_cost(data_columns: usize, raid6: bool, write: usize) -> f64 {
    let col = write / data_columns;
    let cols: Vec<Vec<u8>> = (0..data_columns).map(|i| vec![i as u8 + 1; col]).collect();
    let refs: Vec<&[u8]> = cols.iter().map(|c| c.as_slice()).collect();
    let opt: Vec<Option<&[u8]>> = refs.iter().map(|c| Some(*c)).collect();
    let (mut p, mut q) = (vec![0u8; col], vec![0u8; col]);
    let rounds = (256 << 20) / write;
    let start = Instant::now();
    for _ in 0..rounds {
        gf::p_of(&refs, &mut p);
        if raid6 {
            gf::q_of(&opt, &mut q);
        }
    }
    start.elapsed().as_nanos() as f64 / rounds as f64
}

fn member(bandwidth: u64) -> Arc<DelayDevice> {
    let limits = DelayLimits {
        bandwidth: Some(bandwidth),
        ..DelayLimits::default()
    };
    Arc::new(DelayDevice::new(Arc::new(MemDevice::new(72 << 20)), limits))
}

fn read_rate(dev: &dyn BlockDevice, bytes: u64) -> f64 {
    let mut buf = vec![0u8; IO];
    let start = Instant::now();
    let mut at = 0;
    while at + IO as u64 <= bytes {
        dev.read_at(&mut buf, at).unwrap();
        at += IO as u64;
    }
    at as f64 / start.elapsed().as_secs_f64() / 1e6
}

fn main() {
    for (name, d, raid6) in [("RAID5 4+1", 4, false), ("RAID6 4+2", 4, true)] {
        for write in [4096, 1 << 20] {
            let ns = parity_cost(d, raid6, write);
            println!(
                "{name}: parity of a {} KiB full-stripe write: {:.0} ns CPU ({:.2} GB/s)",
                write >> 10,
                ns,
                write as f64 / ns
            );
        }
    }
    let mb = 100_000_000;
    let one = member(mb);
    let single = read_rate(&*one, 32 << 20);
    println!("one member: {single:.0} MB/s sequential 4 MiB reads");
    for slow in [None, Some(2)] {
        let members: Vec<Arc<DelayDevice>> = (0..4)
            .map(|i| member(if Some(i) == slow { mb / 2 } else { mb }))
            .collect();
        let devs: Vec<Arc<dyn BlockDevice>> = members
            .iter()
            .map(|m| m.clone() as Arc<dyn BlockDevice>)
            .collect();
        let opts = RaidOptions {
            assume_clean: true,
            ..RaidOptions::default()
        };
        let a = RaidArray::create(Level::Raid0, devs.clone(), vec![], opts).unwrap();
        let names: Vec<(Arc<dyn BlockDevice>, String)> = devs
            .iter()
            .enumerate()
            .map(|(i, d)| (d.clone(), format!("ssd{i}")))
            .collect();
        a.name_members(&names);
        let rate = read_rate(&a, 64 << 20);
        match slow {
            None => println!("RAID0 of 4: {rate:.0} MB/s = {:.2} x one member", rate / single),
            Some(s) => println!(
                "RAID0 of 4, ssd{s} at half speed: {rate:.0} MB/s = {:.2} x ssd{s}'s {:.0} MB/s; finding: {}",
                rate / (single / 2.0),
                single / 2.0,
                a.status().weakest_link.map_or("none".into(), |w| w.finding)
            ),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
