//! The layering rules of docs/architecture.md, checked on the source: every `use` and every
//! `crate::`/`super::`/`self::` path in `src/` is resolved to the file it names, then
//!
//! 1. each top-level module may reach only the modules its row below allows (data flows one way:
//!    ir → arch → interp/passes/frontend/codegen/runtime/cpu → compile → generate → bin), and
//! 2. no files import each other in a circle (a structure viewer's "import cycle"): a parent
//!    module declaring and re-exporting its children is not counted as an import of them.
//!
//! Comments are skipped; `#[cfg(test)]` code is held to the same rules as the rest.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Which top-level modules each one may import (besides itself). A module not listed here is a
/// new top-level module: the test fails until its row is written (and docs/architecture.md says
/// where it sits).
const RULES: &[(&str, &[&str])] = &[
    ("ir", &[]),
    ("arch", &["ir"]),
    ("interp", &["ir"]),
    ("passes", &["ir"]),
    ("frontend", &["ir"]),
    ("codegen", &["ir", "arch"]),
    ("runtime", &["ir", "arch"]),
    ("cpu", &["ir", "arch", "interp"]),
    (
        "compile",
        &[
            "ir", "arch", "interp", "passes", "frontend", "codegen", "runtime", "cpu",
        ],
    ),
    (
        "generate",
        &[
            "ir", "arch", "interp", "passes", "frontend", "codegen", "runtime", "cpu", "compile",
        ],
    ),
    (
        "serve",
        &[
            "ir", "arch", "interp", "passes", "frontend", "codegen", "runtime", "cpu", "compile",
            "generate",
        ],
    ),
];

/// A module path (`["codegen", "kernels", "gemm"]`) and the file that holds it.
struct Files {
    by_path: BTreeMap<Vec<String>, PathBuf>,
}

impl Files {
    fn scan(src: &Path) -> Files {
        let mut by_path = BTreeMap::new();
        let mut stack = vec![src.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let p = entry.unwrap().path();
                if p.is_dir() {
                    if p.file_name().unwrap() != "bin" {
                        stack.push(p);
                    }
                    continue;
                }
                if p.extension().is_some_and(|e| e == "rs") {
                    let rel = p.strip_prefix(src).unwrap();
                    let mut parts: Vec<String> = rel
                        .components()
                        .map(|c| c.as_os_str().to_string_lossy().into_owned())
                        .collect();
                    let last = parts.pop().unwrap();
                    let stem = last.trim_end_matches(".rs").to_string();
                    if stem != "mod" && stem != "lib" {
                        parts.push(stem);
                    }
                    by_path.insert(parts, p);
                }
            }
        }
        Files { by_path }
    }

    /// The module (file) a path resolves into: its longest prefix that is a file of ours.
    fn resolve(&self, path: &[String]) -> Option<Vec<String>> {
        (1..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|p| self.by_path.contains_key(p))
    }
}

/// The source with comments removed (line comments and block comments; string literals that
/// contain `//` are rare enough in our sources to be cut too, which only loses text).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("//") {
            rest = after.find('\n').map_or("", |i| &after[i..]);
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map_or("", |i| &after[i + 2..]);
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// Expands one use tree (`crate::a::{b, c::{d, e}}`) into its paths.
fn expand(tree: &str, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head: Vec<String> = segments(&tree[..open]);
        let mut base = prefix.to_vec();
        base.extend(head);
        let inner = &tree[open + 1..tree.rfind('}').unwrap()];
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&inner[start..i], &base, out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        expand(&inner[start..], &base, out);
    } else {
        let mut p = prefix.to_vec();
        p.extend(segments(tree.split(" as ").next().unwrap()));
        // `a::{self}` names `a` itself.
        if p.len() > 1 && p.last().is_some_and(|s| s == "self") {
            p.pop();
        }
        if !p.is_empty() {
            out.push(p);
        }
    }
}

fn segments(s: &str) -> Vec<String> {
    s.split("::")
        .map(|x| x.trim())
        .filter(|x| !x.is_empty())
        .map(String::from)
        .collect()
}

/// Every path of ours that `text` (comments stripped) names, as written (`crate::…`,
/// `super::…`, `self::…`).
fn paths_named(text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    // use statements, which may span lines and hold groups.
    let mut rest = text;
    // The text outside use statements, for the inline scan below.
    let mut outside = String::with_capacity(text.len());
    while let Some(i) = rest.find("use ") {
        let boundary = i == 0
            || !rest.as_bytes()[i - 1].is_ascii_alphanumeric() && rest.as_bytes()[i - 1] != b'_';
        let after = &rest[i + 4..];
        let end = after.find(';').unwrap_or(after.len());
        outside.push_str(&rest[..i]);
        if !boundary {
            outside.push_str("use ");
            outside.push_str(&after[..end]);
        }
        if boundary {
            let tree = after[..end].trim();
            if tree.starts_with("crate::")
                || tree.starts_with("super::")
                || tree.starts_with("self::")
            {
                expand(tree, &[], &mut out);
            }
        }
        rest = &after[end.min(after.len())..];
    }
    outside.push_str(rest);
    // inline paths.
    for start in ["crate::", "super::"] {
        let mut rest = outside.as_str();
        while let Some(i) = rest.find(start) {
            let ok = i == 0 || {
                let b = rest.as_bytes()[i - 1];
                !(b.is_ascii_alphanumeric() || b == b'_' || b == b':')
            };
            let tail = &rest[i..];
            let len = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            if ok {
                let p: Vec<String> = tail[..len]
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect();
                out.push(p);
            }
            rest = &rest[i + len.max(1)..];
        }
    }
    out
}

/// A written path made absolute from the module `at` (whose file is `is_dir_module` when it is a
/// `mod.rs`/`lib.rs`).
fn absolute(written: &[String], at: &[String], is_dir_module: bool) -> Option<Vec<String>> {
    let mut here: Vec<String> = at.to_vec();
    let mut rest = written;
    match written.first().map(String::as_str) {
        Some("crate") => {
            here.clear();
            rest = &written[1..];
        }
        Some("self") => rest = &written[1..],
        Some("super") => {
            while rest.first().map(String::as_str) == Some("super") {
                here.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    let _ = is_dir_module;
    here.extend(rest.iter().cloned());
    Some(here)
}

struct Imports {
    /// file module → modules it imports (resolved to files).
    edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
}

fn imports() -> Imports {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = Files::scan(&src);
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, file) in &files.by_path {
        let text = strip_comments(&std::fs::read_to_string(file).unwrap());
        let is_dir = file
            .file_name()
            .is_some_and(|n| n == "mod.rs" || n == "lib.rs");
        let set = edges.entry(module.clone()).or_default();
        for written in paths_named(&text) {
            let Some(abs) = absolute(&written, module, is_dir) else {
                continue;
            };
            let Some(target) = files.resolve(&abs) else {
                continue;
            };
            // A parent reaching into its own children (declaring, re-exporting) is structure,
            // not an import; a module naming itself is not an edge.
            if target.starts_with(module) {
                continue;
            }
            set.insert(target);
        }
    }
    Imports { edges }
}

#[test]
fn top_level_modules_import_only_downwards() {
    let imports = imports();
    let mut bad = Vec::new();
    for (from, targets) in &imports.edges {
        let Some(top) = from.first() else { continue };
        let allowed = RULES
            .iter()
            .find(|(m, _)| m == top)
            .unwrap_or_else(|| panic!("src/{top} has no layering rule: add its row to RULES and to docs/architecture.md"))
            .1;
        for to in targets {
            let Some(to_top) = to.first() else { continue };
            if to_top != top && !allowed.contains(&to_top.as_str()) {
                bad.push(format!(
                    "{} imports {} ({top} may use: {allowed:?})",
                    from.join("::"),
                    to.join("::")
                ));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "imports against the layering rules:\n{}",
        bad.join("\n")
    );
}

#[test]
fn no_files_import_each_other_in_a_circle() {
    let imports = imports();
    // Tarjan's strongly connected components over the file graph.
    let nodes: Vec<&Vec<String>> = imports.edges.keys().collect();
    let index_of: BTreeMap<&Vec<String>, usize> =
        nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let succ: Vec<Vec<usize>> = nodes
        .iter()
        .map(|n| {
            imports.edges[*n]
                .iter()
                .filter_map(|t| index_of.get(t).copied())
                .collect()
        })
        .collect();
    let mut state = Tarjan {
        index: vec![None; nodes.len()],
        low: vec![0; nodes.len()],
        on: vec![false; nodes.len()],
        stack: Vec::new(),
        next: 0,
        components: Vec::new(),
    };
    for v in 0..nodes.len() {
        if state.index[v].is_none() {
            state.visit(v, &succ);
        }
    }
    let circles: Vec<String> = state
        .components
        .iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            c.iter()
                .map(|&i| nodes[i].join("::"))
                .collect::<Vec<_>>()
                .join(" ↔ ")
        })
        .collect();
    assert!(
        circles.is_empty(),
        "files that import each other in a circle:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_checker_sees_a_circle_and_a_grouped_use() {
    let mut out = Vec::new();
    expand("crate::a::{b::{c, d as e}, f}", &[], &mut out);
    let got: Vec<String> = out.iter().map(|p| p.join("::")).collect();
    assert_eq!(got, ["crate::a::b::c", "crate::a::b::d", "crate::a::f"]);
    let text = strip_comments("// use crate::x::y;\nuse super::z::{w};\nfn f() { crate::q::r(); }");
    let named: Vec<String> = paths_named(&text).iter().map(|p| p.join("::")).collect();
    assert_eq!(named, ["super::z::w", "crate::q::r"]);
    assert_eq!(
        absolute(
            &["super".into(), "z".into()],
            &["codegen".into(), "lower".into()],
            false
        ),
        Some(vec!["codegen".to_string(), "z".to_string()])
    );
}

struct Tarjan {
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    on: Vec<bool>,
    stack: Vec<usize>,
    next: usize,
    components: Vec<Vec<usize>>,
}

impl Tarjan {
    fn visit(&mut self, v: usize, succ: &[Vec<usize>]) {
        self.index[v] = Some(self.next);
        self.low[v] = self.next;
        self.next += 1;
        self.stack.push(v);
        self.on[v] = true;
        for &w in &succ[v] {
            match self.index[w] {
                None => {
                    self.visit(w, succ);
                    self.low[v] = self.low[v].min(self.low[w]);
                }
                Some(iw) if self.on[w] => self.low[v] = self.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(self.low[v]) == self.index[v] {
            let mut component = Vec::new();
            loop {
                let w = self.stack.pop().unwrap();
                self.on[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            self.components.push(component);
        }
    }
}
