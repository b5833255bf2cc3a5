//! Quantized weights: the value the interpreter computes with is the blocks dequantized in f32
//! and rounded to the weight's dtype, bit for bit what a dense weight holding those values gives.

use rocmforge::interp::{run, Bindings, InterpError};
use rocmforge::ir::{
    random_input, random_quant, DType, Graph, GraphError, Op, QuantScheme, Sample, Shape, Tensor,
};

/// `silu(x · Wᵀ)` with W [n, k] quantized (`scheme`) or dense (`None`).
fn layer(dtype: DType, scheme: Option<QuantScheme>, m: usize, n: usize, k: usize) -> Graph {
    let mut g = Graph::new("layer");
    let x = g.input("x", dtype, &[m, k]).unwrap();
    let w = match scheme {
        Some(s) => g.weight_quant("w", dtype, &[n, k], s).unwrap(),
        None => g.weight("w", dtype, &[n, k]).unwrap(),
    };
    let wt = g.permute(w, &[1, 0]).unwrap();
    let y = g.matmul(x, wt).unwrap();
    let y = g.unary(rocmforge::ir::UnaryOp::Silu, y).unwrap();
    g.add_output(y).unwrap();
    g
}

#[test]
fn a_quantized_weight_is_its_dequantized_value_bit_for_bit() {
    for scheme in QuantScheme::ALL {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let (m, n, k) = (3, 17, 3 * scheme.block_elems());
            let blocks = random_quant("w", scheme, &Shape(vec![n, k]), 5).unwrap();
            let x = random_input(
                "x",
                &rocmforge::ir::TensorType::new(dtype, vec![m, k]),
                &Sample::Normal,
                1,
            )
            .unwrap();
            let q = layer(dtype, Some(scheme), m, n, k);
            let mut bq = Bindings::default().with_input("x", x.clone());
            bq.quantized.insert("w".into(), blocks.clone());
            let got = run(&q, &bq).unwrap().remove(0);
            let d = layer(dtype, None, m, n, k);
            let mut bd = Bindings::default().with_input("x", x);
            bd.weights
                .insert("w".into(), blocks.to_tensor(dtype).unwrap());
            let want = run(&d, &bd).unwrap().remove(0);
            assert_eq!(got, want, "{scheme} {dtype}");
        }
    }
}

#[test]
fn unbound_blocks_are_seeded() {
    let g = layer(DType::F32, Some(QuantScheme::Q4_1), 2, 5, 64);
    let b = Bindings::try_random(&g, 3).unwrap();
    let first = run(&g, &b).unwrap().remove(0);
    assert_eq!(first, run(&g, &b).unwrap().remove(0));
    let mut with = b.clone();
    with.quantized.insert(
        "w".into(),
        random_quant("w", QuantScheme::Q4_1, &Shape(vec![5, 64]), 3).unwrap(),
    );
    assert_eq!(first, run(&g, &with).unwrap().remove(0));
    assert!(first.to_f64_vec().iter().any(|&v| v != 0.0));
}

#[test]
fn a_row_of_partial_blocks_is_a_typed_error() {
    let mut g = Graph::new("bad");
    let err = g
        .weight_quant("w", DType::F32, &[4, 40], QuantScheme::Q8_0)
        .unwrap_err();
    assert!(
        matches!(&err, GraphError::BadAttribute { reason, .. } if reason.contains("rows of 40")),
        "{err}"
    );
    let err = g
        .weight_quant("w", DType::I32, &[4, 32], QuantScheme::Q8_0)
        .unwrap_err();
    assert!(matches!(err, GraphError::BadAttribute { .. }), "{err}");
}

#[test]
fn bindings_that_are_not_the_declared_blocks_are_refused() {
    let g = layer(DType::F32, Some(QuantScheme::Q4_0), 1, 3, 32);
    let x = Tensor::from_f32(DType::F32, vec![1, 32], vec![0.5; 32]).unwrap();
    let shape = Shape(vec![3, 32]);
    let bind = |q: Option<QuantScheme>, dense: bool| {
        let mut b = Bindings::default().with_input("x", x.clone());
        if let Some(s) = q {
            b.quantized
                .insert("w".into(), random_quant("w", s, &shape, 0).unwrap());
        }
        if dense {
            b.weights.insert(
                "w".into(),
                Tensor::from_f32(DType::F32, vec![3, 32], vec![1.0; 96]).unwrap(),
            );
        }
        run(&g, &b)
    };
    assert!(bind(Some(QuantScheme::Q4_0), false).is_ok());
    for (q, dense) in [(Some(QuantScheme::Q8_0), false), (None, true)] {
        match bind(q, dense) {
            Err(InterpError::QuantBinding { name, .. }) if name == "w" => {}
            other => panic!("{q:?} dense={dense}: {other:?}"),
        }
    }
    // Blocks bound to a dense weight are refused too.
    let d = layer(DType::F32, None, 1, 3, 32);
    let mut b = Bindings::default().with_input("x", x);
    b.quantized.insert(
        "w".into(),
        random_quant("w", QuantScheme::Q4_0, &shape, 0).unwrap(),
    );
    assert!(matches!(run(&d, &b), Err(InterpError::QuantBinding { .. })));
}

#[test]
fn the_file_format_keeps_the_scheme() {
    let g = layer(DType::F16, Some(QuantScheme::Q4_1), 2, 3, 64);
    let text = rocmforge::ir::format::to_json_string(&g).unwrap();
    assert!(text.contains("\"quant\": \"q4_1\""), "{text}");
    let back = rocmforge::ir::format::from_json_str(&text).unwrap();
    let w = back.find("w").unwrap();
    assert!(matches!(
        back.op(w),
        Op::Weight {
            quant: Some(QuantScheme::Q4_1),
            ..
        }
    ));
}
