//! Fused graph → kernel plan. Every op that can remain after the passes has a kernel here (one
//! exhaustive match); reshapes alias their operand's buffer, and a cache write its state's (it
//! writes in place); sources are host data.

use std::collections::HashMap;

use super::expr_c::op_expr;
use super::kernels::copy::Strides;
use super::kernels::norm::Norm;
use super::kernels::{
    argmax, attention, cache_write, causal_mask, copy, elementwise, gather, gemm as gemm_kernels,
    matmul, norm, reduce, rope, softmax,
};
use super::plan::{Buffer, BufferId, BufferRole, KernelPlan, PlanOutput};
use super::{CodegenError, CodegenOptions};
use crate::arch::Target;
use crate::ir::{Graph, NodeId, Op, QuantScheme};

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
        stall: None,
        notes: Vec::new(),
    };
    let mut buf: HashMap<NodeId, BufferId> = HashMap::new();
    // Buffers holding a quantized weight's blocks (the weight's, which its reshapes alias), and
    // the workspace each was dequantized into for the readers that cannot read blocks.
    let mut blocks: HashMap<BufferId, QuantScheme> = HashMap::new();
    let mut dequantized: HashMap<BufferId, BufferId> = HashMap::new();
    // ArgMaxes computed by the kernel of the GEMM they read, and those GEMMs (their kernel is
    // emitted at the argmax, `argmax::gemv_argmax`).
    let mut argmax_folds: HashMap<NodeId, NodeId> = HashMap::new();
    for &id in &order {
        if let Op::ArgMax { axis } = g.node(id).op {
            if let Ok(src) = gemm_kernels::argmax_fold::argmax_fold(g, id, axis) {
                argmax_folds.insert(id, src);
            }
        }
    }
    let folded_gemms: std::collections::HashSet<NodeId> = argmax_folds.values().copied().collect();
    for id in order {
        let node = g.node(id);
        if let Op::Reshape { .. } = node.op {
            buf.insert(id, buf[&g.operands(id)[0]]);
            continue;
        }
        if let Op::Slice { axis, start, end } = node.op {
            // A contiguous range of a buffer that holds values (not blocks) is read in place.
            let src = buf[&g.operands(id)[0]];
            let in_place = !options.copy_slices && !blocks.contains_key(&src);
            if let (Some(at), true) = (contiguous_slice(g, id, axis, start, end), in_place) {
                let (base, offset) = plan.storage(src);
                let b = plan.buffers.len();
                plan.buffers.push(Buffer {
                    id: b,
                    name: node.name.clone(),
                    ty: node.ty.clone(),
                    role: BufferRole::Alias {
                        base,
                        offset: offset + at,
                    },
                });
                buf.insert(id, b);
                continue;
            }
        }
        if let Op::PagedCacheWrite = node.op {
            // In place, as a cache write below: the pool's buffer holds the written value.
            buf.insert(id, buf[&g.operands(id)[0]]);
            // A write read only by an appending paged attention is done by that attention's
            // kernel.
            if !attention::realised_by_append(g, id) {
                lower_node(g, id, &buf, target, options, &mut plan)?;
            }
            continue;
        }
        if let Op::CacheWrite { .. } = node.op {
            // In place: the state is read by nothing else (checked above), so its buffer holds
            // the written value from here on.
            buf.insert(id, buf[&g.operands(id)[0]]);
            // A write read only by an appending attention is done by that attention's kernel.
            if !attention::realised_by_append(g, id) {
                lower_node(g, id, &buf, target, options, &mut plan)?;
            }
            continue;
        }
        if attention::realised_by_append(g, id) {
            // k's rope under such a write: the attention's kernel rotates the rows itself; no
            // buffer, since nothing else reads it.
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
        if let Some(&src) = argmax_folds.get(&id) {
            let gemm_ops = g.operands(src);
            if gemm_ops.iter().all(|o| !blocks.contains_key(&buf[o])) {
                argmax::gemv_argmax(g, id, src, &buf, target, &mut plan)?;
                continue;
            }
        }
        if folded_gemms.contains(&id)
            && g.operands(id).iter().all(|o| !blocks.contains_key(&buf[o]))
        {
            // Its kernel is the argmax's (above).
            continue;
        }
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
    let mut copied: HashMap<BufferId, BufferId> = HashMap::new();
    for &o in g.outputs() {
        let mut buffer = buf[&o];
        if blocks.contains_key(&buffer) {
            buffer = dequantized_buffer(&mut plan, &blocks, &mut dequantized, buffer, target)?;
        }
        if let BufferRole::Alias { .. } = plan.buffers[buffer].role {
            buffer = match copied.get(&buffer) {
                Some(&c) => c,
                None => {
                    let c = copy_alias(&mut plan, buffer, target)?;
                    copied.insert(buffer, c);
                    c
                }
            };
        }
        outputs.push(PlanOutput {
            name: g.node(o).name.clone(),
            buffer,
            ty: g.ty(o).clone(),
        });
    }
    plan.outputs = outputs;
    mark_programmatic(&mut plan, target);
    Ok(plan)
}

/// Marks the launches that may go as programmatic dependents (the target's `grid_dependency`):
/// those whose kernel waits on the grid dependency before anything else, i.e. whose entry
/// point's body starts with `RF_GRID_ENTER();`. A kernel without it keeps a plain launch, so a
/// template that forgets the wait is slower, never wrong.
pub(crate) fn mark_programmatic(plan: &mut KernelPlan, target: &Target) {
    for k in &mut plan.kernels {
        k.launch.programmatic =
            target.caps.grid_dependency && body_starts_with_grid_enter(&k.body, &k.entry);
    }
}

/// Whether `entry`'s body in `source` reaches `RF_GRID_ENTER();` before anything that could
/// touch memory: only `using namespace` declarations and `RF_PREFETCH_LOOP(...)` statements (L2
/// prefetches of weights, which load nothing into registers and cannot be stale) may come
/// first. Comments between them are skipped.
pub(crate) fn body_starts_with_grid_enter(source: &str, entry: &str) -> bool {
    let Some(at) = source.find(&format!(" {entry}(")) else {
        return false;
    };
    // The parameter list holds no braces: the body opens at the first `{` after the name.
    let Some(open) = source[at..].find('{') else {
        return false;
    };
    for line in source[at + open + 1..].lines().map(str::trim) {
        if line.is_empty() || line.starts_with("//") {
            continue;
        }
        if line == "RF_GRID_ENTER();" {
            return true;
        }
        let allowed = (line.starts_with("using namespace ") && line.ends_with(';'))
            || (line.starts_with("RF_PREFETCH_LOOP(") && line.ends_with(");"));
        if !allowed {
            return false;
        }
    }
    false
}

/// Where a slice node's result starts in its operand's buffer, when it is one contiguous range
/// of it (every axis before the sliced one has one index, or the slice takes the whole axis)
/// starting at an aligned byte.
fn contiguous_slice(g: &Graph, id: NodeId, axis: i64, start: i64, end: i64) -> Option<usize> {
    let x = g.ty(g.operands(id)[0]);
    let ax = x.shape.axis(axis)?;
    let d = x.shape.dims();
    let (s, e) = crate::ir::slice_bounds(start, end, d[ax]).ok()?;
    let whole = s == 0 && e == d[ax];
    let at = s * x.shape.strides()[ax];
    let aligned = (at * x.dtype.size_bytes()).is_multiple_of(crate::ir::IN_PLACE_ALIGN_BYTES);
    ((whole || d[..ax].iter().product::<usize>() == 1) && aligned).then_some(at)
}

/// A graph output's own buffer holding the alias `alias`'s values (an output is bound and
/// read back from its start), copied by a kernel appended here.
fn copy_alias(
    plan: &mut KernelPlan,
    alias: BufferId,
    target: &Target,
) -> Result<BufferId, CodegenError> {
    let (base, offset) = plan.storage(alias);
    let a = plan.buffers[alias].clone();
    let c = plan.buffers.len();
    plan.buffers.push(Buffer {
        id: c,
        name: a.name.clone(),
        ty: a.ty.clone(),
        role: BufferRole::Computed,
    });
    if a.ty.shape.numel() > 0 {
        let strides = a.ty.shape.strides();
        plan.kernels.push(copy::kernel(
            format!("output slice at element {offset}"),
            &a.ty.shape,
            Strides {
                src: &strides,
                dst: &strides,
                bases: (offset, 0),
            },
            a.ty.dtype,
            vec![base, c],
            (&a.name, target),
        )?);
    }
    Ok(c)
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
        Op::CacheWrite { axis, rope } => {
            return cache_write::cache_write(g, id, (*axis, *rope), &ops, buf, target, plan)
        }
        Op::ArgMax { axis } => return argmax::argmax(g, id, *axis, &ops, buf, target, plan),
        Op::PagedCacheWrite => {
            return attention::paged::paged_write(g, id, &ops, buf, target, plan)
        }
        Op::PagedAttention {
            scale,
            window,
            append,
        } => {
            return attention::paged::paged_attention(
                g,
                id,
                (*scale, *window),
                append.as_ref(),
                buf,
                target,
                plan,
            )
        }
        Op::CausalMask { sq, sk, offset } => causal_mask::kernel(
            (*sq, *sk, *offset),
            ty.shape.numel(),
            args(&[]),
            name,
            target,
        )?,
        Op::Permute { perm } => {
            let src = g.ty(ops[0]).shape.strides();
            let permuted: Vec<usize> = perm.iter().map(|&p| src[p]).collect();
            let dst = ty.shape.strides();
            copy::kernel(
                format!("permute {perm:?}"),
                &ty.shape,
                Strides {
                    src: &permuted,
                    dst: &dst,
                    bases: (0, 0),
                },
                ty.dtype,
                args(&ops),
                (name, target),
            )?
        }
        Op::Expand { .. } => {
            let src = g.ty(ops[0]).shape.broadcast_strides(&ty.shape);
            let dst = ty.shape.strides();
            copy::kernel(
                format!("expand to {}", ty.shape),
                &ty.shape,
                Strides {
                    src: &src,
                    dst: &dst,
                    bases: (0, 0),
                },
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
            let dst = ty.shape.strides();
            copy::kernel(
                format!("slice {start}..{end} of axis {axis}"),
                &ty.shape,
                Strides {
                    src: &src,
                    dst: &dst,
                    bases: (s * src[ax], 0),
                },
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
                    plan.kernels.push(copy::kernel(
                        what,
                        part,
                        Strides {
                            src: &part.strides(),
                            dst: &dst,
                            bases: (0, at * dst[ax]),
                        },
                        ty.dtype,
                        vec![buf[&o], buf[&id]],
                        (name, target),
                    )?);
                }
                at += part.dims()[ax];
            }
            return Ok(());
        }
        Op::Gather => return gather::gather(g, id, &ops, buf, target, plan),
        Op::Binary(_) | Op::Unary(_) | Op::Where | Op::Cast { .. } | Op::FusedElementwise(_) => {
            let expr = op_expr(&node.op, ops.len()).ok_or_else(|| CodegenError::Unsupported {
                node: name.to_string(),
                reason: format!("`{}` with {} operands", node.op.name(), ops.len()),
            })?;
            elementwise::kernel(g, id, &expr, &ops, buf, target)?
        }
        Op::Reduce { op, axes, .. } => reduce::kernel(
            *op,
            axes,
            g.ty(ops[0]),
            ty.shape.numel(),
            vec![buf[&ops[0]], buf[&id]],
            name,
            target,
        )?,
        Op::Softmax { axis } => {
            let x = &g.ty(ops[0]).shape;
            let ax = x.axis(*axis).expect("checked by inference");
            softmax::kernel(x, ax, ty, args(&ops), name, target)?
        }
        Op::LayerNorm { eps } => norm::kernel(
            Norm::Layer,
            *eps,
            ty,
            g.ty(ops[1]).dtype,
            args(&ops),
            name,
            target,
        )?,
        Op::RmsNorm { eps } => norm::kernel(
            Norm::Rms,
            *eps,
            ty,
            g.ty(ops[1]).dtype,
            args(&ops),
            name,
            target,
        )?,
        Op::Rope {
            theta,
            offset,
            factors,
        } => rope::kernel(
            (*theta, *offset, factors),
            ty,
            ops.len() == 2,
            args(&ops),
            name,
            target,
        )?,
        Op::MatMul => matmul::kernel(g, id, buf, target)?,
        Op::Gemm(gemm) => gemm_kernels::lower(g, id, gemm, buf, target, options, plan)?,
        Op::FlashAttention(att) => return attention::lower(g, id, att, buf, target, plan, options),
    };
    plan.kernels.push(k);
    Ok(())
}

#[cfg(test)]
mod grid_enter_tests {
    use super::body_starts_with_grid_enter as starts;

    #[test]
    fn the_wait_must_come_before_anything_that_touches_memory() {
        let k =
            |body: &str| format!("extern \"C\" __global__ void k(const float* x) {{\n{body}\n}}");
        assert!(starts(&k("    RF_GRID_ENTER();\n    x[0];"), "k"));
        assert!(starts(
            &k("    using namespace k_ns;\n    // why\n    RF_PREFETCH_LOOP(i, 0, 4, 1, x + i);\n    RF_GRID_ENTER();"),
            "k"
        ));
        assert!(!starts(
            &k("    const float v = x[0];\n    RF_GRID_ENTER();"),
            "k"
        ));
        assert!(!starts(&k("    if (x) return;\n    RF_GRID_ENTER();"), "k"));
        assert!(!starts(&k("    x[0];"), "k"));
        assert!(!starts(&k("    RF_GRID_ENTER();"), "other"));
    }
}
