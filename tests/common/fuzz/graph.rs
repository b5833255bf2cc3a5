//! The graph file format: `ir::format::load` (parse and validate), then everything a loaded
//! graph may go through: save and reload, the text and DOT printers, the default pass pipeline,
//! code generation for an AMD and an NVIDIA target (fused, and unfused without epilogues), and,
//! when every tensor is small, the interpreter on the graph and on its fused form, which must
//! agree.

use std::path::Path;

use rocmforge::arch::Target as Arch;
use rocmforge::codegen::{self, CodegenOptions};
use rocmforge::interp::{self, Bindings};
use rocmforge::ir::{format, to_dot, to_text, DType, Graph, Op, Tensor};
use rocmforge::passes::{optimize, PassManager};

use super::{read_dir_files, root, Outcome, Structure, Target};

#[path = "../op_zoo.rs"]
mod op_zoo;

/// Graphs whose tensors hold at most this many elements each, and this many in all, are
/// interpreted (declared shapes can be huge; the interpreter allocates what they say).
const INTERPRET_MAX_TENSOR: usize = 1 << 14;
const INTERPRET_MAX_TOTAL: usize = 1 << 16;

pub struct GraphTarget {
    amd: Arch,
    nvidia: Arch,
}

impl Default for GraphTarget {
    fn default() -> Self {
        GraphTarget {
            amd: Arch::parse("gfx90a").expect("a known arch"),
            nvidia: Arch::parse("sm_90").expect("a known arch"),
        }
    }
}

/// The variant name of an error, as an outcome label.
pub fn variant(e: &impl std::fmt::Debug) -> String {
    let debug = format!("{e:?}");
    debug
        .split([' ', '{', '('])
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Whether the interpreter may run `g` in a fuzz iteration.
pub fn small(g: &Graph) -> bool {
    let mut total = 0usize;
    for id in g.node_ids() {
        let n = g
            .node(id)
            .ty
            .shape
            .dims()
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d));
        match n {
            Some(n) if n <= INTERPRET_MAX_TENSOR => total += n,
            _ => return false,
        }
    }
    total <= INTERPRET_MAX_TOTAL
}

/// Relative L2 tolerance between fused and unfused outputs, by dtype: fusion keeps f32
/// intermediates where the unfused graph rounds them to the dtype.
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2e-2,
        DType::BF16 => 6e-2,
        DType::F32 | DType::I32 | DType::I64 | DType::Bool => 1e-3,
    }
}

/// The class of a non-finite value, for comparing where outputs are not numbers.
fn non_finite_class(x: f64) -> Option<&'static str> {
    if x.is_nan() {
        Some("NaN")
    } else if x == f64::INFINITY {
        Some("+inf")
    } else if x == f64::NEG_INFINITY {
        Some("-inf")
    } else {
        None
    }
}

/// Fused and unfused outputs must have the same types, non-finite values at the same places
/// and of the same class (NaN, +inf, -inf), and the finite values within the dtype's tolerance.
/// (This used to skip a whole output holding one non-finite value, so a fused graph could be
/// wrong everywhere else in it.)
pub fn compare(unfused: &[Tensor], fused: &[Tensor]) -> Result<(), String> {
    if unfused.len() != fused.len() {
        return Err(format!(
            "fused graph has {} outputs, unfused {}",
            fused.len(),
            unfused.len()
        ));
    }
    for (i, (u, f)) in unfused.iter().zip(fused).enumerate() {
        if u.ty() != f.ty() {
            return Err(format!(
                "output {i}: fused {} but unfused {}",
                f.ty(),
                u.ty()
            ));
        }
        let tol = tolerance(u.dtype());
        let (u, f) = (u.to_f64_vec(), f.to_f64_vec());
        let (mut num, mut den) = (0.0, 0.0);
        for (j, (a, b)) in u.iter().zip(&f).enumerate() {
            match (non_finite_class(*a), non_finite_class(*b)) {
                (None, None) => {
                    num += (a - b).powi(2);
                    den += a * a;
                }
                (ca, cb) if ca == cb => {}
                _ => {
                    return Err(format!(
                        "output {i}: element {j} is {b} fused but {a} unfused"
                    ))
                }
            }
        }
        let err = if den > 0.0 {
            (num / den).sqrt()
        } else {
            num.sqrt()
        };
        if err.is_nan() || err > tol {
            return Err(format!(
                "output {i}: fused and unfused differ (relative L2 {err:e} > {tol:e})"
            ));
        }
    }
    Ok(())
}

/// Runs `g` and its fused form on the same data and compares them. Ok(label).
pub fn differential(g: &Graph, fused: &Graph, data: &Bindings) -> Outcome {
    let unfused = match interp::run(g, data) {
        Ok(out) => out,
        Err(e) => return Ok(format!("interp-err:{}", variant(&e))),
    };
    // Passes drop inputs and weights nothing reads; the fused graph gets the data it still has
    // (as `Compiled::run` uploads only the plan's inputs).
    let mut kept = data.clone();
    kept.inputs.retain(|name, _| fused.find(name).is_some());
    kept.weights.retain(|name, _| fused.find(name).is_some());
    let fused_out = interp::run(fused, &kept)
        .map_err(|e| format!("the unfused graph runs but its fused form fails: {e}"))?;
    compare(&unfused, &fused_out)?;
    Ok("interp:agree".into())
}

impl Target for GraphTarget {
    fn name(&self) -> &'static str {
        "graph"
    }

    fn structure(&self) -> Structure {
        Structure::Json
    }

    fn input_file(&self) -> &'static str {
        "graph.json"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        let mut seeds = Vec::new();
        seeds.extend(read_dir_files(&root().join("graphs"), &[]));
        seeds.extend(read_dir_files(
            &root().join("tests/data/bad_graphs"),
            &["EXPECTED"],
        ));
        seeds.extend(read_dir_files(&root().join("tests/data/fuzz/graph"), &[]));
        for g in op_zoo::zoo() {
            seeds.push(
                format::to_json_string(&g)
                    .expect("zoo graphs serialise")
                    .into_bytes(),
            );
        }
        seeds
    }

    fn dictionary(&self) -> Vec<String> {
        let mut words: Vec<String> = Op::all_names().iter().map(|s| s.to_string()).collect();
        words.extend(DType::ALL.iter().map(|d| d.name().to_string()));
        words
    }

    fn run(&mut self, _input: &[u8], path: &Path) -> Outcome {
        let g = match format::load(path) {
            Ok(g) => g,
            Err(e) => {
                if e.to_string().is_empty() {
                    return Err(format!("error {e:?} has an empty message"));
                }
                return Ok(format!("load-err:{}", e.kind()));
            }
        };
        // What loads must save and load back as the same graph.
        let text = format::to_json_string(&g).map_err(|e| format!("saving a loaded graph: {e}"))?;
        let again = format::from_json_str(&text)
            .map_err(|e| format!("a saved graph does not load back: {e}\n{text}"))?;
        let text2 = format::to_json_string(&again).map_err(|e| format!("saving again: {e}"))?;
        if text != text2 {
            return Err(format!(
                "save → load → save changed the file:\n{text}\n---\n{text2}"
            ));
        }
        to_text(&g).map_err(|e| format!("printing a loaded graph: {e}"))?;
        to_dot(&g).map_err(|e| format!("DOT of a loaded graph: {e}"))?;

        let (fused, _) = optimize(&g).map_err(|e| format!("the default pipeline: {e}"))?;
        let mut label = String::from("passes");
        for (arch, what) in [(&self.amd, "amd"), (&self.nvidia, "nvidia")] {
            if let Err(e) = codegen::generate(&fused, arch) {
                label.push_str(&format!(" codegen-{what}-err:{}", variant(&e)));
            }
        }
        let mut unfused = g.clone();
        PassManager::cleanup()
            .run(&mut unfused)
            .map_err(|e| format!("the clean-up pipeline: {e}"))?;
        let no_epilogues = CodegenOptions::default();
        if let Err(e) = codegen::generate_with(&unfused, &self.amd, &no_epilogues) {
            label.push_str(&format!(" codegen-unfused-err:{}", variant(&e)));
        }

        if !small(&g) {
            return Ok(format!("{label} big"));
        }
        let bindings = Bindings::random(&g, 7);
        let verdict = differential(&g, &fused, &bindings)?;
        Ok(format!("{label} {verdict}"))
    }
}
