//! Code generated from the matrix-instruction rows (`arch::mma`): the prelude's fragment helpers
//! (load, compute, store, row reductions, accumulator-to-operand reuse), and the CPU simulation
//! that holds the generated index expressions against the rows' bit maps.

mod helpers;
#[cfg(test)]
mod simulate;

pub use crate::arch::mma::{atoms, Bit, Field, Layout, Linear, MmaAtom, MmaKind, Precision, Var};
pub use helpers::{
    fragment_helpers, ldmatrix_a, ldmatrix_pairs, stored_element, LdmatrixA, LdmatrixPairs,
};

/// What the generated helpers can do for an atom, decided by the helper generators themselves.
pub trait AtomHelpers {
    /// Whether accumulators can become the A operand of the next MMA without moving between
    /// lanes (the helpers then have `P_c_to_a`).
    fn accumulators_feed_a(&self) -> bool;
    /// Whether two B fragments load with one `ldmatrix.x4` (the helpers then have
    /// `P_load_b_pair_nk_smem` and `P_load_b_pair_kn_smem`).
    fn loads_b_pairs_by_ldmatrix(&self) -> bool;
}

impl AtomHelpers for MmaAtom {
    fn accumulators_feed_a(&self) -> bool {
        helpers::c_to_a(self).is_some()
    }

    fn loads_b_pairs_by_ldmatrix(&self) -> bool {
        ldmatrix_pairs(self).is_some()
    }
}
