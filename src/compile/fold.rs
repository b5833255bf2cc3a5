//! Concatenated weights folded at bind time. The `merge_gemms` pass gives a merged Gemm the
//! weights of its members as `concat(axis 0)` of `Op::Weight` nodes: a value the interpreter and
//! every shape rule already know. Before codegen (or the CPU executor) sees the graph, each such
//! concat becomes one `Op::Weight` of the same name whose data is the parts' data end to end
//! (dense values, or quantized block rows: blocks run along the last axis, so rows of
//! `[N_i, K]` stack along N byte for byte). Kernels then read one bound weight (the quantized
//! GEMV its blocks) and nothing concatenates at run time.

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
    pub ty: TensorType,
    pub quant: Option<QuantScheme>,
}

/// Replaces every `concat(axis 0)` of weights of one scheme by one weight of its name; removes
/// the parts nothing else reads. The data is bound by [`bind_folded`].
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
        let ty = g.ty(id).clone();
        if ty.shape.axis(*axis) != Some(0) {
            continue;
        }
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
        let name = g.node(id).name.clone();
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
        g.replace_all_uses(id, w)?;
        g.remove_node(id);
        g.rename(w, &name)?;
        for p in parts {
            if g.contains(p) && g.use_count(p) == 0 && !g.is_output(p) {
                g.remove_node(p);
            }
        }
        folds.push(FoldedWeight {
            name,
            parts: part_names,
            ty,
            quant: quants[0],
        });
    }
    Ok(folds)
}

/// Binds each folded weight's data: its parts' data concatenated. The parts stay bound (the
/// source graph, which `verify` interprets, still reads them).
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
                let mut bytes = Vec::new();
                for p in &f.parts {
                    bytes.extend_from_slice(quantized.get(p).ok_or_else(|| missing(p))?.bytes());
                }
                let q = QuantTensor::new(scheme, f.ty.shape.clone(), bytes).map_err(
                    |source: QuantError| InterpError::QuantBinding {
                        name: f.name.clone(),
                        source,
                    },
                )?;
                quantized.insert(f.name.clone(), q);
            }
            None => {
                let mut bytes = Vec::new();
                for p in &f.parts {
                    let t = weights.get(p).ok_or_else(|| missing(p))?;
                    // Parts were checked against their nodes' types when bound; the dtype is
                    // the concat's (one dtype by its shape rule).
                    bytes.extend_from_slice(&t.to_bytes());
                }
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
