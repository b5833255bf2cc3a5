//! Rotary embedding and flash attention, parallel over rows and over (batch, head).

use rayon::prelude::*;

use super::{val, Buf, CpuError, Scratch};
use crate::interp::InterpError;
use crate::ir::scalar::round_float;
use crate::ir::{Attention, DType, MaskKind, Shape, TensorType};

pub struct RopeStep {
    /// `theta^(−2i/D)` per pair, in f64 as the interpreter.
    inv_freq: Vec<f64>,
    offset: i64,
    s: usize,
    d: usize,
}

impl RopeStep {
    pub fn new(
        theta: f64,
        offset: i64,
        factors: &[f64],
        shape: &Shape,
        positions: bool,
    ) -> RopeStep {
        let dims = shape.dims();
        let (s, d) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        RopeStep {
            inv_freq: (0..d / 2)
                .map(|i| {
                    theta.powf(-2.0 * i as f64 / d as f64) / factors.get(i).copied().unwrap_or(1.0)
                })
                .collect(),
            offset: if positions { 0 } else { offset },
            s,
            d,
        }
    }

    pub fn run(&self, x: &[f32], pos: Option<&[i64]>, dt: DType, out: &mut [f32]) {
        let (d, half) = (self.d.max(1), self.d / 2);
        out.par_chunks_mut(d)
            .zip(x.par_chunks(d))
            .enumerate()
            .for_each(|(r, (dst, row))| {
                let p = match pos {
                    Some(p) => p[r % self.s.max(1)] as f64,
                    None => (r % self.s.max(1)) as f64 + self.offset as f64,
                };
                for (i, f) in self.inv_freq.iter().enumerate() {
                    let (sin, cos) = (p * f).sin_cos();
                    let (a, b) = (f64::from(row[i]), f64::from(row[i + half]));
                    dst[i] = round_float(dt, (a * cos - b * sin) as f32);
                    dst[i + half] = round_float(dt, (b * cos + a * sin) as f32);
                }
            });
    }
}

pub struct AttentionStep {
    att: Attention,
    b: usize,
    hq: usize,
    hkv: usize,
    sq: usize,
    sk: usize,
    d: usize,
    dv: usize,
    /// Mask strides as if broadcast to [B, Hq, Sq, Sk].
    mask: Option<[usize; 4]>,
    /// The append form: q is rotated at the positions operand first (into the scratch, after
    /// the per-head rows), then attends over the caches as the cache writes left them.
    rope: Option<RopeStep>,
}

impl AttentionStep {
    pub fn new(att: &Attention, ins: &[&TensorType]) -> AttentionStep {
        let q = ins[0].shape.dims();
        let k = ins[1].shape.dims();
        let dv = ins[2].shape.dims()[3];
        let scores = Shape::new(vec![q[0], q[1], q[2], k[2]]);
        let mask = (att.mask != MaskKind::None).then(|| {
            let m = &ins[3].shape;
            let padded = Shape(
                std::iter::repeat_n(1, 4 - m.rank())
                    .chain(m.dims().iter().copied())
                    .collect(),
            );
            let s = padded.broadcast_strides(&scores);
            [s[0], s[1], s[2], s[3]]
        });
        let rope = att
            .append
            .as_ref()
            .map(|ap| RopeStep::new(ap.theta, 0, &ap.factors, &ins[0].shape, true));
        AttentionStep {
            rope,
            att: att.clone(),
            b: q[0],
            hq: q[1],
            hkv: k[1],
            sq: q[2],
            sk: k[2],
            d: q[3],
            dv,
            mask,
        }
    }

    pub fn scratch(&self) -> Scratch {
        Scratch {
            f: vec![0.0; self.b * self.hq * (self.sk + self.dv) + self.q_len()],
            q: Vec::new(),
        }
    }

    /// Elements of the rotated q kept in the scratch (none without append).
    fn q_len(&self) -> usize {
        if self.rope.is_some() {
            self.b * self.hq * self.sq * self.d
        } else {
            0
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        node: &str,
        args: &[usize],
        fixed: &[Option<Buf>],
        bufs: &[Buf],
        scr: &mut Scratch,
        dt: DType,
        out: &mut [f32],
    ) -> Result<(), CpuError> {
        let (q, k, v) = (
            val(fixed, bufs, args[0]).f(),
            val(fixed, bufs, args[1]).f(),
            val(fixed, bufs, args[2]).f(),
        );
        let mask = self.mask.map(|s| (val(fixed, bufs, args[3]), s));
        let heads_len = scr.f.len() - self.q_len();
        let (heads_scr, q_scr) = scr.f.split_at_mut(heads_len);
        let q = match &self.rope {
            Some(r) => {
                let positions = val(fixed, bufs, args[self.att.base_operands()]).i();
                r.run(q, Some(positions), dt, q_scr);
                &*q_scr
            }
            None => q,
        };
        // Valid keys per batch, checked as the interpreter checks them.
        let kv = if let Some(slot) = self.att.kv_len_slot() {
            let given = val(fixed, bufs, args[slot]).i();
            for b in 0..self.b {
                let v = given[if given.len() == 1 { 0 } else { b }];
                if usize::try_from(v).ok().filter(|&n| n <= self.sk).is_none() {
                    return Err(InterpError::KvLenOutOfRange {
                        node: node.to_string(),
                        kv_len: v,
                        keys: self.sk,
                    }
                    .into());
                }
            }
            Some(given)
        } else {
            None
        };
        if out.is_empty() {
            return Ok(());
        }
        let group = (self.hq / self.hkv.max(1)).max(1);
        let (sq, sk, d, dv) = (self.sq, self.sk, self.d, self.dv);
        let scale = self.att.scale as f32;
        out.par_chunks_mut(sq * dv)
            .zip(heads_scr.par_chunks_mut(sk + dv))
            .enumerate()
            .for_each(|(bh, (out_bh, tmp))| {
                let (bi, h) = (bh / self.hq, bh % self.hq);
                let kvh = h / group;
                let (valid, offset) = match kv {
                    Some(g) => {
                        let n = g[if g.len() == 1 { 0 } else { bi }] as usize;
                        (n, n as i64 - sq as i64)
                    }
                    None => (sk, self.att.causal_offset),
                };
                let (scores, acc) = tmp.split_at_mut(sk);
                let q_base = (bi * self.hq + h) * sq * d;
                let k_base = (bi * self.hkv + kvh) * sk * d;
                let v_base = (bi * self.hkv + kvh) * sk * dv;
                for i in 0..sq {
                    let qi = &q[q_base + i * d..][..d];
                    let mut max = f32::NEG_INFINITY;
                    for (j, s) in scores[..valid].iter_mut().enumerate() {
                        let kj = &k[k_base + j * d..][..d];
                        let mut x = dot(qi, kj) * scale;
                        if let Some((m, ms)) = &mask {
                            let mv = m.get(bi * ms[0] + h * ms[1] + i * ms[2] + j * ms[3]);
                            match self.att.mask {
                                MaskKind::Additive => x += mv,
                                MaskKind::Boolean if mv == 0.0 => x = f32::NEG_INFINITY,
                                MaskKind::Boolean | MaskKind::None => {}
                            }
                        }
                        if self.att.causal && (j as i128) > (i as i128) + i128::from(offset) {
                            x = f32::NEG_INFINITY;
                        }
                        *s = x;
                        max = max.max(x);
                    }
                    let oi = &mut out_bh[i * dv..][..dv];
                    if max == f32::NEG_INFINITY {
                        oi.fill(0.0);
                        continue;
                    }
                    acc.fill(0.0);
                    let mut sum = 0.0f32;
                    for (j, s) in scores[..valid].iter().enumerate() {
                        let p = (s - max).exp();
                        if p == 0.0 {
                            continue;
                        }
                        sum += p;
                        let vj = &v[v_base + j * dv..][..dv];
                        acc.iter_mut().zip(vj).for_each(|(a, &x)| *a += p * x);
                    }
                    let inv = 1.0 / sum;
                    oi.iter_mut()
                        .zip(acc.iter())
                        .for_each(|(o, a)| *o = round_float(dt, a * inv));
                }
            });
        Ok(())
    }
}

/// f32 dot product with 8 independent sums (so it vectorises).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut s = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            s[l] += x[l] * y[l];
        }
    }
    let mut t = (s[0] + s[4]) + (s[1] + s[5]) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (x, y) in ra.iter().zip(rb) {
        t += x * y;
    }
    t
}
