//! A fast CPU device for the *fused* graph (what `passes` produce, the plan the GPUs run).
//!
//! Entry API (what `compile` builds sessions and `Device::best()` on):
//! ```text
//! let plan = CpuPlan::new(&fused, &weights, CpuOptions::default())?;   // once per model
//! let mut s = plan.session()?;                                         // buffers, states
//! s.set_input("x", &tensor)?; s.run()?; let y = s.output(0)?;          // per step
//! ```
//! * [`CpuPlan`] holds the steps (one per node, in topological order), the weights (dense f32,
//!   or the blocks of quantized ones) and a rayon pool of an explicit thread count.
//! * [`CpuSession`] holds every value's buffer, allocated once; a warm [`CpuSession::run`]
//!   allocates nothing except in the nodes that run on the interpreter (listed in
//!   [`CpuPlan::fallbacks`]). States live in the session with the interpreter's
//!   `run_with_state` semantics: zeros at first, each cache write gives the next run's value
//!   (written in place: validation guarantees the state has no other reader).
//!
//! Which ops have a kernel here and which run on the interpreter is decided per op in
//! [`CpuPlan::new`]'s exhaustive match: layout ops other than reshape and slice, reductions,
//! concat, permute, expand and unfused matmuls run on the interpreter (the fused graphs of the
//! models have few, and none on a hot path).

mod attention;
mod expr;
mod fastmath;
mod gemm;
mod kernels;
mod packed;
pub mod quant;
mod session;

use std::collections::HashMap;
use std::sync::Arc;

use rayon::ThreadPool;
use thiserror::Error;

use crate::interp::{self, Bindings, InterpError};
use crate::ir::{
    normalize_axis, random_quant, random_weight, Expr, Graph, GraphError, NodeId, NodeMap, Op,
    QuantError, QuantScheme, QuantTensor, Tensor, TensorError, TensorType, UnaryOp,
};

pub use expr::Program;
pub use quant::Kernel;
pub use session::CpuSession;
use session::PlanRef;

#[derive(Debug, Error)]
pub enum CpuError {
    /// What the interpreter reports for the same condition (bindings, indices, cache
    /// windows, kv_len), so both devices fail alike.
    #[error(transparent)]
    Interp(#[from] InterpError),
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error("node `{node}`: {source}")]
    Host {
        node: String,
        #[source]
        source: TensorError,
    },
    #[error("`{name}` is not an input of the graph")]
    UnknownInput { name: String },
    #[error("output {index} does not exist (the graph has {count})")]
    NoOutput { index: usize, count: usize },
    #[error("cannot build the thread pool of {threads} threads: {reason}")]
    Pool { threads: usize, reason: String },
    #[error("the {kernel} kernel needs CPU features this machine lacks")]
    Kernel { kernel: &'static str },
    #[error("node `{node}`: the interpreter fallback could not be built: {reason}")]
    Fallback { node: String, reason: String },
}

/// How products with quantized weights are computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// Quantized weights are dequantized once, when the plan is made (as the interpreter
    /// does every run), and multiplied in f32: results agree with the interpreter to f32
    /// rounding.
    Exact,
    /// Activations are quantized to 8 bits per block of 32 and multiplied with the weight
    /// blocks in integers (llama.cpp's scheme): the fast decode path. Its error against the
    /// f32 product is that of 8-bit activations (about 1e-3 relative).
    Q8Activations,
}

#[derive(Clone, Copy, Debug)]
pub struct CpuOptions {
    /// Worker threads. The default is the number of physical cores: the kernels are bound by
    /// memory bandwidth and SIMD units, which hyper-threads share, so a second thread per core
    /// adds contention rather than speed.
    pub threads: usize,
    pub precision: Precision,
}

impl Default for CpuOptions {
    fn default() -> CpuOptions {
        CpuOptions {
            threads: physical_cores(),
            precision: Precision::Q8Activations,
        }
    }
}

/// Physical cores: distinct (package, core) pairs in `/proc/cpuinfo`, else the logical count
/// (`std::thread::available_parallelism`).
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return logical;
    };
    let mut cores = std::collections::BTreeSet::new();
    let (mut package, mut core) = (None, None);
    for line in info.lines() {
        let mut kv = line.splitn(2, ':').map(str::trim);
        match (kv.next(), kv.next()) {
            (Some("physical id"), Some(v)) => package = Some(v.to_string()),
            (Some("core id"), Some(v)) => core = Some(v.to_string()),
            (Some(""), _) | (None, _) => {
                if let (Some(p), Some(c)) = (package.take(), core.take()) {
                    cores.insert((p, c));
                }
            }
            _ => {}
        }
    }
    if let (Some(p), Some(c)) = (package, core) {
        cores.insert((p, c));
    }
    if cores.is_empty() {
        logical
    } else {
        cores.len().min(logical)
    }
}

/// A value's storage: floats as f32 rounded to their dtype, integers and bools as i64 (the
/// interpreter's `Tensor` representation, so conversions at the edges are copies).
#[derive(Clone, Debug, PartialEq)]
pub enum Buf {
    F(FVec),
    I(Vec<i64>),
}

/// A slot's float values: its own (intermediates, states, outputs), or shared with the tensor
/// they came from (a fixed weight: every plan of one set of weights reads the same values, so a
/// 1B-parameter f32 model is held once, not once per plan). Copy on write: a shared slot
/// written is first copied; fixed slots are never written.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FVec(Arc<Vec<f32>>);

impl From<Vec<f32>> for FVec {
    fn from(v: Vec<f32>) -> FVec {
        FVec(Arc::new(v))
    }
}

impl std::ops::Deref for FVec {
    type Target = Vec<f32>;
    fn deref(&self) -> &Vec<f32> {
        &self.0
    }
}

impl std::ops::DerefMut for FVec {
    fn deref_mut(&mut self) -> &mut Vec<f32> {
        Arc::make_mut(&mut self.0)
    }
}

impl Default for Buf {
    /// An empty placeholder (a slot taken out while its step runs, a fixed slot's session
    /// buffer) that allocates nothing: an empty `FVec` would allocate its `Arc`.
    fn default() -> Buf {
        Buf::I(Vec::new())
    }
}

impl Buf {
    /// Zeros of `ty` (a state's value before any write).
    pub fn zeros(ty: &TensorType) -> Buf {
        let n = ty.shape.numel();
        if ty.dtype.is_float() {
            Buf::F(vec![0.0; n].into())
        } else {
            Buf::I(vec![0; n])
        }
    }

    fn from_tensor(t: &Tensor) -> Buf {
        match t.data() {
            // Shared, not copied (see `FVec`).
            crate::ir::Data::Float(v) => Buf::F(FVec(v.clone())),
            crate::ir::Data::Int(v) => Buf::I(v.clone()),
        }
    }

    pub fn to_tensor(&self, ty: &TensorType) -> Result<Tensor, TensorError> {
        match self {
            Buf::F(v) => Tensor::from_f32(ty.dtype, ty.shape.clone(), v.to_vec()),
            Buf::I(v) => Tensor::from_i64(ty.dtype, ty.shape.clone(), v.clone()),
        }
    }

    /// Overwrites the values with `t`'s (same length and kind, checked by the caller's type
    /// check), without allocating.
    fn copy_from(&mut self, t: &Tensor) {
        match (self, t.data()) {
            (Buf::F(d), crate::ir::Data::Float(s)) => d.copy_from_slice(s),
            (Buf::I(d), crate::ir::Data::Int(s)) => d.copy_from_slice(s),
            (d, _) => *d = Buf::from_tensor(t),
        }
    }

    pub fn f(&self) -> &[f32] {
        match self {
            Buf::F(v) => v,
            Buf::I(_) => &[],
        }
    }

    pub fn i(&self) -> &[i64] {
        match self {
            Buf::I(v) => v,
            Buf::F(_) => &[],
        }
    }

    /// Element `i` as f32 (bools and small integers exactly).
    fn get(&self, i: usize) -> f32 {
        match self {
            Buf::F(v) => v[i],
            Buf::I(v) => v[i] as f32,
        }
    }
}

/// A node that runs on the interpreter: a one-node graph over inputs `$0…`.
struct Fallback {
    /// The op's name (in profiles).
    op: &'static str,
    graph: Graph,
    names: Vec<String>,
    types: Vec<TensorType>,
}

enum Kind {
    /// Sources (inputs, states, weights, constants) and aliases (reshape): no work.
    Nothing,
    Elementwise(Box<kernels::Elementwise>),
    Gemm(Box<gemm::GemmStep>),
    Norm {
        eps: f64,
        rms: bool,
        d: usize,
    },
    Softmax {
        d: usize,
    },
    Rope(Box<attention::RopeStep>),
    Attention(Box<attention::AttentionStep>),
    Gather {
        row: usize,
        rows: usize,
    },
    /// Per index of the axes before the sliced one, a contiguous block of `len` elements at
    /// `start` within a block of `from` (the decode step splits its merged QKV product so).
    Slice {
        start: usize,
        len: usize,
        from: usize,
    },
    /// In place; with a folded rope (at the positions of operand 3), the values rotated first.
    CacheWrite(kernels::Window, Option<Box<attention::RopeStep>>),
    /// In place: a paged pool's rows written at the slots of operand 2 (`Op::PagedCacheWrite`).
    PagedWrite(session::PagedRows),
    ArgMax {
        len: usize,
        inner: usize,
    },
    Fallback(Box<Fallback>),
}

struct Step {
    node: String,
    slot: usize,
    args: Vec<usize>,
    kind: Kind,
}

impl Step {
    /// The op family a profile groups this step under (GEMMs by path and shape).
    fn family(&self) -> String {
        match &self.kind {
            Kind::Nothing => "nothing".into(),
            Kind::Elementwise(_) => "elementwise".into(),
            Kind::Gemm(g) => g.family(),
            Kind::Norm { .. } => "norm".into(),
            Kind::Softmax { .. } => "softmax".into(),
            Kind::Rope(_) => "rope".into(),
            Kind::Attention(_) => "attention".into(),
            Kind::Gather { .. } => "gather".into(),
            Kind::Slice { .. } => "slice".into(),
            Kind::CacheWrite(..) => "cache_write".into(),
            Kind::PagedWrite(_) => "paged_cache_write".into(),
            Kind::ArgMax { .. } => "argmax".into(),
            Kind::Fallback(f) => format!("interp fallback {}", f.op),
        }
    }
}

/// The compiled form of a fused graph for the CPU: immutable, shareable across sessions.
pub struct CpuPlan {
    /// The graph's name (in profiles).
    name: String,
    steps: Vec<Step>,
    types: Vec<TensorType>,
    /// Values fixed for the plan's life: weights, constants, causal masks.
    fixed: Vec<Option<Buf>>,
    /// Quantized weights kept as blocks (read by Q8 GEMV steps).
    quant: Vec<Option<QuantTensor>>,
    inputs: HashMap<String, usize>,
    states: HashMap<String, usize>,
    outputs: Vec<usize>,
    /// Each output's own type (a reshape shares its operand's slot, not its shape).
    output_types: Vec<TensorType>,
    pool: Arc<ThreadPool>,
    kernel: Kernel,
    options: CpuOptions,
}

/// Why the buffer of slot `s` in `bufs` is read from the plan instead.
fn val<'a>(fixed: &'a [Option<Buf>], bufs: &'a [Buf], s: usize) -> &'a Buf {
    fixed[s].as_ref().unwrap_or(&bufs[s])
}

impl CpuPlan {
    /// Plans `fused` (any graph; normally the output of `passes::optimize`). Weights come from
    /// `weights.weights` / `weights.quantized`, or are drawn from `weights.seed` as the
    /// interpreter draws them; `weights.inputs` is not read (inputs are set per run).
    pub fn new(
        fused: &Graph,
        weights: &Bindings,
        options: CpuOptions,
    ) -> Result<CpuPlan, CpuError> {
        fused.validate()?;
        fused.check_state_writes()?;
        let threads = options.threads.max(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| CpuError::Pool {
                threads,
                reason: e.to_string(),
            })?;
        // Every worker takes a job once now: a thread's first steal registers it with
        // crossbeam's epoch GC (an allocation), which a warm run must not be the one to do when
        // the cold run happened to keep a worker idle (small steps run serially).
        pool.broadcast(|_| ());
        let order = fused.topo_order()?;
        let mut slot_of: NodeMap<usize> = NodeMap::default();
        let mut plan = CpuPlan {
            name: fused.name.clone(),
            steps: Vec::new(),
            types: Vec::new(),
            fixed: Vec::new(),
            quant: Vec::new(),
            inputs: HashMap::new(),
            states: HashMap::new(),
            outputs: Vec::new(),
            output_types: Vec::new(),
            pool: Arc::new(pool),
            kernel: Kernel::detect(),
            options: CpuOptions { threads, ..options },
        };
        // Quantized weights only Q8 GEMV steps read need no dense copy.
        let q8 = options.precision == Precision::Q8Activations;
        for id in order {
            let node = fused.node(id);
            let ops: Vec<NodeId> = fused.operands(id);
            let args: Vec<usize> = ops.iter().map(|o| slot_of[o]).collect();
            let arg_ty: Vec<&TensorType> = ops.iter().map(|o| fused.ty(*o)).collect();
            let host = |source| CpuError::Host {
                node: node.name.clone(),
                source,
            };
            crate::ir::check_host_size(&node.ty).map_err(host)?;
            let ty = &node.ty;
            let axis = |a: i64| normalize_axis(a, arg_ty[0].shape.rank()).unwrap_or(0);
            let new_slot = |plan: &mut CpuPlan, fixed: Option<Buf>| {
                plan.types.push(ty.clone());
                plan.fixed.push(fixed);
                plan.quant.push(None);
                plan.types.len() - 1
            };
            let fallback = |plan: &mut CpuPlan| -> Result<Kind, CpuError> {
                let _ = plan;
                Ok(Kind::Fallback(Box::new(build_fallback(
                    &node.name, &node.op, &arg_ty,
                )?)))
            };
            let elementwise = |expr: Expr| -> Option<Kind> {
                let p = Program::compile(&expr, &arg_ty)?;
                Some(Kind::Elementwise(Box::new(kernels::Elementwise::new(
                    p, &arg_ty, ty,
                ))))
            };
            // Each op's choice: a kernel here, or the interpreter (with why).
            let (slot, kind) = match &node.op {
                Op::Input { .. } => {
                    let s = new_slot(&mut plan, None);
                    plan.inputs.insert(node.name.clone(), s);
                    (s, Kind::Nothing)
                }
                Op::State { .. } => {
                    let s = new_slot(&mut plan, None);
                    plan.states.insert(node.name.clone(), s);
                    (s, Kind::Nothing)
                }
                Op::Weight {
                    quant: Some(scheme),
                    ..
                } => {
                    let q = quantized(&node.name, *scheme, ty, weights)?;
                    // A dense copy unless every reader is a GEMV that reads the blocks.
                    // Only the schemes the integer dot products read stay in blocks.
                    let int = q8 && quant::IntScheme::of(*scheme).is_some();
                    let blocks_only = int
                        && fused
                            .consumers(id)
                            .iter()
                            .all(|c| gemm::reads_blocks(fused, *c, id));
                    let dense = if blocks_only {
                        None
                    } else {
                        let t =
                            q.to_tensor(ty.dtype)
                                .map_err(|source| InterpError::QuantBinding {
                                    name: node.name.clone(),
                                    source,
                                })?;
                        Some(Buf::from_tensor(&t))
                    };
                    let s = new_slot(&mut plan, dense.or(Some(Buf::F(FVec::default()))));
                    if int {
                        plan.quant[s] = Some(q);
                    }
                    (s, Kind::Nothing)
                }
                Op::Weight { init, .. } => {
                    let t = dense_weight(&node.name, ty, init, weights)?;
                    (
                        new_slot(&mut plan, Some(Buf::from_tensor(&t))),
                        Kind::Nothing,
                    )
                }
                Op::Constant { values, .. } => {
                    let t = Tensor::constant(ty, values).map_err(host)?;
                    (
                        new_slot(&mut plan, Some(Buf::from_tensor(&t))),
                        Kind::Nothing,
                    )
                }
                Op::CausalMask { .. } => {
                    // Computed once: it depends on attributes only.
                    let mut g = Graph::new("mask");
                    let m = g.add_op(node.op.clone(), &[])?;
                    g.add_output(m)?;
                    let t = interp::run(&g, &Bindings::default())?.remove(0);
                    (
                        new_slot(&mut plan, Some(Buf::from_tensor(&t))),
                        Kind::Nothing,
                    )
                }
                // Row-major data is unchanged by a reshape: the value is its operand's buffer.
                Op::Reshape { .. } => (args[0], Kind::Nothing),
                // Rare in fused graphs and never on a hot path: the interpreter's.
                Op::Permute { .. }
                | Op::Expand { .. }
                | Op::Concat { .. }
                | Op::Reduce { .. }
                | Op::MatMul => (new_slot(&mut plan, None), fallback(&mut plan)?),
                Op::Slice {
                    axis: a,
                    start,
                    end,
                } => {
                    let dims = arg_ty[0].shape.dims();
                    let ax = axis(*a);
                    let inner: usize = dims[ax + 1..].iter().product();
                    let k = match crate::ir::slice_bounds(*start, *end, dims[ax]) {
                        Ok((s, e)) => Kind::Slice {
                            start: s * inner,
                            len: (e - s) * inner,
                            from: dims[ax] * inner,
                        },
                        // Shape inference accepted the bounds; the interpreter reports any
                        // disagreement as it would.
                        Err(_) => fallback(&mut plan)?,
                    };
                    (new_slot(&mut plan, None), k)
                }
                Op::Gather => {
                    let tdims = arg_ty[0].shape.dims();
                    let row: usize = tdims[1..].iter().product();
                    let k = if arg_ty[0].dtype.is_float() && !arg_ty[1].dtype.is_float() {
                        Kind::Gather {
                            row,
                            rows: tdims[0],
                        }
                    } else {
                        fallback(&mut plan)?
                    };
                    (new_slot(&mut plan, None), k)
                }
                Op::Binary(b) => {
                    let e = Expr::Binary(*b, Box::new(Expr::Input(0)), Box::new(Expr::Input(1)));
                    let k = match elementwise(e) {
                        Some(k) => k,
                        None => fallback(&mut plan)?,
                    };
                    (new_slot(&mut plan, None), k)
                }
                Op::Where => {
                    let e = Expr::Where(
                        Box::new(Expr::Input(0)),
                        Box::new(Expr::Input(1)),
                        Box::new(Expr::Input(2)),
                    );
                    let k = match elementwise(e) {
                        Some(k) => k,
                        None => fallback(&mut plan)?,
                    };
                    (new_slot(&mut plan, None), k)
                }
                Op::Unary(u) => {
                    let k = match elementwise(unary_expr(*u)) {
                        Some(k) => k,
                        None => fallback(&mut plan)?,
                    };
                    (new_slot(&mut plan, None), k)
                }
                Op::Cast { to } => {
                    let k = match elementwise(Expr::Cast(*to, Box::new(Expr::Input(0)))) {
                        Some(k) => k,
                        None => fallback(&mut plan)?,
                    };
                    (new_slot(&mut plan, None), k)
                }
                Op::FusedElementwise(e) => {
                    let k = match elementwise(e.clone()) {
                        Some(k) => k,
                        None => fallback(&mut plan)?,
                    };
                    (new_slot(&mut plan, None), k)
                }
                Op::Softmax { axis: a } => {
                    let rank = arg_ty[0].shape.rank();
                    let k = if axis(*a) + 1 == rank {
                        Kind::Softmax {
                            d: arg_ty[0].shape.dims()[rank - 1],
                        }
                    } else {
                        fallback(&mut plan)?
                    };
                    (new_slot(&mut plan, None), k)
                }
                Op::LayerNorm { eps } | Op::RmsNorm { eps } => {
                    let d = arg_ty[0].shape.dims().last().copied().unwrap_or(1);
                    let rms = matches!(node.op, Op::RmsNorm { .. });
                    (new_slot(&mut plan, None), Kind::Norm { eps: *eps, rms, d })
                }
                Op::Rope {
                    theta,
                    offset,
                    factors,
                } => {
                    let k = Kind::Rope(Box::new(attention::RopeStep::new(
                        *theta,
                        *offset,
                        factors,
                        &arg_ty[0].shape,
                        args.len() > 1,
                    )));
                    (new_slot(&mut plan, None), k)
                }
                Op::FlashAttention(att) => {
                    let k = Kind::Attention(Box::new(attention::AttentionStep::new(att, &arg_ty)));
                    (new_slot(&mut plan, None), k)
                }
                Op::Gemm(g) => {
                    let quant_b = if q8 {
                        plan.quant[args[1]]
                            .clone()
                            .filter(|_| gemm::reads_blocks(fused, id, ops[1]))
                    } else {
                        None
                    };
                    // An epilogue over integer values has no program: the interpreter's.
                    let k = if gemm::GemmStep::compilable(g, &arg_ty) {
                        let b_fixed = plan.fixed[args[1]].as_ref();
                        let step = gemm::GemmStep::new(g, &arg_ty, ty, quant_b, b_fixed, threads);
                        Kind::Gemm(Box::new(step))
                    } else {
                        fallback(&mut plan)?
                    };
                    (new_slot(&mut plan, None), k)
                }
                Op::CacheWrite { axis: a, rope } => {
                    // In place: the value is the state's buffer.
                    let w = kernels::Window::new(&arg_ty[0].shape, &arg_ty[1].shape, axis(*a));
                    let r = rope.map(|theta| {
                        Box::new(attention::RopeStep::new(
                            theta,
                            0,
                            &[],
                            &arg_ty[1].shape,
                            true,
                        ))
                    });
                    (args[0], Kind::CacheWrite(w, r))
                }
                Op::PagedCacheWrite => {
                    // In place, as a cache write: the value is the pool's buffer.
                    let p = arg_ty[0].shape.dims();
                    let rows = session::PagedRows {
                        heads: p[1],
                        block_size: p[2],
                        d: p[3],
                        capacity: p[0] * p[2],
                        new_rows: arg_ty[1].shape.dims()[2],
                    };
                    (args[0], Kind::PagedWrite(rows))
                }
                // The interpreter's, which reads through the block tables.
                Op::PagedAttention { .. } => (new_slot(&mut plan, None), fallback(&mut plan)?),
                Op::ArgMax { axis: a } => {
                    let dims = arg_ty[0].shape.dims();
                    let ax = axis(*a);
                    let k = Kind::ArgMax {
                        len: dims[ax],
                        inner: dims[ax + 1..].iter().product(),
                    };
                    (new_slot(&mut plan, None), k)
                }
            };
            slot_of.insert(id, slot);
            if !matches!(kind, Kind::Nothing) {
                plan.steps.push(Step {
                    node: node.name.clone(),
                    slot,
                    args,
                    kind,
                });
            }
        }
        plan.outputs = fused.outputs().iter().map(|o| slot_of[o]).collect();
        plan.output_types = fused
            .outputs()
            .iter()
            .map(|o| fused.ty(*o).clone())
            .collect();
        Ok(plan)
    }

    /// The nodes that run on the interpreter, with their op names.
    pub fn fallbacks(&self) -> Vec<String> {
        self.steps
            .iter()
            .filter(|s| matches!(s.kind, Kind::Fallback(_)))
            .map(|s| s.node.clone())
            .collect()
    }

    /// Each step's op family, as a profile names it (a GEMM by its path and shape, e.g.
    /// `gemm Q4K 1x37x256`: the integer dot products on a scheme's blocks, or `gemm f32`).
    pub fn step_families(&self) -> Vec<String> {
        self.steps.iter().map(|s| s.family()).collect()
    }

    pub fn threads(&self) -> usize {
        self.options.threads
    }

    /// The quantized dot-product kernel this CPU runs.
    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// Runs the quantized products with `kernel` instead of the detected one (tests and
    /// comparisons of the SIMD paths on one machine); refused when the CPU lacks its features.
    pub fn set_kernel(&mut self, kernel: Kernel) -> Result<(), CpuError> {
        if !kernel.supported() {
            return Err(CpuError::Kernel {
                kernel: kernel.name(),
            });
        }
        self.kernel = kernel;
        Ok(())
    }

    /// A session: every buffer allocated now, states zeroed.
    pub fn session(&self) -> Result<CpuSession<'_>, CpuError> {
        self.session_of(PlanRef::Borrowed(self))
    }

    /// A session that keeps the plan alive (`'static`: a session can own it with its plan).
    pub fn shared_session(self: &Arc<Self>) -> Result<CpuSession<'static>, CpuError> {
        self.session_of(PlanRef::Shared(self.clone()))
    }

    /// The type of state `name`, if the graph has one by that name.
    pub fn state_type(&self, name: &str) -> Option<&TensorType> {
        self.states.get(name).map(|&s| &self.types[s])
    }

    /// Whether the fused graph still reads input `name` (the passes may remove one).
    pub fn has_input(&self, name: &str) -> bool {
        self.inputs.contains_key(name)
    }

    pub fn precision(&self) -> Precision {
        self.options.precision
    }

    fn session_of<'p>(&self, plan: PlanRef<'p>) -> Result<CpuSession<'p>, CpuError> {
        let bufs = self
            .types
            .iter()
            .zip(&self.fixed)
            .map(|(ty, f)| {
                if f.is_some() {
                    Buf::default()
                } else {
                    Buf::zeros(ty)
                }
            })
            .collect();
        let scratch = self
            .steps
            .iter()
            .map(|s| match &s.kind {
                Kind::Gemm(g) => g.scratch(),
                Kind::Attention(a) => a.scratch(),
                // The rotated values of a folded rope, before they are written.
                Kind::CacheWrite(w, Some(_)) => Scratch {
                    f: vec![0.0; w.values_len()],
                    q: Vec::new(),
                },
                Kind::Nothing
                | Kind::Elementwise(_)
                | Kind::Norm { .. }
                | Kind::Softmax { .. }
                | Kind::Rope(_)
                | Kind::Gather { .. }
                | Kind::Slice { .. }
                | Kind::CacheWrite(_, None)
                | Kind::PagedWrite(_)
                | Kind::ArgMax { .. }
                | Kind::Fallback(_) => Scratch::default(),
            })
            .collect();
        Ok(CpuSession {
            profile: session::profiling().then(|| vec![Default::default(); self.steps.len()]),
            runs: 0,
            plan,
            bufs,
            scratch,
        })
    }
}

/// Per-step working memory, allocated with the session.
#[derive(Default)]
pub(crate) struct Scratch {
    pub f: Vec<f32>,
    pub q: Vec<quant::Q8Block>,
}

fn unary_expr(u: UnaryOp) -> Expr {
    Expr::Unary(u, Box::new(Expr::Input(0)))
}

fn dense_weight(
    name: &str,
    ty: &TensorType,
    init: &crate::ir::Init,
    w: &Bindings,
) -> Result<Tensor, CpuError> {
    if let Some(q) = w.quantized.get(name) {
        return Err(InterpError::QuantBinding {
            name: name.to_string(),
            source: QuantError::Mismatch {
                expected: format!("dense {ty}"),
                got: q.describe(),
            },
        }
        .into());
    }
    match w.weights.get(name) {
        Some(t) if t.ty() == *ty => Ok(t.clone()),
        Some(t) => Err(InterpError::BindingType {
            name: name.to_string(),
            expected: ty.clone(),
            got: t.ty(),
        }
        .into()),
        None => random_weight(name, ty, init, w.seed).map_err(|source| CpuError::Host {
            node: name.to_string(),
            source,
        }),
    }
}

fn quantized(
    name: &str,
    scheme: QuantScheme,
    ty: &TensorType,
    w: &Bindings,
) -> Result<QuantTensor, CpuError> {
    let err = |source| InterpError::QuantBinding {
        name: name.to_string(),
        source,
    };
    if let Some(t) = w.weights.get(name) {
        return Err(err(QuantError::Mismatch {
            expected: format!("{scheme}{}", ty.shape),
            got: format!("dense {}", t.ty()),
        })
        .into());
    }
    let q = match w.quantized.get(name) {
        Some(q) => q.clone(),
        None => random_quant(name, scheme, &ty.shape, w.seed).map_err(err)?,
    };
    q.check(scheme, &ty.shape).map_err(err)?;
    Ok(q)
}

fn build_fallback(name: &str, op: &Op, tys: &[&TensorType]) -> Result<Fallback, CpuError> {
    let why = |e: GraphError| CpuError::Fallback {
        node: name.to_string(),
        reason: e.to_string(),
    };
    let mut g = Graph::new("fallback");
    let mut ids = Vec::new();
    let mut names = Vec::new();
    for (i, t) in tys.iter().enumerate() {
        let n = format!("in{i}");
        ids.push(g.input(&n, t.dtype, t.shape.dims()).map_err(why)?);
        names.push(n);
    }
    let out = g.add_op(op.clone(), &ids).map_err(why)?;
    g.add_output(out).map_err(why)?;
    Ok(Fallback {
        op: op.name(),
        graph: g,
        names,
        types: tys.iter().map(|t| (*t).clone()).collect(),
    })
}
