//! Timing work on a stream with the device's own clock. A [`Marker`] is an event stamped when
//! the stream reaches it. A [`Hold`] keeps the stream from starting what is queued behind it
//! until the host releases it: queue a run's kernels behind a hold and the time between markers
//! is the device's alone, not the host's launch latency, which on small kernels is larger than
//! the kernels themselves.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaEvent;

use super::hip::HipEvent;
use super::RuntimeError;

/// A point in a stream's work, stamped with the device's clock when the stream reaches it.
pub struct Marker(pub(super) MarkerInner);

pub(super) enum MarkerInner {
    Cuda(CudaEvent),
    Hip(HipEvent),
}

impl Marker {
    /// Whether the stream has reached this marker, without waiting.
    pub fn reached(&self) -> Result<bool, RuntimeError> {
        match &self.0 {
            MarkerInner::Cuda(e) => e
                .try_is_complete()
                .map_err(|e| RuntimeError::Cuda(e.to_string())),
            MarkerInner::Hip(e) => e.is_complete(),
        }
    }

    /// Device time from `start` to this marker; waits until the stream has reached both.
    pub fn since(&self, start: &Marker) -> Result<Duration, RuntimeError> {
        let ms = match (&start.0, &self.0) {
            (MarkerInner::Cuda(a), MarkerInner::Cuda(b)) => a
                .elapsed_ms(b)
                .map_err(|e| RuntimeError::Cuda(e.to_string()))?,
            (MarkerInner::Hip(a), MarkerInner::Hip(b)) => a.elapsed_ms(b)?,
            _ => {
                return Err(RuntimeError::NoDevice {
                    spec: "mixed".into(),
                    reason: "markers of two kinds of device were compared".into(),
                })
            }
        };
        // The clocks are the same device's: a negative interval is rounding, not time.
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }
}

/// What the stream's host callback waits on: a release from the host, or `limit`.
pub(super) struct HoldWait {
    release: Receiver<()>,
    limit: Duration,
    expired: Arc<AtomicBool>,
}

impl HoldWait {
    /// Blocks the driver's callback (and with it the stream) until the hold is released or
    /// dropped, or `limit` has passed; the last is recorded, since the host may have been
    /// blocked itself (a full launch queue) and the stream then ran while it enqueued.
    pub(super) fn wait(self) {
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
    pub(super) fn new(limit: Duration) -> (Hold, HoldWait) {
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
