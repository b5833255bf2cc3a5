//! Paged KV cache cases (`Op::PagedCacheWrite`, `Op::PagedAttention`): pools of blocks, block
//! tables with a prefix block shared by two sequences, lengths that are not multiples of the
//! block size. Every pool row no sequence reads (free blocks, rows past a sequence's length)
//! holds NaN, so a path that reads through the wrong block, or past kv_len, gives NaN and
//! fails. The reference is always the contiguous ops (`FlashAttention` over `kv_len`,
//! `CacheWrite`) on the same data gathered into contiguous caches here, by plain loops, so
//! the paged ops are checked against a different computation.
#![allow(dead_code)]

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rocmforge::interp::{self, Bindings};
use rocmforge::ir::{DType, Graph, Tensor};

#[derive(Clone, Debug, PartialEq)]
pub struct PagedCase {
    pub b: usize,
    pub hq: usize,
    pub hkv: usize,
    /// New tokens (queries) per sequence this step.
    pub s: usize,
    pub d: usize,
    pub block_size: usize,
    pub num_blocks: usize,
    pub max_blocks: usize,
    /// Each sequence's length after this step's rows are written.
    pub kv_len: Vec<usize>,
    /// Whether sequences 0 and 1 share their first block (a common prompt prefix).
    pub share_prefix: bool,
    pub dtype: DType,
}

/// A case's data: pools before the step (`[N, Hkv, BS, D]`), the step's new rows, tables.
#[derive(Clone, Debug)]
pub struct PagedData {
    pub q: Tensor,
    pub k_new: Tensor,
    pub v_new: Tensor,
    pub k_pool: Tensor,
    pub v_pool: Tensor,
    /// i32 `[B, s]`: where each new row goes.
    pub slots: Tensor,
    /// i32 `[B, max_blocks]`; entries past a sequence's blocks are -1.
    pub table: Tensor,
    pub kv_len: Tensor,
    pub tables: Vec<Vec<usize>>,
}

impl PagedCase {
    /// B = 3, GQA 6 over 2, D = 16, blocks of 4 in a pool of 13, lengths 7, 13 and 5 with one
    /// new token each; sequences 0 and 1 share their first block.
    pub fn small(dtype: DType) -> PagedCase {
        PagedCase {
            b: 3,
            hq: 6,
            hkv: 2,
            s: 1,
            d: 16,
            block_size: 4,
            num_blocks: 13,
            max_blocks: 5,
            kv_len: vec![7, 13, 5],
            share_prefix: true,
            dtype,
        }
    }

    pub fn name(&self) -> String {
        let lens: Vec<String> = self.kv_len.iter().map(|l| l.to_string()).collect();
        format!(
            "{}_b{}_h{}x{}_s{}_d{}_bs{}_n{}_kv{}{}",
            self.dtype,
            self.b,
            self.hq,
            self.hkv,
            self.s,
            self.d,
            self.block_size,
            self.num_blocks,
            lens.join("-"),
            if self.share_prefix { "_shared" } else { "" }
        )
    }

    pub fn scale(&self) -> f64 {
        1.0 / (self.d as f64).sqrt()
    }

    fn pool_shape(&self) -> Vec<usize> {
        vec![self.num_blocks, self.hkv, self.block_size, self.d]
    }

    /// Block tables: distinct blocks per sequence drawn from a shuffled pool, sequence 1's
    /// first block sequence 0's when the prefix is shared. The shared block is full for both
    /// (their lengths minus this step's rows reach past it), so no new row lands in it.
    pub fn tables(&self, rng: &mut ChaCha8Rng) -> Vec<Vec<usize>> {
        let mut free: Vec<usize> = (0..self.num_blocks).collect();
        free.shuffle(rng);
        let mut tables: Vec<Vec<usize>> = Vec::new();
        for (bi, &len) in self.kv_len.iter().enumerate() {
            let n = len.div_ceil(self.block_size);
            assert!(n <= self.max_blocks, "{}: table too short", self.name());
            let mut t = Vec::new();
            if self.share_prefix && bi == 1 {
                assert!(
                    self.kv_len[0] - self.s >= self.block_size && len - self.s >= self.block_size
                );
                t.push(tables[0][0]);
            }
            while t.len() < n {
                t.push(free.pop().expect("the pool holds every sequence's blocks"));
            }
            tables.push(t);
        }
        tables
    }

    /// Random data: the rows each sequence holds before the step are random, every other pool
    /// row NaN; the step's rows go to positions `kv_len − s .. kv_len` of each sequence.
    pub fn data(&self, seed: u64) -> PagedData {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let tables = self.tables(&mut rng);
        let (bs, d, hkv) = (self.block_size, self.d, self.hkv);
        let mut pools = [
            vec![f32::NAN; self.pool_shape().iter().product()],
            vec![f32::NAN; self.pool_shape().iter().product()],
        ];
        for (bi, t) in tables.iter().enumerate() {
            for j in 0..self.kv_len[bi] - self.s {
                for pool in pools.iter_mut() {
                    for h in 0..hkv {
                        let at = ((t[j / bs] * hkv + h) * bs + j % bs) * d;
                        for x in &mut pool[at..at + d] {
                            *x = rng.random_range(-2.0..2.0);
                        }
                    }
                }
            }
        }
        let mut random = |shape: Vec<usize>| {
            let n = shape.iter().product();
            let v: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0..2.0)).collect();
            Tensor::from_f32(self.dtype, shape, v).unwrap()
        };
        let q = random(vec![self.b, self.hq, self.s, d]);
        let k_new = random(vec![self.b, hkv, self.s, d]);
        let v_new = random(vec![self.b, hkv, self.s, d]);
        let mut slots = Vec::new();
        for (bi, t) in tables.iter().enumerate() {
            for j in self.kv_len[bi] - self.s..self.kv_len[bi] {
                slots.push((t[j / bs] * bs + j % bs) as i64);
            }
        }
        let mut table = vec![-1i64; self.b * self.max_blocks];
        for (bi, t) in tables.iter().enumerate() {
            for (i, &blk) in t.iter().enumerate() {
                table[bi * self.max_blocks + i] = blk as i64;
            }
        }
        let [kp, vp] = pools;
        let i32s = |shape: Vec<usize>, v: Vec<i64>| Tensor::from_i64(DType::I32, shape, v).unwrap();
        PagedData {
            q,
            k_new,
            v_new,
            k_pool: Tensor::from_f32(self.dtype, self.pool_shape(), kp).unwrap(),
            v_pool: Tensor::from_f32(self.dtype, self.pool_shape(), vp).unwrap(),
            slots: i32s(vec![self.b, self.s], slots),
            table: i32s(vec![self.b, self.max_blocks], table),
            kv_len: i32s(
                vec![self.b],
                self.kv_len.iter().map(|&l| l as i64).collect(),
            ),
            tables,
        }
    }

    /// Paged attention alone over pools given as inputs `k_pool`, `v_pool` (the pools after
    /// this step's writes), at `dtype`.
    pub fn attention_graph(&self, dtype: DType) -> Graph {
        let mut g = Graph::new("paged_attention");
        let q = g
            .input("q", dtype, &[self.b, self.hq, self.s, self.d])
            .unwrap();
        let k = g.input("k_pool", dtype, &self.pool_shape()).unwrap();
        let v = g.input("v_pool", dtype, &self.pool_shape()).unwrap();
        let t = g
            .input("table", DType::I32, &[self.b, self.max_blocks])
            .unwrap();
        let l = g.input("kv_len", DType::I32, &[self.b]).unwrap();
        let out = g.paged_attention((q, k, v), t, l, self.scale()).unwrap();
        g.rename(out, "out").unwrap();
        g.set_outputs(&[out]).unwrap();
        g
    }

    /// One decode step: the new rows written into the pools (states `k_pool`, `v_pool`), then
    /// attention over them.
    pub fn step_graph(&self, dtype: DType) -> Graph {
        let mut g = Graph::new("paged_step");
        let kp = g.state("k_pool", dtype, &self.pool_shape()).unwrap();
        let vp = g.state("v_pool", dtype, &self.pool_shape()).unwrap();
        let q = g
            .input("q", dtype, &[self.b, self.hq, self.s, self.d])
            .unwrap();
        let kn = g
            .input("k_new", dtype, &[self.b, self.hkv, self.s, self.d])
            .unwrap();
        let vn = g
            .input("v_new", dtype, &[self.b, self.hkv, self.s, self.d])
            .unwrap();
        let slots = g.input("slots", DType::I32, &[self.b, self.s]).unwrap();
        let t = g
            .input("table", DType::I32, &[self.b, self.max_blocks])
            .unwrap();
        let l = g.input("kv_len", DType::I32, &[self.b]).unwrap();
        let kw = g.paged_cache_write(kp, kn, slots).unwrap();
        let vw = g.paged_cache_write(vp, vn, slots).unwrap();
        let out = g.paged_attention((q, kw, vw), t, l, self.scale()).unwrap();
        g.rename(out, "out").unwrap();
        g.set_outputs(&[out]).unwrap();
        g
    }

    /// One decode step as the batched LLaMA lowering makes it (`Paged`), with q and k rotated
    /// at `positions` (theta 10⁴, Llama 3's `factors` or none): this step's rows `[1, H, b·s,
    /// D]`, q seen per sequence by the lowering's view, the K/V rows written at slots `[1,
    /// b·s]`; `passes::PagedAppend` makes its attention the append form.
    #[allow(dead_code)]
    pub fn append_graph(&self, dtype: DType, factors: Vec<f64>) -> Graph {
        let (b, s, d, hq, hkv) = (self.b, self.s, self.d, self.hq, self.hkv);
        let mut g = Graph::new("paged_append_step");
        let kp = g.state("k_pool", dtype, &self.pool_shape()).unwrap();
        let vp = g.state("v_pool", dtype, &self.pool_shape()).unwrap();
        let q = g.input("q", dtype, &[1, hq, b * s, d]).unwrap();
        let kn = g.input("k_new", dtype, &[1, hkv, b * s, d]).unwrap();
        let vn = g.input("v_new", dtype, &[1, hkv, b * s, d]).unwrap();
        let pos = g.input("positions", DType::I32, &[b * s]).unwrap();
        let slots = g.input("slots", DType::I32, &[1, b * s]).unwrap();
        let t = g.input("table", DType::I32, &[b, self.max_blocks]).unwrap();
        let l = g.input("kv_len", DType::I32, &[b]).unwrap();
        let qr = g
            .rope_scaled(q, Some(pos), 10_000.0, 0, factors.clone())
            .unwrap();
        let kr = g.rope_scaled(kn, Some(pos), 10_000.0, 0, factors).unwrap();
        let qs = if b == 1 {
            qr
        } else if s == 1 {
            g.permute(qr, &[2, 1, 0, 3]).unwrap()
        } else {
            let r = g
                .reshape(qr, &[hq as i64, b as i64, s as i64, d as i64])
                .unwrap();
            g.permute(r, &[1, 0, 2, 3]).unwrap()
        };
        let kw = g.paged_cache_write(kp, kr, slots).unwrap();
        let vw = g.paged_cache_write(vp, vn, slots).unwrap();
        let out = g.paged_attention((qs, kw, vw), t, l, self.scale()).unwrap();
        g.rename(out, "out").unwrap();
        g.set_outputs(&[out]).unwrap();
        g
    }

    /// The pools after the step, written here by plain loops: each new row at its slot.
    pub fn written_pools(&self, data: &PagedData) -> (Tensor, Tensor) {
        let slots = data.slots.as_i64().unwrap();
        let write = |pool: &Tensor, rows: &Tensor| {
            let mut p = pool.as_f32().unwrap().to_vec();
            let r = rows.as_f32().unwrap();
            let (bs, d, hkv, s) = (self.block_size, self.d, self.hkv, self.s);
            for bi in 0..self.b {
                for si in 0..s {
                    let slot = slots[bi * s + si];
                    if slot < 0 {
                        continue;
                    }
                    let slot = slot as usize;
                    for h in 0..hkv {
                        let dst = ((slot / bs * hkv + h) * bs + slot % bs) * d;
                        let src = ((bi * hkv + h) * s + si) * d;
                        p[dst..dst + d].copy_from_slice(&r[src..src + d]);
                    }
                }
            }
            Tensor::from_f32(pool.dtype(), pool.shape().clone(), p).unwrap()
        };
        (
            write(&data.k_pool, &data.k_new),
            write(&data.v_pool, &data.v_new),
        )
    }

    /// `pool`'s rows of each sequence gathered through its table into a contiguous cache
    /// `[B, Hkv, max_len, D]` (rows past a sequence's length zero: FlashAttention with kv_len
    /// never reads them).
    pub fn gather(&self, pool: &Tensor, tables: &[Vec<usize>]) -> Tensor {
        let p = pool.as_f32().unwrap();
        let (bs, d, hkv) = (self.block_size, self.d, self.hkv);
        let max_len = *self.kv_len.iter().max().unwrap();
        let mut out = vec![0.0f32; self.b * hkv * max_len * d];
        for (bi, t) in tables.iter().enumerate() {
            for h in 0..hkv {
                for j in 0..self.kv_len[bi] {
                    let src = ((t[j / bs] * hkv + h) * bs + j % bs) * d;
                    let dst = ((bi * hkv + h) * max_len + j) * d;
                    out[dst..dst + d].copy_from_slice(&p[src..src + d]);
                }
            }
        }
        Tensor::from_f32(pool.dtype(), vec![self.b, hkv, max_len, d], out).unwrap()
    }

    /// The contiguous reference at `dtype`: FlashAttention over `kv_len`, causal, on the
    /// written pools gathered into contiguous caches (inputs cast to `dtype`).
    pub fn reference(&self, data: &PagedData, dtype: DType) -> Tensor {
        let (kp, vp) = self.written_pools(data);
        let k = self.gather(&kp, &data.tables).cast(dtype);
        let v = self.gather(&vp, &data.tables).cast(dtype);
        let mut g = Graph::new("contiguous");
        let q = g.input("q", dtype, data.q.shape().dims()).unwrap();
        let ki = g.input("k", dtype, k.shape().dims()).unwrap();
        let vi = g.input("v", dtype, v.shape().dims()).unwrap();
        let l = g.input("kv_len", DType::I32, &[self.b]).unwrap();
        let out = g
            .flash_attention_len((q, ki, vi), l, self.scale(), true)
            .unwrap();
        g.set_outputs(&[out]).unwrap();
        let mut b = Bindings::default();
        b.inputs.insert("q".into(), data.q.cast(dtype));
        b.inputs.insert("k".into(), k);
        b.inputs.insert("v".into(), v);
        b.inputs.insert("kv_len".into(), data.kv_len.clone());
        interp::run(&g, &b).unwrap().remove(0)
    }

    /// Bindings of [`PagedCase::attention_graph`]: the written pools, q, table, kv_len.
    pub fn attention_bindings(&self, data: &PagedData) -> Bindings {
        let (kp, vp) = self.written_pools(data);
        let mut b = Bindings::default();
        b.inputs.insert("q".into(), data.q.clone());
        b.inputs.insert("k_pool".into(), kp);
        b.inputs.insert("v_pool".into(), vp);
        b.inputs.insert("table".into(), data.table.clone());
        b.inputs.insert("kv_len".into(), data.kv_len.clone());
        b
    }

    /// Bindings of [`PagedCase::step_graph`] (the pools are its states).
    pub fn step_bindings(&self, data: &PagedData) -> Bindings {
        let mut b = Bindings::default();
        for (n, t) in [
            ("q", &data.q),
            ("k_new", &data.k_new),
            ("v_new", &data.v_new),
            ("slots", &data.slots),
            ("table", &data.table),
            ("kv_len", &data.kv_len),
        ] {
            b.inputs.insert(n.into(), t.clone());
        }
        b
    }
}

/// Cases for every path: GQA and not, one and several new tokens, odd pool sizes, block sizes
/// 1, 4 and 16, lengths of one token and of a whole table, each dtype.
pub fn cases() -> Vec<PagedCase> {
    let mut v = Vec::new();
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        v.push(PagedCase::small(dtype));
    }
    v.push(PagedCase {
        s: 3,
        kv_len: vec![9, 11, 3],
        ..PagedCase::small(DType::F32)
    });
    v.push(PagedCase {
        b: 2,
        hq: 4,
        hkv: 4,
        s: 2,
        d: 8,
        block_size: 1,
        num_blocks: 17,
        max_blocks: 9,
        kv_len: vec![9, 4],
        share_prefix: true,
        dtype: DType::F32,
    });
    v.push(PagedCase {
        b: 3,
        hq: 9,
        hkv: 3,
        s: 1,
        d: 64,
        block_size: 16,
        num_blocks: 11,
        max_blocks: 4,
        kv_len: vec![37, 64, 1],
        share_prefix: true,
        dtype: DType::F16,
    });
    v
}
