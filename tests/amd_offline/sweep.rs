//! The attention register sweep: every attention kernel of a family over the sweep's head sizes
//! compiled on a target, none spilling or using scratch.

use super::*;

/// Head sizes of the register sweep (D = Dv): the smallest, odd sizes, the sizes either side of
/// a power of two (where tilings change), the common model sizes and the largest. Chosen so
/// that the whole sweep stays within CI's minutes: ROCm 5.2's hiprtc takes seconds a kernel.
const SWEEP_HEADS: [usize; 18] = [
    1, 3, 8, 15, 16, 17, 31, 40, 63, 64, 80, 96, 127, 128, 160, 200, 255, 256,
];

/// (D, Dv) pairs with D ≠ Dv, swept in both orders: the case of the issue, small against
/// large, odd against even.
const SWEEP_PAIRS: [(usize, usize); 4] = [(40, 24), (1, 256), (255, 256), (127, 32)];

/// The kernel families of the sweep, each with the graphs that reach it.
#[derive(Clone, Copy, Debug)]
pub(super) enum SweepFamily {
    /// f32 cross attention with a boolean mask: the register-tiled CUDA-core kernel (where
    /// spills are most likely), plus the case of the issue: cross attention Sq 7, Sk 33,
    /// D 40, Dv 24 (which spilled 125 VGPRs on gfx1030).
    Simt,
    /// f16 GQA with a causal offset: the matrix-core kernel where the target has an atom for
    /// the head sizes, the scalar kernel elsewhere.
    Mma,
    /// bf16 decode rows with an additive mask: split-K decode, combined by its last block.
    Decode,
}

/// The attention graphs of the register sweep for one family, per (D, Dv).
fn sweep_graphs(family: SweepFamily) -> Vec<Graph> {
    use rocmforge::ir::DType;
    let mut pairs: Vec<(usize, usize)> = SWEEP_HEADS.iter().map(|&d| (d, d)).collect();
    for (d, dv) in SWEEP_PAIRS {
        pairs.push((d, dv));
        pairs.push((dv, d));
    }
    let mut graphs = Vec::new();
    let mut add = |name: String,
                   dt: DType,
                   (b, hq, hkv, sq, sk): (usize, usize, usize, usize, usize),
                   (d, dv): (usize, usize),
                   mask: Option<DType>,
                   causal: Option<i64>| {
        let mut g = Graph::new(name);
        let q = g.input("q", dt, &[b, hq, sq, d]).unwrap();
        let k = g.input("k", dt, &[b, hkv, sk, d]).unwrap();
        let v = g.input("v", dt, &[b, hkv, sk, dv]).unwrap();
        let m = mask.map(|mt| g.input("m", mt, &[b, 1, sq, sk]).unwrap());
        let o = g.flash_attention(q, k, v, m, 0.125, causal).unwrap();
        g.add_output(o).unwrap();
        graphs.push(g);
    };
    if let SweepFamily::Simt = family {
        add(
            "cross_7x33_d40_dv24".into(),
            DType::F32,
            (1, 2, 2, 7, 33),
            (40, 24),
            None,
            None,
        );
    }
    for (d, dv) in pairs {
        match family {
            SweepFamily::Simt => add(
                format!("f32_bool_{d}_{dv}"),
                DType::F32,
                (2, 2, 2, 7, 33),
                (d, dv),
                Some(DType::Bool),
                None,
            ),
            SweepFamily::Mma => add(
                format!("f16_gqa_causal_{d}_{dv}"),
                DType::F16,
                (1, 6, 2, 77, 300),
                (d, dv),
                None,
                Some(223),
            ),
            SweepFamily::Decode => add(
                format!("bf16_decode_{d}_{dv}"),
                DType::BF16,
                (1, 8, 2, 2, 300),
                (d, dv),
                Some(DType::F32),
                None,
            ),
        }
    }
    graphs
}

/// Where each family of the sweep runs: the CUDA-core kernel on every AMD target of the table,
/// the matrix-core kernel on the targets with atoms, decode on one wave64 and one wave32
/// target (its configuration depends on the wave size, not on the atoms). Measured on 2 cores
/// (hiprtc 5.2, clang-19): the CUDA-core family about 160 s for the 7 targets (40 to 60 s on
/// each hiprtc target, 20 to 35 s on each clang one), the matrix-core family about 65 s,
/// decode about 50 s. Before the register filter it found (VGPRs spilled): f32 D 40/Dv 40
/// (157 on gfx906, 161 on gfx1030), 40/24 (134, 135), 24/40 (20, 14), 200/200 (266, 249; 8
/// on gfx908 and gfx90a), and the scalar kernel's 1040 B of scratch for f16 D 1/Dv 256 on
/// gfx90a, gfx942, gfx1100 and gfx1201.
pub(super) const SWEEP_PLAN: [(SweepFamily, &[&str]); 3] = [
    (
        SweepFamily::Simt,
        &[
            "gfx906", "gfx908", "gfx90a", "gfx1030", "gfx942", "gfx1100", "gfx1201",
        ],
    ),
    (
        SweepFamily::Mma,
        &["gfx90a", "gfx942", "gfx1100", "gfx1201"],
    ),
    (SweepFamily::Decode, &["gfx90a", "gfx1030"]),
];

/// Kernels per program of the sweep: small enough that both cores get batches.
const SWEEP_BATCH: usize = 8;

/// Every attention kernel of one family of the sweep on `arch` compiled once (deduplicated by
/// name, the hash of the body), by hiprtc where the target is hiprtc's (ROCm 5.2: gfx906,
/// gfx908, gfx90a, gfx1030) and by the offline clang otherwise, batches in parallel: none may
/// spill or use scratch, since codegen picks only configurations whose registers fit the
/// target's budget.
pub(super) fn register_sweep(c: &Compiler, arch: &str, family: SweepFamily) -> Result<(), Failed> {
    let started = std::time::Instant::now();
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let mut unique: HashMap<String, (String, String)> = HashMap::new();
    for g in sweep_graphs(family) {
        let plan = generate_with(&g, &target, &CodegenOptions::default())
            .map_err(|e| format!("{}: {e}", g.name))?;
        for k in plan.kernels {
            unique.entry(k.entry).or_insert((k.body, g.name.clone()));
        }
    }
    let mut all: Vec<(String, (String, String))> = unique.into_iter().collect();
    all.sort();
    let prelude = prelude(&target);
    let options = ["-O3".to_string()];
    let hiprtc_target = matches!(arch, "gfx906" | "gfx908" | "gfx90a" | "gfx1030");
    let rows: Vec<Result<Vec<KernelResources>, String>> = if hiprtc_target {
        let rtc = Hiprtc::load().map_err(|e| {
            let required = std::env::var("ROCMFORGE_REQUIRE_HIPRTC").is_ok_and(|v| v == "1");
            format!(
                "{}hiprtc: {e}",
                if required {
                    "ROCMFORGE_REQUIRE_HIPRTC=1 but "
                } else {
                    ""
                }
            )
        })?;
        // One program per batch: the prelude and the device libraries are then paid once per
        // batch, and the batches compile on every core.
        all.par_chunks(SWEEP_BATCH)
            .map(|chunk| {
                let mut src = prelude.clone();
                for (_, (body, _)) in chunk {
                    src.push('\n');
                    src.push_str(body);
                }
                let code = rtc
                    .compile(&src, &chunk[0].0, arch, &options)
                    .map_err(|e| e.to_string())?;
                let info = parse_code_object(&code).map_err(|e| e.to_string())?;
                chunk
                    .iter()
                    .map(|(entry, _)| {
                        info.kernels
                            .iter()
                            .find(|k| &k.name == entry)
                            .cloned()
                            .ok_or(format!("{entry} not in its code object"))
                    })
                    .collect()
            })
            .collect()
    } else {
        all.par_chunks(SWEEP_BATCH)
            .map(|chunk| {
                let pairs: Vec<(&str, &str)> = chunk
                    .iter()
                    .map(|(e, (b, _))| (e.as_str(), b.as_str()))
                    .collect();
                let rows = c
                    .clang
                    .compile_batch(&prelude, &pairs, &target, &options)
                    .map_err(|e| e.to_string())?;
                Ok(rows.into_iter().map(|(r, _)| r).collect())
            })
            .collect()
    };
    let mut failures = Vec::new();
    let mut compiled = 0;
    for (batch, chunk) in rows.into_iter().zip(all.chunks(SWEEP_BATCH)) {
        for (r, (_, (_, case))) in batch?.iter().zip(chunk) {
            compiled += 1;
            if std::env::var("ROCMFORGE_SWEEP_REPORT").is_ok_and(|v| v == "1") {
                eprintln!(
                    "sweep {arch} {family:?} {case}: {} VGPRs, {} AGPRs, {} spills, {} B scratch",
                    r.vgprs, r.agprs, r.vgpr_spills, r.scratch_bytes
                );
            }
            if let Some(p) = problems(&target, r) {
                failures.push(format!("{p} ({case})"));
            }
        }
    }
    if compiled != all.len() {
        return Err(format!("{compiled} of {} kernels compiled", all.len()).into());
    }
    eprintln!(
        "register sweep {family:?} on {arch}: {compiled} kernels in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n").into())
    }
}
