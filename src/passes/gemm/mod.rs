//! GEMM formation: every MatMul left after attention and elementwise fusion becomes one Gemm
//! node (`ir::gemm`) together with the layout ops around it and the elementwise op after it,
//! so the fused graph shows what runs and codegen re-detects nothing.
//!
//! Anchor: a live MatMul. Its problem starts from contiguous views of A, B and the product,
//! with stride 0 on the batch axes an operand broadcasts. Then:
//! - operands read in place: A and B are traced up through `permute`, `reshape` and `expand`
//!   chains (whatever else reads them: reading in place computes nothing twice), so a weight
//!   transpose `permute(W, [1, 0])` becomes B read transposed and the head merge before an
//!   output projection (`permute(ctx, [0, 2, 1, 3])` + `reshape`) becomes A's K read as (H, D).
//!   A step the views cannot express (see `layout.rs`) ends the walk: that layout op stays, a copy
//!   visible in the plan (`view_not_expressible`).
//! - the epilogue: when the product's only live use is an elementwise node (`binary`, `unary`,
//!   `where`, `cast`, `fused_elementwise`) of the product's shape, its expression is folded in
//!   with `$0` for the product (rounded to A's dtype, the value the MatMul held, so fused equals
//!   unfused exactly); its other operands become extras, each traced up like A and B. The node
//!   keeps the expression's op and operand counts, which `ir::expr`'s bounds already held.
//! - the result written in place: while the (epilogue's) result's only live use is a `reshape`
//!   or `permute`, the Gemm writes that op's result instead: the head split before attention
//!   (`reshape` + `permute(0, 2, 1, 3)` feeding FlashAttention's q, k and v).
//! - batch axes B broadcasts become outer sub-axes of M: `[B, S, K] × [K, N]` is one product
//!   with M = B·S.
//!
//! Must not: absorb an intermediate (the product, the epilogue's result, a layout op after it)
//! that another live node reads (`product_shared`, `result_shared`) or that is a graph output
//! (`graph_output`); fold an elementwise op that broadcasts the product to a larger shape
//! (`epilogue_broadcasts`). Permutations and shapes are read from each op, never assumed.
//! Every such refusal leaves the Gemm without that part, and is reported for `--explain`.

mod layout;

use std::fmt::Write as _;

use super::matchers::{replace_node, Live};
use super::{Pass, PassReport};
use crate::ir::{Expr, Gemm, Graph, NodeId, Op, Shape};
use layout::{Problem, Role, A, B, OUT};

pub struct FormGemm;

impl Pass for FormGemm {
    fn name(&self) -> &'static str {
        "form_gemm"
    }

    fn run(&self, g: &mut Graph) -> PassReport {
        let mut report = PassReport::new(self.name());
        let Ok(order) = g.topo_order() else {
            return report;
        };
        let mut live = Live::of(g);
        for mm in order {
            if !g.contains(mm) || !live.contains(mm) || !matches!(g.op(mm), Op::MatMul) {
                continue;
            }
            let name = g.node(mm).name.clone();
            let mut notes = Vec::new();
            let formed = form(g, &live, mm, &mut notes);
            for (code, detail) in notes {
                report.skip(&name, code, detail);
            }
            match formed {
                Ok(what) => {
                    report.rewrote(&name, what);
                    live = Live::of(g);
                }
                Err(detail) => report.skip(&name, "invalid_gemm", detail),
            }
        }
        report
    }
}

/// A part the Gemm left out, with its reason code and what was wrong.
type Note = (&'static str, String);

fn is_elementwise(op: &Op) -> bool {
    matches!(
        op,
        Op::Binary(_) | Op::Unary(_) | Op::Where | Op::Cast { .. } | Op::FusedElementwise(_)
    )
}

/// Replaces `mm` (and what it absorbs) by a Gemm; returns the rewrite's description, or why
/// the node the views describe was refused (a bug: the views are built valid).
fn form(g: &mut Graph, live: &Live, mm: NodeId, notes: &mut Vec<Note>) -> Result<String, String> {
    let [a, b] = g.operands(mm)[..] else {
        return Err("a matmul takes two operands".into());
    };
    let product = g.ty(mm).shape.clone();
    let pd = product.dims();
    let nb = pd.len() - 2;
    let (m, n) = (pd[nb], pd[nb + 1]);
    let k = *g.ty(a).shape.dims().last().expect("rank ≥ 2 by inference");
    let (result, epilogue, extras) = match epilogue(g, live, mm, notes) {
        Some((e, expr, extras)) => (e, Some(expr), extras),
        None => (mm, None, vec![]),
    };

    // Each slot's strides on the product's axes: A on (batch, M, K), B on (batch, K, N), the
    // result and the extras on (batch, M, N), 0 where the tensor is broadcast.
    let frame = |rows: usize, cols: usize| {
        let mut d = pd[..nb].to_vec();
        d.extend([rows, cols]);
        Shape(d)
    };
    let mut strides = vec![
        g.ty(a).shape.broadcast_strides(&frame(m, k)),
        g.ty(b).shape.broadcast_strides(&frame(k, n)),
        product.strides(),
    ];
    strides.extend(
        extras
            .iter()
            .map(|&x| g.ty(x).shape.broadcast_strides(&product)),
    );
    let mut p = Problem::new(&pd[..nb], [m, n, k], strides.len(), |slot, role, i| {
        let s = &strides[slot];
        match (role, slot) {
            (Role::Batch, _) => s[i],
            (Role::M, _) | (Role::K, B) => s[nb],
            (Role::K, _) | (Role::N, _) => s[nb + 1],
        }
    });

    let mut sources = vec![a, b];
    sources.extend(&extras);
    let mut text = String::new();
    let (mut last, mut shape) = (result, g.ty(result).shape.clone());
    if !p.is_empty() {
        for (slot, src) in sources.iter_mut().enumerate() {
            let slot = if slot < 2 { slot } else { slot + 1 };
            let (from, through) = read_in_place(g, &mut p, slot, *src, notes);
            if !through.is_empty() {
                let _ = write!(text, "; %{} read through {}", g.node(from).name, through);
            }
            *src = from;
        }
        let (to, through) = write_in_place(g, live, &mut p, result, notes);
        if !through.is_empty() {
            let _ = write!(text, "; result written through {through}");
        }
        (last, shape) = (to, g.ty(to).shape.clone());
    }
    p.fold_broadcast_batch();
    p.simplify();
    let gemm = Gemm {
        dims: p.dims(),
        a: p.view(A),
        b: p.view(B),
        out: p.view(OUT),
        extras: (OUT + 1..strides.len()).map(|s| p.view(s)).collect(),
        epilogue,
        shape,
        prologue: None,
        paired: false,
    };
    let mut what = format!(
        "gemm {}",
        Op::Gemm(Box::new(gemm.clone()))
            .display()
            .trim_start_matches("gemm")
    );
    if result != mm {
        let _ = write!(what, "; epilogue %{}", g.node(result).name);
    }
    what.push_str(&text);
    let id = g
        .gemm(gemm, sources[0], sources[1], &sources[2..])
        .map_err(|e| e.to_string())?;
    replace_node(g, last, id);
    Ok(what)
}

/// The elementwise node `mm`'s product feeds, as an epilogue: the node, its expression with
/// `$0` the product and `$i` extra `i - 1`, and the extras (distinct, in first-read order).
fn epilogue(
    g: &Graph,
    live: &Live,
    mm: NodeId,
    notes: &mut Vec<Note>,
) -> Option<(NodeId, Expr, Vec<NodeId>)> {
    let users: Vec<NodeId> = g
        .consumers(mm)
        .into_iter()
        .filter(|&u| live.contains(u))
        .collect();
    let names = |ids: &[NodeId]| {
        ids.iter()
            .map(|&i| format!("%{}", g.node(i).name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let [e] = users[..] else {
        if users.iter().any(|&u| is_elementwise(g.op(u))) {
            notes.push((
                "product_shared",
                format!("the product is read by {}: no epilogue", names(&users)),
            ));
        }
        return None;
    };
    if !is_elementwise(g.op(e)) {
        return None;
    }
    if g.is_output(mm) {
        notes.push((
            "graph_output",
            format!(
                "the product is a graph output: %{} stays its own kernel",
                g.node(e).name
            ),
        ));
        return None;
    }
    if g.ty(e).shape != g.ty(mm).shape {
        notes.push((
            "epilogue_broadcasts",
            format!(
                "%{} broadcasts the product {} to {}",
                g.node(e).name,
                g.ty(mm).shape,
                g.ty(e).shape
            ),
        ));
        return None;
    }
    let ops = g.operands(e);
    let slot = |i: usize| Box::new(Expr::Input(i));
    let body = match g.op(e) {
        Op::Binary(op) => Expr::Binary(*op, slot(0), slot(1)),
        Op::Unary(op) => Expr::Unary(*op, slot(0)),
        Op::Where => Expr::Where(slot(0), slot(1), slot(2)),
        Op::Cast { to } => Expr::Cast(*to, slot(0)),
        Op::FusedElementwise(x) => x.clone(),
        _ => return None,
    };
    let mut extras: Vec<NodeId> = Vec::new();
    let map: Vec<usize> = ops
        .iter()
        .map(|&o| {
            if o == mm {
                return 0;
            }
            1 + extras.iter().position(|&x| x == o).unwrap_or_else(|| {
                extras.push(o);
                extras.len() - 1
            })
        })
        .collect();
    Some((e, renumber(&body, &map), extras))
}

/// `e` with operand `$i` read as `$map[i]`. Recursion is bounded by `ir::expr::MAX_OPS`.
fn renumber(e: &Expr, map: &[usize]) -> Expr {
    let r = |x: &Expr| Box::new(renumber(x, map));
    match e {
        Expr::Input(i) => Expr::Input(map[*i]),
        Expr::Const(v, dt) => Expr::Const(*v, *dt),
        Expr::Unary(op, x) => Expr::Unary(*op, r(x)),
        Expr::Cast(to, x) => Expr::Cast(*to, r(x)),
        Expr::Binary(op, x, y) => Expr::Binary(*op, r(x), r(y)),
        Expr::Where(c, x, y) => Expr::Where(r(c), r(x), r(y)),
    }
}

/// Traces `slot`'s tensor up from `x` through layout ops while the views express them;
/// returns the tensor read and the ops read through (`%a, %b`).
fn read_in_place(
    g: &Graph,
    p: &mut Problem,
    slot: usize,
    mut x: NodeId,
    notes: &mut Vec<Note>,
) -> (NodeId, String) {
    let mut through = Vec::new();
    loop {
        let dims = g.ty(x).shape.dims().to_vec();
        if dims.contains(&0) {
            break;
        }
        let step = match g.op(x) {
            Op::Reshape { .. } => Ok(()),
            Op::Permute { perm } => {
                let src = g.ty(g.operands(x)[0]).shape.strides();
                p.through_permute(slot, &dims, perm, &src)
            }
            Op::Expand { .. } => {
                let src = g.ty(g.operands(x)[0]).shape.dims().to_vec();
                p.through_expand(slot, &dims, &src)
            }
            _ => break,
        };
        if let Err(why) = step {
            notes.push((
                "view_not_expressible",
                format!(
                    "%{} ({} {}) stays a copy: {why}",
                    g.node(x).name,
                    g.op(x).display(),
                    g.ty(x).shape
                ),
            ));
            break;
        }
        through.push(format!("%{}", g.node(x).name));
        x = g.operands(x)[0];
    }
    (x, through.join(", "))
}

/// Follows the result `r` down through reshapes and permutes it alone feeds; returns the node
/// the Gemm replaces and the ops written through.
fn write_in_place(
    g: &Graph,
    live: &Live,
    p: &mut Problem,
    mut r: NodeId,
    notes: &mut Vec<Note>,
) -> (NodeId, String) {
    let mut through = Vec::new();
    loop {
        let users: Vec<NodeId> = g
            .consumers(r)
            .into_iter()
            .filter(|&u| live.contains(u))
            .collect();
        let is_layout = |u: NodeId| matches!(g.op(u), Op::Reshape { .. } | Op::Permute { .. });
        let [y] = users[..] else {
            if let Some(&y) = users.iter().find(|&&u| is_layout(u)) {
                notes.push((
                    "result_shared",
                    format!(
                        "%{} is read by {} nodes: %{} stays",
                        g.node(r).name,
                        users.len(),
                        g.node(y).name
                    ),
                ));
            }
            break;
        };
        if !is_layout(y) {
            break;
        }
        if g.is_output(r) {
            notes.push((
                "graph_output",
                format!(
                    "%{} is a graph output: %{} stays",
                    g.node(r).name,
                    g.node(y).name
                ),
            ));
            break;
        }
        if let Op::Permute { perm } = g.op(y) {
            let dims = g.ty(r).shape.dims().to_vec();
            let dst = g.ty(y).shape.strides();
            if let Err(why) = p.out_through_permute(&dims, perm, &dst) {
                notes.push((
                    "view_not_expressible",
                    format!("%{} stays a copy: {why}", g.node(y).name),
                ));
                break;
            }
        }
        through.push(format!("%{}", g.node(y).name));
        r = y;
    }
    (r, through.join(", "))
}
