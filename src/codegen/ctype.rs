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

/// An i64 literal of type `long long`. The most negative value is written as an expression:
/// `-9223372036854775808LL` is the negation of a literal too large for `long long`, which C
/// makes unsigned.
pub(crate) fn i64_literal(v: i64) -> String {
    if v == i64::MIN {
        "(-9223372036854775807LL - 1LL)".into()
    } else if v < 0 {
        format!("({v}LL)")
    } else {
        format!("{v}LL")
    }
}

/// An f64 literal (a C `double`) that reads back exactly, for attributes computed in double;
/// `None` for NaN and infinities, which have no literal.
pub(crate) fn f64_literal(v: f64) -> Option<String> {
    v.is_finite().then(|| {
        let s = format!("{v:e}");
        if v < 0.0 {
            format!("({s})")
        } else {
            s
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_read_back_exactly() {
        assert_eq!(i64_literal(i64::MIN), "(-9223372036854775807LL - 1LL)");
        assert_eq!(i64_literal(-5), "(-5LL)");
        assert_eq!(i64_literal(i64::MAX), "9223372036854775807LL");
        assert_eq!(f64_literal(10000.0).as_deref(), Some("1e4"));
        assert_eq!(f64_literal(-0.5).as_deref(), Some("(-5e-1)"));
        assert_eq!(f64_literal(f64::NAN), None);
        assert_eq!(f64_literal(f64::INFINITY), None);
        assert_eq!(f32_literal(f64::NAN), "NAN");
        assert_eq!(f32_literal(0.1), "1e-1f");
    }
}
