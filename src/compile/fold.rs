//! Concatenated weights folded at bind time. The `merge_gemms` pass gives a merged Gemm the
//! weights of its members as `concat(axis 0)` of `Op::Weight` nodes: a value the interpreter and
//! every shape rule already know. Before codegen (or the CPU executor) sees the graph, each such
//! concat becomes one `Op::Weight` of the same name whose data is the parts' data end to end
//! (dense values, or quantized block rows: blocks run along the last axis, so rows of
//! `[N_i, K]` stack along N byte for byte). Kernels then read one bound weight (the quantized
//! GEMV its blocks) and nothing concatenates at run time.
//!
//! A paired-column Gemm (gate and up merged, `ir::gemm` "paired columns") reads its weights'
//! rows interleaved, row 2j the gate's row j and row 2j + 1 the up's: the pass builds that as
//! `reshape([2N, K], concat(axis 1, W_gate [N, K], W_up [N, K]))` (row j of the concat is the
//! two rows end to end, which the reshape splits). A concat of weights along an inner axis whose
//! only reader is a reshape folds the same way, the reshape with it: the data is, for each index
//! of the axes before the concat's, each part's run after it in turn. Quantized parts
//! interleave whole block rows: the concat's axis is at most the last, whose rows are whole
//! blocks (K a multiple of the block), so a part's run is whole rows of blocks.

use std::collections::HashMap;

use super::CompileError;
use crate::interp::InterpError;
use crate::ir::{Graph, GraphError, Init, NodeId, Op, QuantError, QuantScheme, Tensor};
use crate::ir::{QuantTensor, TensorType};

/// A weight made of other weights concatenated along their first axis.
#[derive(Clone, Debug, PartialEq)]
pub struct FoldedWeight {
    /// The folded weight's name (the concat node's).
    pub name: String,
    /// The parts, in order.
    pub parts: Vec<String>,
    /// The number of indices before the concat's axis: the data is `outer` runs of each part
    /// in turn (1 for a concat along the first axis).
    pub outer: usize,
    pub ty: TensorType,
    pub quant: Option<QuantScheme>,
}

/// Replaces every `concat(axis 0)` of weights of one scheme by one weight of its name, and every
/// concat of weights along another axis that only a reshape reads (with that reshape) by one
/// weight of the reshape's name and type; removes the parts nothing else reads. The data is
/// bound by [`bind_folded`].
pub fn fold_weight_concats(g: &mut Graph) -> Result<Vec<FoldedWeight>, GraphError> {
    let mut folds = Vec::new();
    let concats: Vec<NodeId> = g
        .node_ids()
        .filter(|&id| matches!(g.op(id), Op::Concat { .. }))
        .collect();
    for id in concats {
        let Op::Concat { axis } = g.op(id) else {
            continue;
        };
        let cty = g.ty(id).clone();
        let Some(at) = cty.shape.axis(*axis) else {
            continue;
        };
        // Along an inner axis: only as the interleave that the reshape reading it completes.
        let users = g.consumers(id);
        let reshape = match users.as_slice() {
            [r] if at != 0 && matches!(g.op(*r), Op::Reshape { .. }) && !g.is_output(id) => {
                Some(*r)
            }
            _ if at == 0 => None,
            _ => continue,
        };
        let outer: usize = cty.shape.dims()[..at].iter().product();
        let parts = g.operands(id);
        let quants: Vec<Option<QuantScheme>> = parts
            .iter()
            .map_while(|&p| match g.op(p) {
                Op::Weight { quant, .. } => Some(*quant),
                _ => None,
            })
            .collect();
        if quants.len() != parts.len() || quants.iter().any(|q| *q != quants[0]) {
            continue;
        }
        // The folded weight replaces the reshape where there is one.
        let top = reshape.unwrap_or(id);
        let ty = g.ty(top).clone();
        let name = g.node(top).name.clone();
        let part_names = parts.iter().map(|&p| g.node(p).name.clone()).collect();
        let tmp = g.fresh_name("folded_weight");
        let w = g.add_node(
            Some(&tmp),
            Op::Weight {
                dtype: ty.dtype,
                shape: ty.shape.clone(),
                // Never drawn: `bind_folded` binds the parts' data.
                init: Init::Normal,
                quant: quants[0],
            },
            &[],
        )?;
        g.replace_all_uses(top, w)?;
        g.remove_node(top);
        if top != id {
            g.remove_node(id);
        }
        g.rename(w, &name)?;
        for p in parts {
            if g.contains(p) && g.use_count(p) == 0 && !g.is_output(p) {
                g.remove_node(p);
            }
        }
        folds.push(FoldedWeight {
            name,
            parts: part_names,
            outer,
            ty,
            quant: quants[0],
        });
    }
    Ok(folds)
}

/// Binds each folded weight's data: for each of the `outer` indices before the concat's axis,
/// each part's run in turn (one run each: the parts end to end, along the first axis). The parts
/// stay bound (the source graph, which `verify` interprets, still reads them).
pub fn bind_folded(
    folds: &[FoldedWeight],
    weights: &mut HashMap<String, Tensor>,
    quantized: &mut HashMap<String, QuantTensor>,
) -> Result<(), CompileError> {
    for f in folds {
        let missing = |part: &str| CompileError::FoldedPart {
            name: f.name.clone(),
            part: part.to_string(),
        };
        match f.quant {
            Some(scheme) => {
                let parts = f
                    .parts
                    .iter()
                    .map(|p| Ok(quantized.get(p).ok_or_else(|| missing(p))?.bytes()))
                    .collect::<Result<Vec<&[u8]>, CompileError>>()?;
                let bytes = interleave(&parts, f.outer);
                let q = QuantTensor::new(scheme, f.ty.shape.clone(), bytes).map_err(
                    |source: QuantError| InterpError::QuantBinding {
                        name: f.name.clone(),
                        source,
                    },
                )?;
                quantized.insert(f.name.clone(), q);
            }
            None => {
                // Parts were checked against their nodes' types when bound; the dtype is the
                // concat's (one dtype by its shape rule).
                let parts = f
                    .parts
                    .iter()
                    .map(|p| Ok(weights.get(p).ok_or_else(|| missing(p))?.to_bytes()))
                    .collect::<Result<Vec<Vec<u8>>, CompileError>>()?;
                let refs: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
                let bytes = interleave(&refs, f.outer);
                let t = Tensor::from_bytes(&f.ty, &bytes).map_err(|source| InterpError::Host {
                    node: f.name.clone(),
                    source,
                })?;
                weights.insert(f.name.clone(), t);
            }
        }
    }
    Ok(())
}

/// `outer` runs of each part in turn: part `p`'s run `o` is its bytes `o·len/outer..`. Each
/// part's length is `outer` whole runs (its elements, or its block rows, before the concat's axis
/// times its run), so the division is exact; a length that is not would be a binding the
/// QuantTensor/Tensor constructors after this refuse by its size.
fn interleave(parts: &[&[u8]], outer: usize) -> Vec<u8> {
    let outer = outer.max(1);
    let mut bytes = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for o in 0..outer {
        for p in parts {
            let run = p.len() / outer;
            bytes.extend_from_slice(&p[o * run..(o + 1) * run]);
        }
    }
    bytes
}
