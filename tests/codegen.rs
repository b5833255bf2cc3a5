//! Codegen: snapshots (in `snapshots/`) of every generated kernel for every example graph, fused
//! and unfused, for gfx90a, gfx1030 and sm_90, and of each platform's prelude. A template change
//! shows up as a diff to review.

#[path = "common/attention_graphs.rs"]
mod attention_graphs;
#[path = "common/files.rs"]
mod files;

use std::path::Path;

use attention_graphs::{build, Mask, Spec};
use rocmforge::codegen::{generate_with, prelude, CodegenError, CodegenOptions, Target};
use rocmforge::ir::{format, DType, Graph};
use rocmforge::passes::PassManager;

pub const TARGETS: [&str; 3] = ["gfx90a", "gfx1030", "sm_90"];

/// The graph as compiled: the default pipeline, or clean-up only without epilogues (unfused).
fn compiled(path: &Path, fused: bool) -> (Graph, CodegenOptions) {
    let mut g = format::load(path).unwrap();
    let pm = if fused {
        PassManager::default_pipeline()
    } else {
        PassManager::cleanup()
    };
    pm.run(&mut g).unwrap();
    (
        g,
        CodegenOptions {
            matmul_epilogues: fused,
        },
    )
}

#[test]
fn kernels_of_every_graph_fused_and_unfused_for_every_target() {
    for path in files::graph_files() {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        for fused in [true, false] {
            let (g, options) = compiled(&path, fused);
            for arch in TARGETS {
                let plan = generate_with(&g, &Target::parse(arch).unwrap(), &options).unwrap();
                assert!(!plan.kernels.is_empty());
                for k in &plan.kernels {
                    assert!(
                        k.body
                            .contains("extern \"C\" __global__ void __launch_bounds__"),
                        "{}",
                        k.entry
                    );
                    assert!(k.body.contains(&k.entry));
                    assert!(k.launch.grid.iter().all(|&d| d > 0) && k.launch.block[0] > 0);
                }
                let mode = if fused { "fused" } else { "unfused" };
                files::snapshot_settings().bind(|| {
                    insta::assert_snapshot!(
                        format!("kernels__{name}__{mode}__{arch}"),
                        plan.listing()
                    )
                });
            }
        }
    }
}

#[test]
fn preludes_per_target() {
    for arch in TARGETS {
        let t = Target::parse(arch).unwrap();
        let p = prelude(&t);
        assert!(p.contains(&format!("#define RF_WAVE {}", t.wave_size)));
        files::snapshot_settings().bind(|| insta::assert_snapshot!(format!("prelude__{arch}"), p));
    }
}

#[test]
fn unknown_arch_is_a_typed_error() {
    for bad in ["gfx", "cuda", "sm_", "gfx90a:sramecc", "rdna3"] {
        assert!(
            matches!(Target::parse(bad), Err(CodegenError::UnknownArch { .. })),
            "{bad}"
        );
    }
}

#[test]
fn unfused_attention_has_its_own_kernels() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/attention_padding_mask.json");
    let (g, options) = compiled(&path, false);
    let plan = generate_with(&g, &Target::parse("gfx90a").unwrap(), &options).unwrap();
    let families: Vec<&str> = plan.kernels.iter().map(|k| k.family).collect();
    assert!(!families.contains(&"flash_attention"));
    let mm = families.iter().filter(|f| **f == "matmul").count();
    assert_eq!(mm, 2, "QKᵀ and ·V: {families:?}");
    assert!(
        families.contains(&"softmax") && families.contains(&"elementwise"),
        "{families:?}"
    );
    let (g, options) = compiled(&path, true);
    let plan = generate_with(&g, &Target::parse("gfx90a").unwrap(), &options).unwrap();
    assert!(plan.kernels.iter().any(|k| k.family == "flash_attention"));
}

/// f16/bf16 attention with head sizes in multiples of 16 runs on tensor cores where the target's
/// table has an mma.sync atom and cp.async (NVIDIA sm_80+); every other case keeps the scalar
/// kernel. The f16 kernel is
/// snapshotted for review like the others.
#[test]
fn tensor_core_attention_only_where_the_target_has_it() {
    let family = |dtype: DType, d: usize, arch: &str| -> String {
        let mut g = build(&Spec {
            dtype,
            mask: Mask::Padding,
            cast_softmax: dtype != DType::F32,
            ..Spec::new(2, 4, 100, d)
        });
        PassManager::default_pipeline().run(&mut g).unwrap();
        let plan = generate_with(
            &g,
            &Target::parse(arch).unwrap(),
            &CodegenOptions::default(),
        )
        .unwrap();
        let k = plan
            .kernels
            .iter()
            .find(|k| k.family == "flash_attention")
            .expect("fused attention");
        if arch == "sm_90" && dtype == DType::F16 && d == 64 {
            files::snapshot_settings().bind(|| {
                insta::assert_snapshot!("kernels__tensor_core_attention_f16__sm_90", k.body)
            });
        }
        if k.body.contains("rf_m16n8k16_f16_mma(") {
            "mma f16".into()
        } else if k.body.contains("rf_m16n8k16_bf16_mma(") {
            "mma bf16".into()
        } else {
            "scalar".into()
        }
    };
    assert_eq!(family(DType::F16, 64, "sm_90"), "mma f16");
    assert_eq!(family(DType::BF16, 128, "sm_80"), "mma bf16");
    assert_eq!(family(DType::F16, 64, "sm_75"), "scalar");
    assert_eq!(family(DType::F16, 80, "sm_90"), "mma f16");
    assert_eq!(family(DType::F16, 72, "sm_90"), "scalar");
    assert_eq!(family(DType::F16, 256, "sm_90"), "scalar");
    assert_eq!(family(DType::F32, 64, "sm_90"), "scalar");
    assert_eq!(family(DType::F16, 64, "gfx90a"), "scalar");
    assert_eq!(family(DType::F16, 64, "sm_89"), "mma f16");
    assert_eq!(family(DType::BF16, 64, "sm_120"), "mma bf16");
    assert_eq!(family(DType::F16, 64, "sm_70"), "scalar");
    // MFMA and WMMA atoms exist, but the tensor-core kernel is written for mma.sync's layouts.
    assert_eq!(family(DType::F16, 64, "gfx942"), "scalar");
    assert_eq!(family(DType::BF16, 64, "gfx1100"), "scalar");
}
