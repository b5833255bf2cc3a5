//! One semantics: constant folding against the interpreter, bit for bit.

use super::*;

// ---- one semantics: constant folding against the interpreter, bit for bit ------------------

/// Bits of every element, with every NaN alike (payloads are not part of the semantics).
fn element_bits(t: &Tensor) -> Vec<u64> {
    match (t.as_f32(), t.as_i64()) {
        (Some(f), _) => f
            .iter()
            .map(|x| {
                if x.is_nan() {
                    u64::MAX
                } else {
                    u64::from(x.to_bits())
                }
            })
            .collect(),
        (_, Some(i)) => i.iter().map(|&x| x as u64).collect(),
        _ => unreachable!(),
    }
}

/// Builds `op` over every combination of edge constants, folds a copy, and checks that the
/// interpreter reads the same bits from the folded constants as it computes unfolded, and that
/// everything an f64 can hold was folded.
fn check_fold(
    what: &str,
    dts: &[DType],
    build: impl Fn(&mut Graph, &[rocmforge::ir::NodeId]) -> rocmforge::ir::NodeId,
) {
    use rocmforge::interp::{run, Bindings};
    use rocmforge::passes::{ConstantFold, PassManager};
    let mut g = Graph::new(what);
    let columns: Vec<Vec<f64>> = dts.iter().map(|&dt| edge_cases::edge_values(dt)).collect();
    let mut combos: Vec<Vec<usize>> = vec![vec![]];
    for c in &columns {
        combos = combos
            .into_iter()
            .flat_map(|p| {
                (0..c.len()).map(move |i| {
                    let mut p = p.clone();
                    p.push(i);
                    p
                })
            })
            .collect();
    }
    let mut outs = Vec::new();
    for combo in &combos {
        let operands: Vec<_> = combo
            .iter()
            .zip(dts)
            .zip(&columns)
            .map(|((&i, &dt), c)| g.constant(dt, &[], vec![c[i]]).unwrap())
            .collect();
        outs.push(build(&mut g, &operands));
    }
    g.set_outputs(&outs).unwrap();
    let mut folded = g.clone();
    PassManager::new()
        .with(ConstantFold)
        .run(&mut folded)
        .unwrap();
    let want = run(&g, &Bindings::default()).unwrap();
    let got = run(&folded, &Bindings::default()).unwrap();
    for (k, (w, f)) in want.iter().zip(&got).enumerate() {
        let args: Vec<f64> = combos[k].iter().zip(&columns).map(|(&i, c)| c[i]).collect();
        assert_eq!(
            element_bits(f),
            element_bits(w),
            "{what} {dts:?} on {args:?}: folded {f:?}, interpreted {w:?}"
        );
        let id = folded.outputs()[k];
        // An integer past 2^53 may not be an f64 (constants hold f64s): it stays unfolded.
        let exact = w
            .as_i64()
            .is_none_or(|i| i[0] != i64::MAX && (i[0] as f64) as i64 == i[0]);
        if exact {
            assert!(
                matches!(folded.op(id), rocmforge::ir::Op::Constant { .. }),
                "{what} {dts:?} on {args:?} was not folded"
            );
        }
    }
}

#[test]
fn constant_folding_matches_the_interpreter_bit_for_bit_on_edge_values() {
    use rocmforge::ir::Op;
    let ints = [DType::I32, DType::I64];
    for op in UnaryOp::ALL {
        let dts: Vec<DType> = FLOATS
            .into_iter()
            .chain(if matches!(op, UnaryOp::Neg | UnaryOp::Abs) {
                ints.to_vec()
            } else {
                vec![]
            })
            .collect();
        for dt in dts {
            check_fold(op.name(), &[dt], |g, x| g.unary(op, x[0]).unwrap());
        }
    }
    for op in BinaryOp::ALL {
        let mut dts = FLOATS.to_vec();
        if !op.float_only() {
            dts.extend(ints);
        }
        if op == BinaryOp::Equal {
            dts.push(DType::Bool);
        }
        for dt in dts {
            check_fold(op.name(), &[dt, dt], |g, x| {
                g.binary(op, x[0], x[1]).unwrap()
            });
        }
    }
    for from in DType::ALL {
        for to in DType::ALL {
            check_fold("cast", &[from], |g, x| {
                g.add_op(Op::Cast { to }, &[x[0]]).unwrap()
            });
        }
    }
}

#[test]
fn casts_follow_the_documented_table() {
    let cast = |dt: DType, v: Vec<f64>, to: DType| {
        let t = Tensor::from_f64(dt, vec![v.len()], &v).unwrap();
        run_op(&[&t], |g, i| g.cast(i[0], to).unwrap())
    };
    let (inf, nan) = (f64::INFINITY, f64::NAN);
    // Float → integer: toward zero, saturating, NaN → 0.
    let to_i32 = cast(
        DType::F32,
        vec![nan, inf, -inf, 3e9, -3e9, 2.9, -2.9, -0.0],
        DType::I32,
    );
    let (max, min) = (i64::from(i32::MAX), i64::from(i32::MIN));
    assert_eq!(to_i32.as_i64().unwrap(), &[0, max, min, max, min, 2, -2, 0]);
    let to_i64 = cast(DType::F16, vec![nan, inf, -inf, -65504.0], DType::I64);
    assert_eq!(to_i64.as_i64().unwrap(), &[0, i64::MAX, i64::MIN, -65504]);
    // Anything → bool: non-zero, NaN included.
    let to_bool = cast(DType::F32, vec![nan, -0.0, inf, 1e-45], DType::Bool);
    assert_eq!(to_bool.as_i64().unwrap(), &[1, 0, 1, 1]);
    // To f16: nearest, ties to even, overflow to ±∞.
    let to_f16 = cast(
        DType::F32,
        vec![65519.0, 65520.0, -65520.0, 1e-8],
        DType::F16,
    );
    assert_eq!(
        to_f16.as_f32().unwrap(),
        &[65504.0, f32::INFINITY, f32::NEG_INFINITY, 0.0]
    );
    // Integer → narrower integer wraps; integer → bf16 goes through f32, as PyTorch does:
    // 2^25 + 2^17 + 1 is 2^25 + 2^17 in f32, a tie that rounds to even 2^25 in bf16.
    let to_i32 = cast(
        DType::I64,
        vec![4294967301.0, 2147483648.0, -2147483649.0],
        DType::I32,
    );
    assert_eq!(to_i32.as_i64().unwrap(), &[5, min, max]);
    let to_bf16 = cast(DType::I64, vec![33685505.0], DType::BF16);
    assert_eq!(to_bf16.as_f32().unwrap(), &[33554432.0]);
}

#[test]
fn maximum_and_minimum_order_signed_zeros_and_propagate_nan() {
    let a = Tensor::from_f32(DType::F32, vec![4], vec![-0.0, 0.0, f32::NAN, 1.0]).unwrap();
    let b = Tensor::from_f32(DType::F32, vec![4], vec![0.0, -0.0, 1.0, f32::NAN]).unwrap();
    let max = run_op(&[&a, &b], |g, i| g.maximum(i[0], i[1]).unwrap());
    let min = run_op(&[&a, &b], |g, i| g.minimum(i[0], i[1]).unwrap());
    let (mx, mn) = (max.as_f32().unwrap(), min.as_f32().unwrap());
    // IEEE 754-2019 maximum/minimum: −0 < +0 whatever the operand order.
    assert_eq!(mx[0].to_bits(), 0f32.to_bits());
    assert_eq!(mx[1].to_bits(), 0f32.to_bits());
    assert_eq!(mn[0].to_bits(), (-0f32).to_bits());
    assert_eq!(mn[1].to_bits(), (-0f32).to_bits());
    assert!(mx[2].is_nan() && mx[3].is_nan() && mn[2].is_nan() && mn[3].is_nan());
}

#[test]
fn integer_arithmetic_wraps_at_the_dtype_width() {
    let a = Tensor::from_i64(
        DType::I32,
        vec![3],
        vec![i64::from(i32::MAX), i64::from(i32::MIN), 65536],
    )
    .unwrap();
    let b = Tensor::from_i64(DType::I32, vec![3], vec![1, -1, 65536]).unwrap();
    let add = run_op(&[&a, &b], |g, i| g.add(i[0], i[1]).unwrap());
    assert_eq!(
        add.as_i64().unwrap(),
        &[i64::from(i32::MIN), i64::from(i32::MAX), 131072]
    );
    let mul = run_op(&[&a, &b], |g, i| g.mul(i[0], i[1]).unwrap());
    assert_eq!(
        mul.as_i64().unwrap(),
        &[i64::from(i32::MAX), i64::from(i32::MIN), 0]
    );
    let neg = run_op(&[&a], |g, i| g.neg(i[0]).unwrap());
    assert_eq!(neg.as_i64().unwrap()[1], i64::from(i32::MIN));
    // Comparisons see the wrapped value: i32::MAX + 1 is negative.
    let zero = Tensor::from_i64(DType::I32, vec![], vec![0]).unwrap();
    let mut g = Graph::new("wrap");
    let (x, y, z) = (
        g.input("a", DType::I32, &[3]).unwrap(),
        g.input("b", DType::I32, &[3]).unwrap(),
        g.input("c", DType::I32, &[]).unwrap(),
    );
    let s = g.add(x, y).unwrap();
    let lt = g.less(s, z).unwrap();
    g.add_output(lt).unwrap();
    let out = run_with(
        &g,
        vec![("a", a.clone()), ("b", b.clone()), ("c", zero.clone())],
    );
    assert_eq!(out.as_i64().unwrap(), &[1, 0, 0]);
    // Fused, the sum still wraps before the comparison.
    let (fused, _) = rocmforge::passes::optimize(&g).unwrap();
    assert!(fused
        .node_ids()
        .any(|id| matches!(fused.op(id), rocmforge::ir::Op::FusedElementwise(_))));
    let out = run_with(&fused, vec![("a", a), ("b", b), ("c", zero)]);
    assert_eq!(out.as_i64().unwrap(), &[1, 0, 0]);
}
