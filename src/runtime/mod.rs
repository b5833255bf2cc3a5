//! The runtime: run-time compilation and, later, devices, buffers and streams. The only home of
//! `unsafe` FFI; every unsafe block says why it holds.

pub mod amd_metadata;
pub mod hiprtc;

pub use amd_metadata::{
    parse_code_object, report_table, CodeObjectInfo, KernelResources, MetadataError,
};
pub use hiprtc::{Hiprtc, HiprtcError};
