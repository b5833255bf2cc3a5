//! Target facts at the ground floor: what each processor can do (a row per processor in
//! `amd.rs` and `nvidia.rs`), its matrix instructions as data (`mma`), the launch limits kernels
//! are generated within, and the keys tuning results are stored under. Codegen, the runtime and
//! `compile` all read these; this module uses nothing of ours above `ir`.

mod amd;
mod caps;
mod compiler;
pub mod mma;
mod nvidia;
mod target;
pub mod tma;
pub mod tuning;

use thiserror::Error;

pub use caps::{Arch, ArchSpecific, AsyncCopy, Dot4, Registers};
pub use compiler::compiler_options;
pub use target::{arch, arches, device_processor, LaunchLimits, Platform, Target};
pub use tuning::{Choice, Family, TuneKey, TuneMask, TuneProblem, TuneSite, Tuned};

#[derive(Debug, Error, Clone, PartialEq)]
pub enum ArchError {
    #[error("unknown target arch `{arch}`: {reason}")]
    UnknownArch { arch: String, reason: String },
}
