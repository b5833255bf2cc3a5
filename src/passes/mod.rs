//! Optimisation passes over `ir::Graph`. A pass is a pure function of the graph: it rewrites in
//! place and reports what it rewrote and, for every candidate it looked at and left alone, why.
//! Each rewrite lives in its own file; `matchers` holds the structural checks they share.

mod activations;
mod attention;
mod canonicalize;
mod const_fold;
mod cse;
mod dce;
mod decode_append;
mod elementwise;
mod gemm;
mod matchers;
mod merge_gemms;
mod norm_gemv;
mod norms;
mod paged_append;
mod rope_fold;
mod softmax;

use std::fmt;

use thiserror::Error;

use crate::ir::{Graph, GraphError};

pub use activations::RecognizeActivations;
pub use attention::FuseAttention;
pub use canonicalize::Canonicalize;
pub use const_fold::ConstantFold;
pub use cse::CommonSubexpressions;
pub use dce::DeadCode;
pub use decode_append::DecodeAppend;
pub use elementwise::FuseElementwise;
pub use gemm::FormGemm;
pub use merge_gemms::MergeGemms;
pub use norm_gemv::FoldNormIntoGemv;
pub use norms::RecognizeNorms;
pub use paged_append::PagedAppend;
pub use rope_fold::{FoldRope, RopeFoldRefusal};
pub use softmax::RecognizeSoftmax;

/// A graph rewrite.
pub trait Pass: Send + Sync {
    fn name(&self) -> &'static str;
    fn run(&self, graph: &mut Graph) -> PassReport;
}

/// One rewrite a pass made, named by the node it was anchored at.
#[derive(Clone, Debug, PartialEq)]
pub struct Rewrite {
    pub at: String,
    pub what: String,
}

/// A candidate a pass examined and left alone, with the reason.
#[derive(Clone, Debug, PartialEq)]
pub struct Skip {
    pub at: String,
    /// A stable snake_case code, for tests and tools.
    pub code: &'static str,
    pub detail: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PassReport {
    pub pass: &'static str,
    pub rewrites: Vec<Rewrite>,
    pub skipped: Vec<Skip>,
}

impl PassReport {
    pub fn new(pass: &'static str) -> PassReport {
        PassReport {
            pass,
            ..PassReport::default()
        }
    }

    pub fn changed(&self) -> bool {
        !self.rewrites.is_empty()
    }

    pub fn rewrote(&mut self, at: &str, what: impl Into<String>) {
        self.rewrites.push(Rewrite {
            at: at.to_string(),
            what: what.into(),
        });
    }

    pub fn skip(&mut self, at: &str, code: &'static str, detail: impl Into<String>) {
        self.skipped.push(Skip {
            at: at.to_string(),
            code,
            detail: detail.into(),
        });
    }
}

impl fmt::Display for PassReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "pass {}: {} rewrite(s), {} candidate(s) left alone",
            self.pass,
            self.rewrites.len(),
            self.skipped.len()
        )?;
        for r in &self.rewrites {
            writeln!(f, "  rewrote %{}: {}", r.at, r.what)?;
        }
        for s in &self.skipped {
            writeln!(f, "  left %{}: {} ({})", s.at, s.code, s.detail)?;
        }
        Ok(())
    }
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum PassError {
    #[error("pass `{pass}` left an invalid graph (a rocmforge bug; please report it): {source}")]
    InvalidGraph {
        pass: &'static str,
        #[source]
        source: GraphError,
    },
}

/// An ordered list of passes.
pub struct PassManager {
    passes: Vec<Box<dyn Pass>>,
}

impl PassManager {
    pub fn new() -> PassManager {
        PassManager { passes: Vec::new() }
    }

    pub fn with(mut self, pass: impl Pass + 'static) -> PassManager {
        self.passes.push(Box::new(pass));
        self
    }

    /// Clean-up only: what `--no-fuse` compiles (the unfused baseline).
    pub fn cleanup() -> PassManager {
        // Folding first lets canonicalisation see constants that were expressions (√d).
        PassManager::new()
            .with(ConstantFold)
            .with(Canonicalize)
            .with(CommonSubexpressions)
            .with(DeadCode)
    }

    /// The default pipeline: clean up, recognise decomposed softmax/norms/activations, fuse
    /// attention, fold ropes into the cache writes that store them, take a decode attention's
    /// rope of q and its step's cache writes into it (`decode_append`, and `paged_append` for
    /// the paged attention and its paged writes), then fuse the elementwise
    /// chains left around it, then make every matmul left a Gemm with the layouts and the
    /// epilogue around it, merge the Gemms that share an input (Q/K/V) into one, then fold the
    /// norms that only GEMV-sized Gemms read into them.
    pub fn default_pipeline() -> PassManager {
        PassManager::cleanup()
            .with(RecognizeSoftmax)
            .with(RecognizeNorms)
            .with(RecognizeActivations)
            .with(FuseAttention)
            .with(DeadCode)
            .with(FoldRope)
            .with(DecodeAppend)
            .with(PagedAppend)
            .with(DeadCode)
            .with(FuseElementwise)
            .with(DeadCode)
            .with(FormGemm)
            .with(DeadCode)
            .with(MergeGemms)
            .with(DeadCode)
            .with(FoldNormIntoGemv)
            .with(DeadCode)
    }

    /// The pipeline a compile runs: [`PassManager::default_pipeline`] when fusing, else
    /// [`PassManager::cleanup`] (`--no-fuse`). The one place that choice is made: the compiler,
    /// the CLI and the tests all take it from here.
    pub fn pipeline(fuse: bool) -> PassManager {
        if fuse {
            PassManager::default_pipeline()
        } else {
            PassManager::cleanup()
        }
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// Runs every pass in order, validating the graph after each.
    pub fn run(&self, graph: &mut Graph) -> Result<Vec<PassReport>, PassError> {
        self.run_observed(graph, |_, _| {})
    }

    /// As [`PassManager::run`], calling `observe` after each pass with its report and the graph.
    pub fn run_observed(
        &self,
        graph: &mut Graph,
        mut observe: impl FnMut(&PassReport, &Graph),
    ) -> Result<Vec<PassReport>, PassError> {
        let mut reports = Vec::with_capacity(self.passes.len());
        for pass in &self.passes {
            let start = std::time::Instant::now();
            let report = pass.run(graph);
            graph.validate().map_err(|source| PassError::InvalidGraph {
                pass: pass.name(),
                source,
            })?;
            tracing::debug!(
                pass = pass.name(),
                rewrites = report.rewrites.len(),
                nodes = graph.node_count(),
                ms = start.elapsed().as_secs_f64() * 1e3,
                "pass done"
            );
            observe(&report, graph);
            reports.push(report);
        }
        Ok(reports)
    }
}

impl Default for PassManager {
    fn default() -> Self {
        PassManager::default_pipeline()
    }
}

/// The graph after the default pipeline, and the reports.
pub fn optimize(graph: &Graph) -> Result<(Graph, Vec<PassReport>), PassError> {
    let mut g = graph.clone();
    let reports = PassManager::default_pipeline().run(&mut g)?;
    Ok((g, reports))
}

/// The `--explain` text: every attention candidate, fused or with the reason it was not, then
/// every other candidate a pass left alone (for the GEMM pass, each part it kept out of a gemm).
pub fn explain_text(reports: &[PassReport]) -> String {
    let mut out = String::new();
    for r in reports.iter().filter(|r| r.pass == "fuse_attention") {
        if r.rewrites.is_empty() && r.skipped.is_empty() {
            out.push_str("attention: no candidates (no matmul reads a softmax)\n");
        }
        for w in &r.rewrites {
            out.push_str(&format!("attention %{}: fused: {}\n", w.at, w.what));
        }
        for s in &r.skipped {
            out.push_str(&format!(
                "attention %{}: not fused: {} ({})\n",
                s.at, s.code, s.detail
            ));
        }
    }
    for r in reports.iter().filter(|r| r.pass != "fuse_attention") {
        // The GEMM pass makes its node anyway; what it reports is a part left outside it.
        let verb = if r.pass == "form_gemm" {
            "kept out"
        } else {
            "left alone"
        };
        for s in &r.skipped {
            out.push_str(&format!(
                "{} %{}: {verb}: {} ({})\n",
                r.pass, s.at, s.code, s.detail
            ));
        }
    }
    out
}
