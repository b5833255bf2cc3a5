//! What keeps one bad input from taking the fuzzer down silently: panics are caught and their
//! message and location kept; a watchdog stops the process when an input runs past its time
//! budget (after saving it); the global allocator refuses to let the process hold more than a
//! limit, so a parser that believes a size field aborts at once instead of swapping the machine.
//! An abort cannot be caught in-process, so each input is written to a file before it runs:
//! after an abort, that file (the target's work directory, named at the start of the run) holds
//! it, and the timed run's supervisor saves it as a finding and restarts.

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

use cap::Cap;

/// The allocator of the fuzz binaries: the system's, with a limit on bytes held at once.
#[global_allocator]
static ALLOCATOR: Cap<std::alloc::System> = Cap::new(std::alloc::System, usize::MAX);

/// Limits the bytes this process may hold; an allocation past it aborts the process (Rust's
/// allocation-failure handler) with "memory allocation of N bytes failed".
pub fn install_memory_limit(bytes: usize) {
    // Cap refuses a limit below what is already allocated; the fuzzer sets it at start-up.
    let _ = ALLOCATOR.set_limit(bytes.max(ALLOCATOR.allocated()));
}

/// The exit code of a process stopped by the watchdog.
pub const HANG_EXIT_CODE: i32 = 75;

thread_local! {
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
    static CAPTURED: RefCell<Option<Caught>> = const { RefCell::new(None) };
}

/// A caught panic: its message and location, and a backtrace (symbols are resolved only when
/// it is printed, which happens once per distinct finding).
pub struct Caught {
    /// `file:line:column`, or where it is not known, the message.
    pub location: String,
    pub message: String,
    pub backtrace: Option<std::backtrace::Backtrace>,
}

/// Replaces the panic hook, once, with one that stays quiet on a thread running a fuzz input
/// and keeps the message, location and a backtrace for the report instead; other panics (a
/// test's own assertions, other threads) go to the previous hook.
pub fn install_panic_capture() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if CAPTURING.with(Cell::get) {
                let message = info.payload_as_str().unwrap_or("(non-string payload)");
                let location = info
                    .location()
                    .map_or_else(|| "unknown location".to_string(), ToString::to_string);
                let caught = Caught {
                    message: format!("panicked at {location}: {message}"),
                    location,
                    backtrace: Some(std::backtrace::Backtrace::force_capture()),
                };
                CAPTURED.with(|c| *c.borrow_mut() = Some(caught));
            } else {
                previous(info);
            }
        }));
    });
}

/// Runs `f`, turning a panic into `Err`.
pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, Caught> {
    CAPTURING.with(|c| c.set(true));
    CAPTURED.with(|c| c.borrow_mut().take());
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    CAPTURING.with(|c| c.set(false));
    result.map_err(|payload| {
        CAPTURED.with(|c| c.borrow_mut().take()).unwrap_or_else(|| {
            // A panic on another thread (rayon's workers) reaches us as a payload only.
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(non-string payload)".into());
            Caught {
                location: message.clone(),
                message: format!("panicked on a worker thread: {message}"),
                backtrace: None,
            }
        })
    })
}

/// One fuzz loop's input in flight, watched for running past its time budget.
pub struct Flight {
    state: Arc<FlightState>,
}

struct FlightState {
    target: &'static str,
    seed: u64,
    path: PathBuf,
    crash_dir: PathBuf,
    timeout: Duration,
    iteration: AtomicU64,
    /// Milliseconds since `epoch()` when the input started, plus one; 0 while idle.
    started: AtomicU64,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The inputs in flight, and the watchdog's wake-up: it sleeps until the earliest in-flight
/// input's deadline, or until an input begins (which may bring the deadline closer).
struct Watch {
    flights: Mutex<Vec<Arc<FlightState>>>,
    begun: Condvar,
}

fn watch() -> &'static Watch {
    static WATCH: OnceLock<Watch> = OnceLock::new();
    WATCH.get_or_init(|| {
        std::thread::Builder::new()
            .name("fuzz-watchdog".into())
            .spawn(watchdog)
            .expect("spawning the fuzz watchdog");
        Watch {
            flights: Mutex::new(Vec::new()),
            begun: Condvar::new(),
        }
    })
}

fn watchdog() {
    let w = watch();
    let mut list = w.flights.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        // The earliest deadline (ms since the epoch) of an input in flight, and its flight.
        let due = list
            .iter()
            .filter_map(|f| {
                let started = f.started.load(Ordering::Acquire);
                let timeout = u64::try_from(f.timeout.as_millis()).unwrap_or(u64::MAX);
                (started > 0).then(|| ((started - 1).saturating_add(timeout), f))
            })
            .min_by_key(|(deadline, _)| *deadline);
        list = match due {
            Some((deadline, f)) if now_ms() > deadline => report_hang(f),
            Some((deadline, _)) => {
                let wait = Duration::from_millis(deadline + 1 - now_ms());
                w.begun
                    .wait_timeout(list, wait)
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            }
            None => w.begun.wait(list).unwrap_or_else(|p| p.into_inner()),
        };
    }
}

/// Saves the hung input beside the other findings and stops the process: the thread running
/// it cannot be stopped from outside.
fn report_hang(f: &FlightState) -> ! {
    let iteration = f.iteration.load(Ordering::Acquire);
    let saved = std::fs::read(&f.path).and_then(|input| {
        std::fs::create_dir_all(&f.crash_dir)?;
        let stem = format!("{}-hang-{:016x}", f.target, super::fnv(&input));
        let file = f.crash_dir.join(format!("{stem}.bin"));
        std::fs::write(&file, &input)?;
        std::fs::write(
            f.crash_dir.join(format!("{stem}.txt")),
            format!(
                "target {}, seed {}, iteration {iteration}\nran past {:?}\nreplay: {}\n",
                f.target,
                f.seed,
                f.timeout,
                super::replay_command(f.target, &file)
            ),
        )?;
        Ok(file)
    });
    match saved {
        Ok(file) => eprintln!(
            "FINDING {} Hang (seed {}, iteration {iteration}): an input ran past {:?}; saved to {}",
            f.target,
            f.seed,
            f.timeout,
            file.display()
        ),
        Err(e) => eprintln!(
            "FINDING {} Hang (seed {}, iteration {iteration}): an input ran past {:?}; it is in {} (saving it failed: {e})",
            f.target,
            f.seed,
            f.timeout,
            f.path.display()
        ),
    }
    std::process::exit(HANG_EXIT_CODE)
}

impl Flight {
    pub fn register(
        target: &'static str,
        seed: u64,
        path: &Path,
        timeout: Duration,
        crash_dir: &Path,
    ) -> Flight {
        let state = Arc::new(FlightState {
            target,
            seed,
            path: path.to_path_buf(),
            crash_dir: crash_dir.to_path_buf(),
            timeout,
            iteration: AtomicU64::new(0),
            started: AtomicU64::new(0),
        });
        watch()
            .flights
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(state.clone());
        Flight { state }
    }

    pub fn begin(&self, iteration: u64) {
        self.state.iteration.store(iteration, Ordering::Release);
        self.state.started.store(now_ms() + 1, Ordering::Release);
        // Under the lock, so the watchdog cannot miss it between reading the list and waiting.
        let w = watch();
        let _list = w.flights.lock().unwrap_or_else(|p| p.into_inner());
        w.begun.notify_one();
    }

    pub fn end(&self) {
        self.state.started.store(0, Ordering::Release);
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        watch()
            .flights
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|f| !Arc::ptr_eq(f, &self.state));
    }
}
