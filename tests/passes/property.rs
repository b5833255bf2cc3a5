//! Property: fused = unfused over random attention shapes and forms.

use super::*;
use proptest::prelude::*;

fn spec_strategy() -> impl Strategy<Value = Spec> {
    (
        (
            1usize..3,
            1usize..4,
            1usize..4,
            1usize..13,
            1usize..13,
            prop::sample::select(vec![1usize, 2, 4, 8, 16]),
        ),
        prop::sample::select(vec![
            Mask::None,
            Mask::Padding,
            Mask::Dense2d,
            Mask::PerHead,
            Mask::BoolNegInf,
            Mask::BoolMin,
            Mask::Causal,
            Mask::CausalTril,
        ]),
        prop::sample::select(vec![
            Scale::MulScores,
            Scale::MulScoresLeft,
            Scale::DivScores,
            Scale::OnQ,
            Scale::SqrtOnBoth,
            Scale::None,
        ]),
        prop::sample::select(vec![DType::F32, DType::F16, DType::BF16]),
        (
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            -3i64..4,
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                (b, hkv, group, sq, sk, d),
                mask,
                scale,
                dtype,
                (pre_t, rank3, cast, offset, view),
            )| {
                let gqa = group > 1;
                Spec {
                    b,
                    hq: hkv * group,
                    hkv,
                    sq,
                    sk,
                    d,
                    dtype,
                    scale,
                    mask,
                    k_pretransposed: pre_t && !gqa,
                    cast_softmax: cast && dtype != DType::F32,
                    // 3-D scores take the 4-D masks only through the 4-D view.
                    rank3: rank3
                        && !gqa
                        && (view || !matches!(mask, Mask::PerHead | Mask::Padding)),
                    view,
                    // A negative offset with a finite fill is refused by design; keep those ≥ 0.
                    offset,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn fused_equals_unfused(spec in spec_strategy(), seed in 0u64..1000) {
        let fused = fuse_spec(&spec, seed);
        prop_assert_eq!(attention_nodes(&fused).len(), 1, "{:?}", spec);
    }
}
