//! The scalar FlashAttention (`kernel_templates/flash_attention.hip`): any dtype on any target,
//! f32 arithmetic. `tpr` lanes share a query row, each holding `dper` of its D columns; K/V
//! tiles of `block_n` keys are staged in shared memory as f32.

use serde::Serialize;

use super::super::super::plan::{BufferId, Kernel, Launch};
use super::super::super::CodegenError;
use super::Problem;
use crate::arch::Target;
use crate::codegen::kernel::finish;

/// One tiling of the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Config {
    /// Lanes per query row (a power of two up to 16).
    pub tpr: usize,
    pub block_m: usize,
    pub block_n: usize,
}

/// Enough lanes per row that each holds at most 8 columns of the larger of D and Dv (a lane
/// keeps its share of both the Q row and the O accumulators: sized by D alone, D 1 with Dv 256
/// gave a lane 256 accumulators, 1040 B of scratch on every AMD target of the register sweep),
/// 256 threads a block, and K and V tiles in f32 within 48 KiB of shared memory.
pub(crate) fn choose(p: &Problem) -> Config {
    let tpr = p.d.max(p.dv).div_ceil(8).next_power_of_two().clamp(1, 16);
    Config {
        tpr,
        block_m: 256 / tpr,
        block_n: (12288 / (p.d + p.dv + 2)).clamp(1, 32),
    }
}

/// The launch geometry: grid x over (batch, head), y over query tiles.
pub(crate) fn launch(
    c: &Config,
    p: &Problem,
    node: &str,
    target: &Target,
) -> Result<Launch, CodegenError> {
    p.query_tiles_launch(c.block_m, c.block_m * c.tpr, node, target)
}

#[derive(Serialize)]
struct Context<'a> {
    #[serde(flatten)]
    p: &'a Problem,
    #[serde(flatten)]
    c: Config,
    threads: usize,
    /// Columns of q and of v per lane; at least one register per thread even for D = 0 (no
    /// zero-length arrays in C++): its column is past D, so it holds 0 and adds nothing.
    dper: usize,
    dvper: usize,
}

pub(crate) fn kernel(
    p: &Problem,
    node: &str,
    args: Vec<BufferId>,
    target: &Target,
) -> Result<Kernel, CodegenError> {
    let c = choose(p);
    let launch = launch(&c, p, node, target)?;
    let ctx = Context {
        p,
        c,
        threads: c.block_m * c.tpr,
        dper: p.d.div_ceil(c.tpr).max(1),
        dvper: p.dv.div_ceil(c.tpr).max(1),
    };
    finish(
        "flash_attention",
        "flash_attention.hip",
        ctx,
        launch,
        args,
        node,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::DType;

    fn problem(d: usize, dv: usize) -> Problem {
        Problem {
            b: 1,
            hq: 2,
            hkv: 2,
            group: 1,
            sq: 7,
            sk: 33,
            d,
            dv,
            dtype: DType::F16,
            scale: 0.125,
            scale_f: "0.125f".into(),
            causal: false,
            offset: "0LL".into(),
            offset_text: 0,
            window: 0,
            mask: crate::ir::MaskKind::None,
            mask_ctype: "float",
            mask_load_pre: "",
            mask_load_post: "",
            ms: vec![0; 4],
            kv_len: super::super::KvLen::Static,
            keys: "33".into(),
            ctype: "__half",
            load_pre: "",
            load_post: "",
            store_pre: "",
            store_post: "",
        }
    }

    /// For every D and Dv in 1..=256 a lane holds at most 8 columns of Q and of O, or 16 where
    /// 16 lanes (the most) share a row: the accumulators stay in registers (Dv alone used to
    /// leave D 1, Dv 256 with 256 of them).
    #[test]
    fn a_lane_holds_few_columns_of_both_heads() {
        for d in 1..=256usize {
            for dv in [1, 3, 24, 40, 127, 256, d] {
                let p = problem(d, dv);
                let c = choose(&p);
                assert!(c.tpr.is_power_of_two() && c.tpr <= 16, "D {d}, Dv {dv}");
                let most = if c.tpr == 16 { 16 } else { 8 };
                assert!(d.div_ceil(c.tpr) <= most, "D {d}, Dv {dv}: {c:?}");
                assert!(dv.div_ceil(c.tpr) <= most, "D {d}, Dv {dv}: {c:?}");
                assert!(4 * c.block_n * (d + dv + 2) <= 48 * 1024, "D {d}, Dv {dv}");
            }
        }
    }
}
