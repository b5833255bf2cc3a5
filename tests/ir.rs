//! The IR and its file format: the example graphs load, validate, round-trip unchanged and run;
//! every malformed file of the corpus gives its typed error; no input panics.

mod common;

use common::files::graph_files;

use std::path::Path;

use rocmforge::interp::{run, Bindings};
use rocmforge::ir::{self, format, DType, Graph, GraphError};

#[test]
fn the_required_example_graphs_exist() {
    let names: Vec<String> = graph_files()
        .iter()
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in [
        "attention",
        "attention_causal",
        "attention_padding_mask",
        "gqa_attention",
        "bert_layer",
        "llama_block",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "graphs/{want}.json is missing"
        );
    }
}

#[test]
fn every_graph_file_loads_validates_round_trips_and_runs() {
    for path in graph_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        let g = format::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        g.validate().unwrap();
        // Written back, the file is byte-for-byte what was read, and reads back the same.
        let again = format::to_json_string(&g).unwrap();
        assert_eq!(
            again,
            text,
            "{} does not round-trip unchanged",
            path.display()
        );
        let g2 = format::from_json_str(&again).unwrap();
        assert_eq!(ir::to_text(&g).unwrap(), ir::to_text(&g2).unwrap());
        // It runs, deterministically, and writes finite outputs of the declared types.
        let out = run(&g, &Bindings::random(&g, 3)).unwrap();
        let out2 = run(&g2, &Bindings::random(&g2, 3)).unwrap();
        assert_eq!(
            out,
            out2,
            "{}: same seed, different numbers",
            path.display()
        );
        for (&id, t) in g.outputs().iter().zip(&out) {
            assert_eq!(t.ty(), g.node(id).ty);
            assert!(
                t.to_f64_vec().iter().all(|v| v.is_finite()),
                "{}: non-finite output",
                path.display()
            );
        }
    }
}

#[test]
fn malformed_files_give_their_typed_error() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/bad_graphs");
    let manifest = std::fs::read_to_string(dir.join("EXPECTED")).unwrap();
    let mut checked = 0;
    for line in manifest
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let (file, kind) = line.split_once(' ').unwrap();
        let err = format::load(&dir.join(file))
            .err()
            .unwrap_or_else(|| panic!("{file} loaded without error"));
        assert_eq!(err.kind(), kind.trim(), "{file}: got {err}");
        assert!(!err.to_string().is_empty());
        checked += 1;
    }
    assert!(checked >= 15, "only {checked} malformed files");
    // Every file in the folder is listed, so none is silently skipped.
    let files = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "json")
        })
        .count();
    assert_eq!(files, checked);
}

#[test]
fn errors_name_the_node_the_op_and_the_shapes() {
    let mut g = Graph::new("e");
    let a = g.input("a", DType::F32, &[4, 3]).unwrap();
    let b = g.input("b", DType::F32, &[4, 3]).unwrap();
    let err = g
        .add_node(Some("scores"), rocmforge::ir::Op::MatMul, &[a, b])
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, GraphError::ShapeMismatch { .. }));
    for part in ["scores", "matmul", "[4, 3]"] {
        assert!(msg.contains(part), "`{msg}` does not mention {part}");
    }
    let bad = g
        .add_node(Some("n"), rocmforge::ir::Op::MatMul, &[a])
        .unwrap_err();
    assert_eq!(bad.kind(), "arity");
}

#[test]
fn truncated_and_corrupted_files_never_panic() {
    use rand::Rng;
    let mut r = common::rng(11);
    for path in graph_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        let bytes = text.as_bytes();
        for cut in (0..bytes.len()).step_by(97) {
            let _ = format::from_json_str(&String::from_utf8_lossy(&bytes[..cut]));
        }
        for _ in 0..200 {
            let mut b = bytes.to_vec();
            for _ in 0..3 {
                let i = r.random_range(0..b.len());
                b[i] = b"0123456789-[]{}\",:aez "[r.random_range(0..22)];
            }
            if let Ok(g) = format::from_json_str(&String::from_utf8_lossy(&b)) {
                g.validate().unwrap();
            }
        }
    }
}

#[test]
fn text_form_and_dot_show_every_node() {
    let g =
        format::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/attention.json")).unwrap();
    let text = ir::to_text(&g).unwrap();
    assert!(text.contains("%out = matmul(%softmax_"), "{text}");
    assert!(text.contains("softmax[axis=-1]"));
    assert_eq!(text.lines().count(), g.node_count() + 2);
    let dot = ir::to_dot(&g).unwrap();
    assert!(dot.starts_with("digraph"));
    assert_eq!(dot.matches(" -> ").count(), 8, "{dot}");
}

// ---- deep graphs: no recursion proportional to depth, compile time linear ----------------

/// A chain of `n` ops over `x: f32[4]`. `Elementwise`: first a run of single-use products (the
/// shape activation recognition walks), then unary and binary ops; every inner value has one
/// use, so everything fuses. `Alternating`: tanh and softmax in turn, which never fuse.
#[derive(Clone, Copy)]
enum Chain {
    Elementwise,
    Alternating,
}

fn chain(n: usize, kind: Chain) -> Graph {
    let mut g = Graph::new("chain");
    let x = g.input("x", DType::F32, &[4]).unwrap();
    let c = g.scalar(0.999, DType::F32).unwrap();
    let mut prev = x;
    for i in 0..n {
        prev = match kind {
            Chain::Elementwise if i < n / 2 => {
                if i % 2 == 0 {
                    g.mul(prev, c).unwrap()
                } else {
                    g.mul(prev, x).unwrap()
                }
            }
            Chain::Elementwise => match i % 4 {
                0 => g.tanh(prev).unwrap(),
                1 => g.add(prev, x).unwrap(),
                2 => g.neg(prev).unwrap(),
                _ => g.sub(prev, c).unwrap(),
            },
            Chain::Alternating if i % 2 == 0 => g.tanh(prev).unwrap(),
            Chain::Alternating => g.softmax(prev, -1).unwrap(),
        };
    }
    g.add_output(prev).unwrap();
    g
}

/// The chain's length: a million nodes with `ROCMFORGE_LONG_TESTS=1`, else 250 000, which
/// still proves there is no recursion along the chain: a recursive walk that deep needs at
/// least 250 000 frames of 16 bytes or more (return address and a saved register), 4 MB, twice
/// the 2 MiB stack of a test thread. At a million this test took most of `tests/ir.rs`'s
/// 400 s in CI (its time grows linearly; the linear-growth tests bound the rest).
fn chain_length() -> usize {
    if std::env::var("ROCMFORGE_LONG_TESTS").is_ok_and(|v| v == "1") {
        1_000_000
    } else {
        250_000
    }
}

/// Everything that walks a graph, on a chain of [`chain_length`] nodes, in the default 2 MiB
/// stack of a test thread: validation, text, DOT, the file format both ways, the default
/// pipeline, `Graph::compile` on the CPU and a run of the result against the interpreter.
fn compile_a_million_node_chain(kind: Chain) {
    use rocmforge::compile::CompileOptions;
    use rocmforge::ir::Op;
    use rocmforge::runtime::Device;
    let g = chain(chain_length(), kind);
    g.validate().unwrap();
    assert_eq!(ir::to_text(&g).unwrap().lines().count(), g.node_count() + 2);
    assert!(ir::to_dot(&g).unwrap().len() > g.node_count());
    let text = format::to_json_string(&g).unwrap();
    assert_eq!(
        format::from_json_str(&text).unwrap().node_count(),
        g.node_count()
    );
    drop(text);
    let options = CompileOptions {
        progress: false,
        ..CompileOptions::default()
    };
    let compiled = Graph::compile_with(&g, &Device::cpu(), &options).unwrap();
    let fused = &compiled.graph;
    for id in fused.node_ids() {
        if let Op::FusedElementwise(e) = fused.op(id) {
            assert!(e.op_count() <= ir::expr::MAX_OPS, "{e}");
        }
    }
    assert!(ir::to_text(fused).unwrap().lines().count() > 2);
    let b = Bindings::random(&g, 1);
    let got = compiled.run(&b).unwrap().remove(0).to_f64_vec();
    let want = run(&g, &b).unwrap().remove(0).to_f64_vec();
    assert_eq!(got, want);
}

// One test for both chains, one after the other: each graph of a million nodes takes a few
// hundred MB in its several forms, and tests run in parallel.
#[test]
fn million_node_chains_compile_without_deep_recursion() {
    compile_a_million_node_chain(Chain::Elementwise);
    compile_a_million_node_chain(Chain::Alternating);
}

#[test]
fn fused_expressions_stop_at_the_documented_size() {
    use rocmforge::ir::expr::{MAX_INPUTS, MAX_OPS};
    use rocmforge::ir::Op;
    // 200 ops in a chain: groups of at most MAX_OPS, the same numbers as unfused.
    let g = chain(200, Chain::Elementwise);
    let (fused, _) = rocmforge::passes::optimize(&g).unwrap();
    let groups: Vec<usize> = fused
        .node_ids()
        .filter_map(|id| match fused.op(id) {
            Op::FusedElementwise(e) => Some(e.op_count()),
            _ => None,
        })
        .collect();
    assert_eq!(groups.iter().sum::<usize>(), 200);
    assert_eq!(groups.len(), 200usize.div_ceil(MAX_OPS), "{groups:?}");
    let b = Bindings::random(&g, 2);
    assert_eq!(run(&fused, &b).unwrap(), run(&g, &b).unwrap());
    // A sum of 40 distinct inputs: groups read at most MAX_INPUTS operands.
    let mut w = Graph::new("wide");
    let xs: Vec<_> = (0..40)
        .map(|i| w.input(&format!("x{i}"), DType::F32, &[3]).unwrap())
        .collect();
    let mut acc = xs[0];
    for &x in &xs[1..] {
        let t = w.tanh(x).unwrap();
        acc = w.add(acc, t).unwrap();
    }
    w.add_output(acc).unwrap();
    let (fused, _) = rocmforge::passes::optimize(&w).unwrap();
    let mut fused_nodes = 0;
    for id in fused.node_ids() {
        if let Op::FusedElementwise(e) = fused.op(id) {
            fused_nodes += 1;
            assert!(fused.operands(id).len() <= MAX_INPUTS, "{e}");
        }
    }
    assert!(fused_nodes >= 40 / MAX_INPUTS);
    let b = Bindings::random(&w, 3);
    assert_eq!(run(&fused, &b).unwrap(), run(&w, &b).unwrap());
}

/// A one-node graph file around `node` (a JSON object without `name`), with inputs `x` and `y`.
fn one_node(node: &str) -> Result<Graph, GraphError> {
    format::from_json_str(&format!(
        r#"{{"version": 1, "nodes": [
            {{"name": "x", "op": "input", "dtype": "f32", "shape": [2, 3]}},
            {{"name": "y", "op": "input", "dtype": "f32", "shape": [0, 3]}},
            {{"name": "n", {node}}}], "outputs": ["n"]}}"#
    ))
}

#[test]
fn fused_expressions_from_files_are_checked() {
    let deep = (0..65).fold(r#""$0""#.to_string(), |e, _| format!(r#"["neg", {e}]"#));
    let err = one_node(&format!(
        r#""op": "fused_elementwise", "inputs": ["x"], "expr": {deep}"#
    ));
    assert_eq!(err.unwrap_err().kind(), "bad_attribute");
    let wide = (1..17).fold(r#""$0""#.to_string(), |e, i| {
        format!(r#"["add", {e}, "${i}"]"#)
    });
    let inputs = vec![r#""x""#; 17].join(", ");
    let err = one_node(&format!(
        r#""op": "fused_elementwise", "inputs": [{inputs}], "expr": {wide}"#
    ));
    assert_eq!(err.unwrap_err().kind(), "bad_attribute");
    for bad_const in [
        r#"{"const": 3000000000, "dtype": "i32"}"#,
        r#"{"const": 0.5, "dtype": "i64"}"#,
    ] {
        let e = format!(r#"["add", ["cast", "i32", "$0"], {bad_const}]"#);
        let err = one_node(&format!(
            r#""op": "fused_elementwise", "inputs": ["x"], "expr": {e}"#
        ));
        assert_eq!(err.unwrap_err().kind(), "bad_attribute", "{bad_const}");
    }
    // An f16 constant holds its f16 value, on every path.
    let e = r#"["mul", ["cast", "f16", "$0"], {"const": 0.1, "dtype": "f16"}]"#;
    let g = one_node(&format!(
        r#""op": "fused_elementwise", "inputs": ["x"], "expr": {e}"#
    ))
    .unwrap();
    let id = g.find("n").unwrap();
    let ir::Op::FusedElementwise(ir::Expr::Binary(_, _, c)) = g.op(id) else {
        panic!("{:?}", g.op(id))
    };
    assert_eq!(
        **c,
        ir::Expr::Const(f64::from(half::f16::from_f32(0.1).to_f32()), DType::F16)
    );
}

// ---- integer arithmetic on user values ---------------------------------------------------

#[test]
fn attributes_near_the_integer_limits_are_typed_errors() {
    let min = i64::MIN;
    let max = i64::MAX;
    for (node, kind) in [
        (format!(r#""op": "softmax", "inputs": ["x"], "axis": {min}"#), "bad_attribute"),
        (format!(r#""op": "softmax", "inputs": ["x"], "axis": {max}"#), "bad_attribute"),
        (format!(r#""op": "reduce_sum", "inputs": ["x"], "axes": [{min}]"#), "bad_attribute"),
        (format!(r#""op": "concat", "inputs": ["x", "x"], "axis": {min}"#), "bad_attribute"),
        (format!(r#""op": "slice", "inputs": ["x"], "axis": 1, "start": {min}, "end": {max}"#), "bad_attribute"),
        (format!(r#""op": "slice", "inputs": ["x"], "axis": -1, "start": -1, "end": {min}"#), "bad_attribute"),
        (format!(r#""op": "reshape", "inputs": ["x"], "shape": [{max}, 4]"#), "overflow"),
        (r#""op": "reshape", "inputs": ["y"], "shape": [-1, 0]"#.to_string(), "shape_mismatch"),
        // A zero makes the product zero, whatever the other dimensions: no overflow, no match.
        (r#""op": "reshape", "inputs": ["x"], "shape": [4611686018427387904, 4, 0]"#.to_string(), "shape_mismatch"),
        (r#""op": "input", "dtype": "f32", "shape": [0, 9223372036854775808]"#.to_string(), "overflow"),
        (r#""op": "input", "dtype": "bool", "shape": [0, 1099511627776, 1099511627776]"#.to_string(), "overflow"),
        (r#""op": "causal_mask", "sq": 1099511627776, "sk": 1099511627776"#.to_string(), "overflow"),
        // Values a constant of its dtype cannot hold, instead of a silent wrap or rounding.
        (r#""op": "constant", "dtype": "i64", "value": 9007199254740993"#.to_string(), "bad_attribute"),
        (r#""op": "constant", "dtype": "i64", "value": 18446744073709551615"#.to_string(), "bad_attribute"),
        (r#""op": "constant", "dtype": "i64", "value": 9223372036854775808"#.to_string(), "bad_attribute"),
        (r#""op": "constant", "dtype": "i32", "value": 3000000000"#.to_string(), "bad_attribute"),
        (r##""op": "constant", "dtype": "i32", "value": "nan""##.to_string(), "bad_attribute"),
        (r#""op": "constant", "dtype": "bool", "value": 0.5"#.to_string(), "bad_attribute"),
        // Sampling ranges that are empty or leave the dtype.
        (r#""op": "input", "dtype": "i32", "shape": [4], "sample": {"range": {"low": 0, "high": 1099511627776}}"#.to_string(), "bad_attribute"),
        (format!(r#""op": "input", "dtype": "i64", "shape": [4], "sample": {{"range": {{"low": {max}, "high": {max}}}}}"#), "bad_attribute"),
        (r#""op": "input", "dtype": "i64", "shape": [4], "sample": {"range": {"low": 5, "high": 2}}"#.to_string(), "bad_attribute"),
        (r#""op": "input", "dtype": "f32", "shape": [4], "sample": {"range": {"low": 9007199254740992, "high": 9007199254740993}}"#.to_string(), "bad_attribute"),
        (r#""op": "input", "dtype": "bool", "shape": [4], "sample": {"range": {"low": 0, "high": 3}}"#.to_string(), "bad_attribute"),
    ] {
        let err = one_node(&node).map(|_| ()).unwrap_err();
        assert_eq!(err.kind(), kind, "{node}: {err}");
    }
    // Exact results at the limits.
    let ok = one_node(&format!(
        r#""op": "constant", "dtype": "i64", "value": {min}"#
    ))
    .unwrap();
    let out = run(&ok, &Bindings::random(&ok, 0)).unwrap();
    assert_eq!(out[0].as_i64().unwrap(), &[min]);
    let full = format!(
        r#""op": "input", "dtype": "i64", "shape": [64], "sample": {{"range": {{"low": {min}, "high": {max}}}}}"#
    );
    let g = one_node(&full).unwrap();
    let b = Bindings::random(&g, 7);
    assert!(b.inputs["n"].as_i64().unwrap().iter().any(|&v| v > 1 << 53));
    let small = one_node(r#""op": "input", "dtype": "i32", "shape": [256], "sample": {"range": {"low": -2147483648, "high": -2147483646}}"#).unwrap();
    let b = Bindings::random(&small, 7);
    assert!(b.inputs["n"]
        .as_i64()
        .unwrap()
        .iter()
        .all(|&v| v == -2147483648 || v == -2147483647));
}

#[test]
fn declared_huge_tensors_get_typed_errors_not_allocation_aborts() {
    use rocmforge::compile::{CompileError, CompileOptions};
    use rocmforge::interp::InterpError;
    use rocmforge::ir::TensorError;
    use rocmforge::runtime::Device;
    let too_large = |e: &InterpError| {
        matches!(
            e,
            InterpError::Host {
                source: TensorError::TooLarge { .. },
                ..
            }
        )
    };
    let huge = 1usize << 40;
    // An input: drawing random data for it, and running.
    let mut g = Graph::new("huge_input");
    let x = g.input("x", DType::F32, &[huge]).unwrap();
    let n = g.neg(x).unwrap();
    g.add_output(n).unwrap();
    let err = Bindings::try_random(&g, 0).unwrap_err();
    assert!(too_large(&err), "{err}");
    assert!(
        err.to_string().contains("`x`") && err.to_string().contains("MAX_HOST_ELEMENTS"),
        "{err}"
    );
    let err = run(&g, &Bindings::random(&g, 0)).unwrap_err();
    assert!(too_large(&err), "{err}");
    // A weight, a splat constant and an expand: the interpreter and Graph::compile on the CPU.
    let mut w = Graph::new("huge_weight");
    let p = w.weight("p", DType::F16, &[huge]).unwrap();
    w.add_output(p).unwrap();
    let mut c = Graph::new("huge_constant");
    let k = c
        .constant(DType::F32, &[1 << 20, 1 << 20], vec![1.0])
        .unwrap();
    c.add_output(k).unwrap();
    let mut e = Graph::new("huge_expand");
    let one = e.input("one", DType::F32, &[1]).unwrap();
    let big = e.expand(one, &[huge]).unwrap();
    let s = e
        .reduce(rocmforge::ir::ReduceOp::Sum, big, &[0], false)
        .unwrap();
    e.add_output(s).unwrap();
    for g in [&w, &c, &e] {
        let err = run(g, &Bindings::random(g, 0)).unwrap_err();
        assert!(too_large(&err), "{}: {err}", g.name);
    }
    let options = CompileOptions {
        progress: false,
        ..CompileOptions::default()
    };
    match Graph::compile_with(&w, &Device::cpu(), &options) {
        Err(CompileError::Interp(err)) => assert!(too_large(&err), "{err}"),
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("compiled a 2^40-element weight"),
    }
    // The allocation itself is fallible below the limit too.
    let err = rocmforge::ir::try_collect(usize::MAX / 2, std::iter::empty::<f32>()).unwrap_err();
    assert!(matches!(err, TensorError::OutOfMemory { .. }));
}

#[test]
fn edits_rewrite_exactly_the_operand_slots_that_read_a_value() {
    use rocmforge::passes::{CommonSubexpressions, PassManager};
    // A concat of 3000 products of which every third is a duplicate: CSE rewrites those slots
    // (and only those) of one wide node.
    let mut g = Graph::new("wide_concat");
    let x = g.input("x", DType::F32, &[1]).unwrap();
    let cs: Vec<_> = (0..3)
        .map(|i| g.scalar(f64::from(i) + 2.0, DType::F32).unwrap())
        .collect();
    let parts: Vec<_> = (0..3000).map(|i| g.mul(x, cs[i % 3]).unwrap()).collect();
    let cat = g.concat(&parts, 0).unwrap();
    let twice = g.concat(&[parts[0], parts[0], parts[1]], 0).unwrap();
    g.set_outputs(&[cat, twice]).unwrap();
    let mut merged = g.clone();
    PassManager::new()
        .with(CommonSubexpressions)
        .run(&mut merged)
        .unwrap();
    assert_eq!(merged.node_count(), 1 + 3 + 3 + 2);
    let cat_id = merged.outputs()[0];
    assert_eq!(merged.operands(cat_id).len(), 3000);
    assert_eq!(merged.consumers(merged.operands(cat_id)[0]).len(), 2);
    assert_eq!(merged.use_count(merged.operands(cat_id)[0]), 1000 + 2);
    let b = Bindings::random(&g, 4);
    assert_eq!(run(&merged, &b).unwrap(), run(&g, &b).unwrap());
    // Removing a node that is still read leaves a typed error for validation, not a panic.
    let mut broken = g.clone();
    broken.remove_node(parts[5]);
    assert_eq!(broken.validate().unwrap_err().kind(), "dangling_input");
}

// The op names come from one list (`OpKind`), so the parser, the unknown-op message and the
// fuzzer's vocabulary agree. Each listed name is accepted by the parser (with no attributes it
// is either an op or a missing-attribute error, never "unknown op"); near misses of every name
// that are not themselves listed are unknown; every op of every kind, parsed back from its
// own name and attributes, is that op.
#[test]
fn the_op_name_list_is_exactly_what_the_parser_accepts() {
    use rocmforge::ir::op::OpParseError;
    use rocmforge::ir::{Op, OpKind};
    use serde_json::Map;
    let names = Op::all_names();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len(), "a name is listed twice");
    for must in [
        "gemm",
        "fused_elementwise",
        "flash_attention",
        "add",
        "reduce_mean",
    ] {
        assert!(names.contains(&must), "{must} is not listed");
    }
    for kind in OpKind::ALL {
        assert!(!kind.names().is_empty(), "{kind:?} has no name");
        for name in kind.names() {
            assert_eq!(OpKind::from_name(name), Some(kind));
        }
    }
    let empty = Map::new();
    for name in &names {
        match Op::parse(name, &empty) {
            Ok(op) => assert_eq!(op.name(), *name),
            Err(OpParseError::Attribute(_)) => {}
            Err(OpParseError::UnknownOp) => panic!("`{name}` is listed but not parsed"),
        }
        let near = [
            name.to_uppercase(),
            format!("{name}s"),
            format!(" {name}"),
            name[..name.len() - 1].to_string(),
        ];
        for miss in near.iter().filter(|m| !names.contains(&m.as_str())) {
            assert_eq!(
                Op::parse(miss, &empty),
                Err(OpParseError::UnknownOp),
                "`{miss}` is not listed but parsed"
            );
        }
    }
    // Every op the example graphs hold, before and after the default pipeline (which makes
    // gemm, fused_elementwise and flash_attention), round-trips through its name.
    let mut seen = std::collections::BTreeSet::new();
    for path in graph_files() {
        let g = format::load(&path).unwrap();
        let (fused, _) = rocmforge::passes::optimize(&g).unwrap();
        for graph in [&g, &fused] {
            for id in graph.node_ids() {
                let op = graph.op(id);
                assert!(op.kind().names().contains(&op.name()), "{op}");
                let attrs: Map<String, serde_json::Value> = op
                    .attrs()
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect();
                assert_eq!(&Op::parse(op.name(), &attrs).unwrap(), op);
                seen.insert(op.name());
            }
        }
    }
    assert!(seen.contains("gemm") && seen.contains("fused_elementwise"));
}

// The unknown-op error lists every name, gemm included.
#[test]
fn the_unknown_op_error_lists_every_op() {
    let text = r#"{"format": "rocmforge-graph", "version": 1, "nodes": [
        {"name": "x", "op": "input", "dtype": "f32", "shape": [2]},
        {"name": "y", "op": "gemmm", "inputs": ["x"]}], "outputs": ["y"]}"#;
    match format::from_json_str(text) {
        Err(GraphError::UnknownOp { known, .. }) => {
            let listed: Vec<&str> = known.split(", ").collect();
            assert_eq!(listed, rocmforge::ir::Op::all_names());
            assert!(listed.contains(&"gemm"));
        }
        other => panic!("expected unknown_op, got {other:?}"),
    }
}

/// The `ir` files each file imports through `use super::…` (a name re-exported by `ir/mod.rs`
/// counts as the file that defines it).
fn ir_imports() -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/ir");
    let files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs") && !p.ends_with("mod.rs"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    let words = |s: &str| -> Vec<String> {
        s.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect()
    };
    // `pub use file::{A, B};` in mod.rs: which file defines each re-exported name.
    let module = std::fs::read_to_string(dir.join("mod.rs")).unwrap();
    let mut owner = std::collections::BTreeMap::new();
    for stmt in module.split(';') {
        if let Some(rest) = stmt.trim().strip_prefix("pub use ") {
            let (file, names) = rest.split_once("::").unwrap();
            for name in words(names) {
                owner.insert(name, file.to_string());
            }
        }
    }
    let mut edges = std::collections::BTreeMap::new();
    for f in &files {
        let text = std::fs::read_to_string(dir.join(format!("{f}.rs"))).unwrap();
        // Unit tests may import anything of the module they test.
        let code: String = text
            .split("#[cfg(test)]")
            .next()
            .unwrap()
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            !code.contains("crate::ir"),
            "{f}.rs: import siblings through super::"
        );
        let mut to = std::collections::BTreeSet::new();
        for (i, _) in code.match_indices("super::") {
            let path = words(&code[i + "super::".len()..])
                .into_iter()
                .next()
                .unwrap_or_default();
            // `use super::{A, b::C}` lists several; a path names one.
            let names = if code[i + "super::".len()..].starts_with('{') {
                let body = &code[i + "super::{".len()..];
                words(&body[..body.find('}').unwrap()])
            } else {
                vec![path]
            };
            for name in names {
                let head = name.split("::").next().unwrap().to_string();
                let file = if files.contains(&head) {
                    Some(head)
                } else {
                    owner.get(&head).cloned()
                };
                if let Some(file) = file.filter(|file| file != f) {
                    to.insert(file);
                }
            }
        }
        edges.insert(f.clone(), to);
    }
    edges
}

// No file of `ir` imports itself back through others (op → expr → infer → op and op → quant →
// random → op were such circles): the files form layers. Checked by depth-first search.
#[test]
fn ir_files_import_each_other_without_circles() {
    let edges = ir_imports();
    assert!(edges["op"].contains("expr") && edges["values"].contains("dtype"));
    fn visit(
        f: &str,
        edges: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut std::collections::BTreeSet<String>,
    ) {
        if let Some(at) = path.iter().position(|p| p == f) {
            panic!("import circle: {} → {f}", path[at..].join(" → "));
        }
        if done.contains(f) {
            return;
        }
        path.push(f.to_string());
        for to in &edges[f] {
            visit(to, edges, path, done);
        }
        path.pop();
        done.insert(f.to_string());
    }
    let mut done = std::collections::BTreeSet::new();
    for f in edges.keys() {
        visit(f, &edges, &mut Vec::new(), &mut done);
    }
}
