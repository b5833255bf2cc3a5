//! Re-poisoning: in poison mode every computed buffer is filled with 0xff bytes right before the
//! first kernel of a run that uses it, so an element a kernel fails to write reads as NaN even
//! where an earlier kernel (or an earlier run) left a value in its slot. The poisoning kernel is
//! part of the launch list, so a replayed graph captures it too.

use std::collections::HashMap;
use std::sync::Arc;

use crate::arch::Target;
use crate::codegen::KernelPlan;
use crate::compile::memory_plan::planned as in_slots;
use crate::compile::{load, CompileError, MemoryPlan};
use crate::runtime::device::LoadedKernel;
use crate::runtime::{Device, DeviceBuffer, Stream};

/// The entry of the poisoning kernel.
const POISON_ENTRY: &str = "rocmforge_poison_bytes";

/// Fills `n[0]` bytes of `p` with 0xff (NaN in every float dtype, -1 in the integers). The count
/// comes from a device buffer because launches pass buffers only; a grid-stride loop covers
/// any size with a bounded grid.
const POISON_BODY: &str = r#"// rocmforge: poisons a computed buffer before the first kernel that uses it.
extern "C" __global__ void rocmforge_poison_bytes(unsigned char* __restrict__ p,
                                                  const unsigned long long* __restrict__ n) {
    const unsigned long long count = n[0];
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < count; i += stride) {
        p[i] = 0xff;
    }
}
"#;

/// Threads per block of the poisoning kernel, and at most this many blocks (the loop strides).
pub(super) const POISON_BLOCK: u32 = 256;
pub(super) const POISON_MAX_GRID: usize = 4096;

/// What sessions need to poison a plan's computed buffers: the kernel, and one resident count
/// buffer per distinct byte size.
pub(in crate::compile) struct Poisoner {
    pub(super) kernel: Arc<LoadedKernel>,
    pub(super) counts: HashMap<usize, Arc<DeviceBuffer>>,
}

/// The bytes of plan buffer `id`.
pub(super) fn buffer_bytes(plan: &KernelPlan, id: usize) -> usize {
    plan.buffers[id].ty.shape.numel() * plan.buffers[id].ty.dtype.size_bytes()
}

/// The poisoner of `plan`: its kernel loaded through the device's cache and the counts uploaded
/// on `stream` (synchronised by the caller).
pub(in crate::compile) fn poisoner(
    device: &Device,
    target: &Target,
    compile_opts: &[String],
    plan: &KernelPlan,
    memory: &MemoryPlan,
    stream: &Stream,
) -> Result<Poisoner, CompileError> {
    let kernel = load::load_kernel(device, target, compile_opts, POISON_ENTRY, POISON_BODY)?;
    let mut counts = HashMap::new();
    for &id in memory.slot_of.keys() {
        let bytes = buffer_bytes(plan, id);
        if bytes > 0 && !counts.contains_key(&bytes) {
            let n = (bytes as u64).to_le_bytes();
            counts.insert(bytes, Arc::new(stream.upload(&n)?));
        }
    }
    Ok(Poisoner { kernel, counts })
}

/// For each kernel of `plan`, the computed buffers (slots and workspaces, not empty ones) to
/// poison right before it: those it is the first kernel to use. Each buffer appears once, so
/// every run starts every value from NaN bytes, including a slot an earlier kernel of the same
/// run filled with a value that is dead by then.
pub(in crate::compile) fn poison_points(plan: &KernelPlan) -> Vec<Vec<usize>> {
    let mut seen = std::collections::HashSet::new();
    plan.kernels
        .iter()
        .map(|k| {
            k.args
                .iter()
                .copied()
                .filter(|&a| in_slots(&plan.buffers[a].role) && buffer_bytes(plan, a) > 0)
                .filter(|&a| seen.insert(a))
                .collect()
        })
        .collect()
}
