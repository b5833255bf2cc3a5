//! Fused graph → kernel plan. Every op that can remain after the passes has a kernel here (one
//! exhaustive match); reshapes alias their operand's buffer, and a cache write its state's (it
//! writes in place); sources are host data.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::argmax::argmax;
use super::cache_write::cache_write;
use super::ctype::{ctype, f32_literal, f64_literal, i64_literal};
use super::expr_c::{describe, op_expr, render};
use super::gather::gather;
use super::kernels::gemm as gemm_kernels;
use super::limits::{int_index, kernel_args, launch, launch_1d, BLOCK_1D};
use super::plan::{Buffer, BufferId, BufferRole, Kernel, KernelPlan, Launch, PlanOutput};
use super::{templates, CodegenError, CodegenOptions};
use crate::arch::Target;
use crate::ir::{DType, Expr, Graph, NodeId, Op, QuantScheme, ReduceOp, Shape, TensorType};

const ENTRY: &str = "__RF_ENTRY__";

/// The longest row, in elements per lane, that a norm kernel holds in one wave's registers.
const NORM_WAVE_ELEMS: usize = 32;

/// Renders a template and names the kernel after its body, so identical kernels are one.
/// `launch` comes checked from `limits`; the parameter count is checked here.
pub(crate) fn finish(
    family: &'static str,
    template: &str,
    ctx: impl serde::Serialize,
    launch: Launch,
    args: Vec<BufferId>,
    node: &str,
) -> Result<Kernel, CodegenError> {
    kernel_args(node, args.len())?;
    // Typed contexts and `json!` ones alike become one JSON object, with the entry placeholder.
    let mut ctx = serde_json::to_value(ctx).expect("a context serialises");
    ctx["entry"] = json!(ENTRY);
    let body = templates::render(template, minijinja::Value::from_serialize(&ctx))?;
    let h = crate::ir::Fnv1a::new()
        .write(family.as_bytes())
        .write(body.as_bytes())
        .finish();
    let entry = format!("rf_{family}_{:012x}", h >> 16);
    Ok(Kernel {
        entry: entry.clone(),
        family,
        node: node.to_string(),
        body: body.replace(ENTRY, &entry),
        launch,
        args,
        tune: None,
    })
}

/// A float attribute as a C `double` literal, refused when it has none.
fn double_attr(node: &str, what: &'static str, v: f64) -> Result<String, CodegenError> {
    f64_literal(v).ok_or(CodegenError::NonFinite {
        node: node.to_string(),
        what,
        value: v,
    })
}

/// Strided axes, innermost first, skipping size-1 axes.
fn axes_json(shape: &Shape, strides: &[Vec<usize>]) -> Vec<Value> {
    (0..shape.rank())
        .rev()
        .filter(|&a| shape.dims()[a] > 1)
        .map(|a| json!({"size": shape.dims()[a], "strides": strides.iter().map(|s| s[a]).collect::<Vec<_>>()}))
        .collect()
}

pub(crate) fn generate(
    g: &Graph,
    target: &Target,
    options: &CodegenOptions,
) -> Result<KernelPlan, CodegenError> {
    let order = g.topo_order()?;
    // Cache writes are in place only where their state has no other reader.
    g.check_state_writes()?;
    let mut plan = KernelPlan {
        target: target.clone(),
        graph: g.name.clone(),
        buffers: Vec::new(),
        kernels: Vec::new(),
        outputs: Vec::new(),
        checks: Vec::new(),
    };
    let mut buf: HashMap<NodeId, BufferId> = HashMap::new();
    // Buffers holding a quantized weight's blocks (the weight's, which its reshapes alias), and
    // the workspace each was dequantized into for the readers that cannot read blocks.
    let mut blocks: HashMap<BufferId, QuantScheme> = HashMap::new();
    let mut dequantized: HashMap<BufferId, BufferId> = HashMap::new();
    for id in order {
        let node = g.node(id);
        if let Op::Reshape { .. } = node.op {
            buf.insert(id, buf[&g.operands(id)[0]]);
            continue;
        }
        if let Op::CacheWrite { .. } = node.op {
            // In place: the state is read by nothing else (checked above), so its buffer holds
            // the written value from here on.
            buf.insert(id, buf[&g.operands(id)[0]]);
            lower_node(g, id, &buf, target, options, &mut plan)?;
            continue;
        }
        let role = match &node.op {
            Op::Input { sample, .. } => BufferRole::Input(sample.clone()),
            Op::State { .. } => BufferRole::State {
                name: node.name.clone(),
            },
            Op::Weight {
                quant: Some(scheme),
                ..
            } => BufferRole::QuantWeight(*scheme),
            Op::Weight { init, .. } => BufferRole::Weight(init.clone()),
            Op::Constant { values, .. } => BufferRole::Constant(values.clone()),
            _ => BufferRole::Computed,
        };
        let b = plan.buffers.len();
        if let BufferRole::QuantWeight(scheme) = &role {
            blocks.insert(b, *scheme);
        }
        plan.buffers.push(Buffer {
            id: b,
            name: node.name.clone(),
            ty: node.ty.clone(),
            role,
        });
        buf.insert(id, b);
        // An empty result needs no kernel (its buffer is still bound and read, as zero bytes),
        // except a gather's: the interpreter refuses an out-of-range index even when the rows
        // it would copy are empty, so the indices are still checked.
        if node.ty.shape.numel() == 0 && !matches!(node.op, Op::Gather) {
            continue;
        }
        // Operands held as blocks that this node's kernel does not read as blocks are read
        // from their dequantized workspace instead.
        let fused = match &node.op {
            Op::Gemm(gemm) => {
                gemm_kernels::quant::reads_blocks(g, id, gemm).map(|_| g.operands(id)[1])
            }
            _ => None,
        };
        let mut ops = g.operands(id);
        ops.retain(|&o| blocks.contains_key(&buf[&o]) && Some(o) != fused);
        if ops.is_empty() {
            lower_node(g, id, &buf, target, options, &mut plan)?;
        } else {
            let mut local = buf.clone();
            for o in ops {
                let d = dequantized_buffer(&mut plan, &blocks, &mut dequantized, buf[&o], target)?;
                local.insert(o, d);
            }
            lower_node(g, id, &local, target, options, &mut plan)?;
        }
    }
    let mut outputs = Vec::new();
    for &o in g.outputs() {
        let mut buffer = buf[&o];
        if blocks.contains_key(&buffer) {
            buffer = dequantized_buffer(&mut plan, &blocks, &mut dequantized, buffer, target)?;
        }
        outputs.push(PlanOutput {
            name: g.node(o).name.clone(),
            buffer,
            ty: g.ty(o).clone(),
        });
    }
    plan.outputs = outputs;
    Ok(plan)
}

/// The workspace holding the values of the quantized weight whose blocks are in `weight`,
/// dequantized by a kernel appended the first time a reader needs it.
fn dequantized_buffer(
    plan: &mut KernelPlan,
    blocks: &HashMap<BufferId, QuantScheme>,
    dequantized: &mut HashMap<BufferId, BufferId>,
    weight: BufferId,
    target: &Target,
) -> Result<BufferId, CodegenError> {
    if let Some(&d) = dequantized.get(&weight) {
        return Ok(d);
    }
    let ty = plan.buffers[weight].ty.clone();
    let d = gemm_kernels::quant::dequantize(plan, weight, blocks[&weight], &ty, target)?;
    dequantized.insert(weight, d);
    Ok(d)
}

/// Appends the kernels of node `id` (none for sources and reshapes) to `plan`.
fn lower_node(
    g: &Graph,
    id: NodeId,
    buf: &HashMap<NodeId, BufferId>,
    target: &Target,
    options: &CodegenOptions,
    plan: &mut KernelPlan,
) -> Result<(), CodegenError> {
    let node = g.node(id);
    let ops = g.operands(id);
    let args = |extra: &[NodeId]| -> Vec<BufferId> {
        extra.iter().map(|o| buf[o]).chain([buf[&id]]).collect()
    };
    let name = node.name.as_str();
    let ty = &node.ty;
    let k = match &node.op {
        Op::Input { .. }
        | Op::Weight { .. }
        | Op::State { .. }
        | Op::Constant { .. }
        | Op::Reshape { .. } => return Ok(()),
        Op::CacheWrite { axis } => return cache_write(g, id, *axis, &ops, buf, target, plan),
        Op::ArgMax { axis } => argmax(g, id, *axis, &ops, buf, target)?,
        Op::CausalMask { sq, sk, offset } => {
            let n = ty.shape.numel();
            let ctx = json!({"sq": sq, "sk": sk, "n": n,
                "offset": i64_literal(super::kernels::attention::clamp_offset(*offset, *sq, *sk))});
            finish(
                "causal_mask",
                "causal_mask.hip",
                ctx,
                launch_1d(name, target, n)?,
                args(&[]),
                name,
            )?
        }
        Op::Permute { perm } => {
            let src = g.ty(ops[0]).shape.strides();
            let permuted: Vec<usize> = perm.iter().map(|&p| src[p]).collect();
            copy(
                format!("permute {perm:?}"),
                &ty.shape,
                &permuted,
                &ty.shape.strides(),
                (0, 0),
                ty.dtype,
                args(&ops),
                (name, target),
            )?
        }
        Op::Expand { .. } => {
            let src = g.ty(ops[0]).shape.broadcast_strides(&ty.shape);
            copy(
                format!("expand to {}", ty.shape),
                &ty.shape,
                &src,
                &ty.shape.strides(),
                (0, 0),
                ty.dtype,
                args(&ops),
                (name, target),
            )?
        }
        Op::Slice { axis, start, end } => {
            let x = &g.ty(ops[0]).shape;
            let ax = x.axis(*axis).expect("checked by inference");
            let (s, _) =
                crate::ir::slice_bounds(*start, *end, x.dims()[ax]).expect("checked by inference");
            let src = x.strides();
            copy(
                format!("slice {start}..{end} of axis {axis}"),
                &ty.shape,
                &src,
                &ty.shape.strides(),
                (s * src[ax], 0),
                ty.dtype,
                args(&ops),
                (name, target),
            )?
        }
        Op::Concat { axis } => {
            let ax = ty.shape.axis(*axis).expect("checked by inference");
            let dst = ty.shape.strides();
            let mut at = 0;
            for (part_no, &o) in ops.iter().enumerate() {
                let part = &g.ty(o).shape;
                if part.numel() > 0 {
                    let what = format!("concat part {part_no} at offset {at} of axis {axis}");
                    plan.kernels.push(copy(
                        what,
                        part,
                        &part.strides(),
                        &dst,
                        (0, at * dst[ax]),
                        ty.dtype,
                        vec![buf[&o], buf[&id]],
                        (name, target),
                    )?);
                }
                at += part.dims()[ax];
            }
            return Ok(());
        }
        Op::Gather => return gather(g, id, &ops, buf, target, plan),
        Op::Binary(_) | Op::Unary(_) | Op::Where | Op::Cast { .. } | Op::FusedElementwise(_) => {
            let expr = op_expr(&node.op, ops.len()).ok_or_else(|| CodegenError::Unsupported {
                node: name.to_string(),
                reason: format!("`{}` with {} operands", node.op.name(), ops.len()),
            })?;
            elementwise(g, id, &expr, &ops, buf, target)?
        }
        Op::Reduce { op, axes, .. } => reduce(g, id, *op, axes, &ops, buf, target)?,
        Op::Softmax { axis } => {
            let x = &g.ty(ops[0]).shape;
            let ax = x.axis(*axis).expect("checked by inference");
            let len = x.dims()[ax];
            let inner: usize = x.dims()[ax + 1..].iter().product();
            let rows = x.numel() / len.max(1);
            int_index(name, "the softmax axis length", len)?;
            let c = ctype(ty.dtype);
            let ctx = json!({"len": len, "inner": inner, "rows": rows, "row_span": len * inner, "ctype": c.storage, "load_pre": c.load_pre, "load_post": c.load_post, "store_pre": c.store_pre, "store_post": c.store_post});
            let launch = launch(name, target, [rows, 1, 1], BLOCK_1D)?;
            finish("softmax", "softmax.hip", ctx, launch, args(&ops), name)?
        }
        Op::LayerNorm { eps } | Op::RmsNorm { eps } => {
            let layer = matches!(node.op, Op::LayerNorm { .. });
            let d = *ty.shape.dims().last().expect("checked by inference");
            let rows = ty.shape.numel() / d.max(1);
            int_index(name, "the normalised axis length", d)?;
            let (c, w) = (ctype(ty.dtype), ctype(g.ty(ops[1]).dtype));
            // A row of up to NORM_WAVE_ELEMS per lane is one wave's, held in registers and
            // reduced with shuffles, several rows a block; a longer row is one block's, read
            // twice (LayerNorm three times) through shared-memory reductions.
            let wave = target.wave_size as usize;
            let per_lane = d.div_ceil(wave);
            let per_wave = per_lane <= NORM_WAVE_ELEMS;
            let ctx = json!({"d": d, "rows": rows, "eps": eps, "eps_f": f32_literal(*eps), "ctype": c.storage, "wtype": w.storage,
                "load_pre": c.load_pre, "load_post": c.load_post, "store_pre": c.store_pre, "store_post": c.store_post, "w_pre": w.load_pre, "w_post": w.load_post,
                "per_wave": per_wave, "per_lane": per_lane.max(1)});
            let blocks = if per_wave {
                rows.div_ceil(BLOCK_1D / wave)
            } else {
                rows
            };
            let launch = launch(name, target, [blocks, 1, 1], BLOCK_1D)?;
            let (family, template) = if layer {
                ("layernorm", "layernorm.hip")
            } else {
                ("rmsnorm", "rmsnorm.hip")
            };
            finish(family, template, ctx, launch, args(&ops), name)?
        }
        Op::Rope { theta, offset } => {
            let dims = ty.shape.dims();
            let (s, d) = (dims[dims.len() - 2], dims[dims.len() - 1]);
            let rows = ty.shape.numel() / d.max(1);
            let half = d / 2;
            int_index(name, "half the rotated axis", half)?;
            // Positions are `offset + s` in double, as the interpreter computes them; the
            // offset is written as a double literal, which any i64 has.
            let c = ctype(ty.dtype);
            let ctx = json!({"s": s, "d": d, "half": half, "n": rows * half, "positions": ops.len() == 2,
                "theta": double_attr(name, "theta", *theta)?, "offset": format!("({offset}.0)"), "offset_text": offset,
                "ctype": c.storage, "load_pre": c.load_pre, "load_post": c.load_post, "store_pre": c.store_pre, "store_post": c.store_post});
            finish(
                "rope",
                "rope.hip",
                ctx,
                launch_1d(name, target, rows * half)?,
                args(&ops),
                name,
            )?
        }
        Op::MatMul => matmul(g, id, buf, target)?,
        Op::Gemm(gemm) => super::kernels::gemm::lower(g, id, gemm, buf, target, &options.tuned)?,
        Op::FlashAttention(att) => {
            return super::kernels::attention::lower(g, id, att, buf, target, plan, options)
        }
    };
    plan.kernels.push(k);
    Ok(())
}

/// A strided copy over `iter`: element offsets `src`/`dst` strides from `bases` (source,
/// destination).
#[allow(clippy::too_many_arguments)]
fn copy(
    what: String,
    iter: &Shape,
    src: &[usize],
    dst: &[usize],
    (src_base, dst_base): (usize, usize),
    dt: DType,
    args: Vec<BufferId>,
    (node, target): (&str, &Target),
) -> Result<Kernel, CodegenError> {
    let axes: Vec<Value> = (0..iter.rank())
        .rev()
        .filter(|&a| iter.dims()[a] > 1)
        .map(|a| json!({"size": iter.dims()[a], "src": src[a], "dst": dst[a]}))
        .collect();
    let ctx = json!({"what": what, "n": iter.numel(), "ctype": ctype(dt).storage, "src_base": src_base, "dst_base": dst_base, "axes": axes});
    let launch = launch_1d(node, target, iter.numel())?;
    finish("copy", "copy.hip", ctx, launch, args, node)
}

/// Loads of operand `k`: direct when its shape is the result's, else through its offset.
fn operand_load(k: usize, t: &TensorType, out: &Shape) -> String {
    let c = ctype(t.dtype);
    let idx = if t.shape == *out {
        "i".to_string()
    } else {
        format!("o{k}")
    };
    format!("{}in{k}[{idx}]{}", c.load_pre, c.load_post)
}

fn elementwise(
    g: &Graph,
    id: NodeId,
    expr: &Expr,
    ops: &[NodeId],
    buf: &HashMap<NodeId, BufferId>,
    target: &Target,
) -> Result<Kernel, CodegenError> {
    let name = &g.node(id).name;
    let out = g.ty(id);
    let ins: Vec<TensorType> = ops.iter().map(|&o| g.ty(o).clone()).collect();
    let vars: Vec<String> = (0..ops.len()).map(|k| format!("x{k}")).collect();
    let code = render(expr, &vars, &ins, "t", name)?;
    let oc = ctype(out.dtype);
    let strides: Vec<Vec<usize>> = ins
        .iter()
        .map(|t| {
            if t.shape == out.shape {
                vec![0; out.shape.rank()]
            } else {
                t.shape.broadcast_strides(&out.shape)
            }
        })
        .collect();
    let needs_axes = ins.iter().any(|t| t.shape != out.shape);
    let args_json: Vec<Value> = ins
        .iter()
        .enumerate()
        .map(|(k, t)| json!({"ctype": ctype(t.dtype).storage, "vtype": ctype(t.dtype).value, "shape": t.shape.to_string(), "load": operand_load(k, t, &out.shape)}))
        .collect();
    let ctx = json!({
        "what": describe(expr),
        "n": out.shape.numel(), "out_shape": out.shape.to_string(), "out_ctype": oc.storage, "args": args_json,
        "axes": if needs_axes { axes_json(&out.shape, &strides) } else { vec![] }, "broadcast": needs_axes,
        "lines": code.lines, "store": format!("{}{}{}", oc.store_pre, code.value, oc.store_post),
    });
    let mut all: Vec<BufferId> = ops.iter().map(|o| buf[o]).collect();
    all.push(buf[&id]);
    let launch = launch_1d(name, target, out.shape.numel())?;
    finish("elementwise", "elementwise.hip", ctx, launch, all, name)
}

/// A matmul kernel for a MatMul the GEMM pass left (the unfused baseline): contiguous
/// operands with broadcast batch axes, the product stored as it is.
fn matmul(
    g: &Graph,
    mm: NodeId,
    buf: &HashMap<NodeId, BufferId>,
    target: &Target,
) -> Result<Kernel, CodegenError> {
    let node_name = g.node(mm).name.clone();
    let [a, b] = g.operands(mm)[..] else {
        return Err(CodegenError::Unsupported {
            node: node_name,
            reason: "a matmul takes two operands".into(),
        });
    };
    let (at, bt, ct) = (g.ty(a), g.ty(b), g.ty(mm));
    let (ad, bd, cd) = (at.shape.dims(), bt.shape.dims(), ct.shape.dims());
    let (m, k, n) = (ad[ad.len() - 2], ad[ad.len() - 1], bd[bd.len() - 1]);
    for (what, v) in [
        ("rows (M)", m),
        ("the contraction (K)", k),
        ("columns (N)", n),
    ] {
        int_index(&node_name, what, v)?;
    }
    let batch = Shape(cd[..cd.len() - 2].to_vec());
    let a_b = Shape(ad[..ad.len() - 2].to_vec()).broadcast_strides(&batch);
    let b_b = Shape(bd[..bd.len() - 2].to_vec()).broadcast_strides(&batch);
    let batch_axes: Vec<Value> = (0..batch.rank())
        .rev()
        .filter(|&i| batch.dims()[i] > 1)
        .map(|i| json!({"size": batch.dims()[i], "a": a_b[i] * m * k, "b": b_b[i] * k * n}))
        .collect();
    let nb = batch.numel();
    let launch = launch(
        &node_name,
        target,
        [n.div_ceil(64), m.div_ceil(64), nb],
        BLOCK_1D,
    )?;
    let (ac, bc, oc) = (ctype(at.dtype), ctype(bt.dtype), ctype(ct.dtype));
    let ctx = json!({
        "batch": nb, "m": m, "k": k, "n": n, "mn": m * n, "batch_axes": batch_axes,
        "a_t": ac.storage, "b_t": bc.storage, "c_t": oc.storage,
        "a_load_pre": ac.load_pre, "a_load_post": ac.load_post, "b_load_pre": bc.load_pre, "b_load_post": bc.load_post,
        "store": format!("{}acc_v{}", oc.store_pre, oc.store_post),
    });
    let args = vec![buf[&a], buf[&b], buf[&mm]];
    finish("matmul", "matmul.hip", ctx, launch, args, &node_name)
}

fn reduce(
    g: &Graph,
    id: NodeId,
    op: ReduceOp,
    axes: &[i64],
    ops: &[NodeId],
    buf: &HashMap<NodeId, BufferId>,
    target: &Target,
) -> Result<Kernel, CodegenError> {
    let name = &g.node(id).name;
    let x = g.ty(ops[0]);
    let red = crate::ir::reduce_axes(axes, &x.shape).expect("checked by inference");
    let strides = x.shape.strides();
    let pick = |keep: bool| -> Vec<Value> {
        (0..x.shape.rank())
            .rev()
            .filter(|a| red.contains(a) != keep && x.shape.dims()[*a] > 1)
            .map(|a| json!({"size": x.shape.dims()[a], "stride": strides[a]}))
            .collect()
    };
    // Over an empty axis the loop never runs: a sum is 0, a max -inf, and a mean NaN (0/0),
    // PyTorch's results and the interpreter's.
    let count: usize = red.iter().map(|&a| x.shape.dims()[a]).product();
    let c = ctype(x.dtype);
    let (init, combine, finish_expr) = match op {
        ReduceOp::Sum => ("0.0f", "acc + v", "acc".to_string()),
        ReduceOp::Mean if count == 0 => ("0.0f", "acc + v", "NAN".to_string()),
        ReduceOp::Mean => (
            "0.0f",
            "acc + v",
            format!("acc / {}", f32_literal(count as f64)),
        ),
        // rf_max: NaN propagates, as in the interpreter (fmaxf would drop it).
        ReduceOp::Max => ("(-INFINITY)", "rf_max(acc, v)", "acc".to_string()),
    };
    let n = g.ty(id).shape.numel();
    let ctx = json!({"op": op.name(), "n": n, "count": count, "kept": pick(true), "reduced": pick(false), "init": init, "combine": combine, "finish": finish_expr,
        "ctype": c.storage, "load_pre": c.load_pre, "load_post": c.load_post, "store_pre": c.store_pre, "store_post": c.store_post});
    let launch = launch_1d(name, target, n)?;
    finish(
        "reduce",
        "reduce.hip",
        ctx,
        launch,
        vec![buf[&ops[0]], buf[&id]],
        name,
    )
}
