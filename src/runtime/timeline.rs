//! Timing work on a stream with the device's own clock. A [`Marker`] is an event stamped when
//! the stream reaches it. A [`Hold`] keeps the stream from starting what is queued behind it
//! until the host releases it: queue a run's kernels behind a hold and the time between markers
//! is the device's alone, not the host's launch latency, which on small kernels is larger than
//! the kernels themselves.

use std::sync::Arc;
use std::time::Duration;

use super::dispatch::{Erased, Gpu};
use super::error::RuntimeError;

pub use super::hold::Hold;

/// A point in a stream's work, stamped with the device's clock when the stream reaches it.
pub struct Marker {
    pub(super) gpu: Arc<dyn Gpu>,
    pub(super) event: Erased,
}

impl Marker {
    /// Whether the stream has reached this marker, without waiting.
    pub fn reached(&self) -> Result<bool, RuntimeError> {
        self.gpu.reached(&self.event)
    }

    /// Device time from `start` to this marker; waits until the stream has reached both.
    /// Markers of two kinds of device are refused (the event types differ).
    pub fn since(&self, start: &Marker) -> Result<Duration, RuntimeError> {
        let ms = self.gpu.elapsed_ms(&start.event, &self.event)?;
        // The clocks are the same device's: a negative interval is rounding, not time.
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }
}
