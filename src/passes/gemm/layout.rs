//! The problem a Gemm is built from while its operands and result are traced through layout
//! ops: a list of sub-axes (batch, M, N or K), each with one element stride per tensor the node
//! touches (A, B, the result, each epilogue operand).
//!
//! Strides are flat offsets into a tensor's contiguous storage, so a reshape, which keeps the
//! storage, changes nothing. A permute or expand needs each sub-axis inside one axis of the
//! tensor it rearranges: a sub-axis that spans several is split where the sizes divide
//! (splitting refines every tensor's view, which stays what it was), and one that cannot be
//! split, or sub-axes whose digits would carry from one axis into the next, make the step
//! inexpressible: the walk stops there and the layout op stays, a copy visible in the plan.

use crate::ir::gemm::Operand;
use crate::ir::{GemmDims, View};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    Batch,
    M,
    N,
    K,
}

impl Role {
    /// Whether a view of `operand` has a stride for this role's sub-axes.
    fn seen_by(self, operand: Operand) -> bool {
        !matches!(
            (self, operand),
            (Role::N, Operand::A) | (Role::M, Operand::B) | (Role::K, Operand::Out)
        )
    }
}

#[derive(Clone, Debug)]
struct SubAxis {
    role: Role,
    size: usize,
    /// One stride per slot (0 for slots that do not see the role).
    strides: Vec<usize>,
}

/// Slot numbers: A, B, the result, then the epilogue operands.
pub(super) const A: usize = 0;
pub(super) const B: usize = 1;
pub(super) const OUT: usize = 2;

pub(super) fn operand_of(slot: usize) -> Operand {
    match slot {
        A => Operand::A,
        B => Operand::B,
        _ => Operand::Out,
    }
}

pub(super) struct Problem {
    axes: Vec<SubAxis>,
    slots: usize,
}

/// Where one sub-axis lies in a tensor: (axis, how many steps of that axis one step is).
type Placement = Vec<Option<(usize, usize)>>;

impl Problem {
    /// A matmul's problem: one batch sub-axis per axis of the product's batch shape, then M, N
    /// and K, with each slot's strides given per role by `strides(slot, role, index)`.
    pub(super) fn new(
        batch: &[usize],
        [m, n, k]: [usize; 3],
        slots: usize,
        strides: impl Fn(usize, Role, usize) -> usize,
    ) -> Problem {
        let roles = batch
            .iter()
            .enumerate()
            .map(|(i, &d)| (Role::Batch, i, d))
            .chain([(Role::M, 0, m), (Role::N, 0, n), (Role::K, 0, k)]);
        let axes = roles
            .map(|(role, i, size)| SubAxis {
                role,
                size,
                strides: (0..slots)
                    .map(|s| {
                        if role.seen_by(operand_of(s)) {
                            strides(s, role, i)
                        } else {
                            0
                        }
                    })
                    .collect(),
            })
            .collect();
        Problem { axes, slots }
    }

    /// Whether sub-axis `j` moves `slot`'s offset (it is seen, longer than 1, not broadcast).
    fn moves(&self, j: usize, slot: usize) -> bool {
        let a = &self.axes[j];
        a.role.seen_by(operand_of(slot)) && a.size > 1 && a.strides[slot] > 0
    }

    /// Places every sub-axis that moves `slot` inside one axis of the contiguous tensor of
    /// `dims` that `slot`'s strides index, splitting sub-axes that span several axes.
    fn place(&mut self, slot: usize, dims: &[usize]) -> Result<Placement, String> {
        let st = crate::ir::Shape(dims.to_vec()).strides();
        // The axis holding offset step `s`: the one of size > 1 whose stride range covers it.
        let axis_of =
            |s: usize| (0..dims.len()).find(|&i| dims[i] > 1 && st[i] <= s && s / dims[i] < st[i]);
        let mut j = 0;
        while j < self.axes.len() {
            if !self.moves(j, slot) {
                j += 1;
                continue;
            }
            let (z, s) = (self.axes[j].size, self.axes[j].strides[slot]);
            let i = axis_of(s).ok_or_else(|| format!("stride {s} lies outside {dims:?}"))?;
            if !s.is_multiple_of(st[i]) {
                return Err(format!("stride {s} falls between the axes of {dims:?}"));
            }
            let c = s / st[i];
            if c.checked_mul(z - 1).is_some_and(|r| r < dims[i]) {
                j += 1;
                continue;
            }
            // The sub-axis runs past axis i: its inner `w` steps stay, the rest moves out.
            let w = dims[i] / c;
            if !dims[i].is_multiple_of(c) || !z.is_multiple_of(w) {
                return Err(format!(
                    "a sub-axis of {z} steps of {s} cannot be split over the axes of {dims:?}"
                ));
            }
            // The inner part (now at j + 1) fits; the outer part (now at j) is placed next.
            self.split(j, w);
        }
        let mut placed: Placement = vec![None; self.axes.len()];
        let mut reach = vec![0usize; dims.len()];
        for (j, p) in placed.iter_mut().enumerate() {
            if !self.moves(j, slot) {
                continue;
            }
            let (z, s) = (self.axes[j].size, self.axes[j].strides[slot]);
            let i = axis_of(s).expect("placed above");
            let c = s / st[i];
            reach[i] = reach[i].saturating_add(c.saturating_mul(z - 1));
            *p = Some((i, c));
        }
        if let Some(i) = (0..dims.len()).find(|&i| reach[i] >= dims[i]) {
            return Err(format!(
                "sub-axes reading axis {i} of {dims:?} would carry into the next axis"
            ));
        }
        Ok(placed)
    }

    /// Splits sub-axis `j` into an outer part of `size / w` and an inner part of `w` steps.
    fn split(&mut self, j: usize, w: usize) {
        let inner = self.axes[j].clone();
        let outer = SubAxis {
            role: inner.role,
            size: inner.size / w,
            // Saturating: an offset past the tensor fails shape inference's view check.
            strides: inner.strides.iter().map(|&s| s.saturating_mul(w)).collect(),
        };
        self.axes[j] = SubAxis { size: w, ..inner };
        self.axes.insert(j, outer);
    }

    /// `slot` read through a permute: its strides index the permute's result (`dims`) and
    /// will index its operand, whose strides are `src` (`perm[i]` is the operand axis of
    /// result axis `i`).
    pub(super) fn through_permute(
        &mut self,
        slot: usize,
        dims: &[usize],
        perm: &[usize],
        src: &[usize],
    ) -> Result<(), String> {
        let placed = self.place(slot, dims)?;
        self.restride(slot, &placed, |i| src[perm[i]]);
        Ok(())
    }

    /// `slot` read through an expand to `dims` from an operand of `src_dims`: broadcast axes
    /// read stride 0.
    pub(super) fn through_expand(
        &mut self,
        slot: usize,
        dims: &[usize],
        src_dims: &[usize],
    ) -> Result<(), String> {
        let placed = self.place(slot, dims)?;
        let src = crate::ir::Shape(src_dims.to_vec()).strides();
        let lead = dims.len() - src_dims.len();
        self.restride(slot, &placed, |i| {
            if i < lead || src_dims[i - lead] == 1 {
                0
            } else {
                src[i - lead]
            }
        });
        Ok(())
    }

    /// The result written through a permute: its strides index the permute's operand
    /// (`dims`) and will index the permute's result, whose strides are `dst`.
    pub(super) fn out_through_permute(
        &mut self,
        dims: &[usize],
        perm: &[usize],
        dst: &[usize],
    ) -> Result<(), String> {
        let placed = self.place(OUT, dims)?;
        let mut at = vec![0; perm.len()];
        for (i, &p) in perm.iter().enumerate() {
            at[p] = i;
        }
        self.restride(OUT, &placed, |i| dst[at[i]]);
        Ok(())
    }

    fn restride(&mut self, slot: usize, placed: &Placement, stride: impl Fn(usize) -> usize) {
        for (a, p) in self.axes.iter_mut().zip(placed) {
            if let Some((i, c)) = p {
                a.strides[slot] = c.saturating_mul(stride(*i));
            }
        }
    }

    /// Batch sub-axes that B broadcasts (stride 0) become the outermost sub-axes of M: one
    /// product of more rows instead of many that share B.
    pub(super) fn fold_broadcast_batch(&mut self) {
        let (moved, kept): (Vec<SubAxis>, Vec<SubAxis>) = std::mem::take(&mut self.axes)
            .into_iter()
            .partition(|a| a.role == Role::Batch && a.strides[B] == 0);
        let first_m = kept
            .iter()
            .position(|a| a.role == Role::M)
            .unwrap_or(kept.len());
        self.axes = kept;
        for (i, mut a) in moved.into_iter().enumerate() {
            a.role = Role::M;
            self.axes.insert(first_m + i, a);
        }
    }

    /// Drops sub-axes of one step and merges neighbours of one role that every slot walks as
    /// one (outer stride = inner stride × inner size), so dumps and kernels stay short.
    pub(super) fn simplify(&mut self) {
        self.axes.retain(|a| a.size != 1);
        let mut j = 1;
        while j < self.axes.len() {
            let (o, i) = (&self.axes[j - 1], &self.axes[j]);
            let joins = o.role == i.role
                && (0..self.slots).all(|s| {
                    !o.role.seen_by(operand_of(s)) || o.strides[s] == i.strides[s] * i.size
                });
            if joins {
                let size = o.size * i.size;
                let inner = self.axes.remove(j);
                self.axes[j - 1] = SubAxis { size, ..inner };
            } else {
                j += 1;
            }
        }
    }

    /// Whether any sub-axis has no steps (an empty problem: nothing to trace).
    pub(super) fn is_empty(&self) -> bool {
        self.axes.iter().any(|a| a.size == 0)
    }

    pub(super) fn dims(&self) -> GemmDims {
        let of = |r: Role| {
            self.axes
                .iter()
                .filter(|a| a.role == r)
                .map(|a| a.size)
                .collect()
        };
        GemmDims {
            batch: of(Role::Batch),
            m: of(Role::M),
            n: of(Role::N),
            k: of(Role::K),
        }
    }

    pub(super) fn view(&self, slot: usize) -> View {
        let (rows, cols) = match operand_of(slot) {
            Operand::A => (Role::M, Role::K),
            Operand::B => (Role::K, Role::N),
            Operand::Out => (Role::M, Role::N),
        };
        let of = |r: Role| {
            self.axes
                .iter()
                .filter(|a| a.role == r)
                .map(|a| a.strides[slot])
                .collect()
        };
        View {
            batch: of(Role::Batch),
            rows: of(rows),
            cols: of(cols),
        }
    }
}
