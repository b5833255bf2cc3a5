//! Gemm steps: operands read in place through their views where each view's rows and columns
//! are single strides (else packed once per run into session scratch), products by
//! `matrixmultiply` split over threads, or, for a quantized weight in
//! [`super::Precision::Q8Activations`], integer dot products on its blocks; then the epilogue
//! program and the scatter through the out view. A prologue (a folded norm) packs A and
//! normalises the packed rows by the executor's own norm kernel before the product.

use std::sync::Arc;

use rayon::prelude::*;

use super::expr::{Program, Regs, CHUNK};
use super::packed::{self, PackedB};
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
    /// Per extra: whether its columns are contiguous (a row of it is one slice).
    extra_unit: Vec<bool>,
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
    /// A fixed dense B (a weight) repacked into panels for the AVX-512 kernel, where the
    /// product is not transposed and the CPU has it.
    packed: Option<PackedB>,
    out_contiguous: bool,
    /// The out view's columns in runs of this many unit-strided ones (a result row's columns
    /// are slices of this length): all of them where they are contiguous, a head's size where
    /// the view splits heads, 1 where nothing is contiguous.
    out_run: usize,
    /// A's rows normalised over K (then A is always packed), and the slot of its weight.
    prologue: Option<(Prologue, usize)>,
    /// Product columns 2j, 2j + 1 combined by the epilogue into result column j.
    paired: bool,
}

impl GemmStep {
    /// `b_fixed`: B's value when it is fixed for the plan's life (a weight or constant).
    pub fn new(
        g: &Gemm,
        ins: &[&TensorType],
        out: &TensorType,
        quant: Option<QuantTensor>,
        b_fixed: Option<&Buf>,
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
        let transposed = quant.is_some() || m < 4 * threads;
        // Packed once here, read by every run: only a dense B that every batch shares.
        let packed = match (b_fixed, b_strides) {
            (Some(Buf::F(v)), Some((rs, cs)))
                if !transposed
                    && quant.is_none()
                    && packed::available()
                    && b.batch.iter().all(|&o| o == 0) =>
            {
                let off =
                    b.rows.first().copied().unwrap_or(0) + b.cols.first().copied().unwrap_or(0);
                Some(PackedB::new(v, off, rs, cs, k, n))
            }
            _ => None,
        };
        let n_out = if g.paired { n / 2 } else { n };
        let out_run = if out_contiguous {
            n_out.max(1)
        } else {
            unit_runs(&o.cols)
        };
        let extras: Vec<Offs> = g
            .extras
            .iter()
            .map(|v| Offs::new(v, g, Operand::Out))
            .collect();
        GemmStep {
            nb,
            m,
            n,
            k,
            a,
            b,
            out: o,
            extra_unit: extras.iter().map(|e| arith(&e.cols) == Some(1)).collect(),
            extras,
            // An epilogue that cannot be compiled (integer values) is refused at plan time by
            // `compilable`; here it is always Some(program).
            epilogue: epilogue.flatten(),
            a_dtype: ins[0].dtype,
            out_dtype: out.dtype,
            a_strides,
            b_strides,
            transposed,
            packed,
            quant: quant.and_then(|q| {
                let s = IntScheme::for_blocks(&q)?;
                Some(Packed::shared(s, &q, n, k / BLOCK_ELEMS))
            }),
            out_contiguous,
            out_run,
            prologue: g.prologue.map(|p| (p, g.prologue_slots().start)),
            paired: g.paired,
        }
    }

    /// Whether A is packed row-major into scratch: a view that is not two single strides, a
    /// quantized or packed-B product whose A rows are not contiguous, or a prologue (it
    /// normalises a copy).
    fn packs_a(&self) -> bool {
        let unit_cols = self.a_strides.map(|s| s.1) == Some(1);
        self.a_strides.is_none()
            || ((self.quant.is_some() || self.packed.is_some()) && !unit_cols)
            || self.prologue.is_some()
    }

    /// How a profile names this product: path, [batch·]M×N×K, epilogue and prologue.
    pub fn family(&self) -> String {
        let path = match &self.quant {
            Some(p) => format!("gemm {:?}", p.scheme()),
            None if self.packed.is_some() => "gemm f32 packed".to_string(),
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
        // Paired: result column j combines product columns 2j and 2j + 1.
        let (n_out, pair) = if self.paired { (n / 2, 2) } else { (n, 1) };
        let out_ptr = match out {
            Buf::F(v) => OutPtr::new(v),
            Buf::I(_) => unreachable!("a gemm's result is float"),
        };
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
                let cb = &mut c[bi * m * n..(bi + 1) * m * n];
                if self.transposed {
                    // Cᵀ[n][m] = Bᵀ·Aᵀ, split over N.
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
                } else if let Some(pb) = &self.packed {
                    // The weight's panels split over the threads; each task multiplies all of
                    // A by its panels and finishes those columns of every row.
                    let cp = SharedMut::new(cb);
                    let panels = pb.panels();
                    let per = panels.div_ceil(threads).max(1);
                    let a_rows = &a[ao..];
                    (0..panels.div_ceil(per)).into_par_iter().for_each(|t| {
                        let ps = t * per..((t + 1) * per).min(panels);
                        let cols = (ps.start * packed::NR)..(ps.end * packed::NR).min(n);
                        // SAFETY: the kernel is available (checked when packed); C's m rows
                        // of stride n hold columns `cols`, which only this task writes.
                        unsafe { packed::gemm(a_rows, a_rs, m, pb, ps, cp.at(0), n) };
                        let band = Product::new(cp, bi * m * n, m * n, n, 1);
                        let out_cols = cols.start / pair..cols.end / pair;
                        self.finish(
                            &band,
                            bi * m..(bi + 1) * m,
                            out_cols,
                            args,
                            fixed,
                            bufs,
                            out_ptr,
                        );
                    });
                } else {
                    // Split over N where B is the larger operand (each task packs a slice of B
                    // and all of A; a split over M would pack all of B in every task), else
                    // over M. Each task finishes its band while the products are in cache.
                    let cp = SharedMut::new(cb);
                    let split_n = n >= m;
                    let (len, step) = if split_n {
                        (n, n.div_ceil(threads).next_multiple_of(COLUMN_ALIGN).max(1))
                    } else {
                        (m, m.div_ceil(threads).max(1))
                    };
                    (0..len.div_ceil(step)).into_par_iter().for_each(|t| {
                        let (s0, sl) = (t * step, step.min(len - t * step));
                        let ((i0, mm), (j0, nn)) = if split_n {
                            ((0, m), (s0, sl))
                        } else {
                            ((s0, sl), (0, n))
                        };
                        // SAFETY: A's rows i0..i0+mm and its K columns, and B's columns
                        // j0..j0+nn, lie in their buffers (views checked by shape inference,
                        // packs sized to hold them); the task writes C's rows i0..i0+mm,
                        // columns j0..j0+nn (row stride n), which no other task touches.
                        unsafe {
                            matrixmultiply::sgemm(
                                mm,
                                k,
                                nn,
                                1.0,
                                a.as_ptr().add(ao + i0 * a_rs),
                                a_rs as isize,
                                a_cs as isize,
                                b.as_ptr().add(bo + j0 * b_cs),
                                b_rs as isize,
                                b_cs as isize,
                                0.0,
                                cp.at(i0 * n + j0),
                                n as isize,
                                1,
                            );
                        }
                        let band = Product::new(cp, bi * m * n, m * n, n, 1);
                        let r0 = bi * m + i0;
                        let cols = j0 / pair..(j0 + nn) / pair;
                        self.finish(&band, r0..r0 + mm, cols, args, fixed, bufs, out_ptr);
                    });
                }
            }
        }
        if self.quant.is_none() && !self.transposed {
            return; // every band finished itself
        }
        // The product in C: quantized products are [N][batch·M] over all batches at once,
        // transposed ones [batch][N][M].
        let cp = SharedMut::new(c);
        let product = if self.quant.is_some() {
            Product::new(cp, 0, m, 1, nb * m)
        } else {
            Product::new(cp, 0, m * n, 1, m)
        };
        // Rows finished in parallel bands when there is enough work to pay for the fork.
        let rows = nb * m;
        let band = if rows * n <= SERIAL_ELEMS {
            rows.max(1)
        } else {
            rows.div_ceil(rayon::current_num_threads().max(1)).max(1)
        };
        if band >= rows {
            self.finish(&product, 0..rows, 0..n_out, args, fixed, bufs, out_ptr);
        } else {
            (0..rows.div_ceil(band)).into_par_iter().for_each(|t| {
                let r = t * band..((t + 1) * band).min(rows);
                self.finish(&product, r, 0..n_out, args, fixed, bufs, out_ptr);
            });
        }
    }

    /// Rows `rows` (batch·M + row), result columns `cols`, of the result from `c`: each
    /// product rounded to A's dtype, then the epilogue with the extras (or, without one,
    /// rounded to the result's dtype), and written through the out view.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        c: &Product,
        rows: std::ops::Range<usize>,
        cols: std::ops::Range<usize>,
        args: &[usize],
        fixed: &[Option<Buf>],
        bufs: &[Buf],
        out: OutPtr,
    ) {
        let (m, n) = (self.m.max(1), self.n);
        // Paired: result column j combines product columns 2j ($0) and 2j + 1 ($1).
        let (n_out, pair) = if self.paired { (n / 2, 2) } else { (n, 1) };
        let ex: [Option<&Buf>; crate::ir::expr::MAX_INPUTS] =
            std::array::from_fn(|i| args.get(i + 2).map(|&s| val(fixed, bufs, s)));
        // Where result (bi, i, j) goes: a row base plus the column's offset.
        let out_base = |bi: usize, i: usize, r: usize| {
            if self.out_contiguous {
                r * n_out
            } else {
                self.out.batch[bi] + self.out.rows[i]
            }
        };
        let out_col = |j: usize| {
            if self.out_contiguous {
                j
            } else {
                self.out.cols[j]
            }
        };
        let Some(p) = &self.epilogue else {
            for r in rows {
                let (bi, i) = (r / m, r % m);
                let base = out_base(bi, i, r);
                if c.col == 1 && self.out_dtype == DType::F32 {
                    let v = c.row(bi, i, cols.start, cols.len());
                    self.write_row(out, base, cols.start, v);
                    continue;
                }
                for j in cols.clone() {
                    let v = round_float(self.out_dtype, c.at(bi, i, j));
                    // SAFETY: see `OutPtr::write`; this task owns these rows and columns.
                    unsafe { out.write(base + out_col(j), v) };
                }
            }
            return;
        };
        // A band's product row is one slice where columns are unit-strided and unpaired.
        let slices = c.col == 1 && pair == 1;
        let mut regs = Regs::new();
        let mut ins = [[0.0f32; CHUNK]; crate::ir::expr::MAX_INPUTS];
        let mut res = [0.0f32; CHUNK];
        for r in rows {
            let (bi, i) = (r / m, r % m);
            let base = out_base(bi, i, r);
            let mut j0 = cols.start;
            while j0 < cols.end {
                let cn = CHUNK.min(cols.end - j0);
                if slices {
                    let dst = &mut ins[0][..cn];
                    dst.copy_from_slice(c.row(bi, i, j0, cn));
                    if self.a_dtype != DType::F32 {
                        dst.iter_mut()
                            .for_each(|x| *x = round_float(self.a_dtype, *x));
                    }
                } else {
                    for (p, input) in ins.iter_mut().take(pair).enumerate() {
                        for (t, x) in input[..cn].iter_mut().enumerate() {
                            *x = round_float(self.a_dtype, c.at(bi, i, pair * (j0 + t) + p));
                        }
                    }
                }
                for (e, offs) in self.extras.iter().enumerate() {
                    let src = ex[e].expect("one buffer per extra");
                    let eb = offs.batch[bi] + offs.rows[i];
                    let dst = &mut ins[e + pair][..cn];
                    match src {
                        // A row of a contiguous extra (a bias, a residual) is one copy.
                        Buf::F(v) if self.extra_unit[e] => {
                            let at = eb + offs.cols[j0];
                            dst.copy_from_slice(&v[at..at + cn]);
                        }
                        _ => {
                            for (t, x) in dst.iter_mut().enumerate() {
                                *x = src.get(eb + offs.cols[j0 + t]);
                            }
                        }
                    }
                }
                p.eval(&mut regs, &ins, cn, &mut res);
                self.write_row(out, base, j0, &res[..cn]);
                j0 += cn;
            }
        }
    }

    /// `v` to result columns `j0..` of the row whose out view offset is `base`: slices along
    /// the view's unit-strided runs, else element by element. The caller's task owns these
    /// columns of the row (the contract of [`SharedMut::write`]).
    fn write_row(&self, out: OutPtr, base: usize, j0: usize, v: &[f32]) {
        let col = |j: usize| {
            if self.out_contiguous {
                j
            } else {
                self.out.cols[j]
            }
        };
        if self.out_run < 4 {
            for (t, &x) in v.iter().enumerate() {
                // SAFETY: see `SharedMut::write`; the caller's task owns these columns.
                unsafe { out.write(base + col(j0 + t), x) };
            }
            return;
        }
        let mut t = 0;
        while t < v.len() {
            let j = j0 + t;
            let len = (self.out_run - j % self.out_run).min(v.len() - t);
            // SAFETY: see `SharedMut::row`; columns j..j+len are one unit-strided run of the
            // view (`unit_runs`), owned by the caller's task.
            let dst = unsafe { out.row(base + col(j), len) };
            dst.copy_from_slice(&v[t..t + len]);
            t += len;
        }
    }
}

/// The length of the runs of unit-strided offsets `cols` is made of: r such that every
/// `cols[j] = cols[j − j % r] + j % r`, the first run's length when the rest repeat it, else 1.
fn unit_runs(cols: &[usize]) -> usize {
    let first = cols
        .windows(2)
        .position(|w| w[1] != w[0].wrapping_add(1))
        .map_or(cols.len(), |p| p + 1)
        .max(1);
    let holds = cols.len().is_multiple_of(first)
        && cols
            .chunks(first)
            .all(|run| run.windows(2).all(|w| w[1] == w[0].wrapping_add(1)));
    if holds {
        first
    } else {
        1
    }
}

/// Columns per task of a split over N: whole SIMD registers of results (and even, so a
/// paired product's column pairs stay in one task).
const COLUMN_ALIGN: usize = 16;

/// Products of a GEMM step as computed: element (bi, i, j) of the problem at
/// `bi·batch + i·row + j·col − origin` of `c` (a task's band starts at `origin`). Read through
/// a pointer because other tasks write other elements of the same scratch meanwhile.
struct Product {
    c: SharedMut,
    origin: usize,
    batch: usize,
    row: usize,
    col: usize,
}

impl Product {
    fn new(c: SharedMut, origin: usize, batch: usize, row: usize, col: usize) -> Product {
        Product {
            c,
            origin,
            batch,
            row,
            col,
        }
    }

    fn index(&self, bi: usize, i: usize, j: usize) -> usize {
        bi * self.batch + i * self.row + j * self.col - self.origin
    }

    /// Element (bi, i, j). Callers read only products their own task wrote, or any once
    /// every task has finished (the fork-join orders those writes before the reads).
    #[inline]
    fn at(&self, bi: usize, i: usize, j: usize) -> f32 {
        let at = self.index(bi, i, j);
        assert!(at < self.c.len, "product {at} past {}", self.c.len);
        // SAFETY: inside the scratch (checked above); no task writes an element another
        // task reads (the callers' contract above).
        unsafe { *self.c.ptr.add(at) }
    }

    /// Columns j0..j0 + len of row (bi, i), for unit-strided columns (`col == 1`); the same
    /// contract as [`Product::at`].
    fn row(&self, bi: usize, i: usize, j0: usize, len: usize) -> &[f32] {
        assert_eq!(
            self.col, 1,
            "a product row is a slice only with unit column stride"
        );
        let at = self.index(bi, i, j0);
        assert!(
            at + len <= self.c.len,
            "product row {at}+{len} past {}",
            self.c.len
        );
        // SAFETY: as for `at`, for each element of the range.
        unsafe { std::slice::from_raw_parts(self.c.ptr.add(at), len) }
    }
}

/// A buffer several tasks write at once, each its own elements: the products' scratch, and
/// (as [`OutPtr`]) the result through the out view.
#[derive(Clone, Copy)]
struct SharedMut {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: a `SharedMut` is only accessed at elements its task owns (see `OutPtr::write` and
// `Product::at`); the buffer outlives every task (the step holds `&mut` to it across the
// fork-join).
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

type OutPtr = SharedMut;

impl SharedMut {
    fn new(v: &mut [f32]) -> SharedMut {
        SharedMut {
            ptr: v.as_mut_ptr(),
            len: v.len(),
        }
    }

    /// The address of element `at`, for a product to write from there.
    fn at(&self, at: usize) -> *mut f32 {
        assert!(at <= self.len, "offset {at} past {}", self.len);
        // SAFETY: at most one past the end (checked above).
        unsafe { self.ptr.add(at) }
    }

    /// Elements `at..at + len` as a slice.
    ///
    /// # Safety
    /// As for [`SharedMut::write`], for every element of the range: they are one result
    /// row's columns where the out view's columns are unit-strided.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    unsafe fn row(&self, at: usize, len: usize) -> &mut [f32] {
        assert!(
            at + len <= self.len,
            "out view row {at}+{len} past {}",
            self.len
        );
        // SAFETY: inside the buffer (checked above); exclusivity is the caller's.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(at), len) }
    }

    /// Writes element `at`.
    ///
    /// # Safety
    /// No other task may access element `at` meanwhile. Holds for `finish`'s callers: tasks
    /// own disjoint result rows or columns, and the out view writes each (batch, row,
    /// column) to its own element (shape inference refuses a view that is not a bijection
    /// onto the result).
    #[inline]
    unsafe fn write(self, at: usize, v: f32) {
        assert!(at < self.len, "out view offset {at} past {}", self.len);
        // SAFETY: `at` is inside the buffer (checked above); exclusivity is the caller's.
        unsafe { *self.ptr.add(at) = v };
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

#[cfg(test)]
mod tests {
    use super::unit_runs;

    #[test]
    fn unit_runs_finds_head_sized_runs_and_refuses_irregular_ones() {
        // Contiguous; heads of 3 at stride 10; a single column; nothing contiguous.
        assert_eq!(unit_runs(&[4, 5, 6, 7]), 4);
        assert_eq!(unit_runs(&[0, 1, 2, 10, 11, 12]), 3);
        assert_eq!(unit_runs(&[7]), 1);
        assert_eq!(unit_runs(&[0, 2, 4]), 1);
        // A first run the rest do not repeat, or that does not divide the columns.
        assert_eq!(unit_runs(&[0, 1, 2, 10, 12, 13]), 1);
        assert_eq!(unit_runs(&[0, 1, 5, 6, 9]), 1);
        assert_eq!(unit_runs(&[]), 1);
    }
}
