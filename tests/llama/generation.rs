//! Generation through the KV cache: greedy tokens against the reference, the context limit, decode
//! steps against a full prefill, and f16 and quantized prefill.

use super::*;

/// The f32 generator on the CPU (context 64), made once per test binary.
fn generator(m: &LlamaModel) -> &'static Mutex<Generator> {
    static G: OnceLock<Mutex<Generator>> = OnceLock::new();
    G.get_or_init(|| {
        let t0 = Instant::now();
        let model = LlamaModel::load(&m.path).unwrap();
        let options = GenerateOptions {
            precision: Precision::F32,
            max_context: 64,
            replay: true,
            logits: false,
        };
        let g = Generator::new(model, &Device::cpu(), options).unwrap();
        eprintln!(
            "generator (f32, CPU) in {:.1} s",
            t0.elapsed().as_secs_f64()
        );
        Mutex::new(g)
    })
}

/// Greedy generation by prefill then decode steps through the cache gives the reference's
/// greedy tokens: the first prompt's first 6 always, all 24 of every prompt with
/// ROCMFORGE_LONG_TESTS=1. The tokens stream through the callback in order.
#[test]
fn greedy_through_the_kv_cache_matches_the_reference() {
    let Some(m) = model() else { return };
    let long = std::env::var("ROCMFORGE_LONG_TESTS").is_ok_and(|v| v == "1");
    let cases = reference()["cases"].as_array().unwrap().clone();
    let (n_cases, n_tokens) = if long { (cases.len(), 24) } else { (1, 6) };
    let mut g = generator(m).lock().unwrap();
    for case in &cases[..n_cases] {
        let ids = ids_of(&case["input_ids"]);
        let want = ids_of(&case["greedy_24_ids"]);
        let mut streamed = Vec::new();
        let out = g
            .generate(&ids, n_tokens, |t| {
                streamed.push(t);
                true
            })
            .unwrap();
        assert_eq!(out.ids, want[..n_tokens], "{:?}", case["prompt"]);
        assert_eq!(streamed, out.ids);
        assert_eq!(out.stats.stop, Stop::Length);
        assert_eq!(out.stats.prompt_tokens, ids.len());
        assert_eq!(out.stats.decode_tokens, n_tokens - 1);
        eprintln!("{:?}: {:?}", case["prompt"], out.stats);
    }
    // The callback stops generation at once.
    let ids = ids_of(&cases[0]["input_ids"]);
    let out = g.generate(&ids, 5, |_| false).unwrap();
    assert_eq!((out.ids.len(), out.stats.stop), (1, Stop::Callback));
}

/// A prompt and budget past the maximum context is a typed error before anything runs.
#[test]
fn generating_past_the_maximum_context_is_a_typed_error() {
    let Some(m) = model() else { return };
    let mut g = generator(m).lock().unwrap();
    let ids = ids_of(&reference()["cases"][0]["input_ids"]);
    let n = ids.len();
    assert!(matches!(
        g.generate(&ids, 64 - n + 1, |_| true),
        Err(GenerateError::ContextExceeded { prompt, needed: 65, max_context: 64, .. }) if prompt == n
    ));
    assert!(matches!(
        g.generate(&[], 3, |_| true),
        Err(GenerateError::EmptyPrompt)
    ));
    assert!(matches!(
        g.generate(&[49152], 3, |_| true),
        Err(GenerateError::TokenId { id: 49152, .. })
    ));
}

/// i32 `[n]` (or i64 `[1, n]` for the ids).
fn ints(dtype: DType, dims: &[usize], v: Vec<i64>) -> Tensor {
    Tensor::from_i64(dtype, dims.to_vec(), v).unwrap()
}

/// Runs a KV step of `s` tokens (`ids` right-padded with 0) at `start`, attending over
/// `kv_len`, and returns the token and the logits of row `last`.
fn kv_step(
    sess: &mut Session<'_>,
    s: usize,
    ids: &[u32],
    start: usize,
    kv_len: usize,
    last: usize,
) -> Result<(i64, Vec<f64>), rocmforge::compile::CompileError> {
    let mut padded: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
    padded.resize(s, 0);
    let positions = (start as i64..(start + s) as i64).collect();
    sess.set_input(io::INPUT_IDS, &ints(DType::I64, &[1, s], padded))?;
    sess.set_input(io::POSITIONS, &ints(DType::I32, &[s], positions))?;
    sess.set_input(io::START, &ints(DType::I32, &[1], vec![start as i64]))?;
    sess.set_input(io::KV_LEN, &ints(DType::I32, &[1], vec![kv_len as i64]))?;
    sess.set_input(io::LAST, &ints(DType::I32, &[1], vec![last as i64]))?;
    sess.run()?;
    let token = sess.output(io::TOKEN)?.as_i64().unwrap()[0];
    Ok((token, sess.output(io::LOGITS)?.to_f64_vec()))
}

/// The prefill and decode plans of `p` (context 32), compiled for the CPU with `weights`.
fn kv_plans(m: &LlamaModel, p: Precision) -> (Executable, Executable) {
    let t0 = Instant::now();
    let prefill = m.kv_graph(16, 32, p, true).unwrap();
    let decode = m.kv_graph(1, 32, p, true).unwrap();
    let options = CompileOptions {
        weights: if p == Precision::F32 {
            bindings(m).lock().unwrap().weights.clone()
        } else {
            m.weights_for(&decode).unwrap()
        },
        quantized: m.quantized_for(&decode).unwrap(),
        progress: false,
        ..CompileOptions::default()
    };
    let dev = Device::cpu();
    let plans = (
        Graph::compile_with(prefill, &dev, &options).unwrap(),
        Graph::compile_with(decode, &dev, &options).unwrap(),
    );
    eprintln!("{p:?}: plans in {:.1} s", t0.elapsed().as_secs_f64());
    plans
}

/// With the caches poisoned (NaN) first, the prefill's logits (a padded bucket) and those of a
/// decode step through the cache equal the full prefill's over the same tokens; a cache write
/// past the maximum context is the op's typed error.
#[test]
fn decode_logits_equal_a_full_prefill_and_the_poisoned_tail_is_never_read() {
    let Some(m) = model() else { return };
    let ids = ids_of(&reference()["cases"][0]["input_ids"]);
    let n = ids.len();
    let (prefill, decode) = kv_plans(m, Precision::F32);
    let mut pre = prefill.session().unwrap();
    let mut dec = decode
        .session_sharing(&SessionOptions::default(), &pre)
        .unwrap();
    pre.poison_state().unwrap();
    let (t, logits) = kv_step(&mut pre, 16, &ids, 0, 16, n - 1).unwrap();
    let close = |got: &[f64], want: &[f64], what: &str| {
        let worst = max_abs_diff(got, want);
        assert!(worst <= 1e-4, "{what}: max |Δ| {worst}");
    };
    let want = last_logits(m, &ids);
    close(&logits, &want, "prefill");
    assert_eq!(t as usize, argmax(&want));
    let mut seq = ids.clone();
    seq.push(t as u32);
    let (t2, logits) = kv_step(&mut dec, 1, &[t as u32], n, n + 1, 0).unwrap();
    let want = last_logits(m, &seq);
    close(&logits, &want, "decode");
    assert_eq!(t2 as usize, argmax(&want));
    // Past the end of the cache (32 rows).
    let err = kv_step(&mut dec, 1, &[t2 as u32], 32, 33, 0).unwrap_err();
    assert!(
        matches!(
            err,
            rocmforge::compile::CompileError::Interp(InterpError::CacheWriteOutOfRange {
                start: 32,
                ..
            })
        ),
        "{err}"
    );
}

/// The f16 and quantized (blocks kept, f32 activations) plans give the reference's top-1 for
/// the first prompt and top-8 logits close to it; quantized in f32 reads exactly the values the
/// f32 path dequantizes, so its logits are as close as f32's.
#[test]
fn f16_and_quantized_prefill_keep_the_references_top_logits() {
    let Some(m) = model() else { return };
    let case = &reference()["cases"][0];
    let ids = ids_of(&case["input_ids"]);
    let top8: Vec<(usize, f64)> = serde_json::from_value(case["last_logits_top8"].clone()).unwrap();
    for (p, tol) in [
        (Precision::quantized(DType::F32), 1e-3),
        (Precision::F16, 0.15),
    ] {
        let (prefill, _) = kv_plans(m, p);
        let mut s = prefill.session().unwrap();
        let t0 = Instant::now();
        let (t, logits) = kv_step(&mut s, 16, &ids, 0, 16, ids.len() - 1).unwrap();
        eprintln!("{p:?}: prefill {:.1} s", t0.elapsed().as_secs_f64());
        assert_eq!(t as usize, top8[0].0, "{p:?}");
        let worst = top8
            .iter()
            .map(|&(i, v)| (logits[i] - v).abs())
            .fold(0.0f64, nan_max);
        eprintln!("{p:?}: top-8 max |Δ| {worst:.4}");
        assert!(worst <= tol, "{p:?}: top-8 max |Δ| {worst}");
    }
}
