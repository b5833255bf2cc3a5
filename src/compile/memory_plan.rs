//! Buffer reuse by liveness: computed buffers whose lifetimes do not overlap share a slot.
//! A node's workspace is planned like a computed buffer: live from the kernel that writes it
//! to the last that reads it, its slot free for later values once the node is done. A kernel
//! that binds an alias (a slice read in place) uses its base: the base lives while any alias of
//! it is read.

use std::collections::HashMap;

use crate::codegen::{BufferId, BufferRole, KernelPlan};

#[derive(Clone, Debug, PartialEq)]
pub struct MemoryPlan {
    /// Slot of each computed buffer.
    pub slot_of: HashMap<BufferId, usize>,
    pub slot_bytes: Vec<usize>,
    /// Sum of the slots: what a run allocates for intermediates and outputs.
    pub planned_bytes: usize,
    /// What one buffer per value would take.
    pub unplanned_bytes: usize,
}

/// Whether a buffer lives in the slots: values kernels compute and the workspaces they share.
pub(crate) fn planned(role: &BufferRole) -> bool {
    match role {
        BufferRole::Computed | BufferRole::Workspace => true,
        BufferRole::Input(_)
        | BufferRole::Weight(_)
        | BufferRole::QuantWeight(_)
        | BufferRole::Constant(_)
        | BufferRole::Status
        | BufferRole::Counters
        | BufferRole::State { .. }
        | BufferRole::TensorMap { .. }
        | BufferRole::Alias { .. } => false,
    }
}

pub fn plan_memory(plan: &KernelPlan) -> MemoryPlan {
    let bytes =
        |b: BufferId| plan.buffers[b].ty.shape.numel() * plan.buffers[b].ty.dtype.size_bytes();
    let computed = |b: BufferId| planned(&plan.buffers[b].role);
    let n = plan.kernels.len();
    // Each kernel's arguments as the buffers that hold their memory (an alias's base).
    let args: Vec<Vec<BufferId>> = plan
        .kernels
        .iter()
        .map(|k| k.args.iter().map(|&b| plan.storage(b).0).collect())
        .collect();
    let mut first: HashMap<BufferId, usize> = HashMap::new();
    let mut last: HashMap<BufferId, usize> = HashMap::new();
    for (i, k) in args.iter().enumerate() {
        for &b in k {
            if computed(b) {
                first.entry(b).or_insert(i);
                last.insert(b, i);
            }
        }
    }
    for o in &plan.outputs {
        let b = plan.storage(o.buffer).0;
        if computed(b) {
            last.insert(b, n);
        }
    }
    let mut slot_of = HashMap::new();
    let mut slot_bytes: Vec<usize> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    for (i, k) in plan.kernels.iter().enumerate() {
        // The buffers the kernel writes (its plan says which), each given a slot the first
        // time one is written.
        for out in k.written() {
            if !computed(out) || slot_of.contains_key(&out) {
                continue;
            }
            let need = bytes(out);
            // Best fit among free slots, else a new one.
            let pick = free
                .iter()
                .enumerate()
                .filter(|(_, &s)| slot_bytes[s] >= need)
                .min_by_key(|(_, &s)| slot_bytes[s])
                .map(|(j, _)| j);
            let slot = match pick {
                Some(j) => free.swap_remove(j),
                None => {
                    slot_bytes.push(need);
                    slot_bytes.len() - 1
                }
            };
            slot_of.insert(out, slot);
        }
        // Buffers read for the last time here are free for the next kernel (not this one: a
        // kernel never writes over its own operands).
        for &b in &args[i] {
            if computed(b) && last.get(&b) == Some(&i) && first.get(&b).is_some_and(|&f| f <= i) {
                if let Some(&s) = slot_of.get(&b) {
                    if !free.contains(&s) {
                        free.push(s);
                    }
                }
            }
        }
    }
    // A computed buffer no kernel writes is an empty one (its node's kernel was skipped), yet
    // it is still bound to kernels that read it or returned as an output: such buffers share
    // one slot of their size, nothing.
    let mut empty_slot = None;
    let used = args
        .iter()
        .flat_map(|k| k.iter().copied())
        .chain(plan.outputs.iter().map(|o| plan.storage(o.buffer).0));
    for b in used {
        if !computed(b) || slot_of.contains_key(&b) {
            continue;
        }
        let slot = match bytes(b) {
            0 => *empty_slot.get_or_insert_with(|| {
                slot_bytes.push(0);
                slot_bytes.len() - 1
            }),
            // Not reached by what codegen plans (a non-empty value has a kernel); a slot of its
            // own keeps even that safe to bind.
            need => {
                slot_bytes.push(need);
                slot_bytes.len() - 1
            }
        };
        slot_of.insert(b, slot);
    }
    // Sums saturate rather than wrap: each buffer fits in memory (checked by inference), but
    // a graph of many may not, and these are statistics (allocation refuses the real thing).
    let total = |it: &mut dyn Iterator<Item = usize>| it.fold(0usize, usize::saturating_add);
    let unplanned_bytes = total(
        &mut plan
            .buffers
            .iter()
            .filter(|b| planned(&b.role))
            .map(|b| bytes(b.id)),
    );
    MemoryPlan {
        planned_bytes: total(&mut slot_bytes.iter().copied()),
        slot_of,
        slot_bytes,
        unplanned_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Target;
    use crate::codegen::{generate, Access, Buffer};
    use crate::ir::{DType, Graph, TensorType};

    /// A state buffer bound to kernels (a cache written in place and read) never gets a slot,
    /// and counts in neither total: a session allocates it once and keeps it.
    #[test]
    fn state_buffers_get_no_slot() {
        let mut g = Graph::new("state");
        let x = g.input("x", DType::F32, &[7, 5]).unwrap();
        let e = g.exp(x).unwrap();
        let t = g.tanh(e).unwrap();
        g.add_output(t).unwrap();
        let mut plan = generate(&g, &Target::parse("sm_90").unwrap()).unwrap();
        let before = plan_memory(&plan);
        let id = plan.buffers.len();
        plan.buffers.push(Buffer {
            id,
            name: "kv".into(),
            ty: TensorType::new(DType::F32, vec![64, 9]),
            role: BufferRole::State { name: "kv".into() },
        });
        // Read by the first kernel and written by a last one, as a cache write would be.
        plan.kernels[0].args.insert(0, id);
        plan.kernels[0].access.insert(0, Access::Read);
        let mut write = plan.kernels[0].clone();
        write.args = vec![plan.kernels[0].args[1], id];
        write.access = vec![Access::Read, Access::Write];
        plan.kernels.push(write);
        let m = plan_memory(&plan);
        assert!(!m.slot_of.contains_key(&id));
        assert_eq!(m.slot_bytes, before.slot_bytes);
        assert_eq!(
            (m.planned_bytes, m.unplanned_bytes),
            (before.planned_bytes, before.unplanned_bytes)
        );
    }
}
