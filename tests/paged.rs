//! The paged KV cache (issue 26): `Op::PagedCacheWrite` and `Op::PagedAttention`.
//!
//! - the interpreter reads and writes through slots and block tables directly; here it is held
//!   against the contiguous ops (`CacheWrite`, `FlashAttention` over `kv_len`) on the same data
//!   gathered into contiguous caches (`common/paged_cases.rs`): B = 3, GQA, odd pool sizes,
//!   lengths that are not multiples of the block size, a prefix block shared by two sequences,
//!   every row no sequence reads NaN;
//! - its errors (a slot past the pool, a block id outside it, a length past the table) are
//!   typed and name the node; the shape rules refuse what does not fit;
//! - both ops save, load and print;
//! - the CPU device runs both (the write in place, the attention through the interpreter).

#[path = "common/accuracy.rs"]
mod accuracy;
#[path = "common/paged_cases.rs"]
mod paged_cases;

use std::collections::HashMap;

use accuracy::rel_l2;
use paged_cases::{cases, PagedCase};
use rocmforge::cpu::{CpuOptions, CpuPlan, Precision};
use rocmforge::interp::{self, Bindings, InterpError};
use rocmforge::ir::{format, DType, Graph, GraphError, Op, Tensor};

fn tolerance(dt: DType) -> f64 {
    match dt {
        DType::F16 => 2e-3,
        DType::BF16 => 1e-2,
        _ => 1e-6,
    }
}

fn states_of(data: &paged_cases::PagedData) -> HashMap<String, Tensor> {
    HashMap::from([
        ("k_pool".to_string(), data.k_pool.clone()),
        ("v_pool".to_string(), data.v_pool.clone()),
    ])
}

/// Paged attention over the written pools equals FlashAttention over the same rows gathered
/// into contiguous caches, for every case and seed; NaN in every row no sequence reads.
#[test]
fn paged_attention_equals_contiguous_attention_on_gathered_caches() {
    for case in cases() {
        for seed in 0..3 {
            let data = case.data(seed);
            let g = case.attention_graph(case.dtype);
            let got = interp::run(&g, &case.attention_bindings(&data))
                .unwrap()
                .remove(0);
            let want = case.reference(&data, case.dtype);
            assert_eq!(got.ty(), want.ty(), "{}", case.name());
            let e = rel_l2(&got, &want).unwrap();
            // The same f32 scores and f64 softmax in the same key order: equal but for the
            // order of the softmax sums (and the output's rounding to the dtype).
            assert!(
                e <= tolerance(case.dtype),
                "{} seed {seed}: {e}",
                case.name()
            );
        }
    }
}

/// One decode step through states: the written pools equal the pools written by plain loops,
/// each sequence's written rows equal a contiguous `CacheWrite` of its new rows into its
/// gathered cache, and the output equals the contiguous attention.
#[test]
fn a_paged_step_writes_and_attends_as_the_contiguous_ops() {
    for case in cases() {
        let data = case.data(7);
        let g = case.step_graph(case.dtype);
        let (out, next) = interp::run_with_state(
            &g,
            &case.step_bindings(&data),
            &HashMap::new(),
            &states_of(&data),
        )
        .unwrap();
        let (kp, vp) = case.written_pools(&data);
        for (name, want) in [("k_pool", &kp), ("v_pool", &vp)] {
            let got = &next[name];
            // Bit for bit, NaN rows included (a move of rows, nothing computed).
            let first_diff = got
                .as_f32()
                .unwrap()
                .iter()
                .zip(want.as_f32().unwrap())
                .position(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(
                first_diff,
                None,
                "{}: {name} after the step ({:?} vs {:?})",
                case.name(),
                first_diff.map(|i| got.as_f32().unwrap()[i]),
                first_diff.map(|i| want.as_f32().unwrap()[i]),
            );
        }
        // Sequence by sequence: the old cache gathered, then a contiguous cache write at the
        // sequence's start, equals the new pool gathered.
        for bi in 0..case.b {
            let one = PagedCase {
                b: 1,
                kv_len: vec![case.kv_len[bi]],
                ..case.clone()
            };
            let table = std::slice::from_ref(&data.tables[bi]);
            let len = case.kv_len[bi];
            let before = one.gather(&data.k_pool, table);
            let rows = slice_batch(&data.k_new, bi);
            let mut cw = Graph::new("contiguous_write");
            let st = cw
                .state("cache", case.dtype, before.shape().dims())
                .unwrap();
            let vals = cw.input("rows", case.dtype, rows.shape().dims()).unwrap();
            let start = cw.input("start", DType::I32, &[1]).unwrap();
            let w = cw.cache_write(st, vals, start, 2).unwrap();
            cw.set_outputs(&[w]).unwrap();
            let mut b = Bindings::default();
            b.inputs.insert("rows".into(), rows);
            let start = (len - case.s) as i64;
            b.inputs.insert(
                "start".into(),
                Tensor::from_i64(DType::I32, vec![1], vec![start]).unwrap(),
            );
            let states = HashMap::from([("cache".to_string(), nan_to_zero(&before))]);
            let (w, _) = interp::run_with_state(&cw, &b, &HashMap::new(), &states).unwrap();
            let after = one.gather(&next["k_pool"], table);
            assert_eq!(
                w[0].as_f32().unwrap(),
                after.as_f32().unwrap(),
                "{} sequence {bi}",
                case.name()
            );
        }
        let want = case.reference(&data, case.dtype);
        let e = rel_l2(&out[0], &want).unwrap();
        assert!(e <= tolerance(case.dtype), "{}: {e}", case.name());
    }
}

fn slice_batch(t: &Tensor, bi: usize) -> Tensor {
    let dims = t.shape().dims();
    let per: usize = dims[1..].iter().product();
    let v = t.as_f32().unwrap()[bi * per..][..per].to_vec();
    let mut shape = dims.to_vec();
    shape[0] = 1;
    Tensor::from_f32(t.dtype(), shape, v).unwrap()
}

fn nan_to_zero(t: &Tensor) -> Tensor {
    let v = t
        .as_f32()
        .unwrap()
        .iter()
        .map(|x| if x.is_nan() { 0.0 } else { *x });
    Tensor::from_f32(t.dtype(), t.shape().clone(), v.collect()).unwrap()
}

/// Queries that see no key (a length shorter than the step's queries) give zeros, as the
/// contiguous attention's safe softmax does; a length of zero reads no block at all, so its
/// table may be all -1.
#[test]
fn queries_that_see_no_key_give_zeros() {
    let case = PagedCase {
        s: 3,
        kv_len: vec![9, 11, 3],
        ..PagedCase::small(DType::F32)
    };
    let data = case.data(3);
    let g = case.attention_graph(DType::F32);
    let mut b = case.attention_bindings(&data);
    let mut table = data.table.as_i64().unwrap().to_vec();
    table[2 * case.max_blocks..]
        .iter_mut()
        .for_each(|x| *x = -1);
    b.inputs.insert(
        "table".into(),
        Tensor::from_i64(DType::I32, vec![case.b, case.max_blocks], table).unwrap(),
    );
    b.inputs.insert(
        "kv_len".into(),
        Tensor::from_i64(DType::I32, vec![3], vec![9, 1, 0]).unwrap(),
    );
    let out = interp::run(&g, &b).unwrap().remove(0);
    let o = out.as_f32().unwrap();
    let row = case.s * case.d;
    for h in 0..case.hq {
        // Sequence 1 (one key, three queries): the first two see nothing.
        let seq1 = &o[(case.hq + h) * row..][..row];
        assert!(seq1[..2 * case.d].iter().all(|&x| x == 0.0));
        assert!(seq1[2 * case.d..].iter().any(|&x| x != 0.0));
        // Sequence 2 (no keys): zeros.
        assert!(o[(2 * case.hq + h) * row..][..row]
            .iter()
            .all(|&x| x == 0.0));
    }
    assert!(o.iter().all(|x| x.is_finite()));
}

/// The run-time errors: typed, naming the node and the offending value; nothing written.
#[test]
fn bad_slots_blocks_and_lengths_are_typed_errors() {
    let case = PagedCase::small(DType::F32);
    let data = case.data(1);
    let capacity = case.num_blocks * case.block_size;

    // A slot one past the pool.
    let g = case.step_graph(DType::F32);
    let mut b = case.step_bindings(&data);
    b.inputs.insert(
        "slots".into(),
        Tensor::from_i64(DType::I32, vec![3, 1], vec![0, capacity as i64, -1]).unwrap(),
    );
    match interp::run_with_state(&g, &b, &HashMap::new(), &states_of(&data)) {
        Err(InterpError::PagedSlotOutOfRange { slot, slots, .. }) => {
            assert_eq!((slot, slots), (capacity as i64, capacity));
        }
        other => panic!("expected PagedSlotOutOfRange, got {other:?}"),
    }

    // A block id outside the pool among the blocks sequence 2 reads, then a negative one.
    let g = case.attention_graph(DType::F32);
    for bad in [case.num_blocks as i64, -1] {
        let mut b = case.attention_bindings(&data);
        let mut table = data.table.as_i64().unwrap().to_vec();
        table[2 * case.max_blocks + 1] = bad;
        b.inputs.insert(
            "table".into(),
            Tensor::from_i64(DType::I32, vec![case.b, case.max_blocks], table).unwrap(),
        );
        match interp::run(&g, &b) {
            Err(InterpError::PagedBlockOutOfRange {
                node,
                sequence,
                slot,
                block,
                blocks,
            }) => {
                assert_eq!(node, "out");
                assert_eq!(
                    (sequence, slot, block, blocks),
                    (2, 1, bad, case.num_blocks)
                );
            }
            other => panic!("expected PagedBlockOutOfRange, got {other:?}"),
        }
    }

    // A length past the table, and a negative one.
    let keys = case.max_blocks * case.block_size;
    for bad in [keys as i64 + 1, -1] {
        let mut b = case.attention_bindings(&data);
        b.inputs.insert(
            "kv_len".into(),
            Tensor::from_i64(DType::I32, vec![3], vec![7, bad, 5]).unwrap(),
        );
        match interp::run(&g, &b) {
            Err(InterpError::KvLenOutOfRange {
                kv_len, keys: k, ..
            }) => {
                assert_eq!((kv_len, k), (bad, keys));
            }
            other => panic!("expected KvLenOutOfRange, got {other:?}"),
        }
    }
}

/// Of two rows that name one slot the later stays; padding (-1) writes nothing.
#[test]
fn a_write_keeps_the_later_of_two_rows_and_skips_padding() {
    let mut g = Graph::new("w");
    let p = g.state("pool", DType::F32, &[3, 1, 2, 1]).unwrap();
    let v = g.input("v", DType::F32, &[2, 1, 2, 1]).unwrap();
    let s = g.input("s", DType::I32, &[2, 2]).unwrap();
    let w = g.paged_cache_write(p, v, s).unwrap();
    g.set_outputs(&[w]).unwrap();
    let mut b = Bindings::default();
    b.inputs.insert(
        "v".into(),
        Tensor::from_f32(DType::F32, vec![2, 1, 2, 1], vec![1.0, 2.0, 3.0, 4.0]).unwrap(),
    );
    b.inputs.insert(
        "s".into(),
        Tensor::from_i64(DType::I32, vec![2, 2], vec![5, -1, 0, 5]).unwrap(),
    );
    let pool = Tensor::from_f32(DType::F32, vec![3, 1, 2, 1], vec![9.0; 6]).unwrap();
    let states = HashMap::from([("pool".to_string(), pool)]);
    let (out, _) = interp::run_with_state(&g, &b, &HashMap::new(), &states).unwrap();
    assert_eq!(out[0].as_f32().unwrap(), &[3.0, 9.0, 9.0, 9.0, 9.0, 4.0]);
}

/// The shape rules refuse what does not fit, with the shapes in the message; a paged write
/// must write a state nothing else reads.
#[test]
fn shape_rules_refuse_what_does_not_fit() {
    let mut g = Graph::new("bad");
    let pool = g.input("pool", DType::F16, &[5, 2, 4, 8]).unwrap();
    let q = g.input("q", DType::F16, &[3, 5, 1, 8]).unwrap();
    let table = g.input("table", DType::I32, &[3, 4]).unwrap();
    let table2 = g.input("table2", DType::I32, &[2, 4]).unwrap();
    let lens = g.input("lens", DType::I32, &[3]).unwrap();
    let lens_f = g.input("lens_f", DType::F32, &[3]).unwrap();
    let vals = g.input("vals", DType::F16, &[3, 2, 1, 8]).unwrap();
    let vals32 = g.input("vals32", DType::F32, &[3, 2, 1, 8]).unwrap();
    let slots = g.input("slots", DType::I32, &[3, 1]).unwrap();
    let slots_bad = g.input("slots_bad", DType::I32, &[3, 2]).unwrap();
    // 5 query heads over 2 K/V heads.
    let e = g.paged_attention((q, pool, pool), table, lens, 0.5);
    assert!(e.unwrap_err().to_string().contains("multiple"));
    let q6 = g.input("q6", DType::F16, &[3, 6, 1, 8]).unwrap();
    let e = g.paged_attention((q6, pool, pool), table2, lens, 0.5);
    assert!(e.unwrap_err().to_string().contains("block table"));
    let e = g.paged_attention((q6, pool, pool), table, lens_f, 0.5);
    assert!(e.unwrap_err().to_string().contains("kv_len"));
    assert!(g
        .paged_attention((q6, pool, pool), table, lens, 0.5)
        .is_ok());
    let e = g.paged_cache_write(pool, vals32, slots);
    assert!(e.unwrap_err().to_string().contains("dtype"));
    let e = g.paged_cache_write(pool, vals, slots_bad);
    assert!(e.unwrap_err().to_string().contains("slots"));
    // Well typed, but its pool is an input, not a state.
    g.paged_cache_write(pool, vals, slots).unwrap();
    assert!(matches!(
        g.check_state_writes(),
        Err(GraphError::StateWrite { .. })
    ));
}

/// Both ops save, load and print; the attribute (scale) survives.
#[test]
fn both_ops_round_trip_through_the_file_format() {
    let case = PagedCase::small(DType::F16);
    let g = case.step_graph(DType::F16);
    let text = format::to_json_string(&g).unwrap();
    let back = format::from_json_str(&text).unwrap();
    assert_eq!(format::to_json_string(&back).unwrap(), text);
    let printed = rocmforge::ir::to_text(&back).unwrap();
    assert!(printed.contains("paged_cache_write"), "{printed}");
    assert!(printed.contains("paged_attention[scale=0.25]"), "{printed}");
    let att = back
        .node_ids()
        .into_iter()
        .find(|&id| matches!(back.op(id), Op::PagedAttention { .. }))
        .unwrap();
    assert_eq!(
        back.op(att),
        &Op::PagedAttention {
            scale: 0.25,
            window: None,
            append: None,
        }
    );
}

/// The CPU device runs a paged step as the interpreter does: the output, and both pools (in
/// place) bit for bit, over three steps that carry the pools.
#[test]
fn the_cpu_device_runs_paged_steps_as_the_interpreter() {
    let case = PagedCase::small(DType::F32);
    let g = case.step_graph(DType::F32);
    let opts = CpuOptions {
        threads: 2,
        precision: Precision::Exact,
    };
    let plan = CpuPlan::new(&g, &Bindings::default(), opts).unwrap();
    let mut s = plan.session().unwrap();
    let data = case.data(11);
    let mut states = states_of(&data);
    for (n, t) in &states {
        s.set_state(n, t).unwrap();
    }
    for step in 0..3u64 {
        // Fresh rows each step into the same slots (the sequences do not grow here: what is
        // checked is that the pools carry across runs as the interpreter's states do).
        let mut d = case.data(11);
        let fresh = case.data(100 + step);
        d.q = fresh.q;
        d.k_new = fresh.k_new;
        d.v_new = fresh.v_new;
        let b = case.step_bindings(&d);
        let (want, next) = interp::run_with_state(&g, &b, &HashMap::new(), &states).unwrap();
        s.set_inputs(&b).unwrap();
        s.run().unwrap();
        let got = s.outputs().unwrap();
        assert!(rel_l2(&got[0], &want[0]).unwrap() <= 1e-6, "step {step}");
        for (n, t) in &next {
            let st = s.state(n).unwrap();
            let same = st
                .as_f32()
                .unwrap()
                .iter()
                .zip(t.as_f32().unwrap())
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "state {n} after step {step}");
        }
        states = next;
    }
    // A slot past the pool is the interpreter's error on this device too.
    let mut b = case.step_bindings(&data);
    b.inputs.insert(
        "slots".into(),
        Tensor::from_i64(DType::I32, vec![3, 1], vec![0, 1000, -1]).unwrap(),
    );
    s.set_inputs(&b).unwrap();
    let e = s.run().unwrap_err().to_string();
    assert!(e.contains("slot 1000"), "{e}");
}

mod kv_blocks {
    //! The block pool (`serve::kv_blocks`): seeded random sequences of starts (half of them on
    //! a live sequence's prefix), appends, forks and frees over a small pool, with the pool's
    //! rows simulated: every slot an append gives is written with its token, every copy it asks
    //! for performed. After each operation the invariants hold (no block held and free, counts
    //! equal to the table entries holding each block) and every live sequence reads its own
    //! tokens back through its table — a block shared, copied or recycled wrongly shows there.

    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use rocmforge::serve::kv_blocks::{Appended, BlockPool, KvBlockError, SeqId};
    use std::collections::HashMap;

    struct Sim {
        pool: BlockPool,
        rows: Vec<Option<u32>>,
        want: HashMap<SeqId, Vec<u32>>,
    }

    impl Sim {
        fn apply(&mut self, a: &Appended, tokens: &[u32]) {
            let bs = self.pool.block_size();
            if let Some(c) = a.copy {
                for r in 0..c.rows {
                    self.rows[c.to as usize * bs + r] = self.rows[c.from as usize * bs + r];
                }
            }
            assert_eq!(a.slots.len(), tokens.len());
            for (&s, &t) in a.slots.iter().zip(tokens) {
                self.rows[s as usize] = Some(t);
            }
        }

        fn verify(&self) {
            self.pool.check().unwrap();
            let bs = self.pool.block_size();
            for (seq, want) in &self.want {
                let table = self.pool.table(*seq).unwrap();
                let got: Vec<Option<u32>> = (0..want.len())
                    .map(|j| self.rows[table[j / bs] as usize * bs + j % bs])
                    .collect();
                let want_rows: Vec<Option<u32>> = want.iter().map(|&t| Some(t)).collect();
                assert_eq!(got, want_rows, "sequence {seq}");
                assert_eq!(self.pool.tokens(*seq).unwrap(), want.as_slice());
            }
        }
    }

    /// Writes reserved sequence `seq`'s rows past its `cached` prefix in random chunks, each
    /// reported written; between two chunks, sequence `other` may start on the prompt's prefix
    /// and more: it must not share a block whose rows are not in yet (`verify` reads every
    /// live sequence's rows back). `seq` joins the live ones once all its rows are in.
    fn chunked(
        sim: &mut Sim,
        rng: &mut ChaCha8Rng,
        (seq, other): (SeqId, SeqId),
        prompt: &[u32],
        (cached, a): (usize, &Appended),
    ) {
        assert_eq!(a.copy, None, "a new sequence shares full blocks only");
        let mut done = cached;
        while done < prompt.len() {
            let c = rng.random_range(1..=prompt.len() - done);
            let rows = Appended {
                slots: a.slots[done - cached..done - cached + c].to_vec(),
                copy: None,
            };
            sim.apply(&rows, &prompt[done..done + c]);
            done += c;
            sim.pool.written(seq, done).unwrap();
            // An append waits for the prefill to end.
            if done < prompt.len() {
                assert_eq!(
                    sim.pool.append(seq, &[1]),
                    Err(KvBlockError::Unwritten(seq))
                );
            }
            if sim.pool.table(other).is_none() && rng.random_bool(0.3) {
                let mut p = prompt.to_vec();
                p.push(rng.random_range(0..50));
                if let Ok((k, b)) = sim.pool.start(other, &p) {
                    assert!(k <= done, "shared {k} rows, {done} written");
                    sim.apply(&b, &p[k..]);
                    sim.want.insert(other, p);
                }
            }
            sim.verify();
        }
        assert_eq!(
            sim.pool.written(seq, prompt.len() + 1),
            Err(KvBlockError::PastEnd {
                seq,
                upto: prompt.len() + 1,
                len: prompt.len()
            })
        );
        sim.want.insert(seq, prompt.to_vec());
    }

    fn run(seed: u64, num_blocks: usize, bs: usize) -> (usize, usize, usize) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut sim = Sim {
            pool: BlockPool::new(num_blocks, bs).unwrap(),
            rows: vec![None; num_blocks * bs],
            want: HashMap::new(),
        };
        let (mut shared, mut copies, mut preempted) = (0, 0, 0);
        let mut next: SeqId = 0;
        for _ in 0..400 {
            let live: Vec<SeqId> = {
                let mut v: Vec<SeqId> = sim.want.keys().copied().collect();
                v.sort_unstable();
                v
            };
            let pick = |rng: &mut ChaCha8Rng| live[rng.random_range(0..live.len())];
            let op = if live.is_empty() {
                0
            } else {
                rng.random_range(0..10)
            };
            let before = sim.pool.clone();
            let result = match op {
                0..=2 => {
                    let mut prompt: Vec<u32> = if !live.is_empty() && rng.random_bool(0.5) {
                        let p = &sim.want[&pick(&mut rng)];
                        p[..rng.random_range(0..=p.len())].to_vec()
                    } else {
                        Vec::new()
                    };
                    for _ in 0..rng.random_range(1..3 * bs) {
                        prompt.push(rng.random_range(0..50));
                    }
                    let seq = next;
                    next += 1;
                    if rng.random_bool(0.5) {
                        sim.pool.start(seq, &prompt).map(|(cached, a)| {
                            shared += cached;
                            copies += usize::from(a.copy.is_some());
                            // Only the tokens past the cached prefix are written: the prefix is
                            // read back from the shared blocks by the `verify` after this step.
                            sim.apply(&a, &prompt[cached..]);
                            sim.want.insert(seq, prompt);
                        })
                    } else {
                        sim.pool.reserve(seq, &prompt).map(|(cached, a)| {
                            shared += cached;
                            next += 1;
                            chunked(&mut sim, &mut rng, (seq, next - 1), &prompt, (cached, &a))
                        })
                    }
                }
                3..=6 => {
                    let seq = pick(&mut rng);
                    let tokens: Vec<u32> = (0..rng.random_range(1..=bs + 2))
                        .map(|_| rng.random_range(0..50))
                        .collect();
                    sim.pool.append(seq, &tokens).map(|a| {
                        copies += usize::from(a.copy.is_some());
                        sim.apply(&a, &tokens);
                        sim.want.get_mut(&seq).unwrap().extend(&tokens);
                    })
                }
                7 => {
                    let parent = pick(&mut rng);
                    let child = next;
                    next += 1;
                    sim.pool.fork(parent, child).map(|()| {
                        let t = sim.want[&parent].clone();
                        sim.want.insert(child, t);
                    })
                }
                _ => {
                    let seq = pick(&mut rng);
                    sim.pool.free(seq).map(|()| {
                        sim.want.remove(&seq);
                    })
                }
            };
            match result {
                Ok(()) => {}
                Err(KvBlockError::OutOfBlocks { needed, free }) => {
                    assert!(needed > free);
                    // Nothing changed: then the scheduler's preemption frees a sequence.
                    assert_eq!(format!("{:?}", sim.pool), format!("{before:?}"));
                    let victim = pick(&mut rng);
                    sim.pool.free(victim).unwrap();
                    sim.want.remove(&victim);
                    preempted += 1;
                }
                Err(e) => panic!("seed {seed}: {e}"),
            }
            sim.verify();
        }
        let live: Vec<SeqId> = sim.want.keys().copied().collect();
        for seq in live {
            sim.pool.free(seq).unwrap();
            sim.want.remove(&seq);
            sim.verify();
        }
        assert_eq!(sim.pool.free_blocks(), num_blocks, "seed {seed}");
        (shared, copies, preempted)
    }

    /// Many seeds and pool shapes; across them prefixes were shared, partial blocks copied and
    /// sequences preempted (so each path ran).
    #[test]
    fn random_operations_keep_the_pool_consistent() {
        let (mut shared, mut copies, mut preempted) = (0, 0, 0);
        for seed in 0..40 {
            let (bs, n) = [(1, 23), (4, 17), (16, 9), (3, 31)][seed as usize % 4];
            let (s, c, p) = run(seed, n, bs);
            shared += s;
            copies += c;
            preempted += p;
        }
        assert!(
            shared > 0 && copies > 0 && preempted > 0,
            "{shared} {copies} {preempted}"
        );
    }

    /// By hand: two prompts with two full blocks in common share them; the block with the last
    /// prompt token is never taken from the cache; a fork copies the partial block on its first
    /// append, and the original keeps writing into its own.
    #[test]
    fn prefix_sharing_and_copy_on_write_by_hand() {
        let mut p = BlockPool::new(10, 4).unwrap();
        let prompt: Vec<u32> = (0..10).collect();
        let (cached, a) = p.start(1, &prompt).unwrap();
        assert_eq!((cached, a.slots.len(), a.copy), (0, 10, None));
        let t1 = p.table(1).unwrap().to_vec();
        let mut other = prompt[..8].to_vec();
        other.extend([77, 78]);
        let (cached, a) = p.start(2, &other).unwrap();
        assert_eq!(cached, 8);
        assert_eq!(a.slots.len(), 2);
        let t2 = p.table(2).unwrap().to_vec();
        assert_eq!(t2[..2], t1[..2]);
        assert_ne!(t2[2], t1[2]);
        assert_eq!((p.refcount(t1[0]), p.refcount(t1[2])), (2, 1));
        // Exactly two full blocks: the second holds the last token, so only one is shared.
        let (cached, _) = p.start(3, &prompt[..8]).unwrap();
        assert_eq!(cached, 4);
        // Fork 1 (10 tokens: the third block holds 2) and append to the child.
        p.fork(1, 4).unwrap();
        assert_eq!(p.refcount(t1[2]), 2);
        let a = p.append(4, &[5]).unwrap();
        let copy = a.copy.unwrap();
        assert_eq!((copy.from, copy.rows), (t1[2], 2));
        assert_eq!(a.slots, vec![(copy.to * 4 + 2) as i32]);
        assert_eq!(p.refcount(t1[2]), 1);
        // The parent's own block is no longer shared: no copy.
        assert_eq!(p.append(1, &[6]).unwrap().copy, None);
        for s in [1, 2, 3, 4] {
            p.free(s).unwrap();
            p.check().unwrap();
        }
        assert_eq!(p.free_blocks(), 10);
        assert_eq!(p.free(1), Err(KvBlockError::UnknownSequence(1)));
        assert_eq!(
            p.start(5, &[0; 41]).unwrap_err(),
            KvBlockError::OutOfBlocks {
                needed: 11,
                free: 10
            }
        );
        assert!(p.table(5).is_none());
        // A reserved prompt's blocks are shared only once their rows are written.
        let (cached, a) = p.reserve(6, &prompt).unwrap();
        assert_eq!((cached, a.slots.len()), (0, 10));
        assert_eq!(p.start(7, &prompt).unwrap().0, 0);
        p.free(7).unwrap();
        p.written(6, 6).unwrap();
        assert_eq!(p.start(7, &prompt).unwrap().0, 4);
        p.free(7).unwrap();
        p.written(6, 10).unwrap();
        assert_eq!(p.start(7, &prompt).unwrap().0, 8);
        for s in [6, 7] {
            p.free(s).unwrap();
            p.check().unwrap();
        }
        assert_eq!(p.free_blocks(), 10);
    }
}
