//! The errors of the AMD compiler libraries (hiprtc and its target table): a file of value
//! types that `hiprtc` and `amd_targets` both import, so neither imports the other.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum HiprtcError {
    #[error("hiprtc not found (tried {tried}); install ROCm or Debian's libamdhip64-5 and libhiprtc-builtins5")]
    NotFound { tried: String },
    #[error("{reason}")]
    Unusable { reason: String },
    #[error("{library} has no symbol {symbol}")]
    MissingSymbol { library: String, symbol: String },
    #[error("hiprtc cannot compile for target `{target}`: {reason}; it supports {supported}")]
    UnsupportedTarget {
        target: String,
        reason: String,
        supported: String,
    },
    #[error("hiprtc could not compile kernel `{kernel}` for {target}:\n{log}")]
    Compile {
        kernel: String,
        target: String,
        log: String,
    },
    #[error("hiprtc call {call} failed: {message}")]
    Call { call: &'static str, message: String },
}
