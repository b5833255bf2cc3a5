//! A bundle replayed by hand from its files alone, failed emits that leave nothing behind, and
//! hostile names kept as data.

use super::*;

/// Pointwise kernels only (the host can run them one thread at a time), odd sizes, three dtypes
/// and a gather with its index check.
fn pointwise_graph() -> Graph {
    let mut g = Graph::new("pointwise");
    let x = g.input("x", DType::F32, &[3, 17]).unwrap();
    let y = g.input("y", DType::F16, &[17]).unwrap();
    let e = g.unary(UnaryOp::Exp, x).unwrap();
    let yf = g.cast(y, DType::F32).unwrap();
    let a = g.binary(BinaryOp::Add, e, yf).unwrap();
    let p = g.permute(a, &[1, 0]).unwrap();
    let r = g.reduce(ReduceOp::Sum, p, &[1], false).unwrap();
    let table = g.weight("table", DType::F16, &[11, 7]).unwrap();
    let idx = g
        .input_sampled(
            "idx",
            DType::I32,
            &[2, 3],
            Sample::Range { low: 0, high: 11 },
        )
        .unwrap();
    let rows = g.gather(table, idx).unwrap();
    for o in [p, r, rows] {
        g.add_output(o).unwrap();
    }
    g
}

/// ‖got − want‖ / ‖want‖ over elements finite in both (absolute when want is zero); `None`
/// when NaN or ±inf differ in place: the bundle's compare rule, written from its README.
fn rule_error(got: &[f64], want: &[f64]) -> Option<f64> {
    let (mut num, mut den) = (0.0, 0.0);
    for (g, w) in got.iter().zip(want) {
        if g.is_finite() && w.is_finite() {
            num += (g - w) * (g - w);
            den += w * w;
        } else if !(g.is_nan() && w.is_nan() || g == w) {
            return None;
        }
    }
    Some(if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    })
}

/// A bundle replayed by hand from its files alone, as its README says, each kernel's source
/// compiled for the host (standing in for a simulator): every computed buffer must match
/// `expected/` under the bundle's own compare rule.
#[test]
fn a_bundle_replays_by_hand_from_its_files_alone() {
    let cxx = match host_kernels::host_cxx() {
        Ok(c) => c,
        Err(why) if std::env::var("ROCMFORGE_REQUIRE_HOST_CXX").is_ok_and(|v| v == "1") => {
            panic!("{why}")
        }
        Err(why) => return eprintln!("not run: {why}"),
    };
    let dir = scratch("by-hand");
    let options = EmitOptions {
        seed: 9,
        ..EmitOptions::default()
    };
    bundle::emit(
        &pointwise_graph(),
        &Target::parse("gfx90a").unwrap(),
        &dir,
        &options,
    )
    .unwrap();
    let opened = Bundle::open(&dir, u64::MAX).unwrap();
    opened.check().unwrap();
    let plan = opened.plan();
    let mut bufs: Vec<Vec<u8>> = plan
        .buffers
        .iter()
        .map(|b| match b.role {
            Role::Input | Role::Weight | Role::Constant | Role::State | Role::Quantized => {
                std::fs::read(dir.join(b.data.as_ref().unwrap())).unwrap()
            }
            // Zeroed, as the replay allocates them.
            Role::Status | Role::Counters => vec![0; b.bytes as usize],
            Role::Computed | Role::Output | Role::Workspace => vec![0xFF; b.bytes as usize],
        })
        .collect();
    for k in &plan.kernels {
        let source = std::fs::read_to_string(dir.join(&k.source)).unwrap();
        let args: Vec<usize> = k.args.iter().map(|a| a.buffer).collect();
        let launch = host_kernels::HostLaunch {
            entry: &k.entry,
            grid: k.grid,
            block: k.block,
            args: &args,
            offsets: vec![],
            cooperative: host_kernels::COOPERATIVE.contains(&k.family.as_str()),
        };
        host_kernels::run_source(&cxx, &source, launch, &mut bufs).unwrap();
    }
    assert!(!plan.checks.is_empty());
    for c in &plan.checks {
        assert_eq!(&bufs[c.status][..8], &[0; 8], "index check of {}", c.node);
    }
    let mut compared = 0;
    for b in plan.buffers.iter().filter(|b| b.role.is_computed()) {
        let ty = TensorType::new(b.dtype, b.shape.clone());
        let want = std::fs::read(dir.join(b.expected.as_ref().unwrap())).unwrap();
        let got = Tensor::from_bytes(&ty, &bufs[b.id]).unwrap().to_f64_vec();
        let want = Tensor::from_bytes(&ty, &want).unwrap().to_f64_vec();
        let err = rule_error(&got, &want).unwrap_or(f64::INFINITY);
        let tol = plan.compare.tolerances[&b.dtype];
        assert!(
            err <= tol,
            "buffer {} ({}): error {err:e} > {tol:e}",
            b.id,
            b.name
        );
        compared += 1;
    }
    assert!(compared >= 4, "{compared} computed buffers");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_emit_that_fails_leaves_no_half_written_bundle() {
    // Indices drawn past the table: the interpreter refuses them, naming the gather.
    let mut g = Graph::new("bad_indices");
    let table = g.weight("table", DType::F32, &[4, 3]).unwrap();
    let idx = g
        .input_sampled("idx", DType::I32, &[9], Sample::Range { low: 0, high: 40 })
        .unwrap();
    let rows = g.gather(table, idx).unwrap();
    g.add_output(rows).unwrap();
    let dir = scratch("failed");
    match bundle::emit(
        &g,
        &Target::parse("gfx90a").unwrap(),
        &dir,
        &EmitOptions::default(),
    ) {
        Err(BundleError::Compile(e)) => {
            assert!(e.to_string().contains("outside a table of 4 rows"), "{e}")
        }
        other => panic!("{:?}", other.map(|e| e.bytes)),
    }
    assert!(!dir.exists(), "the new directory is removed again");
    std::fs::create_dir_all(&dir).unwrap();
    assert!(bundle::emit(
        &g,
        &Target::parse("gfx90a").unwrap(),
        &dir,
        &EmitOptions::default()
    )
    .is_err());
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "an empty directory stays empty"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Every file name from ids and entries, every name in plan.json as data: hostile names come
/// back byte for byte from plan.json and appear nowhere raw in the README or the file tree,
/// and the kernels are the plain graph's.
#[test]
fn hostile_names_are_data_only() {
    let target = Target::parse("gfx90a").unwrap();
    for g in op_zoo::zoo().into_iter().take(3) {
        let h = op_zoo::with_hostile_names(&g);
        let (plain_dir, dir) = (scratch("plain"), scratch("hostile"));
        let plain = bundle::emit(&g, &target, &plain_dir, &EmitOptions::default()).unwrap();
        let hostile = bundle::emit(&h, &target, &dir, &EmitOptions::default()).unwrap();
        let entries = |p: &BundlePlan| {
            p.kernels
                .iter()
                .map(|k| k.entry.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(entries(&plain.plan), entries(&hostile.plan), "{}", g.name);
        let plan = read_plan(&dir);
        assert_eq!(plan.graph, h.name);
        for b in &plan.buffers {
            assert!(h.find(&b.name).is_some(), "{:?} is a node's name", b.name);
        }
        let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
        for name in op_zoo::HOSTILE_NAMES {
            assert!(!readme.contains(name), "README holds {name:?}");
        }
        for sub in ["kernels", "buffers", "expected"] {
            for e in std::fs::read_dir(dir.join(sub)).unwrap() {
                let f = e.unwrap().file_name().into_string().unwrap();
                assert!(
                    f.bytes()
                        .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'.'),
                    "{sub}/{f}"
                );
            }
        }
        Bundle::open(&dir, u64::MAX).unwrap().check().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&plain_dir).unwrap();
    }
}
