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
