//! Edge cases (issue 11): zero-size dimensions, empty reductions, attention without keys, out-of-range gathers, causal offsets near the i64 limits, edge values, launches past the limits.

use crate::common::*;
use crate::gemm::quant_bound_blocks;
use crate::harness::*;
use libtest_mimic::{Failed, Trial};
use rocmforge::compile::CompileOptions;
use rocmforge::interp::{run, Bindings};
use rocmforge::ir::{DType, Graph, Tensor};
use rocmforge::runtime::Device;

/// Runs `g` on the device with `b` (fused and not) and returns each mode's outputs.
pub fn run_both(device: &Device, g: &Graph, b: &Bindings) -> Result<Vec<Vec<Tensor>>, Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    [true, false]
        .iter()
        .map(|&fuse| {
            let c = Graph::compile_with(g, device, &CompileOptions { fuse, ..options() })
                .map_err(|e| format!("{}: {e}", g.name))?;
            c.run(b)
                .map_err(|e| format!("{} (fused: {fuse}): {e}", g.name).into())
        })
        .collect()
}

/// Reductions over an empty axis give PyTorch's values: sum 0, max -inf, mean NaN.
pub fn empty_axis_reductions(device: &Device) -> Result<(), Failed> {
    for (g, want) in edge_cases::empty_axis_reductions() {
        for outs in run_both(device, &g, &Bindings::random(&g, 1))? {
            for (i, (t, w)) in outs.iter().zip(&want).enumerate() {
                edge_cases::compare_values(t, w, &format!("{} output {i}", g.name))?;
            }
        }
    }
    Ok(())
}

/// Attention with no keys writes zeros (no key is visible); with a head size of 0 every score
/// is 0, so each row is the mean of V. Both by hand, in f32.
pub fn attention_without_keys_or_head_size(device: &Device) -> Result<(), Failed> {
    for (name, want_mean) in [
        ("empty_attention_sk0_f32", false),
        ("empty_attention_d0_f32", true),
    ] {
        let g = edge_cases::empty_graphs()
            .into_iter()
            .find(|g| g.name == name)
            .ok_or(format!("no graph {name}"))?;
        let b = Bindings::random(&g, 5);
        let q = g.ty(g.find("q").unwrap()).shape.dims().to_vec();
        let v = &b.inputs["v"];
        let vd = v.shape().dims().to_vec();
        let (hq, sq, hkv, sk, dv) = (q[1], q[2], vd[1], vd[2], vd[3]);
        let vv = v.to_f64_vec();
        let mut want = Vec::new();
        for bi in 0..q[0] {
            for h in 0..hq {
                let kvh = h / (hq / hkv);
                for _ in 0..sq {
                    for c in 0..dv {
                        want.push(if want_mean {
                            (0..sk)
                                .map(|j| vv[((bi * hkv + kvh) * sk + j) * dv + c])
                                .sum::<f64>()
                                / sk as f64
                        } else {
                            0.0
                        });
                    }
                }
            }
        }
        for outs in run_both(device, &g, &b)? {
            let want = Tensor::from_f64(DType::F32, outs[0].shape().clone(), &want)
                .map_err(|e| e.to_string())?;
            let err = compare(&outs[0], &want, 1e-5, name)?;
            if err > 1e-5 {
                return Err(format!("{name}: relative L2 {err:e}").into());
            }
        }
    }
    Ok(())
}

/// A gather with an index out of range fails on the GPU with the CPU's error, naming the same
/// node, the same (first) index and the table size; in range, the rows agree.
pub fn gathers_fail_as_on_the_cpu(device: &Device) -> Result<(), Failed> {
    let cpu = Device::cpu();
    let mut cases = edge_cases::gathers_out_of_range();
    cases.push(edge_cases::gather_case(DType::I64, &[4, 0, 3, 3], 5, 3));
    for c in cases {
        for fuse in [true, false] {
            let opts = CompileOptions { fuse, ..options() };
            let on = |d: &Device| {
                let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
                Graph::compile_with(&c.graph, d, &opts).and_then(|m| m.run(&c.bindings))
            };
            let (gpu, want) = (on(device), on(&cpu));
            match (&gpu, &want) {
                (Err(g), Err(w)) if g.to_string() == w.to_string() => {}
                (Ok(g), Ok(w)) if g == w => {}
                _ => {
                    return Err(format!(
                        "{} (fused: {fuse}): GPU {:?}, CPU {:?}",
                        c.graph.name,
                        gpu.as_ref().err().map(|e| e.to_string()),
                        want.as_ref().err().map(|e| e.to_string())
                    )
                    .into())
                }
            }
            if let Err(e) = &gpu {
                if !matches!(
                    e,
                    rocmforge::compile::CompileError::Interp(
                        rocmforge::interp::InterpError::IndexOutOfRange { .. }
                    )
                ) {
                    return Err(format!("{}: {e:?} is not IndexOutOfRange", c.graph.name).into());
                }
            }
        }
    }
    Ok(())
}

/// Causal masks and causal attention with offsets at the i64 limits: masks against the
/// definition (in i128), attention against the interpreter with the in-range offset that
/// gives the same mask.
pub fn causal_offsets_near_the_limits(device: &Device) -> Result<(), Failed> {
    let (g, want) = edge_cases::causal_masks(5, 7);
    for outs in run_both(device, &g, &Bindings::default())? {
        for ((t, w), off) in outs
            .iter()
            .zip(&want)
            .zip(edge_cases::extreme_offsets(5, 7))
        {
            edge_cases::compare_values(t, w, &format!("causal mask, offset {off}"))?;
        }
    }
    for (dt, d) in [(DType::F32, 32), (DType::F16, 32), (DType::F16, 24)] {
        for off in edge_cases::extreme_offsets(70, 90) {
            let g = edge_cases::causal_attention(dt, 70, 90, d, off);
            let same = edge_cases::causal_attention(dt, 70, 90, d, off.clamp(-70, 90));
            let b = Bindings::random(&g, 9);
            let want = run(&same, &b).map_err(|e| e.to_string())?.remove(0);
            for outs in run_both(device, &g, &b)? {
                let err = compare(&outs[0], &want, tolerance(dt), &g.name)?;
                if err > tolerance(dt) {
                    return Err(format!("{}: relative L2 {err:e}", g.name).into());
                }
            }
        }
    }
    Ok(())
}

/// Edge values (NaN, infinities, values past f16, i32 and i64) through every elementwise row
/// and through fused expressions whose intermediates overflow or wrap: the interpreter's
/// results, within a few ulps for libm functions.
pub fn edge_values(device: &Device, case: &edge_cases::Case) -> Result<(), Failed> {
    let want = run(&case.graph, &case.bindings).map_err(|e| e.to_string())?;
    for outs in run_both(device, &case.graph, &case.bindings)? {
        for ((o, t), w) in case.graph.outputs().iter().zip(&outs).zip(&want) {
            let what = format!("{} %{}", case.graph.name, case.graph.node(*o).name);
            edge_cases::compare(t, w, 16.0, &what)?;
        }
    }
    Ok(())
}

/// A launch past the device's own limits is refused with a typed error before it reaches the
/// driver: a grid of 2³²−1 blocks in x, a block of 2048 threads.
pub fn launch_past_the_device_limits(device: &Device) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let mut g = Graph::new("launch_limits");
    let x = g.input("x", DType::F32, &[256]).unwrap();
    let y = g.neg(x).unwrap();
    g.add_output(y).unwrap();
    let target = device.target().ok_or("no target")?.clone();
    let plan = rocmforge::codegen::generate(&g, &target).map_err(|e| e.to_string())?;
    let k = &plan.kernels[0];
    let opts = rocmforge::arch::compiler_options(target.platform);
    let image = device
        .compile_source(&plan.source(k), &k.entry, &opts)
        .map_err(|e| e.to_string())?;
    let loaded = device
        .load_kernel(&image, &k.entry)
        .map_err(|e| e.to_string())?;
    let stream = device.new_stream().map_err(|e| e.to_string())?;
    let a = stream.alloc(1024, true).map_err(|e| e.to_string())?;
    let o = stream.alloc(1024, true).map_err(|e| e.to_string())?;
    for (grid, block, what) in [
        ([u32::MAX, 1, 1], [256, 1, 1], "grid.x"),
        ([1, 1, 1], [2048, 1, 1], "block.x"),
    ] {
        match stream.launch(&loaded, grid, block, 0, &[&a, &o]) {
            Err(rocmforge::runtime::RuntimeError::LaunchLimit { what: w, .. }) if w == what => {}
            other => return Err(format!("{grid:?} {block:?}: {other:?}").into()),
        }
    }
    stream
        .launch(&loaded, [1, 1, 1], [256, 1, 1], 0, &[&a, &o])
        .map_err(|e| format!("a launch within the limits: {e}"))?;
    stream.synchronize().map_err(|e| e.to_string())?;
    Ok(())
}

/// Elementwise ops and casts at their edge values (±0, ±∞, NaN, f16's limit and overflow,
/// values past every integer type, the integer limits) on the device, fused and unfused, bit for
/// bit against the interpreter (`ir::scalar`, docs/ops.md "Scalar semantics"). Only ops IEEE
/// specifies exactly are compared: transcendental functions may differ in the last place.
pub fn elementwise_edges_bit_for_bit(device: &Device, dt: DType, fuse: bool) -> Result<(), Failed> {
    use rocmforge::ir::{BinaryOp, Op, UnaryOp};
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let values = edge_cases::edge_values(dt);
    let k = values.len();
    let mut g = Graph::new(format!("edges_{dt}"));
    let a = g.input("a", dt, &[k, 1]).map_err(|e| e.to_string())?;
    let b = g.input("b", dt, &[1, k]).map_err(|e| e.to_string())?;
    let mut outs = Vec::new();
    let mut add = |g: &mut Graph, op: Op, ins: &[rocmforge::ir::NodeId]| {
        if let Ok(id) = g.add_op(op, ins) {
            outs.push(id);
        }
    };
    for u in [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Sqrt, UnaryOp::Recip] {
        add(&mut g, Op::Unary(u), &[a]);
    }
    for op in [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::Equal,
        BinaryOp::Less,
        BinaryOp::Greater,
    ] {
        add(&mut g, Op::Binary(op), &[a, b]);
    }
    for to in DType::ALL {
        add(&mut g, Op::Cast { to }, &[a]);
        // Fused: the sum is stored to its dtype (wrapped, rounded) before the cast.
        if let Ok(s) = g.add(a, b) {
            add(&mut g, Op::Cast { to }, &[s]);
        }
    }
    // Fused: a wrapped integer sum compared with zero.
    if dt.is_int() {
        let zero = g.scalar(0.0, dt).map_err(|e| e.to_string())?;
        let s = g.add(a, b).map_err(|e| e.to_string())?;
        add(&mut g, Op::Binary(BinaryOp::Less), &[s, zero]);
    }
    g.set_outputs(&outs).map_err(|e| e.to_string())?;
    let bindings = Bindings::default()
        .with_input(
            "a",
            Tensor::from_f64(dt, vec![k, 1], &values).map_err(|e| e.to_string())?,
        )
        .with_input(
            "b",
            Tensor::from_f64(dt, vec![1, k], &values).map_err(|e| e.to_string())?,
        );
    let c = Graph::compile_with(&g, device, &CompileOptions { fuse, ..options() })
        .map_err(|e| e.to_string())?;
    let got = c.run(&bindings).map_err(|e| e.to_string())?;
    let want = run(&g, &bindings).map_err(|e| e.to_string())?;
    let bits = |t: &Tensor| -> Vec<u64> {
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
            _ => vec![],
        }
    };
    for ((o, gt), wt) in g.outputs().iter().zip(&got).zip(&want) {
        let (gb, wb) = (bits(gt), bits(wt));
        if let Some(i) = (0..wb.len()).find(|&i| gb.get(i) != Some(&wb[i])) {
            return Err(format!(
                "{} ({}): element {i} of {}: device {:?}, interpreter {:?} (edge values {values:?})",
                g.node(*o).op,
                if fuse { "fused" } else { "unfused" },
                wt.shape(),
                gt.to_f64_vec().get(i),
                wt.to_f64_vec()[i]
            )
            .into());
        }
    }
    Ok(())
}

/// Every op with a zero-size dimension, fused and unfused.
pub fn zero_size(device: &Device, ignored: &Option<String>, trials: &mut Vec<Trial>) {
    for g in edge_cases::empty_graphs() {
        for fuse in [true, false] {
            let d = device.clone();
            let name = format!(
                "zero_size::{}::{}",
                g.name,
                if fuse { "fused" } else { "unfused" }
            );
            let g = g.clone();
            push(
                trials,
                ignored,
                name,
                Box::new(move || check_graph(&d, &g, fuse, 6)),
            );
        }
    }
}

/// Edge cases and scalar semantics.
pub fn trials(device: &Device, ignored: &Option<String>, trials: &mut Vec<Trial>) {
    let edge_trials: [(&str, DeviceTrial); 6] = [
        ("quant::bound_blocks", quant_bound_blocks),
        (
            "zero_size::reductions_over_an_empty_axis",
            empty_axis_reductions,
        ),
        (
            "zero_size::attention_without_keys_or_head_size_by_hand",
            attention_without_keys_or_head_size,
        ),
        (
            "gather::out_of_range_is_the_cpu_error",
            gathers_fail_as_on_the_cpu,
        ),
        (
            "causal::offsets_near_the_i64_limits",
            causal_offsets_near_the_limits,
        ),
        (
            "launch::past_the_device_limits_is_refused",
            launch_past_the_device_limits,
        ),
    ];
    for (name, f) in edge_trials {
        let d = device.clone();
        push(trials, ignored, name.into(), Box::new(move || f(&d)));
    }
    for case in edge_cases::elementwise_edges()
        .into_iter()
        .chain(edge_cases::fused_edges())
    {
        let d = device.clone();
        let name = format!("semantics::{}", case.graph.name);
        push(
            trials,
            ignored,
            name,
            Box::new(move || edge_values(&d, &case)),
        );
    }
    for dt in DType::ALL {
        for fuse in [true, false] {
            let d = device.clone();
            push(
                trials,
                ignored,
                format!(
                    "semantics::{dt}_edge_values_bit_for_bit::{}",
                    if fuse { "fused" } else { "unfused" }
                ),
                Box::new(move || elementwise_edges_bit_for_bit(&d, dt, fuse)),
            );
        }
    }
}
