//! The outgoing side of a connection: how many bytes may wait for the
//! peer, and how long a write may make no progress.

use std::future::Future;
use std::io;
use std::time::Duration;

use tokio::sync::{Semaphore, TryAcquireError};

/// Why bytes could not be queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stalled {
    /// The peer did not drain the queue within the deadline.
    Deadline,
    /// The connection is being torn down (the budget was closed).
    Closed,
}

/// Bytes a connection may have queued toward its peer but not yet written.
///
/// The sender takes from the budget before queueing; the writer gives back
/// once the bytes are on the socket. A PDU larger than the whole budget
/// takes all of it, so it still goes out alone. Closing the budget wakes a
/// sender waiting on it, which is how a connection blocked on a silent
/// peer is told to end.
#[derive(Debug)]
pub struct OutgoingBudget {
    permits: Semaphore,
    limit: u32,
}

impl OutgoingBudget {
    pub fn new(limit_bytes: usize) -> OutgoingBudget {
        let limit = limit_bytes
            .clamp(1, Semaphore::MAX_PERMITS)
            .min(u32::MAX as usize) as u32;
        OutgoingBudget {
            permits: Semaphore::new(limit as usize),
            limit,
        }
    }

    /// What queueing `bytes` costs: at least one, at most the whole budget.
    fn cost(&self, bytes: usize) -> u32 {
        bytes.clamp(1, self.limit as usize) as u32
    }

    /// Take `bytes` without waiting; the amount taken is to be given back.
    pub fn try_take(&self, bytes: usize) -> Result<u32, Stalled> {
        let cost = self.cost(bytes);
        match self.permits.try_acquire_many(cost) {
            Ok(p) => {
                p.forget();
                Ok(cost)
            }
            Err(TryAcquireError::Closed) => Err(Stalled::Closed),
            Err(TryAcquireError::NoPermits) => Err(Stalled::Deadline),
        }
    }

    /// Take `bytes`, waiting at most `deadline` for the writer to free them.
    pub async fn take(&self, bytes: usize, deadline: Duration) -> Result<u32, Stalled> {
        let cost = self.cost(bytes);
        match tokio::time::timeout(deadline, self.permits.acquire_many(cost)).await {
            Ok(Ok(p)) => {
                p.forget();
                Ok(cost)
            }
            Ok(Err(_)) => Err(Stalled::Closed),
            Err(_) => Err(Stalled::Deadline),
        }
    }

    /// Return what [`take`](Self::take) or [`try_take`](Self::try_take)
    /// took, once those bytes are written (or dropped).
    pub fn give_back(&self, taken: u32) {
        if taken > 0 && !self.permits.is_closed() {
            self.permits.add_permits(taken as usize);
        }
    }

    /// End the connection's sending: every waiting and later take fails.
    pub fn close(&self) {
        self.permits.close();
    }

    pub fn is_closed(&self) -> bool {
        self.permits.is_closed()
    }

    /// Bytes queued now (taken and not given back).
    pub fn queued(&self) -> usize {
        self.limit as usize - self.permits.available_permits()
    }
}

/// Run one write step, failing with `TimedOut` if it makes no progress
/// within `deadline`. Applied to each write call rather than to a whole
/// batch, it measures a stalled peer, not a slow link.
pub async fn write_deadline<T>(
    deadline: Duration,
    step: impl Future<Output = io::Result<T>>,
) -> io::Result<T> {
    match tokio::time::timeout(deadline, step).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the peer accepted no data for {} ms", deadline.as_millis()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn bytes_are_bounded_and_given_back() {
        let b = OutgoingBudget::new(1000);
        let a = b.try_take(600).unwrap();
        assert_eq!(b.queued(), 600);
        assert_eq!(b.try_take(600), Err(Stalled::Deadline));
        assert_eq!(
            b.take(600, Duration::from_millis(20)).await,
            Err(Stalled::Deadline)
        );
        b.give_back(a);
        assert_eq!(b.queued(), 0);
        assert_eq!(b.try_take(600), Ok(600));
    }

    #[tokio::test]
    async fn an_oversized_item_takes_the_whole_budget() {
        let b = OutgoingBudget::new(1000);
        assert_eq!(b.try_take(1 << 30), Ok(1000));
        assert_eq!(b.try_take(0), Err(Stalled::Deadline));
        b.give_back(1000);
        assert_eq!(b.try_take(0), Ok(1));
    }

    #[tokio::test]
    async fn a_waiting_sender_gets_freed_bytes() {
        let b = Arc::new(OutgoingBudget::new(100));
        let first = b.try_take(100).unwrap();
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move { b.take(50, Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        b.give_back(first);
        assert_eq!(waiter.await.unwrap(), Ok(50));
    }

    #[tokio::test]
    async fn closing_wakes_a_waiting_sender_at_once() {
        let b = Arc::new(OutgoingBudget::new(100));
        b.try_take(100).unwrap();
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move { b.take(1, Duration::from_secs(60)).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        let started = std::time::Instant::now();
        b.close();
        assert_eq!(waiter.await.unwrap(), Err(Stalled::Closed));
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(b.try_take(1), Err(Stalled::Closed));
        b.give_back(100);
        assert!(b.is_closed());
    }

    #[tokio::test]
    async fn a_write_that_makes_no_progress_times_out() {
        // A duplex pipe with a 16-byte buffer nobody reads: the second
        // write can never finish.
        let (mut w, _r) = tokio::io::duplex(16);
        let d = Duration::from_millis(50);
        write_deadline(d, w.write_all(&[0; 16])).await.unwrap();
        let e = write_deadline(d, w.write_all(&[0; 16])).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }
}
