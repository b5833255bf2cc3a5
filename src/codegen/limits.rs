//! The limits generated kernels live within, checked when a kernel is generated: launch
//! geometry against the target (a grid is never truncated to `u32`), sizes a kernel holds in
//! 32-bit `int`s, the number of buffer parameters, and the size of a fused expression.

use super::plan::Launch;
use super::CodegenError;
use crate::arch::Target;

/// Most buffer parameters one kernel takes. CUDA's classic parameter space is 4 KiB (512
/// pointers); half of it leaves room for the launch's own bookkeeping on every driver.
pub const MAX_KERNEL_ARGS: usize = 256;

/// Most operations one elementwise expression renders to (one line of C each). The fusion
/// pass keeps expressions far smaller; this bounds what a graph file can ask for directly.
pub const MAX_EXPR_OPS: usize = 4096;

/// Largest value a kernel may hold in an `int` loop bound or row index: `i32::MAX` less room
/// for the block stride (256) or tile (64) a loop adds before it compares.
pub(crate) const INT_INDEX_LIMIT: u64 = i32::MAX as u64 - 1024;

/// Threads per block of the one-dimensional kernels.
pub(crate) const BLOCK_1D: usize = 256;

/// A launch of `blocks` (x, y, z) blocks of `threads` threads, each dimension checked against
/// the target's limits.
pub(crate) fn launch(
    node: &str,
    target: &Target,
    blocks: [usize; 3],
    threads: usize,
) -> Result<Launch, CodegenError> {
    let lim = target.limits();
    let mut grid = [1u32; 3];
    for (axis, (&b, slot)) in blocks.iter().zip(&mut grid).enumerate() {
        let limit = u64::from(lim.grid[axis]);
        let value = u64::try_from(b).unwrap_or(u64::MAX);
        if value > limit {
            return Err(CodegenError::LaunchLimit {
                node: node.to_string(),
                what: format!("grid.{}", ["x", "y", "z"][axis]),
                value,
                limit,
            });
        }
        // Fits: at most the limit, itself a u32. A grid dimension of 0 is not a launch; a
        // kernel with nothing to do is not generated at all.
        *slot = u32::try_from(value.max(1)).expect("checked against a u32 limit");
    }
    let max_threads = lim.block_threads.min(lim.block[0]);
    let t = u64::try_from(threads).unwrap_or(u64::MAX);
    if t > u64::from(max_threads) || t == 0 {
        return Err(CodegenError::LaunchLimit {
            node: node.to_string(),
            what: "threads per block".into(),
            value: t,
            limit: u64::from(max_threads),
        });
    }
    Ok(Launch {
        grid,
        block: [u32::try_from(t).expect("at most the block limit"), 1, 1],
        shared_bytes: 0,
        programmatic: false,
    })
}

/// One thread per element of `n`, in blocks of [`BLOCK_1D`].
pub(crate) fn launch_1d(node: &str, target: &Target, n: usize) -> Result<Launch, CodegenError> {
    launch(node, target, [n.div_ceil(BLOCK_1D), 1, 1], BLOCK_1D)
}

/// Refuses a size its kernel would hold in an `int`, when it does not fit.
pub(crate) fn int_index(node: &str, what: &str, value: usize) -> Result<(), CodegenError> {
    let v = u64::try_from(value).unwrap_or(u64::MAX);
    if v > INT_INDEX_LIMIT {
        return Err(CodegenError::IndexRange {
            node: node.to_string(),
            what: what.to_string(),
            value: v,
            limit: INT_INDEX_LIMIT,
        });
    }
    Ok(())
}

/// Refuses a kernel with more buffer parameters than [`MAX_KERNEL_ARGS`].
pub(crate) fn kernel_args(node: &str, args: usize) -> Result<(), CodegenError> {
    if args > MAX_KERNEL_ARGS {
        return Err(CodegenError::TooManyArgs {
            node: node.to_string(),
            args,
            limit: MAX_KERNEL_ARGS,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_are_checked_never_truncated() {
        let t = Target::parse("sm_90").unwrap();
        let l = launch("n", &t, [i32::MAX as usize, 65535, 65535], 256).unwrap();
        assert_eq!(l.grid, [i32::MAX as u32, 65535, 65535]);
        // One block past each limit, and a count whose low 32 bits are small.
        for (blocks, what) in [
            ([1usize << 31, 1, 1], "grid.x"),
            ([1, 65536, 1], "grid.y"),
            ([1, 1, 65536], "grid.z"),
            ([(1usize << 32) + 1, 1, 1], "grid.x"),
        ] {
            match launch("n", &t, blocks, 256) {
                Err(CodegenError::LaunchLimit { what: w, value, .. }) => {
                    assert_eq!(w, what);
                    assert_eq!(value, blocks.iter().copied().max().unwrap() as u64);
                }
                other => panic!("{blocks:?}: {other:?}"),
            }
        }
        assert!(matches!(
            launch("n", &t, [1, 1, 1], 2048),
            Err(CodegenError::LaunchLimit { .. })
        ));
        assert!(int_index("n", "d", INT_INDEX_LIMIT as usize).is_ok());
        assert!(matches!(
            int_index("n", "d", INT_INDEX_LIMIT as usize + 1),
            Err(CodegenError::IndexRange { value, .. }) if value == INT_INDEX_LIMIT + 1
        ));
        assert!(kernel_args("n", MAX_KERNEL_ARGS).is_ok());
        assert!(kernel_args("n", MAX_KERNEL_ARGS + 1).is_err());
    }
}
