//! Progress bars for long compiles: drawn on stderr only when it is a terminal and the work has
//! taken more than a moment, so quick compiles, pipes and logs stay quiet.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Work shorter than this shows no bar.
const QUIET: Duration = Duration::from_millis(500);

/// A bar over `total` steps (cheap to clone and to advance from many threads).
#[derive(Clone)]
pub(super) struct Bar {
    bar: Option<ProgressBar>,
    start: Instant,
    shown: Arc<AtomicBool>,
}

/// A bar labelled `what`; `show` false (or stderr not a terminal) makes one that never draws.
pub(super) fn bar(total: usize, what: &str, show: bool) -> Bar {
    let show = show && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let bar = show.then(|| {
        let b = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::hidden());
        if let Ok(style) =
            ProgressStyle::with_template("{msg}: {pos}/{len} [{elapsed_precise}] {wide_bar}")
        {
            b.set_style(style);
        }
        b.set_message(what.to_string());
        b
    });
    Bar {
        bar,
        start: Instant::now(),
        shown: Arc::new(AtomicBool::new(false)),
    }
}

impl Bar {
    pub(super) fn inc(&self, n: u64) {
        let Some(b) = &self.bar else { return };
        if self.start.elapsed() > QUIET && !self.shown.swap(true, Ordering::Relaxed) {
            b.set_draw_target(ProgressDrawTarget::stderr());
        }
        b.inc(n);
    }

    pub(super) fn finish_and_clear(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
