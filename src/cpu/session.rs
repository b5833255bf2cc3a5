//! A session of the fast CPU executor: every value's buffer, allocated once, and the states
//! across runs; a warm run walks the plan's steps over them.

use super::*;

/// The plan a session runs: borrowed, or shared with the session's owner.
pub(super) enum PlanRef<'p> {
    Borrowed(&'p CpuPlan),
    Shared(Arc<CpuPlan>),
}

impl std::ops::Deref for PlanRef<'_> {
    type Target = CpuPlan;
    fn deref(&self) -> &CpuPlan {
        match self {
            PlanRef::Borrowed(p) => p,
            PlanRef::Shared(p) => p,
        }
    }
}

/// One run's worth of buffers and the states across runs.
pub struct CpuSession<'p> {
    pub(super) plan: PlanRef<'p>,
    pub(super) bufs: Vec<Buf>,
    pub(super) scratch: Vec<Scratch>,
    /// Per step: total wall time and the running thread's CPU time, when
    /// `ROCMFORGE_CPU_PROFILE=1` (printed on drop).
    pub(super) profile: Option<Vec<(std::time::Duration, std::time::Duration)>>,
    pub(super) runs: usize,
}

/// Whether sessions time their steps (`ROCMFORGE_CPU_PROFILE=1`): read once per session.
pub(super) fn profiling() -> bool {
    std::env::var("ROCMFORGE_CPU_PROFILE").is_ok_and(|v| v == "1")
}

/// The calling thread's CPU time. On a shared machine wall time measures the other loads as
/// much as ours; with one worker thread (ROCMFORGE_THREADS=1) this is the step's own work.
fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID exists on Linux (on
    // failure `ts` stays zero and the profile shows no CPU time).
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

impl Drop for CpuSession<'_> {
    /// The profile, when one was taken: time per op family, largest first, so a decode
    /// token's time can be attributed without a profiler (the GPU's ROCMFORGE_BENCH_BREAKDOWN).
    fn drop(&mut self) {
        let Some(times) = &self.profile else {
            return;
        };
        if self.runs == 0 {
            return;
        }
        type Times = (std::time::Duration, std::time::Duration, usize);
        let mut fam: std::collections::BTreeMap<String, Times> = Default::default();
        for (step, (wall, cpu)) in self.plan.steps.iter().zip(times) {
            let e = fam.entry(step.family()).or_default();
            e.0 += *wall;
            e.1 += *cpu;
            e.2 += 1;
        }
        let total: std::time::Duration = times.iter().map(|t| t.0).sum();
        let total_cpu: std::time::Duration = times.iter().map(|t| t.1).sum();
        let mut rows: Vec<_> = fam.into_iter().collect();
        rows.sort_by_key(|r| std::cmp::Reverse(r.1 .0));
        let per = |d: std::time::Duration| d.as_secs_f64() * 1e3 / self.runs as f64;
        eprintln!(
            "ROCMFORGE_CPU_PROFILE {} ({} steps, {} runs, {} threads): {:.3} ms a run, \
             {:.3} ms CPU of the thread that ran the steps (all the work with 1 thread)",
            self.plan.name,
            self.plan.steps.len(),
            self.runs,
            self.plan.threads(),
            per(total),
            per(total_cpu)
        );
        for (name, (t, cpu, count)) in rows {
            eprintln!(
                "  {:>9.3} ms {:>5.1}% {:>9.3} ms CPU  {count:>4} x {name}",
                per(t),
                100.0 * t.as_secs_f64() / total.as_secs_f64().max(1e-12),
                per(cpu)
            );
        }
    }
}

impl CpuSession<'_> {
    /// Copies `t` into input `name` (its type checked against the graph's).
    pub fn set_input(&mut self, name: &str, t: &Tensor) -> Result<(), CpuError> {
        let &s = self
            .plan
            .inputs
            .get(name)
            .ok_or_else(|| CpuError::UnknownInput {
                name: name.to_string(),
            })?;
        let ty = &self.plan.types[s];
        if t.ty() != *ty {
            return Err(InterpError::BindingType {
                name: name.to_string(),
                expected: ty.clone(),
                got: t.ty(),
            }
            .into());
        }
        self.bufs[s].copy_from(t);
        Ok(())
    }

    /// Every input of `b` (weights in `b` are the plan's business, not the session's).
    pub fn set_inputs(&mut self, b: &Bindings) -> Result<(), CpuError> {
        for (name, t) in &b.inputs {
            self.set_input(name, t)?;
        }
        Ok(())
    }

    /// Sets state `name`'s value (as `run_with_state`'s `states`).
    pub fn set_state(&mut self, name: &str, t: &Tensor) -> Result<(), CpuError> {
        let &s = self
            .plan
            .states
            .get(name)
            .ok_or_else(|| InterpError::UnknownState {
                name: name.to_string(),
            })?;
        let ty = &self.plan.types[s];
        if t.ty() != *ty {
            return Err(InterpError::BindingType {
                name: name.to_string(),
                expected: ty.clone(),
                got: t.ty(),
            }
            .into());
        }
        self.bufs[s].copy_from(t);
        Ok(())
    }

    /// Exchanges state `name`'s buffer with `buf` (no copy): how sessions that share states
    /// (a prefill plan's and a decode plan's, on one KV cache) hand them over. `buf` must hold
    /// the state's type, else [`InterpError::BindingType`] and nothing moves.
    pub fn swap_state(&mut self, name: &str, buf: &mut Buf) -> Result<(), CpuError> {
        let &s = self
            .plan
            .states
            .get(name)
            .ok_or_else(|| InterpError::UnknownState {
                name: name.to_string(),
            })?;
        let ty = &self.plan.types[s];
        let fits = match buf {
            Buf::F(v) => ty.dtype.is_float() && v.len() == ty.shape.numel(),
            Buf::I(v) => !ty.dtype.is_float() && v.len() == ty.shape.numel(),
        };
        if !fits {
            return Err(CpuError::Host {
                node: name.to_string(),
                source: TensorError::Length {
                    shape: ty.shape.clone(),
                    expected: ty.shape.numel(),
                    got: buf.f().len().max(buf.i().len()),
                },
            });
        }
        std::mem::swap(&mut self.bufs[s], buf);
        Ok(())
    }

    /// State `name`'s current value (after a run: the next run's).
    pub fn state(&self, name: &str) -> Result<Tensor, CpuError> {
        let &s = self
            .plan
            .states
            .get(name)
            .ok_or_else(|| InterpError::UnknownState {
                name: name.to_string(),
            })?;
        self.bufs[s]
            .to_tensor(&self.plan.types[s])
            .map_err(|source| CpuError::Host {
                node: name.to_string(),
                source,
            })
    }

    /// Output `index` of the last run as a tensor (a copy).
    pub fn output(&self, index: usize) -> Result<Tensor, CpuError> {
        let &s = self.plan.outputs.get(index).ok_or(CpuError::NoOutput {
            index,
            count: self.plan.outputs.len(),
        })?;
        val(&self.plan.fixed, &self.bufs, s)
            .to_tensor(&self.plan.output_types[index])
            .map_err(|source| CpuError::Host {
                node: format!("output {index}"),
                source,
            })
    }

    /// Output `index` of the last run, borrowed (no copy).
    pub fn output_buf(&self, index: usize) -> Option<&Buf> {
        let &s = self.plan.outputs.get(index)?;
        Some(val(&self.plan.fixed, &self.bufs, s))
    }

    pub fn outputs(&self) -> Result<Vec<Tensor>, CpuError> {
        (0..self.plan.outputs.len())
            .map(|i| self.output(i))
            .collect()
    }

    /// Runs every step once, on the plan's thread pool.
    pub fn run(&mut self) -> Result<(), CpuError> {
        let CpuSession {
            plan,
            bufs,
            scratch,
            profile,
            runs,
        } = self;
        let plan: &CpuPlan = plan;
        *runs += 1;
        plan.pool.install(|| {
            match profile {
                None => {
                    for (step, scr) in plan.steps.iter().zip(scratch.iter_mut()) {
                        run_step(plan, step, bufs, scr)?;
                    }
                }
                Some(times) => {
                    for ((step, scr), t) in plan.steps.iter().zip(scratch.iter_mut()).zip(times) {
                        let (start, cpu) = (std::time::Instant::now(), thread_cpu_time());
                        run_step(plan, step, bufs, scr)?;
                        t.0 += start.elapsed();
                        t.1 += thread_cpu_time().saturating_sub(cpu);
                    }
                }
            }
            Ok(())
        })
    }
}

fn run_step(
    plan: &CpuPlan,
    step: &Step,
    bufs: &mut [Buf],
    scr: &mut Scratch,
) -> Result<(), CpuError> {
    let mut out = std::mem::take(&mut bufs[step.slot]);
    let result = run_into(plan, step, bufs, scr, &mut out);
    bufs[step.slot] = out;
    result
}

fn run_into(
    plan: &CpuPlan,
    step: &Step,
    bufs: &[Buf],
    scr: &mut Scratch,
    out: &mut Buf,
) -> Result<(), CpuError> {
    let arg = |i: usize| val(&plan.fixed, bufs, step.args[i]);
    let ty = &plan.types[step.slot];
    match &step.kind {
        Kind::Nothing => Ok(()),
        Kind::Elementwise(e) => {
            e.run(&step.args, &plan.fixed, bufs, out);
            Ok(())
        }
        Kind::Gemm(g) => {
            g.run(plan.kernel, &step.args, &plan.fixed, bufs, scr, out);
            Ok(())
        }
        Kind::Norm { eps, rms, d } => {
            let bias = if *rms { None } else { Some(arg(2).f()) };
            kernels::norm(
                arg(0).f(),
                arg(1).f(),
                bias,
                *eps,
                *rms,
                *d,
                ty.dtype,
                out_f(out),
            );
            Ok(())
        }
        Kind::Softmax { d } => {
            kernels::softmax(arg(0).f(), *d, ty.dtype, out_f(out));
            Ok(())
        }
        Kind::Rope(r) => {
            let pos = if step.args.len() > 1 {
                Some(arg(1).i())
            } else {
                None
            };
            r.run(arg(0).f(), pos, ty.dtype, out_f(out));
            Ok(())
        }
        Kind::Attention(a) => a.run(
            &step.node,
            &step.args,
            &plan.fixed,
            bufs,
            scr,
            ty.dtype,
            out_f(out),
        ),
        Kind::Gather { row, rows } => {
            kernels::gather(&step.node, arg(0).f(), arg(1).i(), *row, *rows, out_f(out))
        }
        Kind::Slice { start, len, from } => {
            // Blocks copied in order: a few hundred elements a block in the models' graphs.
            match (arg(0), out) {
                (Buf::F(x), Buf::F(o)) => slice_copy(x, o, *start, *len, *from),
                (Buf::I(x), Buf::I(o)) => slice_copy(x, o, *start, *len, *from),
                _ => unreachable!("a slice keeps its operand's kind (shape inference)"),
            }
            Ok(())
        }
        Kind::CacheWrite(w, rope) => {
            let start = arg(2).i()[0];
            match out {
                Buf::F(o) => match rope {
                    // Rotated into the step's scratch first (sized to the values when the plan
                    // was made), exactly as the rope step would rotate them.
                    Some(r) => {
                        let x = arg(1).f();
                        let rotated = &mut scr.f[..x.len()];
                        r.run(x, Some(arg(3).i()), ty.dtype, rotated);
                        w.write(&step.node, o, rotated, start)
                    }
                    None => w.write(&step.node, o, arg(1).f(), start),
                },
                // Integer values: inference gives a rope float values only, so there is none.
                Buf::I(o) => w.write(&step.node, o, arg(1).i(), start),
            }
        }
        Kind::PagedWrite(rows) => {
            let Buf::F(o) = out else {
                unreachable!("pools are float (shape inference)")
            };
            rows.write(&step.node, o, arg(1).f(), arg(2).i())
        }
        Kind::ArgMax { len, inner } => {
            let Buf::I(o) = out else {
                unreachable!("argmax gives i32")
            };
            kernels::argmax(arg(0), *len, *inner, o);
            Ok(())
        }
        Kind::Fallback(f) => {
            let mut b = Bindings::default();
            for (i, (n, t)) in f.names.iter().zip(&f.types).enumerate() {
                let t = arg(i).to_tensor(t).map_err(|source| CpuError::Host {
                    node: step.node.clone(),
                    source,
                })?;
                b.inputs.insert(n.clone(), t);
            }
            let r = interp::run(&f.graph, &b)?;
            out.copy_from(&r[0]);
            Ok(())
        }
    }
}

/// The sizes of a paged cache write (`Op::PagedCacheWrite`) on a pool of `capacity` rows.
#[derive(Clone, Debug)]
pub(crate) struct PagedRows {
    pub heads: usize,
    pub block_size: usize,
    pub d: usize,
    pub capacity: usize,
    /// New rows per sequence (the values' axis 2).
    pub new_rows: usize,
}

impl PagedRows {
    /// Writes `values` (`[B, heads, new_rows, d]`) into `pool` at `slots` (`[B, new_rows]`),
    /// as the interpreter does: negative slots skipped, every slot checked before any row is
    /// written, later rows winning.
    fn write(
        &self,
        node: &str,
        pool: &mut [f32],
        values: &[f32],
        slots: &[i64],
    ) -> Result<(), CpuError> {
        if let Some(&slot) = slots
            .iter()
            .find(|&&s| s >= 0 && s as usize >= self.capacity)
        {
            return Err(InterpError::PagedSlotOutOfRange {
                node: node.to_string(),
                slot,
                slots: self.capacity,
            }
            .into());
        }
        let (h, bs, d, s) = (self.heads, self.block_size, self.d, self.new_rows);
        for (r, &slot) in slots.iter().enumerate() {
            let Ok(slot) = usize::try_from(slot) else {
                continue;
            };
            let (bi, si) = (r / s, r % s);
            let (block, row) = (slot / bs, slot % bs);
            for head in 0..h {
                let dst = ((block * h + head) * bs + row) * d;
                let from = ((bi * h + head) * s + si) * d;
                pool[dst..dst + d].copy_from_slice(&values[from..from + d]);
            }
        }
        Ok(())
    }
}

/// Per block of `from` elements of `x`, its `len` elements from `start`, one after the other.
fn slice_copy<T: Copy>(x: &[T], out: &mut [T], start: usize, len: usize, from: usize) {
    if len == 0 {
        return;
    }
    for (o, blk) in out.chunks_exact_mut(len).zip(x.chunks_exact(from)) {
        o.copy_from_slice(&blk[start..start + len]);
    }
}

fn out_f(out: &mut Buf) -> &mut [f32] {
    match out {
        Buf::F(v) => v,
        Buf::I(_) => unreachable!("a float op's buffer is float"),
    }
}
