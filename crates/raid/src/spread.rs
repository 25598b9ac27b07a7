//! Large requests run their stripes on several threads at once, so the
//! members work in parallel: a RAID0 read of N chunks takes as long as the
//! slowest member's share, not the sum of all of them.

use std::io;

/// Requests at least this large are spread; below, a thread costs more
/// than it saves.
pub const SPREAD_MIN_BYTES: usize = 256 << 10;

/// Runs `f` on every item; with `threads > 1`, item `i` runs on thread
/// `i % threads` (on RAID0 that is one thread per member). The first
/// error is returned.
pub fn spread<T: Send, F>(items: Vec<T>, threads: usize, f: F) -> io::Result<()>
where
    F: Fn(T) -> io::Result<()> + Sync,
{
    if threads <= 1 || items.len() <= 1 {
        return items.into_iter().try_for_each(f);
    }
    let threads = threads.min(items.len());
    let mut lanes: Vec<Vec<T>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, item) in items.into_iter().enumerate() {
        lanes[i % threads].push(item);
    }
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = lanes
            .into_iter()
            .map(|lane| s.spawn(move || lane.into_iter().try_for_each(f)))
            .collect();
        let mut result = Ok(());
        for h in handles {
            let r = h
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("RAID I/O thread panicked")));
            if result.is_ok() {
                result = r;
            }
        }
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn every_item_runs_once_and_errors_come_back() {
        let sum = AtomicUsize::new(0);
        spread((1..=100).collect(), 4, |i: usize| {
            sum.fetch_add(i, Ordering::Relaxed);
            Ok(())
        })
        .unwrap();
        assert_eq!(sum.into_inner(), 5050);
        let r = spread((0..10).collect(), 3, |i: usize| {
            if i == 7 {
                Err(io::Error::other("seven"))
            } else {
                Ok(())
            }
        });
        assert_eq!(r.unwrap_err().to_string(), "seven");
    }
}
