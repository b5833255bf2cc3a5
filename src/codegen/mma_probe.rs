//! A small kernel rendered from one matrix atom, so tests can compile it for the atom's targets
//! (the instruction must appear in the ISA, with no spills) and run it on a GPU against an f64
//! product. It uses nothing but the generated fragment helpers.

use serde::Serialize;

use super::mma::MmaAtom;
use super::{prelude, templates, CodegenError};
use crate::arch::Target;

/// The probe of one atom on one target: `entry(a, b, bt, c)` run by one wave (`lanes` threads)
/// computes `c = a · b`, where `a` is `m × k` row-major, `b` is `k × n` row-major and `bt` is
/// the same `b` transposed (`n × k`), all values of the atom's input type (16-bit, or f32 for
/// the TF32 atoms), and `c` is `m × n` f32.
#[derive(Clone, Debug, PartialEq)]
pub struct MmaProbe {
    pub entry: String,
    /// Prelude and kernel.
    pub source: String,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lanes: u32,
}

/// The probe template's context: the atom's helper prefix and shape, and the entry name
/// (fixed per atom: the probe is one kernel, not named by a hash).
#[derive(Serialize)]
struct ProbeContext<'a> {
    p: String,
    m: u32,
    n: u32,
    k: u32,
    lanes: u32,
    entry: &'a str,
    /// The element type of A and B in memory.
    et: &'static str,
}

pub fn mma_probe_kernel(target: &Target, atom: &'static MmaAtom) -> Result<MmaProbe, CodegenError> {
    if !target.caps.mma.iter().any(|a| std::ptr::eq(*a, atom)) {
        return Err(CodegenError::Unsupported {
            node: format!("mma probe {}", atom.name),
            reason: format!("{} has no {} instruction", target.arch, atom.intrinsic),
        });
    }
    let entry = format!("rf_mma_probe_{}", atom.name);
    let ctx = ProbeContext {
        p: atom.prefix(),
        m: atom.m,
        n: atom.n,
        k: atom.k,
        lanes: atom.lanes,
        entry: &entry,
        et: super::mma::stored_element(atom),
    };
    let body = templates::render("mma_probe.hip", minijinja::Value::from_serialize(&ctx))?;
    Ok(MmaProbe {
        entry,
        source: format!("{}\n{body}", prelude(target)),
        m: atom.m as usize,
        n: atom.n as usize,
        k: 2 * atom.k as usize,
        lanes: atom.lanes,
    })
}
