//! Errors of devices, buffers, kernel compilation and the kernel cache.

use thiserror::Error;

use super::rtc_error::HiprtcError;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum RuntimeError {
    #[error("no device `{spec}`: {reason}")]
    NoDevice { spec: String, reason: String },
    #[error("device `{spec}`: {reason} (expected cpu, cuda:N or hip:N)")]
    DeviceSpec { spec: String, reason: String },
    #[error("{var}: {source}")]
    FromEnv {
        var: &'static str,
        source: Box<RuntimeError>,
    },
    #[error(transparent)]
    Hiprtc(#[from] HiprtcError),
    #[error("NVRTC could not compile kernel `{kernel}` for {target}:\n{log}")]
    Nvrtc {
        kernel: String,
        target: String,
        log: String,
    },
    /// A compiler library that is absent or unusable here (asked for without a device).
    #[error("no {what} here: {reason}")]
    NoCompiler { what: &'static str, reason: String },
    #[error("CUDA: {0}")]
    Cuda(String),
    /// A TMA tensor map the device would not encode, or one that would reach past its buffer.
    #[error("TMA tensor map ({map}): {reason}")]
    TensorMap { map: String, reason: String },
    #[error("HIP: {0}")]
    Hip(String),
    #[error("device memory budget exceeded: {requested} bytes requested with {in_use} of {budget} in use")]
    OverBudget {
        requested: usize,
        in_use: usize,
        budget: usize,
    },
    /// A launch past what the device reports it can run (checked before the launch, so a grid
    /// is never cut short by the driver).
    #[error("kernel launch needs {what} = {requested}, past this device's limit of {limit}")]
    LaunchLimit {
        what: &'static str,
        requested: u64,
        limit: u64,
    },
    /// An in-place write or copy of more bytes than the buffer holds.
    #[error("{what} of {bytes} bytes into a device buffer of {buffer}")]
    BufferSize {
        what: &'static str,
        bytes: usize,
        buffer: usize,
    },
    #[error("kernel cache at {path}: {message}")]
    Cache { path: String, message: String },
}

impl RuntimeError {
    /// This error, as the value of environment variable `var` caused it.
    pub fn in_env(self, var: &'static str) -> RuntimeError {
        RuntimeError::FromEnv {
            var,
            source: Box::new(self),
        }
    }
}
