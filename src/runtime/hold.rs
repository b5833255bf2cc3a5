//! Holding a stream: a [`Hold`] keeps the stream from starting what is queued behind it until
//! the host releases it (or a time limit passes). The value types here are shared by the
//! backends (whose host callbacks wait on a [`HoldWait`]) and the timeline, and import nothing
//! of the runtime, so neither imports the other.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

/// What the stream's host callback waits on: a release from the host, or `limit`.
pub struct HoldWait {
    release: Receiver<()>,
    limit: Duration,
    expired: Arc<AtomicBool>,
}

impl HoldWait {
    /// Blocks the driver's callback (and with it the stream) until the hold is released or
    /// dropped, or `limit` has passed; the last is recorded, since the host may have been
    /// blocked itself (a full launch queue) and the stream then ran while it enqueued.
    pub fn wait(self) {
        if let Err(RecvTimeoutError::Timeout) = self.release.recv_timeout(self.limit) {
            self.expired.store(true, Ordering::Release);
        }
    }
}

/// A stream held at the point it was made; released by [`Hold::release`] or on drop, so an
/// error on the way never leaves a stream stuck.
pub struct Hold {
    release: Option<Sender<()>>,
    expired: Arc<AtomicBool>,
    limit: Duration,
}

impl Hold {
    /// A hold that gives up after `limit`, and what the stream's callback waits on.
    pub(crate) fn new(limit: Duration) -> (Hold, HoldWait) {
        let (tx, rx) = channel();
        let expired = Arc::new(AtomicBool::new(false));
        let hold = Hold {
            release: Some(tx),
            expired: expired.clone(),
            limit,
        };
        let wait = HoldWait {
            release: rx,
            limit,
            expired,
        };
        (hold, wait)
    }

    /// Lets the stream go on.
    pub fn release(&mut self) {
        // Dropping the sender ends the callback's wait at once.
        self.release.take();
    }

    /// Whether the hold gave up before it was released (so the stream started before the host
    /// had enqueued everything). Meaningful once the stream has been synchronised.
    pub fn expired(&self) -> bool {
        self.expired.load(Ordering::Acquire)
    }

    pub fn limit(&self) -> Duration {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_released_or_dropped_hold_ends_the_wait_and_a_forgotten_one_expires() {
        let (mut hold, wait) = Hold::new(Duration::from_secs(30));
        let waiter = std::thread::spawn(move || wait.wait());
        hold.release();
        waiter.join().unwrap();
        assert!(!hold.expired());

        let (hold, wait) = Hold::new(Duration::from_secs(30));
        let expired = hold.expired.clone();
        drop(hold);
        wait.wait();
        assert!(
            !expired.load(Ordering::Acquire),
            "dropping a hold releases it"
        );

        let (hold, wait) = Hold::new(Duration::from_millis(10));
        wait.wait();
        assert!(
            hold.expired(),
            "a hold never released gives up at its limit"
        );
    }
}
