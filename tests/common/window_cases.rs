//! Sliding-window attention cases (issue 25, `Attention::window`, `Op::PagedAttention`'s
//! window) and their independent reference: dense f64 loops over the visibility rule written
//! out here (`q + offset − window < k ≤ q + offset`, keys below kv_len), sharing no code with
//! the interpreter or the kernels. The K/V rows no kernel may read hold NaN: the rows before the
//! first row's window start (rounded down to `poison_align`, the widest key tile a kernel of
//! the case may load whole) and, with kv_len, the rows from kv_len on. A kernel that loads a
//! skipped tile multiplies a NaN value by its zero weight and fails.
#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rocmforge::interp::Bindings;
use rocmforge::ir::{DType, Graph, Tensor};

#[derive(Clone, Debug)]
pub struct WindowCase {
    pub name: String,
    pub b: usize,
    pub hq: usize,
    pub hkv: usize,
    pub sq: usize,
    pub sk: usize,
    pub d: usize,
    pub dtype: DType,
    /// The static causal offset (without kv_len).
    pub offset: i64,
    /// Valid keys per batch; the queries are the last Sq of them.
    pub kv_len: Option<Vec<usize>>,
    pub window: u32,
    /// Rows before the first row's window start, rounded down to this, are NaN (1: exact, for
    /// the decode kernels, whose splits start at the window; a tile multiple for prefill).
    pub poison_align: usize,
}

impl WindowCase {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: &str,
        (b, hq, hkv): (usize, usize, usize),
        (sq, sk, d): (usize, usize, usize),
        dtype: DType,
        offset: i64,
        kv_len: Option<Vec<usize>>,
        window: u32,
    ) -> WindowCase {
        WindowCase {
            name: name.to_string(),
            b,
            hq,
            hkv,
            sq,
            sk,
            d,
            dtype,
            offset,
            kv_len,
            window,
            poison_align: 256,
        }
    }

    pub fn scale(&self) -> f64 {
        1.0 / (self.d as f64).sqrt()
    }

    /// Valid keys and the causal offset of batch `bi`.
    pub fn bounds(&self, bi: usize) -> (usize, i64) {
        match &self.kv_len {
            Some(l) => (l[bi], l[bi] as i64 - self.sq as i64),
            None => (self.sk, self.offset),
        }
    }

    /// Whether key `j` is visible from query `i` of batch `bi`, written out.
    pub fn visible(&self, bi: usize, i: usize, j: usize) -> bool {
        let (valid, off) = self.bounds(bi);
        let (i, j, w) = (i as i64, j as i64, i64::from(self.window));
        (j as usize) < valid && j <= i + off && j > i + off - w
    }

    /// Whether the window hides any key a plain causal attention shows (the kernels drop one
    /// that does not: `codegen::kernels::attention::effective_window`).
    pub fn effective(&self) -> bool {
        (0..self.b).any(|bi| {
            let (valid, off) = self.bounds(bi);
            let last = (self.sq as i64 - 1 + off).min(valid as i64 - 1);
            i64::from(self.window) <= last
        })
    }

    /// The first row's window start in batch `bi` (no query sees a key before it).
    pub fn first_visible(&self, bi: usize) -> usize {
        let (_, off) = self.bounds(bi);
        usize::try_from(off - i64::from(self.window) + 1).unwrap_or(0)
    }

    /// The graph: one FlashAttention with the window attribute; output `out`.
    pub fn graph(&self) -> Graph {
        self.graph_window(Some(self.window))
    }

    /// The graph with `window` instead of the case's (`None`: the plain causal attention).
    pub fn graph_window(&self, window: Option<u32>) -> Graph {
        let mut g = Graph::new(&self.name);
        let q = g
            .input("q", self.dtype, &[self.b, self.hq, self.sq, self.d])
            .unwrap();
        let k = g
            .input("k", self.dtype, &[self.b, self.hkv, self.sk, self.d])
            .unwrap();
        let v = g
            .input("v", self.dtype, &[self.b, self.hkv, self.sk, self.d])
            .unwrap();
        let kv = self
            .kv_len
            .as_ref()
            .map(|_| g.input("kv_len", DType::I32, &[self.b]).unwrap());
        let offset = if kv.is_some() { 0 } else { self.offset };
        let out = g
            .flash_attention_windowed((q, k, v), kv, self.scale(), offset, window)
            .unwrap();
        g.rename(out, "out").unwrap();
        g.set_outputs(&[out]).unwrap();
        g
    }

    /// Seeded data rounded to the dtype, the rows no kernel may read NaN.
    pub fn bindings(&self, seed: u64) -> Bindings {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut draw =
            |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
        let (b, hq, hkv, sq, sk, d) = (self.b, self.hq, self.hkv, self.sq, self.sk, self.d);
        let q = draw(b * hq * sq * d);
        let mut k = draw(b * hkv * sk * d);
        let mut v = draw(b * hkv * sk * d);
        for bi in 0..b {
            let (valid, _) = self.bounds(bi);
            let before = self.first_visible(bi) / self.poison_align * self.poison_align;
            for h in 0..hkv {
                for j in (0..sk).filter(|&j| j < before || j >= valid) {
                    let at = ((bi * hkv + h) * sk + j) * d;
                    k[at..at + d].fill(f32::NAN);
                    v[at..at + d].fill(f32::NAN);
                }
            }
        }
        let mut bind = Bindings::default();
        let t = |x: Vec<f32>, shape: Vec<usize>| Tensor::from_f32(self.dtype, shape, x).unwrap();
        bind.inputs.insert("q".into(), t(q, vec![b, hq, sq, d]));
        bind.inputs.insert("k".into(), t(k, vec![b, hkv, sk, d]));
        bind.inputs.insert("v".into(), t(v, vec![b, hkv, sk, d]));
        if let Some(l) = &self.kv_len {
            let l = l.iter().map(|&x| x as i64).collect();
            bind.inputs.insert(
                "kv_len".into(),
                Tensor::from_i64(DType::I32, vec![b], l).unwrap(),
            );
        }
        bind
    }

    /// The attention written out in f64 on the bound (rounded) data: only visible keys are
    /// read; a row with none is zeros.
    pub fn reference(&self, bind: &Bindings) -> Tensor {
        let f = |n: &str| bind.inputs[n].as_f32().unwrap().to_vec();
        let (q, k, v) = (f("q"), f("k"), f("v"));
        let (b, hq, hkv, sq, sk, d) = (self.b, self.hq, self.hkv, self.sq, self.sk, self.d);
        let group = hq / hkv;
        let mut out = vec![0.0f32; b * hq * sq * d];
        for bi in 0..b {
            for h in 0..hq {
                let kvh = h / group;
                for i in 0..sq {
                    let qi = &q[((bi * hq + h) * sq + i) * d..][..d];
                    let keys: Vec<usize> = (0..sk).filter(|&j| self.visible(bi, i, j)).collect();
                    if keys.is_empty() {
                        continue;
                    }
                    let row = |x: &[f32], j: usize| -> Vec<f64> {
                        x[((bi * hkv + kvh) * sk + j) * d..][..d]
                            .iter()
                            .map(|&e| f64::from(e))
                            .collect()
                    };
                    let s: Vec<f64> = keys
                        .iter()
                        .map(|&j| {
                            row(&k, j)
                                .iter()
                                .zip(qi)
                                .map(|(a, &c)| a * f64::from(c))
                                .sum::<f64>()
                                * self.scale()
                        })
                        .collect();
                    let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let p: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
                    let sum: f64 = p.iter().sum();
                    let o = &mut out[((bi * hq + h) * sq + i) * d..][..d];
                    for (c, oc) in o.iter_mut().enumerate() {
                        let acc: f64 = keys
                            .iter()
                            .zip(&p)
                            .map(|(&j, &pj)| pj * row(&v, j)[c])
                            .sum();
                        *oc = (acc / sum) as f32;
                    }
                }
            }
        }
        Tensor::from_f32(DType::F32, vec![b, hq, sq, d], out).unwrap()
    }
}

/// Prefill cases: windows smaller than, equal to and larger than the kernels' key tiles (16 to
/// 128), window 1 (a query sees only itself), causal offsets either way, kv_len per batch, GQA,
/// sizes off the tiles.
pub fn prefill_cases(dtype: DType) -> Vec<WindowCase> {
    let c = WindowCase::new;
    vec![
        c("w1_gqa", (1, 4, 2), (45, 45, 32), dtype, 0, None, 1),
        c("w7_off300", (1, 2, 1), (77, 400, 64), dtype, 300, None, 7),
        c(
            "w64_off256",
            (2, 3, 1),
            (130, 420, 64),
            dtype,
            256,
            None,
            64,
        ),
        c(
            "w128_off280",
            (1, 2, 2),
            (99, 500, 128),
            dtype,
            280,
            None,
            128,
        ),
        c(
            "w200_off290",
            (1, 4, 1),
            (201, 640, 64),
            dtype,
            290,
            None,
            200,
        ),
        c("w33_neg_off", (1, 2, 1), (90, 60, 32), dtype, -10, None, 33),
        c(
            "w50_kvlen",
            (2, 4, 2),
            (70, 700, 64),
            dtype,
            0,
            Some(vec![650, 333]),
            50,
        ),
    ]
}

/// Decode cases (few query rows per K/V head: the split-K kernel): windows of 1, below a
/// split, across several splits and past the whole context; kv_len per batch and static
/// offsets. The NaN rows start exactly at the window.
pub fn decode_cases(dtype: DType) -> Vec<WindowCase> {
    let c = |name, heads, sizes, off, kv, w| WindowCase {
        poison_align: 1,
        ..WindowCase::new(name, heads, sizes, dtype, off, kv, w)
    };
    vec![
        c("dec_w1", (1, 4, 1), (1, 300, 64), 299, None, 1),
        c(
            "dec_w100_kvlen",
            (2, 8, 2),
            (1, 2000, 64),
            0,
            Some(vec![1999, 901]),
            100,
        ),
        c("dec_w700_split", (1, 4, 1), (2, 3000, 64), 2998, None, 700),
        c(
            "dec_w1500_kvlen",
            (1, 6, 2),
            (2, 4096, 128),
            0,
            Some(vec![4000]),
            1500,
        ),
        c("dec_w5000_all", (1, 4, 1), (1, 800, 64), 799, None, 5000),
    ]
}

/// A paged decode step in a window: the [`WindowCase`] (kv_len per sequence, Sk the table's
/// reach) held in pools of `block_size` rows. Block 0 of the pool is all NaN, and every table
/// entry of a block wholly before a sequence's window names it, so a kernel that reads a
/// skipped block fails; the other blocks are given in reverse order.
#[derive(Clone, Debug)]
pub struct PagedWindow {
    pub base: WindowCase,
    pub block_size: usize,
}

impl PagedWindow {
    pub fn new(base: WindowCase, block_size: usize) -> PagedWindow {
        assert!(base.kv_len.is_some() && base.sk.is_multiple_of(block_size));
        PagedWindow {
            base: WindowCase {
                poison_align: 1,
                ..base
            },
            block_size,
        }
    }

    fn max_blocks(&self) -> usize {
        self.base.sk / self.block_size
    }

    /// Blocks each sequence needs (its table's used entries), and the pool's size.
    fn num_blocks(&self) -> usize {
        let lens = self.base.kv_len.as_ref().unwrap();
        1 + lens
            .iter()
            .map(|l| l.div_ceil(self.block_size))
            .sum::<usize>()
    }

    pub fn graph(&self) -> Graph {
        let c = &self.base;
        let mut g = Graph::new(&c.name);
        let pool = [self.num_blocks(), c.hkv, self.block_size, c.d];
        let q = g.input("q", c.dtype, &[c.b, c.hq, c.sq, c.d]).unwrap();
        let k = g.input("k_pool", c.dtype, &pool).unwrap();
        let v = g.input("v_pool", c.dtype, &pool).unwrap();
        let t = g
            .input("table", DType::I32, &[c.b, self.max_blocks()])
            .unwrap();
        let l = g.input("kv_len", DType::I32, &[c.b]).unwrap();
        let out = g
            .paged_attention_windowed((q, k, v), t, l, c.scale(), Some(c.window))
            .unwrap();
        g.rename(out, "out").unwrap();
        g.set_outputs(&[out]).unwrap();
        g
    }

    /// The paged bindings and the contiguous ones they hold (for [`WindowCase::reference`]).
    pub fn bindings(&self, seed: u64) -> (Bindings, Bindings) {
        let c = &self.base;
        let flat = c.bindings(seed);
        let (bs, hkv, d, sk) = (self.block_size, c.hkv, c.d, c.sk);
        let n = self.num_blocks();
        let mut kp = vec![f32::NAN; n * hkv * bs * d];
        let mut vp = kp.clone();
        let mut table = vec![-1i64; c.b * self.max_blocks()];
        let mut next = n - 1;
        let (kf, vf) = (
            flat.inputs["k"].as_f32().unwrap(),
            flat.inputs["v"].as_f32().unwrap(),
        );
        for bi in 0..c.b {
            let (len, _) = c.bounds(bi);
            for t in 0..len.div_ceil(bs) {
                if (t + 1) * bs <= c.first_visible(bi) {
                    table[bi * self.max_blocks() + t] = 0;
                    continue;
                }
                let blk = next;
                next -= 1;
                table[bi * self.max_blocks() + t] = blk as i64;
                for h in 0..hkv {
                    for r in 0..bs {
                        let from = ((bi * hkv + h) * sk + t * bs + r) * d;
                        let to = ((blk * hkv + h) * bs + r) * d;
                        kp[to..to + d].copy_from_slice(&kf[from..from + d]);
                        vp[to..to + d].copy_from_slice(&vf[from..from + d]);
                    }
                }
            }
        }
        let pool = vec![n, hkv, bs, d];
        let mut b = Bindings::default();
        b.inputs.insert("q".into(), flat.inputs["q"].clone());
        b.inputs.insert(
            "k_pool".into(),
            Tensor::from_f32(c.dtype, pool.clone(), kp).unwrap(),
        );
        b.inputs.insert(
            "v_pool".into(),
            Tensor::from_f32(c.dtype, pool, vp).unwrap(),
        );
        b.inputs.insert(
            "table".into(),
            Tensor::from_i64(DType::I32, vec![c.b, self.max_blocks()], table).unwrap(),
        );
        b.inputs
            .insert("kv_len".into(), flat.inputs["kv_len"].clone());
        (b, flat)
    }
}

/// Paged decode cases: a window inside one block, across blocks, and across splits.
pub fn paged_cases(dtype: DType) -> Vec<PagedWindow> {
    let c = |name, heads, sizes, kv: Vec<usize>, w| {
        WindowCase::new(name, heads, sizes, dtype, 0, Some(kv), w)
    };
    vec![
        PagedWindow::new(c("paged_w3", (2, 4, 2), (1, 64, 16), vec![37, 22], 3), 4),
        PagedWindow::new(
            c("paged_w21_s2", (3, 6, 2), (2, 96, 32), vec![90, 41, 2], 21),
            16,
        ),
        PagedWindow::new(
            c("paged_w900", (1, 8, 2), (1, 2048, 64), vec![2000], 900),
            16,
        ),
    ]
}
