//! Small graphs that together use every op in every dtype it supports, for checks that must
//! cover all of codegen, not just the example models.
#![allow(dead_code)]

use rocmforge::ir::{BinaryOp, DType, Graph, NodeId, ReduceOp, Sample, UnaryOp};

const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

fn out(g: &mut Graph, ids: &[NodeId]) {
    g.set_outputs(ids).unwrap();
}

pub fn zoo() -> Vec<Graph> {
    let mut graphs = Vec::new();
    for dt in FLOATS {
        let mut g = Graph::new(format!("elementwise_{dt}"));
        let x = g.input("x", dt, &[3, 17]).unwrap();
        let y = g.input("y", dt, &[17]).unwrap();
        let mut outs = Vec::new();
        for u in UnaryOp::ALL {
            outs.push(g.unary(u, x).unwrap());
        }
        for b in BinaryOp::ALL {
            outs.push(g.binary(b, x, y).unwrap());
        }
        let c = g.less(x, y).unwrap();
        outs.push(g.where_(c, x, y).unwrap());
        for to in DType::ALL {
            outs.push(g.cast(x, to).unwrap());
        }
        out(&mut g, &outs);
        graphs.push(g);

        let mut g = Graph::new(format!("layout_{dt}"));
        let x = g.input("x", dt, &[2, 3, 5]).unwrap();
        let p = g.permute(x, &[2, 0, 1]).unwrap();
        let e = g.expand(x, &[4, 2, 3, 5]).unwrap();
        let s = g.slice(x, 2, 1, -1).unwrap();
        let cc = g.concat(&[x, x], 1).unwrap();
        let r = g.reshape(x, &[6, 5]).unwrap();
        let table = g.weight("table", dt, &[11, 7]).unwrap();
        let i32s = g
            .input_sampled(
                "ids32",
                DType::I32,
                &[2, 3],
                Sample::Range { low: 0, high: 11 },
            )
            .unwrap();
        let i64s = g
            .input_sampled(
                "ids64",
                DType::I64,
                &[4],
                Sample::Range { low: 0, high: 11 },
            )
            .unwrap();
        let g1 = g.gather(table, i32s).unwrap();
        let g2 = g.gather(table, i64s).unwrap();
        out(&mut g, &[p, e, s, cc, r, g1, g2]);
        graphs.push(g);

        let mut g = Graph::new(format!("reduce_norm_{dt}"));
        let x = g.input("x", dt, &[3, 4, 33]).unwrap();
        let mut outs = Vec::new();
        for op in ReduceOp::ALL {
            outs.push(g.reduce(op, x, &[-1], true).unwrap());
            outs.push(g.reduce(op, x, &[0, 2], false).unwrap());
        }
        outs.push(g.softmax(x, -1).unwrap());
        outs.push(g.softmax(x, 1).unwrap());
        let w = g.weight("w", dt, &[33]).unwrap();
        let b = g.weight("b", dt, &[33]).unwrap();
        outs.push(g.layer_norm(x, w, b, 1e-5).unwrap());
        outs.push(g.rms_norm(x, w, 1e-6).unwrap());
        let rx = g.input("rx", dt, &[1, 2, 9, 16]).unwrap();
        outs.push(g.rope(rx, 10000.0, 3).unwrap());
        out(&mut g, &outs);
        graphs.push(g);

        let mut g = Graph::new(format!("matmul_{dt}"));
        let a = g.input("a", dt, &[2, 1, 17, 33]).unwrap();
        let bm = g.input("b", dt, &[3, 33, 9]).unwrap();
        let bias = g.input("bias", dt, &[9]).unwrap();
        let mm = g.matmul(a, bm).unwrap();
        let y = g.add(mm, bias).unwrap();
        let y = g.gelu(y).unwrap();
        let mm2 = g.matmul(a, bm).unwrap();
        out(&mut g, &[y, mm2]);
        graphs.push(g);

        for (d, dv, hq, hkv, causal, mask) in [
            (128usize, 128usize, 4usize, 2usize, Some(5i64), "bool"),
            (64, 32, 3, 1, None, "additive"),
            (16, 16, 2, 2, Some(-2), "none"),
            (1, 1, 1, 1, None, "none"),
        ] {
            let mut g = Graph::new(format!("flash_{dt}_d{d}_{mask}"));
            let q = g.input("q", dt, &[2, hq, 7, d]).unwrap();
            let k = g.input("k", dt, &[2, hkv, 11, d]).unwrap();
            let v = g.input("v", dt, &[2, hkv, 11, dv]).unwrap();
            let m = match mask {
                "bool" => Some(g.input("m", DType::Bool, &[2, 1, 7, 11]).unwrap()),
                "additive" => Some(g.input("m", dt, &[11]).unwrap()),
                _ => None,
            };
            let o = g.flash_attention(q, k, v, m, 0.25, causal).unwrap();
            out(&mut g, &[o]);
            graphs.push(g);
        }
    }
    for dt in FLOATS {
        // State ops: a cache write at a drawn start, rope at drawn positions, attention over a
        // drawn number of valid keys of the written cache, argmax.
        let mut g = Graph::new(format!("state_{dt}"));
        let cache = g.state("cache", dt, &[2, 3, 13, 16]).unwrap();
        let vals = g.input("vals", dt, &[2, 3, 2, 16]).unwrap();
        let range = |low, high| Sample::Range { low, high };
        let start = g
            .input_sampled("start", DType::I32, &[1], range(0, 12))
            .unwrap();
        let written = g.cache_write(cache, vals, start, 2).unwrap();
        let q = g.input("q", dt, &[2, 6, 2, 16]).unwrap();
        let pos = g
            .input_sampled("pos", DType::I32, &[2], range(0, 100))
            .unwrap();
        let qr = g.rope_at(q, pos, 10000.0).unwrap();
        let kv_len = g
            .input_sampled("kv_len", DType::I32, &[2], range(1, 14))
            .unwrap();
        let o = g
            .flash_attention_len((qr, written, written), kv_len, 0.25, true)
            .unwrap();
        let x = g.input("x", dt, &[3, 33]).unwrap();
        let am = g.argmax(x, -1).unwrap();
        let am0 = g.argmax(x, 0).unwrap();
        out(&mut g, &[o, am, am0, written]);
        graphs.push(g);
    }
    for dt in [DType::I32, DType::I64] {
        let mut g = Graph::new(format!("integers_{dt}"));
        let x = g.input("x", dt, &[5, 3]).unwrap();
        let y = g.input("y", dt, &[3]).unwrap();
        let mut outs = vec![g.neg(x).unwrap(), g.abs(x).unwrap()];
        for b in [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Maximum,
            BinaryOp::Minimum,
            BinaryOp::Equal,
            BinaryOp::Less,
            BinaryOp::Greater,
        ] {
            outs.push(g.binary(b, x, y).unwrap());
        }
        for to in DType::ALL {
            outs.push(g.cast(x, to).unwrap());
        }
        let m = g.causal_mask(4, 6, -1).unwrap();
        let bb = g.input("flags", DType::Bool, &[4, 6]).unwrap();
        outs.push(g.equal(m, bb).unwrap());
        outs.push(g.cast(bb, DType::F16).unwrap());
        out(&mut g, &outs);
        graphs.push(g);
    }
    // Outputs whose every axis has size 1, fed by broadcast scalars: the kernels still declare
    // the broadcast operands' offsets (MiniLM's pooled count at batch 1 once did not compile).
    let mut g = Graph::new("single_element_broadcast");
    let x = g.input("x", DType::F32, &[1, 1]).unwrap();
    let floor = g.weight("floor", DType::F32, &[]).unwrap();
    let a = g.input("a", DType::F32, &[1, 1, 4]).unwrap();
    let w = g.weight("w", DType::F32, &[4, 1]).unwrap();
    let mm = g.matmul(a, w).unwrap();
    let outs = vec![g.maximum(x, floor).unwrap(), g.add(mm, floor).unwrap()];
    out(&mut g, &outs);
    graphs.push(g);
    graphs
}

/// Names no kernel may be affected by: a line of C after a newline, a comment terminator and
/// code, a trailing backslash (which splices the next line into a `//` comment), quotes, a
/// NUL (which ends a C string), a carriage return, non-ASCII and Unicode line separators,
/// braces, and text that looks like an escape.
pub const HOSTILE_NAMES: [&str; 9] = [
    "x\n#define float double\n",
    "*/ asm(\"trap;\"); /*",
    "evil\\",
    "q\"'`$?\\n",
    "é名前\u{2028}\r",
    "a\0b",
    "}; __global__ void pwn() { //",
    "%0A#include <stdio.h>",
    "{{ entry }}{% raw %}",
];

/// `g` with the graph and every node renamed to hostile text (each name made unique by a
/// leading number, so a trailing backslash stays trailing).
pub fn with_hostile_names(g: &Graph) -> Graph {
    let mut h = g.clone();
    h.name = format!("{}{}", g.name, HOSTILE_NAMES[0]);
    for (i, id) in g.node_ids().enumerate() {
        let name = format!("{i}{}", HOSTILE_NAMES[i % HOSTILE_NAMES.len()]);
        h.rename(id, &name).unwrap();
    }
    h
}
