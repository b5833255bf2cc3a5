//! Element types and the rounding rules of the reduced-precision ones.

use half::{bf16, f16};

use serde::{Deserialize, Serialize};
use std::fmt;

/// The element types a tensor in the graph can have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F16,
    BF16,
    I32,
    I64,
    Bool,
}

impl DType {
    pub const ALL: [DType; 6] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::Bool,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
        }
    }

    pub fn parse(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::Bool => 1,
        }
    }

    /// The design's tolerance: the largest relative L2 error against the f32 interpreter a
    /// result of this dtype may have (f32 1e-5, f16 2e-3, bf16 1e-2); integers and booleans
    /// must match exactly. `compile`'s bundle comparison and the tests all read it here.
    pub fn tolerance(self) -> f64 {
        match self {
            DType::F32 => 1e-5,
            DType::F16 => 2e-3,
            DType::BF16 => 1e-2,
            DType::I32 | DType::I64 | DType::Bool => 0.0,
        }
    }

    /// The most negative finite value: what "dtype-min" masks fill with.
    pub fn min_value(self) -> f64 {
        match self {
            DType::F32 => f32::MIN as f64,
            DType::F16 => f16::MIN.to_f64(),
            DType::BF16 => bf16::MIN.to_f64(),
            DType::I32 => i32::MIN as f64,
            DType::I64 => i64::MIN as f64,
            DType::Bool => 0.0,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
