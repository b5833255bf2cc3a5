#!/usr/bin/env python3
"""Decode side by side with llama.cpp on one GGUF and one GPU: ms/token, tokens/s, the ratio, and
our kernels per token. Standard library only: the GPU machine has Python 3 but no Rust, so our
side is a carried binary.

Ours, from one or both of:
  --bench BIN      our llama bench executable (`cargo bench --bench llama --no-run` prints its
                   path; benches/llama.rs): its decode rows at contexts 128/512/2048, f16 and Q4
                   blocks, each a median over 100 replayed steps after a prefill that filled the
                   cache to that context (ROCMFORGE_SMOLLM2 points it at --model), per kernel
                   and as one persistent kernel (`mk` rows; ROCMFORGE_BENCH_MK picks shapes);
  --rocmforge BIN  `rocmforge generate --json --max-tokens N` from a one-word prompt: decode
                   seconds over decode steps, and kernels/token from its stats.
Theirs:
  --llama-bench BIN  `llama-bench -m MODEL -p 0 -n 128 -fa 1 -ngl 99 -r R -o json`, with
                   `-d 128,512,2048` (the KV depth before the 128 generated tokens) where that
                   llama-bench knows -d; tg128 at depth 0 otherwise. scripts/build-llama-cpp
                   builds one.

    python3 benches/llamacpp_compare.py --model smollm2.gguf --llama-bench build/bin/llama-bench \\
        --bench target/release/deps/llama-HASH --rocmforge target/release/rocmforge [--json out.json]

CPU mode (--cpu): our CPU device (`rocmforge generate --device cpu --dtype q4 --json`, a prompt of
--prompt-tokens tokens, then --n-gen tokens) against `llama-bench -t THREADS -p PROMPT -n N` (a CPU
build of llama.cpp) in one run; one table: prompt and decode tokens/s both sides and ours over
theirs (above 1 we are faster):

    python3 benches/llamacpp_compare.py --cpu --threads 2 --model smollm2-q4_1.gguf \
        --llama-bench /work/llamacpu/.../build/bin/llama-bench --rocmforge target/release/rocmforge

Rows are matched by context: ours at context C against their tg128 at depth C (theirs averages
contexts C..C+128, ours is at C: within a few percent for this model, see docs/performance.md).
Our generate row (a short prompt, contexts ~1..N) is set against their depth-0 row. The ratio is
llama.cpp's ms/token over ours: above 1 we are faster.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def run(cmd, env=None, timeout=1800):
    """Runs `cmd`, returning stdout; exits with its stderr when it fails."""
    print("$ " + " ".join(cmd), file=sys.stderr)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"{cmd[0]} failed (exit {p.returncode}):\n{p.stderr[-4000:]}")
    return p.stdout, p.stderr


def ours_bench(bench, model, contexts):
    """Our llama bench's decode rows: {(context, quantized): ms}."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        env = dict(os.environ, ROCMFORGE_SMOLLM2=model, ROCMFORGE_BENCH_JSON=out,
                   ROCMFORGE_BENCH_FILTER="decode")
        stdout, _ = run([bench, "--bench"], env=env)
        if not os.path.exists(out):
            sys.exit(f"our bench wrote no rows (no GPU or no model?):\n{stdout}")
        with open(out) as f:
            data = json.load(f)
    rows = data["rows"] if isinstance(data, dict) else data
    found = {}
    for r in rows:
        case = r.get("case", "")
        if not case.startswith("decode_ctx"):
            continue
        # decode_ctx512, decode_ctx512_q4, decode_ctx512_mk, decode_ctx512_q4_mk4x1024, ...:
        # the context, then the variant (`_mk…`: the step as one persistent kernel).
        ctx, _, variant = case[len("decode_ctx"):].partition("_")
        persistent = next((v for v in variant.split("_") if v.startswith("mk")), None)
        if int(ctx) in contexts:
            found[(int(ctx), bool(r.get("quantized")), persistent)] = {
                "ms": r["ms"], "kernels_per_token": r.get("kernels_per_token")}
    return found, (data.get("device") if isinstance(data, dict) else None)


def ours_generate(rocmforge, model, dtype, tokens):
    """`rocmforge generate --json`: ms/token and kernels/token of one short-prompt generation."""
    stdout, _ = run([rocmforge, "generate", "--model", model, "--dtype", dtype, "--max-tokens",
                     str(tokens), "--max-context", "2048", "--json", "The"])
    v = json.loads(stdout.strip().splitlines()[-1])
    st = v["stats"]
    if not st.get("decode_ms_per_token"):
        sys.exit(f"generate ran no decode step (stopped: {st.get('stop')})")
    return {"ms": st["decode_ms_per_token"], "kernels_per_token": st.get("kernels_per_token"),
            "decode_tokens": st["decode_tokens"], "device": v.get("device")}


def theirs(llama_bench, model, depths, n_gen, reps):
    """llama-bench tg rows: {depth: {"ms", "ts", "ts_sd"}}."""
    base = [llama_bench, "-m", model, "-p", "0", "-n", str(n_gen), "-fa", "1", "-ngl", "99",
            "-r", str(reps), "-o", "json"]
    with_depth = base + ["-d", ",".join(str(d) for d in depths)]
    p = subprocess.run(with_depth, capture_output=True, text=True, timeout=1800)
    if p.returncode == 0:
        stdout = p.stdout
    else:
        print(f"note: llama-bench refused -d ({p.stderr.strip().splitlines()[-1:]}), "
              "so tg at depth 0 only", file=sys.stderr)
        stdout, _ = run(base)
    out = {}
    info = {}
    for r in json.loads(stdout):
        if r.get("n_gen", 0) == 0:
            continue
        depth = int(r.get("n_depth", 0))
        out[depth] = {"ms": r["avg_ns"] / r["n_gen"] / 1e6, "ts": r["avg_ts"],
                      "ts_sd": r.get("stddev_ts")}
        info = {k: r.get(k) for k in ("build_commit", "gpu_info", "model_type", "n_gen")}
    return out, info


def cpu_prompt(n):
    """A prompt of about `n` tokens for SmolLM2's tokenizer (one short word per token)."""
    words = "the cat sat on a mat and the dog ran to the park so".split()
    return " ".join(words[i % len(words)] for i in range(max(n - 1, 1)))


def cpu_mode(args):
    """Our CPU device against llama.cpp's CPU build: prompt and decode tokens/s, one table."""
    env = dict(os.environ, ROCMFORGE_THREADS=str(args.threads))
    ours = []
    for _ in range(args.reps_ours):
        stdout, _ = run([args.rocmforge, "generate", "--device", "cpu", "--dtype", args.dtype,
                         "--model", args.model, "--max-tokens", str(args.n_gen),
                         "--max-context", str(args.prompt_tokens + args.n_gen + 8), "--json",
                         cpu_prompt(args.prompt_tokens)], env=env)
        ours.append(json.loads(stdout.strip().splitlines()[-1])["stats"])
    # The best of the runs (the machine is shared: the least disturbed run), as llama-bench's
    # mean over its repetitions would be without the disturbances.
    pp = max(o["prompt_tokens_per_s"] for o in ours)
    tg = max(o["decode_tokens_per_s"] for o in ours)
    n_prompt = ours[0]["prompt_tokens"]
    stdout, _ = run([args.llama_bench, "-m", args.model, "-t", str(args.threads), "-p",
                     str(n_prompt), "-n", str(args.n_gen), "-r", str(args.reps), "-o", "json"])
    theirs_rows = json.loads(stdout)
    t = {}
    info = {}
    for r in theirs_rows:
        kind = "decode" if r.get("n_gen", 0) else "prompt"
        t[kind] = (r["avg_ts"], r.get("stddev_ts"))
        info = {k: r.get(k) for k in ("build_commit", "cpu_info", "model_type", "n_threads")}
    rows = [
        {"phase": f"prompt ({n_prompt} tokens)", "ours_tokens_per_s": pp,
         "llama_cpp_tokens_per_s": t.get("prompt", (None,))[0]},
        {"phase": f"decode ({args.n_gen} tokens)", "ours_tokens_per_s": tg,
         "llama_cpp_tokens_per_s": t.get("decode", (None,))[0]},
    ]
    for r in rows:
        r["ours_over_llama_cpp"] = (r["ours_tokens_per_s"] / r["llama_cpp_tokens_per_s"]
                                    if r["llama_cpp_tokens_per_s"] else None)
    print(f"CPU, {os.path.basename(args.model)}, {args.threads} threads; ours: cpu --dtype "
          f"{args.dtype} (best of {args.reps_ours}); llama.cpp {info.get('build_commit')} "
          f"({info.get('cpu_info')}, mean of {args.reps})")
    print(f"{'phase':<22} {'ours tok/s':>10} {'llama.cpp tok/s':>16} {'ours/llama.cpp':>15}")
    for r in rows:
        print(f"{r['phase']:<22} {fmt(r['ours_tokens_per_s'], '.1f'):>10} "
              f"{fmt(r['llama_cpp_tokens_per_s'], '.1f'):>16} "
              f"{fmt(r['ours_over_llama_cpp'], '.2f'):>15}")
    report = {"model": args.model, "threads": args.threads, "llama_cpp": info, "rows": rows,
              "ours_runs": ours}
    print(json.dumps(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the GGUF both sides run")
    ap.add_argument("--llama-bench", required=True, help="llama.cpp's llama-bench")
    ap.add_argument("--bench", help="our llama bench executable (benches/llama.rs)")
    ap.add_argument("--rocmforge", help="our CLI, for `generate --json`")
    ap.add_argument("--dtype", default="q4", choices=["q4", "f16"],
                    help="our generate precision (default q4: the file's blocks)")
    ap.add_argument("--contexts", default="128,512,2048")
    ap.add_argument("--n-gen", type=int, default=128, help="tokens generated per run")
    ap.add_argument("--reps", type=int, default=5, help="llama-bench repetitions")
    ap.add_argument("--json", help="also write the table as JSON here")
    ap.add_argument("--cpu", action="store_true",
                    help="our CPU device against llama.cpp's CPU build (needs --rocmforge)")
    ap.add_argument("--threads", type=int, default=2, help="--cpu: threads on both sides")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="--cpu: prompt length")
    ap.add_argument("--reps-ours", type=int, default=3, help="--cpu: our generate runs")
    args = ap.parse_args()
    if args.cpu:
        if not args.rocmforge:
            ap.error("--cpu needs --rocmforge")
        for path in (args.model, args.llama_bench, args.rocmforge):
            if not os.path.exists(path):
                ap.error(f"not found: {path}")
        if args.n_gen == 128:
            args.n_gen = 64
        return cpu_mode(args)
    if not (args.bench or args.rocmforge):
        ap.error("give --bench, --rocmforge or both (our side)")
    for path in (args.model, args.llama_bench, args.bench, args.rocmforge):
        if path and not os.path.exists(path):
            ap.error(f"not found: {path}")
    contexts = [int(c) for c in args.contexts.split(",") if c]

    their_rows, their_info = theirs(args.llama_bench, args.model, [0] + contexts, args.n_gen,
                                    args.reps)
    rows = []
    device = None

    def add(ours_label, ctx, mine, depth):
        t = their_rows.get(depth)
        ms = mine["ms"] if mine else None
        rows.append({
            "ours": ours_label, "context": ctx, "llama_cpp_depth": depth if t else None,
            "ours_ms_per_token": ms,
            "ours_tokens_per_s": 1e3 / ms if ms else None,
            "ours_kernels_per_token": mine.get("kernels_per_token") if mine else None,
            "llama_cpp_ms_per_token": t["ms"] if t else None,
            "llama_cpp_tokens_per_s": t["ts"] if t else None,
            "llama_cpp_tokens_per_s_sd": t["ts_sd"] if t else None,
            # Their time over ours: above 1, ours is faster.
            "ratio": t["ms"] / ms if (t and ms) else None,
        })

    if args.bench:
        mine, device = ours_bench(args.bench, args.model, contexts)
        # The per-kernel rows first, then each persistent shape the bench ran
        # (ROCMFORGE_BENCH_MK; unset: the default shape, `mk`).
        shapes = [None] + sorted({k[2] for k in mine if k[2]})
        for shape in shapes:
            for quantized, label in ((False, "f16"), (True, "q4 blocks")):
                name = f"bench {label}" + (f" {shape}" if shape else "")
                for ctx in contexts:
                    add(name, ctx, mine.get((ctx, quantized, shape)), ctx)
    if args.rocmforge:
        g = ours_generate(args.rocmforge, args.model, args.dtype, args.n_gen + 1)
        device = device or g["device"]
        add(f"generate {args.dtype} ({g['decode_tokens']} tokens)", 0, g, 0)

    head = ("ours", "ctx", "ms/tok", "tok/s", "kern/tok", "llama.cpp ms/tok", "tok/s",
            "llama.cpp/ours")
    print(f"decode, {os.path.basename(args.model)}; ours on {device}; llama.cpp "
          f"{their_info.get('build_commit')} on {their_info.get('gpu_info')}")
    print(f"{head[0]:<30} {head[1]:>5} {head[2]:>8} {head[3]:>8} {head[4]:>8} {head[5]:>16} "
          f"{head[6]:>8} {head[7]:>14}")
    for r in rows:
        print(f"{r['ours']:<30} {r['context']:>5} {fmt(r['ours_ms_per_token'], '.3f'):>8} "
              f"{fmt(r['ours_tokens_per_s'], '.0f'):>8} "
              f"{fmt(r['ours_kernels_per_token'], '.0f'):>8} "
              f"{fmt(r['llama_cpp_ms_per_token'], '.3f'):>16} "
              f"{fmt(r['llama_cpp_tokens_per_s'], '.0f'):>8} {fmt(r['ratio'], '.2f'):>14}")
    report = {"model": args.model, "ours_device": device, "llama_cpp": their_info,
              "llama_cpp_rows": {str(k): v for k, v in sorted(their_rows.items())}, "rows": rows}
    print(json.dumps(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
