//! Fused graph → kernel plan. Every op that can remain after the passes has a kernel here (one
//! exhaustive match); reshapes alias their operand's buffer; sources are host data.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::ctype::{ctype, f32_literal};
use super::expr_c::{op_expr, render};
use super::mma::MmaAtom;
use super::plan::{Buffer, BufferId, BufferRole, Kernel, KernelPlan, Launch, PlanOutput};
use super::{templates, CodegenError, CodegenOptions, Target};
use crate::ir::{Attention, DType, Expr, Graph, MaskKind, NodeId, Op, ReduceOp, Shape, TensorType};

const ENTRY: &str = "__RF_ENTRY__";

/// Renders a template and names the kernel after its body, so identical kernels are one.
fn finish(
    family: &'static str,
    template: &str,
    ctx: Value,
    launch: Launch,
    args: Vec<BufferId>,
    node: &str,
) -> Result<Kernel, CodegenError> {
    let mut ctx = ctx;
    ctx["entry"] = json!(ENTRY);
    let body = templates::render(template, minijinja::Value::from_serialize(&ctx))?;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in family.bytes().chain(body.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let entry = format!("rf_{family}_{:012x}", h >> 16);
    Ok(Kernel {
        entry: entry.clone(),
        family,
        node: node.to_string(),
        body: body.replace(ENTRY, &entry),
        launch,
        args,
    })
}

fn blocks_1d(n: usize) -> Launch {
    Launch {
        grid: [n.div_ceil(256).max(1) as u32, 1, 1],
        block: [256, 1, 1],
        shared_bytes: 0,
    }
}

fn too_big(node: &str, what: String) -> CodegenError {
    CodegenError::Unsupported {
        node: node.to_string(),
        reason: what,
    }
}

/// Strided axes, innermost first, skipping size-1 axes.
fn axes_json(shape: &Shape, strides: &[Vec<usize>]) -> Vec<Value> {
    (0..shape.rank())
        .rev()
        .filter(|&a| shape.dims()[a] > 1)
        .map(|a| json!({"size": shape.dims()[a], "strides": strides.iter().map(|s| s[a]).collect::<Vec<_>>()}))
        .collect()
}

/// A MatMul whose only use is an elementwise node of the same shape computes that node's
/// expression in its store loop (bias, activation, residual): returns consumer → matmul.
fn epilogues(g: &Graph) -> HashMap<NodeId, NodeId> {
    let mut out = HashMap::new();
    for id in g.node_ids() {
        if !matches!(g.op(id), Op::MatMul) || g.use_count(id) != 1 || g.is_output(id) {
            continue;
        }
        let [user] = g.consumers(id)[..] else {
            continue;
        };
        if op_expr(g.op(user), g.operands(user).len()).is_some()
            && g.ty(user).shape == g.ty(id).shape
            && !out.contains_key(&user)
        {
            out.insert(user, id);
        }
    }
    out
}

pub(crate) fn generate(
    g: &Graph,
    target: &Target,
    options: &CodegenOptions,
) -> Result<KernelPlan, CodegenError> {
    let order = g.topo_order()?;
    let epi = if options.matmul_epilogues {
        epilogues(g)
    } else {
        HashMap::new()
    };
    let absorbed: std::collections::HashSet<NodeId> = epi.values().copied().collect();
    let mut plan = KernelPlan {
        target: target.clone(),
        graph: g.name.clone(),
        buffers: Vec::new(),
        kernels: Vec::new(),
        outputs: Vec::new(),
    };
    let mut buf: HashMap<NodeId, BufferId> = HashMap::new();
    for id in order {
        if absorbed.contains(&id) {
            continue;
        }
        let node = g.node(id);
        if let Op::Reshape { .. } = node.op {
            buf.insert(id, buf[&g.operands(id)[0]]);
            continue;
        }
        let role = match &node.op {
            Op::Input { sample, .. } => BufferRole::Input(sample.clone()),
            Op::Weight { init, .. } => BufferRole::Weight(init.clone()),
            Op::Constant { values, .. } => BufferRole::Constant(values.clone()),
            _ => BufferRole::Computed,
        };
        let b = plan.buffers.len();
        plan.buffers.push(Buffer {
            id: b,
            name: node.name.clone(),
            ty: node.ty.clone(),
            role,
        });
        buf.insert(id, b);
        if node.ty.shape.numel() == 0 {
            continue;
        }
        let kernels = lower_node(g, id, &buf, epi.get(&id).copied(), target)?;
        plan.kernels.extend(kernels);
    }
    plan.outputs = g
        .outputs()
        .iter()
        .map(|&o| PlanOutput {
            name: g.node(o).name.clone(),
            buffer: buf[&o],
            ty: g.ty(o).clone(),
        })
        .collect();
    Ok(plan)
}

fn lower_node(
    g: &Graph,
    id: NodeId,
    buf: &HashMap<NodeId, BufferId>,
    epilogue_of: Option<NodeId>,
    target: &Target,
) -> Result<Vec<Kernel>, CodegenError> {
    let node = g.node(id);
    let ops = g.operands(id);
    let args = |extra: &[NodeId]| -> Vec<BufferId> {
        extra.iter().map(|o| buf[o]).chain([buf[&id]]).collect()
    };
    let name = node.name.as_str();
    let ty = &node.ty;
    let k = match &node.op {
        Op::Input { .. } | Op::Weight { .. } | Op::Constant { .. } | Op::Reshape { .. } => {
            return Ok(vec![])
        }
        Op::CausalMask { sq, sk, offset } => {
            let ctx = json!({"sq": sq, "sk": sk, "offset": offset});
            finish(
                "causal_mask",
                "causal_mask.hip",
                ctx,
                blocks_1d(sq * sk),
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
                0,
                0,
                ty.dtype,
                args(&ops),
                name,
            )?
        }
        Op::Expand { .. } => {
            let src = g.ty(ops[0]).shape.broadcast_strides(&ty.shape);
            copy(
                format!("expand to {}", ty.shape),
                &ty.shape,
                &src,
                &ty.shape.strides(),
                0,
                0,
                ty.dtype,
                args(&ops),
                name,
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
                s * src[ax],
                0,
                ty.dtype,
                args(&ops),
                name,
            )?
        }
        Op::Concat { axis } => {
            let ax = ty.shape.axis(*axis).expect("checked by inference");
            let dst = ty.shape.strides();
            let mut at = 0;
            let mut kernels = Vec::new();
            for &o in &ops {
                let part = &g.ty(o).shape;
                if part.numel() > 0 {
                    let what = format!(
                        "concat part {} at offset {at} of axis {axis}",
                        g.node(o).name
                    );
                    kernels.push(copy(
                        what,
                        part,
                        &part.strides(),
                        &dst,
                        0,
                        at * dst[ax],
                        ty.dtype,
                        vec![buf[&o], buf[&id]],
                        name,
                    )?);
                }
                at += part.dims()[ax];
            }
            return Ok(kernels);
        }
        Op::Gather => {
            let t = g.ty(ops[0]);
            let c = ctype(t.dtype);
            let bad = if t.dtype.is_float() {
                format!("{}NAN{}", c.store_pre, c.store_post)
            } else {
                "0".into()
            };
            let row: usize = t.shape.dims()[1..].iter().product();
            let ctx = json!({"ctype": c.storage, "itype": ctype(g.ty(ops[1]).dtype).storage, "row": row.max(1), "rows": t.shape.dims()[0], "n": ty.shape.numel(), "count": g.ty(ops[1]).shape.numel(), "bad": bad});
            finish(
                "gather",
                "gather.hip",
                ctx,
                blocks_1d(ty.shape.numel()),
                args(&ops),
                name,
            )?
        }
        Op::Binary(_) | Op::Unary(_) | Op::Where | Op::Cast { .. } | Op::FusedElementwise(_) => {
            let expr = op_expr(&node.op, ops.len()).expect("elementwise op");
            match epilogue_of {
                Some(mm) => matmul(g, mm, Some((id, &expr, &ops)), buf)?,
                None => elementwise(g, id, &expr, &ops, buf)?,
            }
        }
        Op::Reduce { op, axes, .. } => reduce(g, id, *op, axes, &ops, buf)?,
        Op::Softmax { axis } => {
            let x = &g.ty(ops[0]).shape;
            let ax = x.axis(*axis).expect("checked by inference");
            let len = x.dims()[ax];
            let inner: usize = x.dims()[ax + 1..].iter().product();
            let rows = x.numel() / len.max(1);
            let c = ctype(ty.dtype);
            let ctx = json!({"len": len, "inner": inner, "rows": rows, "ctype": c.storage, "load_pre": c.load_pre, "load_post": c.load_post, "store_pre": c.store_pre, "store_post": c.store_post});
            let launch = Launch {
                grid: [rows as u32, 1, 1],
                block: [256, 1, 1],
                shared_bytes: 0,
            };
            finish("softmax", "softmax.hip", ctx, launch, args(&ops), name)?
        }
        Op::LayerNorm { eps } | Op::RmsNorm { eps } => {
            let layer = matches!(node.op, Op::LayerNorm { .. });
            let d = *ty.shape.dims().last().expect("checked by inference");
            let rows = ty.shape.numel() / d;
            let (c, w) = (ctype(ty.dtype), ctype(g.ty(ops[1]).dtype));
            let ctx = json!({"d": d, "rows": rows, "eps": eps, "eps_f": f32_literal(*eps), "ctype": c.storage, "wtype": w.storage,
                "load_pre": c.load_pre, "load_post": c.load_post, "store_pre": c.store_pre, "store_post": c.store_post, "w_pre": w.load_pre, "w_post": w.load_post});
            let launch = Launch {
                grid: [rows as u32, 1, 1],
                block: [256, 1, 1],
                shared_bytes: 0,
            };
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
            let rows = ty.shape.numel() / d;
            let c = ctype(ty.dtype);
            let ctx = json!({"s": s, "d": d, "half": d / 2, "rows": rows, "theta": format!("{theta:e}"), "offset": offset,
                "ctype": c.storage, "load_pre": c.load_pre, "load_post": c.load_post, "store_pre": c.store_pre, "store_post": c.store_post});
            finish(
                "rope",
                "rope.hip",
                ctx,
                blocks_1d(rows * d / 2),
                args(&ops),
                name,
            )?
        }
        Op::MatMul => matmul(g, id, None, buf)?,
        Op::FlashAttention(att) => flash(g, id, att, &ops, buf, target)?,
    };
    Ok(vec![k])
}

#[allow(clippy::too_many_arguments)]
fn copy(
    what: String,
    iter: &Shape,
    src: &[usize],
    dst: &[usize],
    src_base: usize,
    dst_base: usize,
    dt: DType,
    args: Vec<BufferId>,
    node: &str,
) -> Result<Kernel, CodegenError> {
    let axes: Vec<Value> = (0..iter.rank())
        .rev()
        .filter(|&a| iter.dims()[a] > 1)
        .map(|a| json!({"size": iter.dims()[a], "src": src[a], "dst": dst[a]}))
        .collect();
    let ctx = json!({"what": what, "n": iter.numel(), "ctype": ctype(dt).storage, "src_base": src_base, "dst_base": dst_base, "axes": axes});
    finish("copy", "copy.hip", ctx, blocks_1d(iter.numel()), args, node)
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
) -> Result<Kernel, CodegenError> {
    let out = g.ty(id);
    let ins: Vec<TensorType> = ops.iter().map(|&o| g.ty(o).clone()).collect();
    let vars: Vec<String> = (0..ops.len()).map(|k| format!("x{k}")).collect();
    let (code, _) = render(expr, &vars, &ins);
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
        "what": format!("{} = {expr}", g.node(id).name).replace("{", "(").replace("}", ")"),
        "n": out.shape.numel(), "out_shape": out.shape.to_string(), "out_ctype": oc.storage, "args": args_json,
        "axes": if needs_axes { axes_json(&out.shape, &strides) } else { vec![] }, "broadcast": needs_axes,
        "store": format!("{}{code}{}", oc.store_pre, oc.store_post),
    });
    let mut all: Vec<BufferId> = ops.iter().map(|o| buf[o]).collect();
    all.push(buf[&id]);
    finish(
        "elementwise",
        "elementwise.hip",
        ctx,
        blocks_1d(out.shape.numel()),
        all,
        &g.node(id).name,
    )
}

/// A matmul kernel; with `epilogue`, it computes that elementwise node's expression on the
/// product (operand slots reading the matmul become the accumulator) and writes its buffer.
fn matmul(
    g: &Graph,
    mm: NodeId,
    epilogue: Option<(NodeId, &Expr, &[NodeId])>,
    buf: &HashMap<NodeId, BufferId>,
) -> Result<Kernel, CodegenError> {
    let [a, b] = g.operands(mm)[..] else {
        unreachable!("matmul has two operands")
    };
    let (at, bt, ct) = (g.ty(a), g.ty(b), g.ty(mm));
    let (ad, bd, cd) = (at.shape.dims(), bt.shape.dims(), ct.shape.dims());
    let (m, k, n) = (ad[ad.len() - 2], ad[ad.len() - 1], bd[bd.len() - 1]);
    let batch = Shape(cd[..cd.len() - 2].to_vec());
    let a_b = Shape(ad[..ad.len() - 2].to_vec()).broadcast_strides(&batch);
    let b_b = Shape(bd[..bd.len() - 2].to_vec()).broadcast_strides(&batch);
    let batch_axes: Vec<Value> = (0..batch.rank())
        .rev()
        .filter(|&i| batch.dims()[i] > 1)
        .map(|i| json!({"size": batch.dims()[i], "a": a_b[i] * m * k, "b": b_b[i] * k * n}))
        .collect();
    let nb = batch.numel();
    let node_name = epilogue
        .map_or(&g.node(mm).name, |(e, ..)| &g.node(e).name)
        .clone();
    if nb > 65535 {
        return Err(too_big(
            &node_name,
            format!("{nb} matmul batches exceed the grid's z limit"),
        ));
    }
    let (ac, bc) = (ctype(at.dtype), ctype(bt.dtype));
    let mut args = vec![buf[&a], buf[&b]];
    let (mut extra, mut axes, mut text, out_id) = (
        vec![],
        vec![],
        String::new(),
        epilogue.map_or(mm, |(e, ..)| e),
    );
    let store;
    // Some epilogue operand is broadcast, so its offset must be declared even when every axis of
    // the output has size 1 (and no axis loop is emitted).
    let mut broadcast = false;
    let oc = ctype(g.ty(out_id).dtype);
    match epilogue {
        None => store = format!("{}acc_v{}", oc.store_pre, oc.store_post),
        Some((e, expr, ops)) => {
            let ins: Vec<TensorType> = ops.iter().map(|&o| g.ty(o).clone()).collect();
            let vars: Vec<String> = ops
                .iter()
                .enumerate()
                .map(|(i, &o)| {
                    if o == mm {
                        "acc_v".into()
                    } else {
                        format!("x{i}")
                    }
                })
                .collect();
            let (code, _) = render(expr, &vars, &ins);
            store = format!("{}{code}{}", oc.store_pre, oc.store_post);
            text = format!(
                "%{} = {expr}, with ${} the product",
                g.node(e).name,
                ops.iter().position(|&o| o == mm).unwrap_or(0)
            );
            let out_shape = &g.ty(e).shape;
            let mut seen = Vec::new();
            let mut strides_list = Vec::new();
            for (i, &o) in ops.iter().enumerate() {
                if o == mm || seen.contains(&i) {
                    continue;
                }
                seen.push(i);
                let t = g.ty(o);
                extra.push(json!({"index": i, "ctype": ctype(t.dtype).storage, "vtype": ctype(t.dtype).value, "load": operand_load(i, t, out_shape)}));
                args.push(buf[&o]);
                let s = if t.shape == *out_shape {
                    vec![0; out_shape.rank()]
                } else {
                    t.shape.broadcast_strides(out_shape)
                };
                broadcast |= t.shape != *out_shape;
                strides_list.push((i, s));
            }
            axes = (0..out_shape.rank())
                .rev()
                .filter(|&x| out_shape.dims()[x] > 1)
                .map(|x| json!({"size": out_shape.dims()[x], "strides": strides_list.iter().map(|(i, s)| json!({"index": i, "stride": s[x]})).collect::<Vec<_>>()}))
                .collect();
        }
    }
    args.push(buf[&out_id]);
    let ctx = json!({
        "batch": nb, "m": m, "k": k, "n": n, "batch_axes": batch_axes,
        "a_t": ac.storage, "b_t": bc.storage, "c_t": oc.storage,
        "a_load_pre": ac.load_pre, "a_load_post": ac.load_post, "b_load_pre": bc.load_pre, "b_load_post": bc.load_post,
        "epilogue": epilogue.is_some(), "epilogue_text": text, "extra": extra, "axes": axes, "store": store, "broadcast": broadcast,
    });
    let launch = Launch {
        grid: [n.div_ceil(64) as u32, m.div_ceil(64) as u32, nb as u32],
        block: [256, 1, 1],
        shared_bytes: 0,
    };
    finish("matmul", "matmul.hip", ctx, launch, args, &node_name)
}

fn reduce(
    g: &Graph,
    id: NodeId,
    op: ReduceOp,
    axes: &[i64],
    ops: &[NodeId],
    buf: &HashMap<NodeId, BufferId>,
) -> Result<Kernel, CodegenError> {
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
    let count: usize = red.iter().map(|&a| x.shape.dims()[a]).product();
    let c = ctype(x.dtype);
    let (init, combine, finish_expr) = match op {
        ReduceOp::Sum => ("0.0f", "acc + v", "acc".to_string()),
        ReduceOp::Mean => (
            "0.0f",
            "acc + v",
            format!("acc / {}", f32_literal(count as f64)),
        ),
        ReduceOp::Max => ("(-INFINITY)", "fmaxf(acc, v)", "acc".to_string()),
    };
    let n = g.ty(id).shape.numel();
    let ctx = json!({"op": op.name(), "n": n, "count": count, "kept": pick(true), "reduced": pick(false), "init": init, "combine": combine, "finish": finish_expr,
        "ctype": c.storage, "load_pre": c.load_pre, "load_post": c.load_post, "store_pre": c.store_pre, "store_post": c.store_post});
    finish(
        "reduce",
        "reduce.hip",
        ctx,
        blocks_1d(n),
        vec![buf[&ops[0]], buf[&id]],
        &g.node(id).name,
    )
}

fn flash(
    g: &Graph,
    id: NodeId,
    att: &Attention,
    ops: &[NodeId],
    buf: &HashMap<NodeId, BufferId>,
    target: &Target,
) -> Result<Kernel, CodegenError> {
    let (q, k, v) = (g.ty(ops[0]), g.ty(ops[1]), g.ty(ops[2]));
    let [b, hq, sq, d] = q.shape.dims()[..] else {
        unreachable!("rank 4 by inference")
    };
    let [_, hkv, sk, _] = k.shape.dims()[..] else {
        unreachable!()
    };
    let dv = v.shape.dims()[3];
    let c = ctype(q.dtype);
    let (mask_kind, mask_t, ms) = match (att.mask, ops.get(3)) {
        (MaskKind::None, _) | (_, None) => ("", DType::F32, vec![0usize; 4]),
        (kind, Some(&m)) => {
            let mt = g.ty(m);
            let padded = Shape(
                std::iter::repeat_n(1, 4 - mt.shape.rank())
                    .chain(mt.shape.dims().iter().copied())
                    .collect(),
            );
            let strides = padded.broadcast_strides(&Shape::new(vec![b, hq, sq, sk]));
            (
                if kind == MaskKind::Boolean {
                    "boolean"
                } else {
                    "additive"
                },
                mt.dtype,
                strides,
            )
        }
    };
    let mc = ctype(mask_t);
    let mut ctx = json!({
        "b": b, "hq": hq, "hkv": hkv, "group": hq / hkv, "sq": sq, "sk": sk, "d": d, "dv": dv,
        "scale": att.scale, "scale_f": f32_literal(att.scale), "causal": att.causal, "offset": att.causal_offset,
        "mask": mask_kind, "mask_ctype": mc.storage, "mask_load_pre": mc.load_pre, "mask_load_post": mc.load_post, "ms": ms,
        "ctype": c.storage, "load_pre": c.load_pre, "load_post": c.load_post, "store_pre": c.store_pre, "store_post": c.store_post,
    });
    // Tensor cores where the target's table has an atom the kernel is written for (see
    // `tensor_core_atom`), the head sizes are whole atoms (D in K steps, Dv in pairs of N
    // tiles) and the fragments fit in registers (up to 128).
    let mma = tensor_core_atom(target, q.dtype)
        .filter(|a| d % a.k as usize == 0 && dv % (2 * a.n as usize) == 0 && d <= 128 && dv <= 128);
    let (template, block_m, threads) = match mma {
        Some(atom) => {
            let warps = 4;
            let (block_m, threads) = (atom.m as usize * warps, atom.lanes as usize * warps);
            let tile = json!({"warps": warps, "block_m": block_m, "block_n": 64, "threads": threads,
                "dtype": q.dtype.to_string(), "p": atom.prefix(), "am": atom.m, "an": atom.n, "ak": atom.k});
            merge(&mut ctx, tile);
            ("flash_attention_mma.hip", block_m, threads)
        }
        None => {
            let tpr = d.div_ceil(8).next_power_of_two().clamp(1, 16);
            let block_m = 256 / tpr;
            // K and V tiles in f32 within 48 KiB of shared memory.
            let block_n = (12288 / (d + dv + 2)).clamp(1, 32);
            let tile = json!({"tpr": tpr, "block_m": block_m, "block_n": block_n, "threads": block_m * tpr,
                "dper": d.div_ceil(tpr), "dvper": dv.div_ceil(tpr)});
            merge(&mut ctx, tile);
            ("flash_attention.hip", block_m, block_m * tpr)
        }
    };
    let launch = Launch {
        grid: [(b * hq) as u32, sq.div_ceil(block_m) as u32, 1],
        block: [threads as u32, 1, 1],
        shared_bytes: 0,
    };
    let mut args: Vec<BufferId> = ops.iter().map(|o| buf[o]).collect();
    args.push(buf[&id]);
    finish(
        "flash_attention",
        template,
        ctx,
        launch,
        args,
        &g.node(id).name,
    )
}

/// The matrix atom `flash_attention_mma.hip` runs on, if the target's table has one for `dtype`:
/// f32 accumulation, S accumulators that become the P·V operand in registers, K and V
/// fragments by `ldmatrix` pairs, and `cp.async` for the K/V tiles.
fn tensor_core_atom(target: &Target, dtype: DType) -> Option<&'static MmaAtom> {
    if !target.caps.async_copy.has_cp_async() {
        return None;
    }
    target.caps.mma.iter().copied().find(|a| {
        a.input == dtype
            && a.acc == DType::F32
            && a.accumulators_feed_a()
            && a.loads_b_pairs_by_ldmatrix()
    })
}

/// Adds the keys of `extra` (a JSON object) to `ctx`.
fn merge(ctx: &mut Value, extra: Value) {
    if let (Some(c), Value::Object(e)) = (ctx.as_object_mut(), extra) {
        c.extend(e);
    }
}
