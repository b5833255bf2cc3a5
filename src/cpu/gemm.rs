//! Gemm steps: operands read in place through their views where each view's rows and columns
//! are single strides (else packed once per run into session scratch), products by
//! `matrixmultiply` split over threads, or, for a quantized weight in
//! [`super::Precision::Q8Activations`], integer dot products on its blocks; then the epilogue
//! program and the scatter through the out view. A prologue (a folded norm) packs A and
//! normalises the packed rows by the executor's own norm kernel before the product.

use std::sync::Arc;

use rayon::prelude::*;

use super::expr::{Program, Regs, CHUNK};
use super::quant::{quantize_row, IntScheme, Kernel, Packed, Q8Block, GROUP, TILE};
use super::{val, Buf, Scratch};
use crate::ir::gemm::{Axis, Operand};
use crate::ir::quant::BLOCK_ELEMS;
use crate::ir::scalar::round_float;
use crate::ir::{
    DType, Gemm, Graph, NodeId, NormKind, Op, Prologue, QuantTensor, TensorType, View,
};

/// Work (elements touched) below which a step runs on the calling thread: a fork-join costs
/// microseconds, as much as the whole of a small decode GEMV's share.
const SERIAL_ELEMS: usize = 1 << 15;

/// Offsets of one view: per batch index, per row, per column (sums give an element's offset).
struct Offs {
    batch: Vec<usize>,
    rows: Vec<usize>,
    cols: Vec<usize>,
}

fn walk(axes: &[Axis]) -> Vec<usize> {
    let mut out = vec![0usize];
    for a in axes {
        out = out
            .iter()
            .flat_map(|&o| (0..a.size).map(move |i| o + i * a.stride))
            .collect();
    }
    out
}

impl Offs {
    fn new(view: &View, g: &Gemm, op: Operand) -> Offs {
        // The result and the extras run over the paired problem's columns.
        let dims = match op {
            Operand::Out => g.out_dims(),
            Operand::A | Operand::B => std::borrow::Cow::Borrowed(&g.dims),
        };
        let axes = view.axes(&dims, op);
        let (nb, nr) = (dims.batch.len(), dims.of(op)[1].len());
        Offs {
            batch: walk(&axes[..nb]),
            rows: walk(&axes[nb..nb + nr]),
            cols: walk(&axes[nb + nr..]),
        }
    }
}

/// The single stride of an arithmetic offset list.
fn arith(v: &[usize]) -> Option<usize> {
    if v.len() < 2 {
        return Some(1);
    }
    let s = v[1].checked_sub(v[0])?;
    v.windows(2)
        .all(|w| w[1].checked_sub(w[0]) == Some(s))
        .then_some(s)
}

/// Whether gemm `node` reads quantized weight `w` as its B operand only, as the rows of a
/// `[N, K]` matrix (B's K contiguous, N at stride K, no batch stride): `y = x·Wᵀ`.
pub fn reads_blocks(graph: &Graph, node: NodeId, w: NodeId) -> bool {
    let Op::Gemm(g) = graph.op(node) else {
        return false;
    };
    let ops = graph.operands(node);
    if ops.get(1) != Some(&w) || ops.iter().filter(|&&o| o == w).count() != 1 {
        return false;
    }
    let Some([_, _, n, k]) = g.dims.sizes() else {
        return false;
    };
    let b = Offs::new(&g.b, g, Operand::B);
    k % BLOCK_ELEMS == 0
        && b.batch.iter().all(|&o| o == 0)
        && b.rows.iter().enumerate().all(|(i, &o)| o == i)
        && b.cols.iter().enumerate().all(|(j, &o)| o == j * k)
        && graph.ty(w).shape.numel() == n * k
}

pub struct GemmStep {
    nb: usize,
    m: usize,
    n: usize,
    k: usize,
    a: Offs,
    b: Offs,
    out: Offs,
    extras: Vec<Offs>,
    epilogue: Option<Program>,
    a_dtype: DType,
    out_dtype: DType,
    /// A read in place with these (row, column) strides, else packed.
    a_strides: Option<(usize, usize)>,
    b_strides: Option<(usize, usize)>,
    /// B read in its blocks by the integer dot products (a scheme they read), repacked in
    /// groups of rows once for every plan that reads it ([`Packed::shared`]).
    quant: Option<Arc<Packed>>,
    /// Product stored transposed ([N][batch·M]): when M is small the threads split N.
    transposed: bool,
    out_contiguous: bool,
    /// A's rows normalised over K (then A is always packed), and the slot of its weight.
    prologue: Option<(Prologue, usize)>,
    /// Product columns 2j, 2j + 1 combined by the epilogue into result column j.
    paired: bool,
}

impl GemmStep {
    pub fn new(
        g: &Gemm,
        ins: &[&TensorType],
        out: &TensorType,
        quant: Option<QuantTensor>,
        threads: usize,
    ) -> GemmStep {
        let [nb, m, n, k] = g.dims.sizes().expect("checked by shape inference");
        let a = Offs::new(&g.a, g, Operand::A);
        let b = Offs::new(&g.b, g, Operand::B);
        let o = Offs::new(&g.out, g, Operand::Out);
        let a_strides = arith(&a.rows).zip(arith(&a.cols));
        let b_strides = arith(&b.rows).zip(arith(&b.cols));
        let n_out = if g.paired { n / 2 } else { n };
        let out_contiguous = o.batch.iter().enumerate().all(|(i, &x)| x == i * m * n_out)
            && o.rows.iter().enumerate().all(|(i, &x)| x == i * n_out)
            && o.cols.iter().enumerate().all(|(j, &x)| x == j);
        // The epilogue's operands: the product ($0, A's dtype; paired: $0 and $1), then the
        // extras.
        let p_ty = TensorType::new(ins[0].dtype, vec![]);
        let epilogue = g.epilogue.as_ref().map(|e| {
            let mut tys = vec![&p_ty; g.first_extra_var()];
            tys.extend(ins[2..2 + g.extras.len()].iter().copied());
            let scalar: Vec<TensorType> = tys
                .iter()
                .map(|t| TensorType::new(t.dtype, vec![]))
                .collect();
            let refs: Vec<&TensorType> = scalar.iter().collect();
            Program::compile(e, &refs)
        });
        GemmStep {
            nb,
            m,
            n,
            k,
            a,
            b,
            out: o,
            extras: g
                .extras
                .iter()
                .map(|v| Offs::new(v, g, Operand::Out))
                .collect(),
            // An epilogue that cannot be compiled (integer values) is refused at plan time by
            // `compilable`; here it is always Some(program).
            epilogue: epilogue.flatten(),
            a_dtype: ins[0].dtype,
            out_dtype: out.dtype,
            a_strides,
            b_strides,
            transposed: quant.is_some() || m < 4 * threads,
            quant: quant.and_then(|q| {
                let s = IntScheme::of(q.scheme())?;
                Some(Packed::shared(s, &q, n, k / BLOCK_ELEMS))
            }),
            out_contiguous,
            prologue: g.prologue.map(|p| (p, g.prologue_slots().start)),
            paired: g.paired,
        }
    }

    /// Whether A is packed row-major into scratch: a view that is not two single strides, a
    /// quantized product whose A rows are not contiguous, or a prologue (it normalises a copy).
    fn packs_a(&self) -> bool {
        self.a_strides.is_none()
            || (self.quant.is_some() && self.a_strides.map(|s| s.1) != Some(1))
            || self.prologue.is_some()
    }

    /// How a profile names this product: path, [batch·]M×N×K, epilogue and prologue.
    pub fn family(&self) -> String {
        let path = match &self.quant {
            Some(p) => format!("gemm {:?}", p.scheme()),
            None => "gemm f32".to_string(),
        };
        format!(
            "{path} {}{}x{}x{}{}{}",
            if self.nb > 1 {
                format!("{}·", self.nb)
            } else {
                String::new()
            },
            self.m,
            self.n,
            self.k,
            if self.prologue.is_some() {
                " +norm"
            } else {
                ""
            },
            if self.epilogue.is_some() { " +epi" } else { "" },
        )
    }

    /// Whether the epilogue (if any) compiled.
    pub fn compilable(g: &Gemm, ins: &[&TensorType]) -> bool {
        match &g.epilogue {
            None => true,
            Some(e) => {
                let mut tys = vec![TensorType::new(ins[0].dtype, vec![]); g.first_extra_var()];
                tys.extend(
                    ins[2..2 + g.extras.len()]
                        .iter()
                        .map(|t| TensorType::new(t.dtype, vec![])),
                );
                let refs: Vec<&TensorType> = tys.iter().collect();
                Program::compile(e, &refs).is_some()
            }
        }
    }

    pub fn scratch(&self) -> Scratch {
        let (nb, m, n, k) = (self.nb, self.m, self.n, self.k);
        let pack_a = if self.packs_a() { nb * m * k } else { 0 };
        // The raw rows a prologue normalises into the pack.
        let raw_a = if self.prologue.is_some() {
            nb * m * k
        } else {
            0
        };
        let pack_b = if self.b_strides.is_none() && self.quant.is_none() {
            nb * k * n
        } else {
            0
        };
        Scratch {
            f: vec![0.0; nb * m * n + pack_a + pack_b + raw_a],
            q: if self.quant.is_some() {
                vec![Q8Block::default(); nb * m * (k / BLOCK_ELEMS)]
            } else {
                Vec::new()
            },
        }
    }

    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    pub fn run(
        &self,
        kernel: Kernel,
        args: &[usize],
        fixed: &[Option<Buf>],
        bufs: &[Buf],
        scr: &mut Scratch,
        out: &mut Buf,
    ) {
        let (nb, m, n, k) = (self.nb, self.m, self.n, self.k);
        let a_src = val(fixed, bufs, args[0]).f();
        let b_src = val(fixed, bufs, args[1]).f();
        let (c, rest) = scr.f.split_at_mut(nb * m * n);
        let (pack_a, rest) = rest.split_at_mut(if self.packs_a() { nb * m * k } else { 0 });
        let pack_b_len = if self.b_strides.is_none() && self.quant.is_none() {
            nb * k * n
        } else {
            0
        };
        let (pack_b, raw_a) = rest.split_at_mut(pack_b_len);
        // A (and B) through their views: in place, or packed row-major.
        let (a, a_rs, a_cs, a_bs): (&[f32], usize, usize, Option<usize>) = if self.packs_a() {
            match self.prologue {
                Some((p, slot)) => {
                    pack(a_src, &self.a, raw_a);
                    let w = val(fixed, bufs, args[slot]).f();
                    let bias = match p.norm {
                        NormKind::Rms => None,
                        NormKind::Layer => Some(val(fixed, bufs, args[slot + 1]).f()),
                    };
                    let rms = p.norm == NormKind::Rms;
                    super::kernels::norm(raw_a, w, bias, p.eps, rms, k, self.a_dtype, pack_a);
                }
                None => pack(a_src, &self.a, pack_a),
            }
            (&*pack_a, k, 1, Some(m * k))
        } else {
            let (rs, cs) = self.a_strides.expect("in place");
            (a_src, rs, cs, None)
        };
        let a_off = |bi: usize| {
            a_bs.map_or(self.a.batch[bi] + self.a.rows[0] + self.a.cols[0], |s| {
                bi * s
            })
        };
        if let Some(packed) = &self.quant {
            // Quantize each activation row once (in order: one row's blocks depend on it
            // alone), then each group of GROUP weight rows dotted with TILE activation rows at
            // a time.
            let kb = k / BLOCK_ELEMS;
            let rows = nb * m;
            let quantize = |(r, dst): (usize, &mut [Q8Block])| {
                let (bi, i) = (r / m, r % m);
                let start = a_off(bi) + i * a_rs;
                quantize_row(&a[start..start + k], dst);
            };
            // A decode step's few rows are quicker here than through a fork-join.
            if rows * k <= SERIAL_ELEMS {
                scr.q.chunks_mut(kb.max(1)).enumerate().for_each(quantize);
            } else {
                scr.q
                    .par_chunks_mut(kb.max(1))
                    .enumerate()
                    .for_each(quantize);
            }
            let blocks = &scr.q;
            // Tasks of whole row groups: about 4 per thread to even out the load, at least
            // enough rows to pay for a task.
            let threads = rayon::current_num_threads().max(1);
            let min_rows = (SERIAL_ELEMS / (k * rows.min(TILE)).max(1)).max(1);
            let per_task = n
                .div_ceil(4 * threads)
                .max(min_rows)
                .max(1)
                .next_multiple_of(GROUP);
            let work = |(t, ct): (usize, &mut [f32])| {
                let mut res = [[0.0f32; GROUP]; TILE];
                // `ct` is [rows of this task][rows]: whole groups but maybe the weight's last.
                for (gg, cg) in ct.chunks_mut(rows * GROUP).enumerate() {
                    let group = (t * per_task) / GROUP + gg;
                    for g in 0..rows.div_ceil(TILE) {
                        let t0 = g * TILE;
                        let h = TILE.min(rows - t0);
                        let a = &blocks[t0 * kb..(t0 + h) * kb];
                        kernel.dot_group(packed, group, a, &mut res[..h]);
                        for (r, col) in cg.chunks_mut(rows).enumerate() {
                            for (tt, v) in col[t0..t0 + h].iter_mut().enumerate() {
                                *v = res[tt][r];
                            }
                        }
                    }
                }
            };
            if per_task >= n {
                work((0, c));
            } else {
                c.par_chunks_mut(rows * per_task).enumerate().for_each(work);
            }
        } else {
            let (b, b_rs, b_cs, b_bs): (&[f32], usize, usize, Option<usize>) = match self.b_strides
            {
                Some((rs, cs)) => (b_src, rs, cs, None),
                None => {
                    pack(b_src, &self.b, pack_b);
                    (&*pack_b, n, 1, Some(k * n))
                }
            };
            let b_off = |bi: usize| {
                b_bs.map_or(self.b.batch[bi] + self.b.rows[0] + self.b.cols[0], |s| {
                    bi * s
                })
            };
            let threads = rayon::current_num_threads().max(1);
            for bi in 0..nb {
                let (ao, bo) = (a_off(bi), b_off(bi));
                if self.transposed {
                    // Cᵀ[n][m] = Bᵀ·Aᵀ, split over N.
                    let cb = &mut c[bi * m * n..(bi + 1) * m * n];
                    let cols = n.div_ceil(threads).max(1);
                    cb.par_chunks_mut(cols * m).enumerate().for_each(|(t, ct)| {
                        let j0 = t * cols;
                        let nn = ct.len() / m.max(1);
                        // SAFETY: Bᵀ's rows j0..j0+nn (stride b_cs) and K columns (stride
                        // b_rs) and Aᵀ's K rows and M columns are inside their buffers (the
                        // views were checked by shape inference, packs are sized nb·m·k and
                        // nb·k·n); `ct` holds exactly nn×m elements written at (m, 1).
                        unsafe {
                            matrixmultiply::sgemm(
                                nn,
                                k,
                                m,
                                1.0,
                                b.as_ptr().add(bo + j0 * b_cs),
                                b_cs as isize,
                                b_rs as isize,
                                a.as_ptr().add(ao),
                                a_cs as isize,
                                a_rs as isize,
                                0.0,
                                ct.as_mut_ptr(),
                                m as isize,
                                1,
                            );
                        }
                    });
                } else {
                    let cb = &mut c[bi * m * n..(bi + 1) * m * n];
                    let rows = m.div_ceil(threads).max(1);
                    cb.par_chunks_mut(rows * n).enumerate().for_each(|(t, ct)| {
                        let i0 = t * rows;
                        let mm = ct.len() / n.max(1);
                        // SAFETY: A's rows i0..i0+mm and its K columns, and B's K×N, lie in
                        // their buffers (views checked by shape inference, packs sized to
                        // hold them); `ct` holds exactly mm×n elements written at (n, 1).
                        unsafe {
                            matrixmultiply::sgemm(
                                mm,
                                k,
                                n,
                                1.0,
                                a.as_ptr().add(ao + i0 * a_rs),
                                a_rs as isize,
                                a_cs as isize,
                                b.as_ptr().add(bo),
                                b_rs as isize,
                                b_cs as isize,
                                0.0,
                                ct.as_mut_ptr(),
                                n as isize,
                                1,
                            );
                        }
                    });
                }
            }
        }
        // The product in C: element (bi, i, j) at bi·m·n + these strides.
        // Quantized products are [N][batch·M] over all batches at once.
        let (crs, ccs) = if self.quant.is_some() {
            (1, nb * m)
        } else if self.transposed {
            (1, m)
        } else {
            (n, 1)
        };
        let batch_stride = if self.quant.is_some() { m } else { m * n };
        let c = &*c;
        let o = match out {
            Buf::F(v) => v,
            Buf::I(_) => unreachable!("a gemm's result is float"),
        };
        let ex: [Option<&Buf>; crate::ir::expr::MAX_INPUTS] =
            std::array::from_fn(|i| args.get(i + 2).map(|&s| val(fixed, bufs, s)));
        // Paired: result column j combines product columns 2j ($0) and 2j + 1 ($1).
        let (n_out, pair) = if self.paired { (n / 2, 2) } else { (n, 1) };
        let first = pair;
        let row = |r: usize, dst: &mut dyn FnMut(usize, f32)| {
            let (bi, i) = (r / m.max(1), r % m.max(1));
            let base = bi * batch_stride + i * crs;
            match &self.epilogue {
                None => {
                    for j in 0..n {
                        dst(j, round_float(self.out_dtype, c[base + j * ccs]));
                    }
                }
                Some(p) => {
                    let mut regs = Regs::new();
                    let mut ins = [[0.0f32; CHUNK]; crate::ir::expr::MAX_INPUTS];
                    let mut res = [0.0f32; CHUNK];
                    let mut j0 = 0;
                    while j0 < n_out {
                        let cn = CHUNK.min(n_out - j0);
                        for (p, input) in ins.iter_mut().take(pair).enumerate() {
                            for t in 0..cn {
                                let col = pair * (j0 + t) + p;
                                input[t] = round_float(self.a_dtype, c[base + col * ccs]);
                            }
                        }
                        for (e, offs) in self.extras.iter().enumerate() {
                            let src = ex[e].expect("one buffer per extra");
                            let eb = offs.batch[bi] + offs.rows[i];
                            for t in 0..cn {
                                ins[e + first][t] = src.get(eb + offs.cols[j0 + t]);
                            }
                        }
                        p.eval(&mut regs, &ins, cn, &mut res);
                        for t in 0..cn {
                            dst(j0 + t, res[t]);
                        }
                        j0 += cn;
                    }
                }
            }
        };
        if self.out_contiguous {
            o.par_chunks_mut(n_out.max(1))
                .enumerate()
                .for_each(|(r, d)| {
                    row(r, &mut |j, v| d[j] = v);
                });
        } else {
            for r in 0..nb * m {
                let (bi, i) = (r / m.max(1), r % m.max(1));
                let base = self.out.batch[bi] + self.out.rows[i];
                let cols = &self.out.cols;
                row(r, &mut |j, v| o[base + cols[j]] = v);
            }
        }
    }
}

/// `src` read through `offs` into row-major `dst` [batch][rows][cols].
fn pack(src: &[f32], offs: &Offs, dst: &mut [f32]) {
    let per = offs.rows.len() * offs.cols.len();
    dst.par_chunks_mut(per.max(1))
        .enumerate()
        .for_each(|(bi, d)| {
            let mut t = 0;
            for &r in &offs.rows {
                for &c in &offs.cols {
                    d[t] = src[offs.batch[bi] + r + c];
                    t += 1;
                }
            }
        });
}
