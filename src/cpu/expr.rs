//! Elementwise expressions compiled once into a flat register program and evaluated a chunk of
//! [`CHUNK`] elements at a time, so a run allocates nothing: the registers live on the stack.
//!
//! Every register holds f32 values; bools are 0/1 (exactly what `ir::scalar` gives a
//! comparison), and each op rounds to its own dtype as `ir::scalar` does, so a compiled program
//! computes the interpreter's bits for the same expression — except f32 exp, sigmoid, SiLU and
//! GELU, which take [`super::fastmath`]'s vectorised forms (within a few ulp; a call per
//! element cost more than the GEMM it followed). Integer values (i32, i64) are not
//! held exactly by f32: an expression that touches one is not compiled ([`Program::compile`]
//! returns `None`) and its node runs on the interpreter instead.

use crate::ir::scalar::{binary_f32, round_float, unary_f32};
use crate::ir::{BinaryOp, DType, Expr, TensorType, UnaryOp};

/// Elements evaluated per pass over the program.
pub const CHUNK: usize = 64;
/// The most registers a compiled program may use (operands, constants and op results).
pub const MAX_REGS: usize = 160;

#[derive(Clone, Debug)]
enum Instr {
    /// Register ← operand `i`'s chunk.
    Load(usize),
    Const(f32),
    Unary(UnaryOp, DType, usize),
    Binary(BinaryOp, DType, usize, usize),
    Where(usize, usize, usize),
    /// To a float dtype (rounding) or to bool (non-zero).
    Cast(DType, usize),
}

/// A compiled expression: instructions in evaluation order, register `i` written by
/// instruction `i`; the last register is the result.
#[derive(Clone, Debug)]
pub struct Program {
    instrs: Vec<Instr>,
    /// Whether operand `i` is read by the program at all.
    pub inputs: usize,
}

fn held(dt: DType) -> bool {
    match dt {
        DType::F32 | DType::F16 | DType::BF16 | DType::Bool => true,
        DType::I32 | DType::I64 => false,
    }
}

impl Program {
    /// Compiles `expr` over operands of types `ins`, or `None` when a value is an integer or
    /// the program would need more than [`MAX_REGS`] registers.
    pub fn compile(expr: &Expr, ins: &[&TensorType]) -> Option<Program> {
        let mut p = Program {
            instrs: Vec::new(),
            inputs: ins.len(),
        };
        p.emit(expr, ins)?;
        (p.instrs.len() <= MAX_REGS).then_some(p)
    }

    /// Emits `e` and returns its register. Recursion is bounded by `ir::expr::MAX_OPS`.
    fn emit(&mut self, e: &Expr, ins: &[&TensorType]) -> Option<usize> {
        let ty = e.ty(ins).ok()?;
        if !held(ty.dtype) {
            return None;
        }
        let instr = match e {
            Expr::Input(i) => Instr::Load(*i),
            Expr::Const(v, _) => Instr::Const(*v as f32),
            Expr::Unary(op, a) => Instr::Unary(*op, ty.dtype, self.emit(a, ins)?),
            Expr::Binary(op, a, b) => {
                let (a, b) = (self.emit(a, ins)?, self.emit(b, ins)?);
                Instr::Binary(*op, ty.dtype, a, b)
            }
            Expr::Where(c, a, b) => {
                let (c, a, b) = (self.emit(c, ins)?, self.emit(a, ins)?, self.emit(b, ins)?);
                Instr::Where(c, a, b)
            }
            Expr::Cast(to, a) => Instr::Cast(*to, self.emit(a, ins)?),
        };
        if self.instrs.len() >= MAX_REGS {
            return None;
        }
        self.instrs.push(instr);
        Some(self.instrs.len() - 1)
    }

    /// Evaluates `n ≤ CHUNK` elements: `inputs[i][..n]` is operand `i`, the result goes to
    /// `out[..n]`.
    pub fn eval(&self, regs: &mut Regs, inputs: &[[f32; CHUNK]], n: usize, out: &mut [f32]) {
        let regs = &mut regs.0;
        for (r, instr) in self.instrs.iter().enumerate() {
            let (done, rest) = regs.split_at_mut(r);
            let dst = &mut rest[0][..n];
            match *instr {
                Instr::Load(i) => dst.copy_from_slice(&inputs[i][..n]),
                Instr::Const(v) => dst.fill(v),
                Instr::Unary(op, dt, a) => unary_chunk(op, dt, &done[a][..n], dst),
                Instr::Binary(op, dt, a, b) => {
                    let (xa, xb) = (&done[a][..n], &done[b][..n]);
                    binary_chunk(op, dt, xa, xb, dst);
                }
                Instr::Where(c, a, b) => {
                    for i in 0..n {
                        dst[i] = if done[c][i] != 0.0 {
                            done[a][i]
                        } else {
                            done[b][i]
                        };
                    }
                }
                Instr::Cast(to, a) => {
                    for (d, &x) in dst.iter_mut().zip(&done[a][..n]) {
                        *d = match to {
                            DType::Bool => f32::from(u8::from(x != 0.0)),
                            DType::F32 | DType::F16 | DType::BF16 | DType::I32 | DType::I64 => {
                                round_float(to, x)
                            }
                        };
                    }
                }
            }
        }
        let last = self.instrs.len() - 1;
        out[..n].copy_from_slice(&regs[last][..n]);
    }
}

/// Registers for [`Program::eval`]: made once per task (40 KiB on the stack), reused for
/// every chunk.
pub struct Regs([[f32; CHUNK]; MAX_REGS]);

impl Regs {
    pub fn new() -> Regs {
        Regs([[0.0; CHUNK]; MAX_REGS])
    }
}

impl Default for Regs {
    fn default() -> Regs {
        Regs::new()
    }
}

/// A value as `dtype` holds it: floats rounded, bools non-zero (`ir::scalar::wrap_int`).
fn fit(dt: DType, v: f32) -> f32 {
    match dt {
        DType::Bool => f32::from(u8::from(v != 0.0)),
        DType::F32 | DType::F16 | DType::BF16 | DType::I32 | DType::I64 => round_float(dt, v),
    }
}

/// One unary op over a chunk: the f32 transcendentals through [`super::fastmath`]'s
/// vectorised forms, everything else as the interpreter computes it.
fn unary_chunk(op: UnaryOp, dt: DType, a: &[f32], dst: &mut [f32]) {
    use super::fastmath;
    match op {
        UnaryOp::Exp if dt == DType::F32 => fastmath::exp(a, dst),
        UnaryOp::Sigmoid if dt == DType::F32 => fastmath::sigmoid(a, dst),
        UnaryOp::Silu if dt == DType::F32 => fastmath::silu(a, dst),
        UnaryOp::Gelu if dt == DType::F32 => fastmath::gelu(a, dst),
        UnaryOp::Neg
        | UnaryOp::Abs
        | UnaryOp::Exp
        | UnaryOp::Log
        | UnaryOp::Sqrt
        | UnaryOp::Rsqrt
        | UnaryOp::Recip
        | UnaryOp::Tanh
        | UnaryOp::Erf
        | UnaryOp::Sigmoid
        | UnaryOp::Silu
        | UnaryOp::Gelu
        | UnaryOp::GeluTanh
        | UnaryOp::Softplus => {
            for (d, &x) in dst.iter_mut().zip(a) {
                *d = fit(dt, unary_f32(op, x));
            }
        }
    }
}

/// One binary op over a chunk; the common f32 arithmetic is written out so it vectorises.
fn binary_chunk(op: BinaryOp, dt: DType, a: &[f32], b: &[f32], dst: &mut [f32]) {
    let plain = dt == DType::F32;
    match op {
        BinaryOp::Add if plain => dst
            .iter_mut()
            .zip(a.iter().zip(b))
            .for_each(|(d, (x, y))| *d = x + y),
        BinaryOp::Sub if plain => dst
            .iter_mut()
            .zip(a.iter().zip(b))
            .for_each(|(d, (x, y))| *d = x - y),
        BinaryOp::Mul if plain => dst
            .iter_mut()
            .zip(a.iter().zip(b))
            .for_each(|(d, (x, y))| *d = x * y),
        BinaryOp::Div if plain => dst
            .iter_mut()
            .zip(a.iter().zip(b))
            .for_each(|(d, (x, y))| *d = x / y),
        BinaryOp::Add
        | BinaryOp::Sub
        | BinaryOp::Mul
        | BinaryOp::Div
        | BinaryOp::Pow
        | BinaryOp::Maximum
        | BinaryOp::Minimum
        | BinaryOp::Equal
        | BinaryOp::Less
        | BinaryOp::Greater => {
            for ((d, &x), &y) in dst.iter_mut().zip(a).zip(b) {
                let v = binary_f32(op, x, y);
                *d = if op.is_comparison() {
                    f32::from(u8::from(v != 0.0))
                } else {
                    fit(dt, v)
                };
            }
        }
    }
}
