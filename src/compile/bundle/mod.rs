//! Replay bundles (`rocmforge compile --emit bundle`, `rocmforge replay`): a directory that holds
//! a kernel plan with everything needed to run it elsewhere (a machine, a simulator, new
//! hardware) and compare every buffer with the interpreter's value. See `docs/bundle.md`.
//!
//! - [`format`]: `plan.json`, typed and versioned.
//! - [`emit`]: writes a bundle: sources, code objects, seeded data, the interpreter's values.
//! - [`check`]: opens one (a bundle is user input: every inconsistency is a typed error).
//! - [`replay`]: runs one on a device and compares buffer by buffer.

pub mod check;
pub mod emit;
pub mod format;
mod readme;
pub mod replay;
mod signature;

use thiserror::Error;

use super::CompileError;
use crate::ir::FileError;
use crate::runtime::RuntimeError;

pub use check::{Bundle, CheckReport};
pub use emit::{emit, EmitOptions, Emitted};
pub use format::{BundlePlan, FORMAT, FORMAT_V1};
pub use replay::{BufferReport, KernelSource, Mismatch, ReplayOptions, ReplayReport};

/// The default limit on a bundle's bytes (written or read): 2 GiB.
pub const DEFAULT_MAX_BUNDLE_BYTES: u64 = 2 << 30;

#[derive(Debug, Error)]
pub enum BundleError {
    /// Passes, codegen, the interpreter or a compiler failed while emitting.
    #[error(transparent)]
    Compile(Box<CompileError>),
    /// The compiler `--compiler` named is not usable here.
    #[error("{reason}")]
    NoCompiler { reason: String },
    #[error("cannot compile kernel {entry} into a code object: {message}")]
    CodeObject { entry: String, message: String },
    #[error("cannot write {path}: {message}")]
    Write { path: String, message: String },
    #[error("{path} is not empty; a bundle is written into a new or empty directory")]
    NotEmpty { path: String },
    #[error(
        "the bundle would hold {bytes} bytes, more than the limit of {limit} (--max-bundle-bytes)"
    )]
    TooLarge { bytes: u64, limit: u64 },
    #[error(transparent)]
    File(#[from] FileError),
    #[error("{path}: not a bundle plan: {message}")]
    Json { path: String, message: String },
    #[error("{path}: format `{found}` is not one this build reads (it reads `{FORMAT}`)")]
    Version { path: String, found: String },
    /// `plan.json` contradicts itself or the files beside it.
    #[error("malformed bundle: {reason}")]
    Malformed { reason: String },
    #[error("{path} has {found} bytes; the buffer table says {expected}")]
    Size {
        path: String,
        expected: u64,
        found: u64,
    },
    #[error(
        "replay needs a GPU: {reason} (`rocmforge replay --check` checks a bundle without one)"
    )]
    NoGpu { reason: String },
    #[error("the bundle was made for {bundle} ({vendor}); the device is {device}")]
    TargetMismatch {
        bundle: String,
        vendor: String,
        device: String,
    },
    /// A device call failed; `kernel` names the kernel it was for, when there is one.
    #[error("{}{source}", kernel.as_ref().map(|k| format!("kernel {k}: ")).unwrap_or_default())]
    Runtime {
        kernel: Option<String>,
        source: RuntimeError,
    },
}

impl From<CompileError> for BundleError {
    fn from(e: CompileError) -> BundleError {
        BundleError::Compile(Box::new(e))
    }
}

impl BundleError {
    fn malformed(reason: impl Into<String>) -> BundleError {
        BundleError::Malformed {
            reason: reason.into(),
        }
    }

    fn runtime(kernel: Option<&str>) -> impl Fn(RuntimeError) -> BundleError + '_ {
        move |source| BundleError::Runtime {
            kernel: kernel.map(str::to_string),
            source,
        }
    }
}
