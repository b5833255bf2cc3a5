//! rocmforge: a compute-graph compiler for transformer models.
//!
//! The pipeline is model → [`ir::Graph`] → passes → codegen → runtime; the [`interp`] CPU
//! interpreter runs the same graph and is the numeric reference for everything else.

pub mod arch;
pub mod codegen;
pub mod compile;
pub mod cpu;
pub mod frontend;
pub mod generate;
pub mod interp;
pub mod ir;
pub mod passes;
pub mod runtime;
pub mod serve;
