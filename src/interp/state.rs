//! State ops: the values a session keeps across runs, the cache write that gives their next
//! value, and the number of valid keys an attention reads from data.

use std::collections::HashMap;

use crate::ir::{Graph, Op, Tensor};

use super::InterpError;

/// Zeros for every state of `graph`, by name (a fresh session's first run).
pub(super) fn zeros(graph: &Graph) -> Result<HashMap<String, Tensor>, InterpError> {
    let mut out = HashMap::new();
    for id in graph.node_ids() {
        let node = graph.node(id);
        if let Op::State { .. } = node.op {
            crate::ir::check_host_size(&node.ty).map_err(|source| InterpError::Host {
                node: node.name.clone(),
                source,
            })?;
            out.insert(node.name.clone(), Tensor::zeros(&node.ty));
        }
    }
    Ok(out)
}

/// Refuses a value for a name that is not a state of `graph`, and a state left without one.
/// (Types are checked when the state is read, as bindings are.)
pub(super) fn check_against(
    graph: &Graph,
    states: &HashMap<String, Tensor>,
) -> Result<(), InterpError> {
    let mut names: Vec<&String> = states.keys().collect();
    names.sort();
    for name in names {
        match graph.find(name).map(|id| graph.op(id)) {
            Some(Op::State { .. }) => {}
            _ => return Err(InterpError::UnknownState { name: name.clone() }),
        }
    }
    for id in graph.node_ids() {
        let node = graph.node(id);
        if matches!(node.op, Op::State { .. }) && !states.contains_key(&node.name) {
            return Err(InterpError::MissingState {
                name: node.name.clone(),
                ty: node.ty.clone(),
            });
        }
    }
    Ok(())
}

/// `state` with `values` written at `start..start + len` along `axis`; rows outside the state
/// are an error naming the start, never a partial write.
pub(super) fn cache_write(
    node: &str,
    state: &Tensor,
    values: &Tensor,
    start: &Tensor,
    axis: usize,
) -> Result<Tensor, InterpError> {
    let start = start.as_i64().expect("start is i32 by inference")[0];
    let size = state.shape().dims()[axis];
    let len = values.shape().dims()[axis];
    let fits = usize::try_from(start)
        .ok()
        .and_then(|s| s.checked_add(len))
        .is_some_and(|end| end <= size);
    if !fits {
        return Err(InterpError::CacheWriteOutOfRange {
            node: node.to_string(),
            start,
            len,
            size,
        });
    }
    let at = start as usize;
    // Every element of the result: from the values inside the window, else from the state.
    let dims = state.shape().dims();
    let (sv, vv) = (state.shape().strides(), values.shape().strides());
    let n = state.len();
    let elements = (0..n).map(|i| {
        let mut voff = Some(0usize);
        for (a, &stride) in sv.iter().enumerate() {
            let idx = (i / stride) % dims[a].max(1);
            let vidx = if a == axis {
                idx.checked_sub(at).filter(|&r| r < len)
            } else {
                Some(idx)
            };
            voff = voff.zip(vidx).map(|(o, x)| o + x * vv[a]);
        }
        match voff {
            Some(o) => values.element(o),
            None => state.element(i),
        }
    });
    Tensor::from_elements(state.dtype(), state.shape().clone(), n, elements).map_err(|source| {
        InterpError::Host {
            node: node.to_string(),
            source,
        }
    })
}

/// The number of valid keys per batch from an attention's `kv_len` operand (one element for
/// every batch, or one per batch), each within `0..=Sk` of `k`.
pub(super) fn kv_len(node: &str, kv: &Tensor, k: &Tensor) -> Result<Vec<usize>, InterpError> {
    let keys = k.shape().dims()[2];
    let batches = k.shape().dims()[0];
    let given = kv.as_i64().expect("kv_len is i32 by inference");
    (0..batches)
        .map(|b| {
            let v = given[if given.len() == 1 { 0 } else { b }];
            usize::try_from(v)
                .ok()
                .filter(|&n| n <= keys)
                .ok_or_else(|| InterpError::KvLenOutOfRange {
                    node: node.to_string(),
                    kv_len: v,
                    keys,
                })
        })
        .collect()
}
