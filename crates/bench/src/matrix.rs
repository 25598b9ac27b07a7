//! Runs the points of a matrix against one target, or two interleaved
//! point by point, with a progress bar and its ETA on stderr.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::engine::Driver;
use crate::probe;
use crate::spec::{Measured, Point};

/// One point's figures, one per target in the order given.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    pub point: Point,
    pub measured: Vec<Measured>,
}

pub struct Plan<'a> {
    pub drivers: &'a [Driver],
    pub points: &'a [Point],
    pub runtime: u64,
    pub size: Option<u64>,
    pub destroy_data: bool,
}

/// Refuses write patterns on a target that holds data unless the data
/// may go; reads never change a device and are always allowed.
pub fn guard(plan: &Plan) -> Result<()> {
    let writes: Vec<&str> = plan
        .points
        .iter()
        .filter(|p| p.pattern.is_write())
        .map(|p| p.pattern.fio_rw())
        .collect();
    if writes.is_empty() || plan.destroy_data {
        return Ok(());
    }
    for driver in plan.drivers {
        let mut reader = driver
            .reader()
            .with_context(|| format!("checking {} for data before writing", driver.target))?;
        if let Some(offset) = probe::first_data(reader.as_mut())? {
            bail!(
                "{} holds data (the block at byte offset {offset} is not zeros) and the matrix \
                 writes to it ({}): those writes overwrite it. Pass --destroy-data to benchmark \
                 it anyway, or run read patterns only (--patterns randread,seqread)",
                driver.target,
                writes.join(", ")
            );
        }
    }
    Ok(())
}

pub fn run(plan: &Plan) -> Result<Vec<Row>> {
    let steps = (plan.points.len() * plan.drivers.len()) as u64;
    let bar = ProgressBar::new(steps * plan.runtime * 1000).with_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {percent:>3}% ETA {eta_precise} {msg}",
        )
        .expect("a valid template"),
    );
    let mut rows = Vec::with_capacity(plan.points.len());
    for (i, &point) in plan.points.iter().enumerate() {
        let mut measured = vec![None; plan.drivers.len()];
        // Alternating which target goes first keeps a drift of the machine
        // (another job starting, a cache warming) from favouring one.
        let mut order: Vec<usize> = (0..plan.drivers.len()).collect();
        if i % 2 == 1 {
            order.reverse();
        }
        for t in order {
            let driver = &plan.drivers[t];
            let done =
                (i * plan.drivers.len() + measured.iter().filter(|m| m.is_some()).count()) as u64;
            bar.set_message(format!(
                "{} QD{} on {}",
                point.label(),
                point.depth,
                driver.target
            ));
            let m = with_ticks(&bar, done * plan.runtime * 1000, plan.runtime, || {
                driver.run(point, plan.runtime, plan.size)
            })
            .with_context(|| format!("{} QD{} on {}", point.label(), point.depth, driver.target))?;
            bar.println(format!(
                "{:<13} QD{:<4} {:>10.0} IOPS {:>9.1} MB/s  p99 {:>8.1} us  {}",
                point.label(),
                point.depth,
                m.iops,
                m.mb_per_sec(),
                m.p99_us,
                driver.target
            ));
            measured[t] = Some(m);
        }
        rows.push(Row {
            point,
            measured: measured
                .into_iter()
                .map(|m| m.expect("every target ran"))
                .collect(),
        });
    }
    bar.finish_and_clear();
    Ok(rows)
}

/// Runs `work` while the bar moves with the clock across its runtime, so
/// the ETA is right within a point too.
fn with_ticks<T: Send>(
    bar: &ProgressBar,
    base: u64,
    runtime: u64,
    work: impl FnOnce() -> T + Send,
) -> T {
    let finished = AtomicBool::new(false);
    let start = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            while !finished.load(Ordering::Relaxed) {
                let ms = (start.elapsed().as_millis() as u64).min(runtime * 1000);
                bar.set_position(base + ms);
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        let out = work();
        finished.store(true, Ordering::Relaxed);
        out
    })
}
