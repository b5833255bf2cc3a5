//! `rocmforge show`: a graph in the text form, optionally as Graphviz DOT.

use std::path::Path;

use rocmforge::ir;
use rocmforge::passes::PassManager;

use crate::common::load;

pub(crate) fn cmd_show(file: &Path, dot: Option<&Path>, fused: bool) -> Result<(), String> {
    let mut graph = load(file)?;
    if fused {
        PassManager::default_pipeline()
            .run(&mut graph)
            .map_err(|e| e.to_string())?;
    }
    out!("{}", ir::to_text(&graph).map_err(|e| e.to_string())?);
    if let Some(path) = dot {
        let text = ir::to_dot(&graph).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
