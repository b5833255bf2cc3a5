//! How each dtype is stored in device memory and read into arithmetic: f16/bf16 are 16-bit
//! storage converted to and from f32; integers and bools compute as `long long`.

use crate::ir::DType;

pub(crate) struct CType {
    /// Element type in memory.
    pub storage: &'static str,
    /// Type of a loaded value in arithmetic.
    pub value: &'static str,
    pub load_pre: &'static str,
    pub load_post: &'static str,
    pub store_pre: &'static str,
    pub store_post: &'static str,
}

pub(crate) fn ctype(dt: DType) -> CType {
    let c = |storage, value, load_pre, load_post, store_pre, store_post| CType {
        storage,
        value,
        load_pre,
        load_post,
        store_pre,
        store_post,
    };
    match dt {
        DType::F32 => c("float", "float", "", "", "", ""),
        DType::F16 => c("rf_half", "float", "rf_h2f(", ")", "rf_f2h(", ")"),
        DType::BF16 => c("rf_bf16", "float", "rf_b2f(", ")", "rf_f2b(", ")"),
        DType::I32 => c("int", "long long", "(long long)", "", "(int)(", ")"),
        DType::I64 => c("long long", "long long", "", "", "", ""),
        DType::Bool => c(
            "unsigned char",
            "long long",
            "(long long)",
            "",
            "(unsigned char)((",
            ") != 0)",
        ),
    }
}

/// An f32 literal that reads back exactly (shortest round-trip form).
pub(crate) fn f32_literal(v: f64) -> String {
    let f = v as f32;
    if f.is_nan() {
        "NAN".into()
    } else if f == f32::INFINITY {
        "INFINITY".into()
    } else if f == f32::NEG_INFINITY {
        "(-INFINITY)".into()
    } else {
        let s = format!("{f:e}");
        if f < 0.0 {
            format!("({s}f)")
        } else {
            format!("{s}f")
        }
    }
}
