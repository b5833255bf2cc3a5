//! Codegen: snapshots (in `snapshots/`) of every generated kernel for every example graph, fused
//! and unfused, for gfx90a, gfx1030 and sm_90, and of each platform's prelude. A template change
//! shows up as a diff to review.

#[path = "common/attention_graphs.rs"]
mod attention_graphs;
#[path = "common/edge_cases.rs"]
mod edge_cases;
#[path = "common/files.rs"]
mod files;
#[path = "common/gemm_cases.rs"]
mod gemm_cases;
#[path = "common/op_zoo.rs"]
mod op_zoo;

use std::path::Path;

use attention_graphs::{build, Mask, Spec};
use rocmforge::arch::{ArchError, Target};
use rocmforge::codegen::{
    generate, generate_with, prelude, BufferRole, CodegenError, CodegenOptions, F32Matmul,
    KernelPlan, TmaWidth, MAX_KERNEL_ARGS,
};
use rocmforge::compile::plan_memory;
use rocmforge::ir::expr::{MAX_INPUTS, MAX_OPS};
use rocmforge::ir::{format, BinaryOp, DType, Expr, Graph, GraphError, Op, UnaryOp};
use rocmforge::passes::PassManager;

pub const TARGETS: [&str; 3] = ["gfx90a", "gfx1030", "sm_90"];

/// The graph as compiled: the default pipeline, or clean-up only (unfused).
fn compiled(path: &Path, fused: bool) -> (Graph, CodegenOptions) {
    let mut g = format::load(path).unwrap();
    PassManager::pipeline(fused).run(&mut g).unwrap();
    (g, CodegenOptions::default())
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
            matches!(Target::parse(bad), Err(ArchError::UnknownArch { .. })),
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

/// f16/bf16 attention with head sizes in whole atom steps (up to 256) runs on the matrix cores
/// wherever the target's table has an atom for its type: mma.sync on NVIDIA sm_80+, MFMA on
/// CDNA, WMMA on RDNA3/4; every other case keeps the scalar kernel. The f16 kernel is
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
        let t = Target::parse(arch).unwrap();
        t.caps
            .mma
            .iter()
            .find(|a| k.body.contains(&format!("{}_mma(", a.prefix())))
            .map_or("scalar".to_string(), |a| a.name.to_string())
    };
    assert_eq!(family(DType::F16, 64, "sm_90"), "m16n8k16_f16");
    assert_eq!(family(DType::BF16, 128, "sm_80"), "m16n8k16_bf16");
    assert_eq!(family(DType::F16, 64, "sm_75"), "scalar");
    assert_eq!(family(DType::F16, 80, "sm_90"), "m16n8k16_f16");
    assert_eq!(family(DType::F16, 72, "sm_90"), "scalar");
    assert_eq!(family(DType::F16, 256, "sm_90"), "m16n8k16_f16");
    assert_eq!(family(DType::F16, 272, "sm_90"), "scalar");
    assert_eq!(family(DType::F32, 64, "sm_90"), "scalar");
    assert_eq!(family(DType::F16, 64, "sm_89"), "m16n8k16_f16");
    assert_eq!(family(DType::BF16, 64, "sm_120"), "m16n8k16_bf16");
    assert_eq!(family(DType::F16, 64, "sm_70"), "scalar");
    // AMD: the atom whose lanes hold the fewest C rows (softmax statistics per row).
    assert_eq!(family(DType::F16, 64, "gfx90a"), "mfma_16x16x16_f16");
    assert_eq!(family(DType::BF16, 128, "gfx942"), "mfma_16x16x16_bf16");
    assert_eq!(family(DType::BF16, 64, "gfx1100"), "wmma11_16x16x16_bf16");
    assert_eq!(family(DType::F16, 64, "gfx1201"), "wmma12_16x16x16_f16");
    assert_eq!(family(DType::F16, 64, "gfx1030"), "scalar");
}

/// Every graph a test here generates for: the examples and the op zoo, fused and unfused.
fn all_graphs() -> Vec<(Graph, bool)> {
    let mut graphs: Vec<Graph> = files::graph_files()
        .iter()
        .map(|p| format::load(p).unwrap())
        .collect();
    graphs.extend(op_zoo::zoo());
    let mut out = Vec::new();
    for g in graphs {
        for fused in [true, false] {
            let mut c = g.clone();
            PassManager::pipeline(fused).run(&mut c).unwrap();
            out.push((c, fused));
        }
    }
    out
}

fn plan_for(g: &Graph, arch: &str) -> Result<KernelPlan, CodegenError> {
    generate_with(g, &Target::parse(arch).unwrap(), &CodegenOptions::default())
}

/// Issue 11, item 3: the same graph with hostile names and with plain names gives
/// byte-identical kernels (bodies, entries, launches), and the plan listing shows every name
/// on one line, with nothing a C comment would act on.
#[test]
fn hostile_names_never_reach_kernel_source() {
    for (g, _) in all_graphs() {
        let hostile = op_zoo::with_hostile_names(&g);
        for arch in TARGETS {
            let (plain, bad) = (
                plan_for(&g, arch).unwrap(),
                plan_for(&hostile, arch).unwrap(),
            );
            assert_eq!(plain.kernels.len(), bad.kernels.len(), "{}", g.name);
            for (a, b) in plain.kernels.iter().zip(&bad.kernels) {
                assert_eq!(
                    a.body, b.body,
                    "{} on {arch}: a name changed a kernel",
                    g.name
                );
                assert_eq!((&a.entry, a.launch), (&b.entry, b.launch));
                assert_eq!(plain.source(a), bad.source(b));
            }
            let listing = bad.listing();
            assert_eq!(
                listing.lines().count(),
                plain.listing().lines().count(),
                "{}: a name broke a line of the listing",
                g.name
            );
            for bad_text in [
                "#define", "#include", "\\", "\0", "\r", "*/", "\u{2028}", "{{", "{%",
            ] {
                assert!(
                    !listing.contains(bad_text) || plain.listing().contains(bad_text),
                    "{}: the listing shows `{bad_text}` from a name",
                    g.name
                );
            }
        }
    }
}

/// Issue 11, item 4: every op with a zero-size dimension generates, launches no empty grid,
/// and every buffer a kernel binds or an output reads gets device memory (none for empty
/// ones: they share one slot of zero bytes).
#[test]
fn zero_size_dims_in_every_op_generate_and_get_memory() {
    for g in edge_cases::empty_graphs() {
        for fused in [true, false] {
            let mut c = g.clone();
            PassManager::pipeline(fused).run(&mut c).unwrap();
            for arch in TARGETS {
                let plan = plan_for(&c, arch).unwrap();
                for k in &plan.kernels {
                    assert!(k.launch.grid.iter().all(|&d| d > 0), "{}", k.entry);
                    // A head size of 0 keeps the scalar kernel: tensor-core fragments of 0
                    // columns would be zero-length arrays.
                    assert!(!k.body.contains("rf_mma_") || !c.name.contains("_d0_"));
                    for array in ["qr[0]", "acc[0]", "qf[0]", "o[0]"] {
                        assert!(!k.body.contains(array), "{}: zero-length {array}", k.entry);
                    }
                }
                let memory = plan_memory(&plan);
                let bound = plan
                    .kernels
                    .iter()
                    .flat_map(|k| k.args.iter().copied())
                    .chain(plan.outputs.iter().map(|o| o.buffer));
                for b in bound {
                    if plan.buffers[b].role == BufferRole::Computed {
                        let slot = memory.slot_of.get(&b).unwrap_or_else(|| {
                            panic!("{}: %{} has no memory", c.name, plan.buffers[b].name)
                        });
                        let need = plan.buffers[b].ty.shape.numel()
                            * plan.buffers[b].ty.dtype.size_bytes();
                        assert!(memory.slot_bytes[*slot] >= need);
                    }
                }
            }
        }
    }
    // Rows of no elements still check their indices: a gather kernel runs (it checks them).
    let g = edge_cases::empty_graphs()
        .into_iter()
        .find(|g| g.name == "empty_gather")
        .unwrap();
    let plan = generate(&g, &Target::parse("gfx90a").unwrap()).unwrap();
    let families: Vec<&str> = plan.kernels.iter().map(|k| k.family).collect();
    assert_eq!(
        families,
        ["gather", "gather"],
        "the empty index list needs nothing; the two others are checked"
    );
    assert_eq!(plan.checks.len(), 2);
}

fn refusal(g: &Graph) -> CodegenError {
    match generate(g, &Target::parse("sm_90").unwrap()) {
        Err(e) => e,
        Ok(_) => panic!("{}: generated", g.name),
    }
}

/// Issue 11, item 4: a launch past the target's limits is a typed error naming the node, the
/// dimension and the limit — never a grid cut to 32 bits. Shapes only: nothing is allocated.
#[test]
fn launches_past_the_target_limits_are_typed_errors() {
    let limit = |e: CodegenError| match e {
        CodegenError::LaunchLimit {
            node,
            what,
            value,
            limit,
        } => (node, what, value, limit),
        other => panic!("not a launch limit: {other:?}"),
    };
    // 2⁴⁰ elements, one thread each: 2³² blocks, whose low 32 bits are 0.
    let mut g = Graph::new("wide");
    let x = g.input("x", DType::F32, &[1 << 40]).unwrap();
    let y = g.neg(x).unwrap();
    g.add_output(y).unwrap();
    assert_eq!(
        limit(refusal(&g)),
        (
            g.node(y).name.clone(),
            "grid.x".into(),
            1 << 32,
            i32::MAX as u64
        )
    );
    // 65536 row tiles of 64 rows.
    let mut g = Graph::new("tall");
    let a = g.input("a", DType::F32, &[65536 * 64, 1]).unwrap();
    let b = g.input("b", DType::F32, &[1, 1]).unwrap();
    let m = g.matmul(a, b).unwrap();
    g.add_output(m).unwrap();
    assert_eq!(limit(refusal(&g)).1, "grid.y");
    let mut g = Graph::new("batched");
    let a = g.input("a", DType::F32, &[65536, 1, 1]).unwrap();
    let b = g.input("b", DType::F32, &[1, 1]).unwrap();
    let m = g.matmul(a, b).unwrap();
    g.add_output(m).unwrap();
    assert_eq!(limit(refusal(&g)).1, "grid.z");
    // One block per softmax row: 2³¹ rows.
    let mut g = Graph::new("rows");
    let x = g.input("x", DType::F16, &[1 << 31, 1]).unwrap();
    let s = g.softmax(x, -1).unwrap();
    g.add_output(s).unwrap();
    assert_eq!(limit(refusal(&g)).2, 1 << 31);
    // Attention query blocks past grid.y: more rows than 65535 blocks of 128 (the most rows
    // any attention kernel's block takes) cover.
    let mut g = Graph::new("long_queries");
    let q = g
        .input("q", DType::F32, &[1, 1, 65536 * 128 + 1, 64])
        .unwrap();
    let k = g.input("k", DType::F32, &[1, 1, 1, 64]).unwrap();
    let v = g.input("v", DType::F32, &[1, 1, 1, 64]).unwrap();
    let o = g.flash_attention(q, k, v, None, 0.125, None).unwrap();
    g.add_output(o).unwrap();
    assert_eq!(limit(refusal(&g)).1, "grid.y");
}

/// Issue 11, items 4 and 5: a length a kernel holds in an `int` (a softmax row, a normalised
/// axis, a matmul contraction) past its range is a typed error, not a loop that wraps.
#[test]
fn int_indexed_sizes_past_32_bits_are_typed_errors() {
    let big = (i32::MAX as usize) + 1;
    let range = |e: CodegenError| match e {
        CodegenError::IndexRange { value, limit, .. } => {
            assert!(value > limit);
            value
        }
        other => panic!("not an index range error: {other:?}"),
    };
    let mut g = Graph::new("long_row");
    let x = g.input("x", DType::F32, &[1, big]).unwrap();
    let s = g.softmax(x, -1).unwrap();
    g.add_output(s).unwrap();
    assert_eq!(range(refusal(&g)), big as u64);
    let mut g = Graph::new("long_norm");
    let x = g.input("x", DType::F32, &[1, big]).unwrap();
    let w = g.weight("w", DType::F32, &[big]).unwrap();
    let y = g.rms_norm(x, w, 1e-6).unwrap();
    g.add_output(y).unwrap();
    assert_eq!(range(refusal(&g)), big as u64);
    let mut g = Graph::new("long_contraction");
    let a = g.input("a", DType::F32, &[1, big]).unwrap();
    let b = g.input("b", DType::F32, &[big, 1]).unwrap();
    let m = g.matmul(a, b).unwrap();
    g.add_output(m).unwrap();
    assert_eq!(range(refusal(&g)), big as u64);
}

/// Issue 11, item 4: a fused node is bounded before it reaches codegen: past
/// `ir::expr::MAX_INPUTS` operands or `ir::expr::MAX_OPS` ops it is a typed graph error, so no
/// kernel gets more parameters than [`MAX_KERNEL_ARGS`] (checked again in codegen, see
/// `codegen::limits`), and the widest fused node allowed generates.
#[test]
fn fused_nodes_are_bounded_before_codegen() {
    let wide = |n: usize| {
        let mut g = Graph::new("wide_fusion");
        let xs: Vec<_> = (0..n)
            .map(|i| g.input(&format!("x{i}"), DType::F32, &[4]).unwrap())
            .collect();
        let mut e = Expr::Input(0);
        for i in 1..n {
            e = Expr::Binary(BinaryOp::Add, Box::new(e), Box::new(Expr::Input(i)));
        }
        let f = g.add_op(Op::FusedElementwise(e), &xs);
        (g, f)
    };
    let (mut g, f) = wide(MAX_INPUTS);
    g.add_output(f.unwrap()).unwrap();
    let t = Target::parse("gfx90a").unwrap();
    let plan = generate(&g, &t).unwrap();
    assert!(plan.kernels[0].args.len() <= MAX_KERNEL_ARGS);
    let n = MAX_INPUTS + 1;
    assert!(
        matches!(wide(n).1, Err(GraphError::BadAttribute { ref reason, .. }) if reason.contains("MAX_INPUTS")),
        "{n} operands"
    );
}

/// Issue 11, item 4: an expression is rendered without recursion (one line per op, on a small
/// stack) up to the IR's cap, and an expression past the cap is a typed graph error.
#[test]
fn deep_expressions_render_without_recursion() {
    let build = |depth: usize| {
        let mut g = Graph::new(format!("deep_{depth}"));
        let x = g.input("x", DType::F32, &[8]).unwrap();
        let mut e = Expr::Input(0);
        for i in 0..depth {
            let op = if i % 2 == 0 {
                UnaryOp::Neg
            } else {
                UnaryOp::Tanh
            };
            e = Expr::Unary(op, Box::new(e));
        }
        let f = g.add_op(Op::FusedElementwise(e), &[x])?;
        g.add_output(f)?;
        Ok::<_, GraphError>(g)
    };
    let ok = build(MAX_OPS).unwrap();
    assert!(matches!(
        build(MAX_OPS + 1),
        Err(GraphError::BadAttribute { ref reason, .. }) if reason.contains("MAX_OPS")
    ));
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .stack_size(128 << 10)
            .spawn_scoped(s, || {
                let t = Target::parse("gfx90a").unwrap();
                let plan = generate(&ok, &t).unwrap();
                let body = &plan.kernels[0].body;
                assert_eq!(body.matches("const float t").count(), MAX_OPS);
            })
            .unwrap()
            .join()
            .unwrap();
    });
}

/// Issue 11, item 5: causal offsets near the i64 limits reach kernels clamped to the mask's
/// own range, which gives the same mask and cannot overflow `q + offset`: no literal near
/// i64's limits appears, and i64::MIN is never written as a literal C reads as unsigned.
#[test]
fn causal_offsets_are_clamped_into_range() {
    for off in edge_cases::extreme_offsets(5, 7) {
        let mut g = Graph::new("offsets");
        let m = g.causal_mask(5, 7, off).unwrap();
        let a = edge_cases::causal_attention(DType::F16, 5, 7, 64, off);
        g.add_output(m).unwrap();
        for (graph, arch) in [(&g, "gfx90a"), (&a, "gfx90a"), (&a, "sm_90")] {
            let plan = generate(graph, &Target::parse(arch).unwrap()).unwrap();
            for k in &plan.kernels {
                assert!(!k.body.contains("922337203685477"), "{off}: {}", k.body);
            }
            let want = off.clamp(-5, 7);
            let lit = if want < 0 {
                format!("+ ({want}LL)")
            } else {
                format!("+ {want}LL")
            };
            assert!(
                plan.kernels.iter().any(|k| k.body.contains(&lit)),
                "{off} → {lit}"
            );
        }
    }
}

/// On sm_90a, f16 and bf16 Gemm nodes that fill a tile and read A and B in 16-byte pieces
/// along K go to the warpgroup kernel, with its ring in dynamic shared memory past the static
/// 48 KiB and within the row's opt-in; the others, and every node on sm_90, do not.
#[test]
fn gemm_nodes_go_to_wgmma_on_sm_90a_where_they_suit() {
    let (a, p) = (
        Target::parse("sm_90a").unwrap(),
        Target::parse("sm_90").unwrap(),
    );
    let on = CodegenOptions::default();
    let off = CodegenOptions {
        wgmma_gemm: false,
        ..CodegenOptions::default()
    };
    for dt in [DType::F16, DType::BF16] {
        for g in gemm_cases::wgmma_cases(dt) {
            // On by default (`CodegenOptions::wgmma_gemm`); off: the mma.sync kernel.
            let without = generate_with(&g, &a, &off).unwrap();
            assert!(
                without.kernels.iter().all(|k| k.family == "gemm_mma"),
                "{} took a warpgroup kernel with the option off",
                g.name
            );
            let plan = generate(&g, &a).unwrap();
            assert_eq!(plan.kernels.len(), 1, "{}", g.name);
            let k = &plan.kernels[0];
            let want = gemm_cases::wgmma_family(&g);
            assert_eq!(k.family, want, "{}", g.name);
            let maps: Vec<_> = plan
                .buffers
                .iter()
                .filter_map(|b| match &b.role {
                    BufferRole::TensorMap { of, spec } => Some((*of, spec.clone())),
                    _ => None,
                })
                .collect();
            match want {
                "gemm_wgmma_tma" => {
                    assert!(k.body.contains("cp.async.bulk.tensor"));
                    assert!(k.body.contains("setmaxnreg.inc.sync.aligned.u32"));
                    assert_eq!(k.launch.block[0], 384, "a producer and two consumers");
                    // One map of A and one of B, bound after the result, each describing the
                    // buffer the kernel also takes as that operand.
                    assert_eq!(maps.len(), 2, "{}", g.name);
                    let n = k.args.len();
                    assert_eq!((maps[0].0, maps[1].0), (k.args[0], k.args[1]), "{}", g.name);
                    assert_eq!(
                        &k.args[n - 2..],
                        &[plan.buffers.len() - 2, plan.buffers.len() - 1]
                    );
                    // Boxes of 64 along K (one 128-byte line), 128 rows of A.
                    assert_eq!(maps[0].1.boxes[..2], [64, 128]);
                    assert_eq!(maps[1].1.boxes[0], 64);
                }
                "gemm_wgmma" => {
                    assert!(k.body.contains("wgmma.mma_async.sync.aligned.m64n128k16"));
                    assert_eq!(k.launch.block[0], 256, "two warpgroups");
                    assert!(maps.is_empty());
                }
                _ => assert_eq!(k.launch.shared_bytes, 0, "{}", g.name),
            }
            if want != "gemm_mma" {
                assert!(k.launch.shared_bytes > a.caps.static_shared_bytes);
                assert!(k.launch.shared_bytes <= a.caps.shared_bytes_per_block);
            }
            let plan = generate_with(&g, &p, &on).unwrap();
            assert_eq!(plan.kernels[0].family, "gemm_mma", "sm_90 {}", g.name);
        }
    }
    // f32 never: the warpgroup rows take f16 and bf16 only.
    let g = gemm_cases::plain_case(DType::F32, 1000, 1000, 1000, true);
    assert_eq!(
        generate_with(&g, &a, &on).unwrap().kernels[0].family,
        "gemm"
    );
}

/// The TMA kernel's width is the caller's where given (its instruction's N), refused where it is
/// not a width the kernel has, and the cp.async kernel takes its place when TMA is off.
#[test]
fn the_tma_gemm_width_is_an_option() {
    let t = Target::parse("sm_90a").unwrap();
    let g = gemm_cases::plain_case(DType::F16, 1000, 1000, 1000, true);
    let with = |w| CodegenOptions {
        wgmma_gemm: true,
        wgmma_tma: w,
        ..CodegenOptions::default()
    };
    for (w, n) in [(64, "m64n64k16"), (128, "m64n128k16"), (256, "m64n256k16")] {
        let plan = generate_with(&g, &t, &with(TmaWidth::Fixed(w))).unwrap();
        let k = &plan.kernels[0];
        assert_eq!(k.family, "gemm_wgmma_tma");
        assert!(k.body.contains(n), "width {w}");
        // Persistent: one block a tile up to the 132 the grid plans for (8 tiles along M).
        assert_eq!(
            k.launch.grid,
            [(8 * 1000usize.div_ceil(w)).min(132) as u32, 1, 1]
        );
    }
    match generate_with(&g, &t, &with(TmaWidth::Fixed(96))) {
        Err(CodegenError::Unsupported { reason, .. }) => assert!(reason.contains("96"), "{reason}"),
        other => panic!("{other:?}"),
    }
    let plan = generate_with(&g, &t, &with(TmaWidth::Off)).unwrap();
    assert_eq!(plan.kernels[0].family, "gemm_wgmma");
}

/// f16 and bf16 Gemm nodes go to the matrix-core kernel on every target with an atom for them
/// (one kernel each, with the geometry `launch` gives), f32 and targets without atoms to the
/// CUDA-core one. One kernel per target family is a snapshot.
#[test]
fn gemm_nodes_go_to_the_matrix_cores_where_the_target_has_an_atom() {
    for arch in [
        "sm_80", "sm_90", "gfx90a", "gfx942", "gfx1100", "gfx1201", "gfx1030",
    ] {
        let t = Target::parse(arch).unwrap();
        for (dt, f32_matmul) in [
            (DType::F16, F32Matmul::Exact),
            (DType::BF16, F32Matmul::Exact),
            (DType::F32, F32Matmul::Exact),
            (DType::F16, F32Matmul::Tf32),
            (DType::F32, F32Matmul::Tf32),
        ] {
            let options = CodegenOptions {
                f32_matmul,
                ..CodegenOptions::default()
            };
            for g in gemm_cases::cases(dt, true) {
                let plan = generate_with(&g, &t, &options).unwrap();
                assert_eq!(plan.kernels.len(), 1, "{arch} {}", g.name);
                let k = &plan.kernels[0];
                // f32 takes a TF32 atom only when asked (sm_80+, gfx942); never otherwise.
                let has_atom = t
                    .caps
                    .mma
                    .iter()
                    .any(|a| a.input == dt && f32_matmul.admits(a));
                let want = if has_atom { "gemm_mma" } else { "gemm" };
                assert_eq!(k.family, want, "{arch} {} {f32_matmul:?}", g.name);
                assert_eq!(
                    k.body.contains("at TF32 precision"),
                    dt == DType::F32 && has_atom,
                    "{arch} {}",
                    g.name
                );
                // Asked for TF32 and not given it: the plan says so.
                let fell_back = dt == DType::F32 && f32_matmul == F32Matmul::Tf32 && !has_atom;
                assert_eq!(
                    plan.notes.len(),
                    usize::from(fell_back),
                    "{arch} {}",
                    g.name
                );
                if fell_back {
                    assert!(plan.notes[0].contains("has no TF32 matrix instruction: exact f32"));
                    assert!(plan.listing().contains("// note: "));
                }
                if has_atom {
                    // Threads are whole waves; the grid covers M and N with the tile the
                    // kernel's comment names.
                    assert_eq!(k.launch.block[0] % t.wave_size, 0);
                    let tile = k
                        .body
                        .lines()
                        .find_map(|l| l.strip_prefix("// Block tile "))
                        .unwrap();
                    let (bm, rest) = tile.split_once('×').unwrap();
                    let bn: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
                    let (bm, bn): (u32, u32) = (bm.parse().unwrap(), bn.parse().unwrap());
                    let Op::Gemm(gm) = g.op(g.outputs()[0]) else {
                        panic!("{} ends in a Gemm", g.name)
                    };
                    let [batch, m, n, _] = gm.dims.sizes().unwrap();
                    assert_eq!(
                        k.launch.grid,
                        [
                            n.div_ceil(bn as usize) as u32,
                            m.div_ceil(bm as usize) as u32,
                            batch as u32
                        ],
                        "{arch} {}",
                        g.name
                    );
                }
            }
        }
    }
    for (arch, case) in [
        ("sm_90", "heads_bias_gelu"),
        ("gfx942", "heads_bias_gelu"),
        ("gfx1100", "k36"),
        ("gfx1201", "odd_kn"),
    ] {
        let t = Target::parse(arch).unwrap();
        let g = gemm_cases::cases(DType::F16, false)
            .into_iter()
            .find(|g| g.name.contains(case))
            .unwrap();
        let plan = generate(&g, &t).unwrap();
        files::snapshot_settings().bind(|| {
            insta::assert_snapshot!(
                format!("kernels__gemm_mma_{case}_f16__{arch}"),
                plan.kernels[0].body
            )
        });
    }
    // The TF32 GEMM on both kinds of TF32 atom.
    let tf32 = CodegenOptions {
        f32_matmul: F32Matmul::Tf32,
        ..CodegenOptions::default()
    };
    for arch in ["sm_90", "gfx942"] {
        let t = Target::parse(arch).unwrap();
        let g = gemm_cases::cases(DType::F32, false)
            .into_iter()
            .find(|g| g.name.contains("odd_kn"))
            .unwrap();
        let plan = generate_with(&g, &t, &tf32).unwrap();
        files::snapshot_settings().bind(|| {
            insta::assert_snapshot!(
                format!("kernels__gemm_mma_odd_kn_f32_tf32__{arch}"),
                plan.kernels[0].body
            )
        });
    }
}

/// f32 attention asked to run at TF32: the matrix-core kernel on the TF32 atom where the target
/// has one and the head size fits (D ≤ 128), with a note where it falls back to exact f32; never
/// without being asked.
#[test]
fn f32_attention_takes_the_tf32_atom_only_when_asked() {
    let spec = Spec {
        hkv: 2,
        sk: 130,
        dtype: DType::F32,
        mask: Mask::Causal,
        offset: 3,
        ..Spec::new(1, 4, 77, 64)
    };
    let mut g = build(&spec);
    PassManager::default_pipeline().run(&mut g).unwrap();
    let tf32 = CodegenOptions {
        f32_matmul: F32Matmul::Tf32,
        ..CodegenOptions::default()
    };
    let attention = |plan: &KernelPlan| {
        plan.kernels
            .iter()
            .find(|k| k.family == "flash_attention")
            .unwrap()
            .body
            .clone()
    };
    for arch in ["sm_80", "sm_90", "gfx942"] {
        let t = Target::parse(arch).unwrap();
        let plan = generate_with(&g, &t, &tf32).unwrap();
        assert!(attention(&plan).contains("at TF32 precision"), "{arch}");
        assert!(plan.notes.is_empty(), "{arch}");
        let exact = generate(&g, &t).unwrap();
        assert!(!attention(&exact).contains("at TF32 precision"), "{arch}");
        if arch == "sm_90" {
            files::snapshot_settings().bind(|| {
                insta::assert_snapshot!(
                    "kernels__flash_attention_mma_f32_tf32__sm_90",
                    attention(&plan)
                )
            });
        }
    }
    for arch in ["gfx90a", "gfx1100", "gfx1201", "gfx1030"] {
        let t = Target::parse(arch).unwrap();
        let plan = generate_with(&g, &t, &tf32).unwrap();
        assert!(!attention(&plan).contains("at TF32 precision"), "{arch}");
        assert_eq!(plan.notes.len(), 1, "{arch}");
        assert!(plan.notes[0].contains(&format!("{arch} has no TF32 matrix instruction")));
    }
    // D 256: the TF32 kernel's O accumulators alone pass its register budget; exact f32, noted.
    let mut g = build(&Spec {
        dtype: DType::F32,
        ..Spec::new(1, 2, 40, 256)
    });
    PassManager::default_pipeline().run(&mut g).unwrap();
    let plan = generate_with(&g, &Target::parse("sm_90").unwrap(), &tf32).unwrap();
    assert!(!attention(&plan).contains("at TF32 precision"));
    assert!(plan.notes[0].contains("no TF32 configuration of its kernel fits"));
}

/// A field `name: N` of a configuration as its `Debug` text shows it.
fn config_field(config: &str, name: &str) -> usize {
    let at = config
        .find(&format!("{name}: "))
        .unwrap_or_else(|| panic!("no `{name}` in {config}"));
    config[at + name.len() + 2..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap()
}

/// Tuning: for an f16 GEMM and an f16 attention at odd sizes on sm_90, each candidate the
/// table names is the kernel emitted (its launch geometry is that candidate's tiling, every
/// candidate a different kernel); without a table, or with a choice made for another candidate
/// list, the family's default is emitted, as the snapshots hold it.
#[test]
fn a_tuned_choice_emits_that_configuration_and_none_the_default() {
    use rocmforge::arch::{Choice, Family, Tuned};
    let target = Target::parse("sm_90").unwrap();
    let gemm = gemm_cases::plain_case(DType::F16, 77, 130, 72, true);
    let spec = Spec {
        dtype: DType::F16,
        hkv: 2,
        sk: 93,
        mask: Mask::Causal,
        ..Spec::new(2, 6, 77, 64)
    };
    let mut attention = build(&spec);
    PassManager::default_pipeline().run(&mut attention).unwrap();
    for g in [gemm, attention] {
        let default = generate(&g, &target).unwrap();
        let tunable = |plan: &KernelPlan| {
            let ks: Vec<_> = plan.kernels.iter().filter(|k| k.tune.is_some()).collect();
            assert_eq!(ks.len(), 1, "{}: one tunable kernel", g.name);
            ks[0].clone()
        };
        let k0 = tunable(&default);
        let site = k0.tune.clone().unwrap();
        assert!(site.candidates.len() > 1, "{:?}", site.candidates);
        assert_eq!(site.chosen, site.default, "untuned: the default");
        let mut bodies = std::collections::HashSet::new();
        for index in 0..site.candidates.len() {
            let mut tuned = Tuned::new();
            let checksum = site.checksum;
            tuned.insert(site.key.clone(), Choice { index, checksum });
            let options = CodegenOptions {
                tuned,
                ..CodegenOptions::default()
            };
            let k = tunable(&generate_with(&g, &target, &options).unwrap());
            assert_eq!(k.tune.as_ref().unwrap().chosen, index);
            let c = &site.candidates[index];
            let (grid, block) = match site.key.family {
                Family::GemmMma => (
                    [
                        130usize.div_ceil(config_field(c, "bn")),
                        77usize.div_ceil(config_field(c, "bm")),
                        1,
                    ],
                    config_field(c, "warps_m") * config_field(c, "warps_n") * 32,
                ),
                Family::AttentionMma => (
                    [2 * 6, 77usize.div_ceil(config_field(c, "block_m")), 1],
                    config_field(c, "warps") * 32,
                ),
                Family::AttentionWgmma => (
                    [
                        2 * 6,
                        77usize.div_ceil(64 * config_field(c, "warpgroups")),
                        1,
                    ],
                    config_field(c, "warpgroups") * 128,
                ),
                Family::AttentionSimt => unreachable!("f16 runs on the matrix cores"),
            };
            assert_eq!(
                (
                    k.launch.grid.map(|x| x as usize),
                    k.launch.block[0] as usize
                ),
                (grid, block),
                "{c}"
            );
            if index == site.default {
                assert_eq!(
                    k.body, k0.body,
                    "the default chosen by index is the default"
                );
            }
            bodies.insert(k.body);
        }
        assert_eq!(
            bodies.len(),
            site.candidates.len(),
            "one kernel per candidate"
        );
        // A choice made for another candidate list is not applied.
        let other = (site.default + 1) % site.candidates.len();
        let mut stale = Tuned::new();
        stale.insert(
            site.key.clone(),
            Choice {
                index: other,
                checksum: site.checksum ^ 1,
            },
        );
        let options = CodegenOptions {
            tuned: stale,
            ..CodegenOptions::default()
        };
        let k = tunable(&generate_with(&g, &target, &options).unwrap());
        assert_eq!(k.body, k0.body);
    }
}

/// Programmatic dependent launch: on a target with `grid_dependency` (sm_90) every kernel of
/// every graph waits on the grid dependency in its first statement and so is launched as a
/// programmatic dependent; a template without the wait would be launched plainly (slower, not
/// wrong) and fails here. AMD targets have no such launch.
#[test]
fn every_kernel_waits_on_the_grid_dependency_where_the_target_has_it() {
    for (g, fused) in all_graphs() {
        for (arch, want) in [
            ("sm_90", true),
            ("sm_90a", true),
            ("sm_80", false),
            ("gfx90a", false),
        ] {
            let Ok(plan) = plan_for(&g, arch) else {
                continue;
            };
            for k in &plan.kernels {
                assert_eq!(
                    k.launch.programmatic, want,
                    "{} ({}) on {arch}, fused {fused}: kernel {} ({})",
                    g.name, k.node, k.entry, k.family
                );
            }
        }
    }
}
