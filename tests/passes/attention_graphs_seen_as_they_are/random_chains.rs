//! Property: random chains either fuse exactly or are refused.

use super::*;
use proptest::prelude::*;

const DIMS: [usize; 4] = [2, 3, 5, 4];

/// Mask shapes that broadcast to the scores in their current view.
fn mask_shape(rank4: bool, which: usize) -> Vec<usize> {
    let [b, h, s, _] = DIMS;
    let shapes = if rank4 {
        [
            vec![1, 1, s, s],
            vec![b, 1, 1, s],
            vec![s, s],
            vec![1, h, 1, s],
        ]
    } else {
        [
            vec![1, s, s],
            vec![b * h, 1, s],
            vec![s, s],
            vec![b * h, s, s],
        ]
    };
    shapes[which % 4].clone()
}

/// Turns codes into steps that type-check: casts change the current dtype, masks fit the
/// current view, the probabilities end in the attention dtype `t` and rank 4.
fn steps(t: DType, codes: &[(u8, u8)], post: &[u8], axis_last: bool) -> Vec<Step> {
    let [b, h, s, _] = DIMS.map(|d| d as i64);
    let (mut dt, mut rank) = (t, 4);
    let dts = [F32, F16, BF16];
    let fill = |dt: DType, which: usize| match which % 4 {
        0 | 1 => NEG_INF,
        2 => dt.min_value(),
        _ => -1e4,
    };
    let mut out = Vec::new();
    for &(op, arg) in codes {
        let a = usize::from(arg);
        out.push(match op % 9 {
            0 => {
                dt = dts[a % 3];
                Cast(dt)
            }
            1 => Mul([0.5, 1.0 / 80f64.sqrt(), -0.3, 2.0][a % 4]),
            2 => Div([8f64.sqrt(), 3.0, -2.0, 0.7][a % 4]),
            3 => Add(mask_shape(rank == 4, a)),
            4 => Where(mask_shape(rank == 4, a), fill(dt, a / 4)),
            5 => MaskedFill(mask_shape(rank == 4, a), fill(dt, a / 4)),
            6 => Causal(i64::from(arg) % 5 - 2, fill(dt, a / 5)),
            7 => {
                rank = 7 - rank;
                Reshape(if rank == 4 {
                    vec![b, h, s, s]
                } else {
                    vec![b * h, s, s]
                })
            }
            // Rows moved: what follows would not fit, so the list ends here.
            _ => {
                rank = 0;
                out.push(Reshape(vec![b, h * s, s]));
                break;
            }
        });
    }
    out.push(Softmax(if axis_last { -1 } else { -2 }));
    for &c in post {
        dt = dts[usize::from(c) % 3];
        out.push(Cast(dt));
    }
    if dt != t {
        out.push(Cast(t));
    }
    if rank != 4 {
        out.push(Reshape(vec![b, h, s, s]));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_chains_fuse_exactly_or_are_refused(
        t in prop::sample::select(vec![F32, F16, BF16]),
        codes in prop::collection::vec((0u8..9, 0u8..40), 0..6),
        post in prop::collection::vec(0u8..3, 0..3),
        axis_last in prop::bool::weighted(0.9),
        seed in 0u64..1000,
    ) {
        let steps = steps(t, &codes, &post, axis_last);
        let g = Chain::new(t, DIMS, steps.clone()).build();
        let b = random(&g, seed);
        let (fused, reports) = optimize(&g).unwrap();
        let fa = reports.iter().find(|r| r.pass == "fuse_attention").unwrap();
        prop_assert_eq!(fa.rewrites.len() + fa.skipped.len(), 1, "{:?}: {}", steps, fa);
        if fa.rewrites.is_empty() {
            let (w, o) = (first_output(&g, &b), first_output(&fused, &b));
            let nan = |v: &[f64]| v.iter().map(|x| x.is_nan()).collect::<Vec<_>>();
            prop_assert_eq!(nan(&w), nan(&o));
        } else {
            assert_fuses(&g, &b);
        }
    }
}
