#!/usr/bin/env python3
"""rocmforge attention against PyTorch's scaled_dot_product_attention, on the same GPU, in one run.

Runs rocmforge's attention bench (the staged executable, or `cargo bench`), then SDPA with each
backend (FLASH, CUDNN, EFFICIENT, MATH) on the same shapes, and prints two tables. Prefill
(Sq = Sk): ours fused and unfused, each torch backend, and the ratios. Decode (Sq = 1, grouped
K/V heads): the same, plus the best backend, each backend also replayed from a CUDA graph (no
Python launch overhead, which is larger than a decode kernel), ours on the device's clock, the
bytes of Q, K, V and O and the time they take at the H100 SXM's bandwidth (the floor), and each
one's distance from it. Grouped K/V heads go to torch with enable_gqa=True where the backend
takes it, else repeated to the query heads before timing (the "kv" column says which: g or r,
per backend). A backend that rejects a shape or dtype prints n/a.

    python3 benches/torch_compare.py --bench .gpu/bin/attention-bench     # on the GPU machine
    python3 benches/torch_compare.py                                        # here: cargo bench
    python3 benches/torch_compare.py --ours-json attn.json --no-torch      # the bench's JSON alone

With --models, the models bench instead, and all-MiniLM-L6-v2 (the rows named minilm_B*_S128_*)
against Hugging Face transformers' BertModel loaded from the same directory, with the
sentence-transformers pooling (mean over the mask, L2 normalisation): eager attention, SDPA
attention, SDPA under torch.compile (default mode), and under torch.compile(mode="reduce-overhead")
(Inductor's kernels replayed from a CUDA graph). Ours: plain launches and, where the bench has it,
the warm session replaying its captured graph.

    python3 benches/torch_compare.py --models --bench .gpu/bin/models-bench --model DIR
    python3 benches/torch_compare.py --models --cpu --threads 2 --model DIR      # no GPU: CPU vs CPU

With --gemm, the GEMM bench (benches/gemm.rs: linear layers x @ W^T of MiniLM and SmolLM2 at
M = 1, 16, 128, 4096) against torch.matmul (cuBLAS) on the same shapes and dtypes, the weight
stored [N, K] and read transposed as the models do; f32 under torch's defaults (no TF32), and
bias + GELU rows as torch.nn.functional.gelu(x @ W.T + b). --json FILE writes the table too (also
for attention).

    python3 benches/torch_compare.py --gemm --bench .gpu/bin/gemm-bench [--json gemm.json]

Inputs are random normal, never zeros. Times are CUDA-event medians.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile


def run_ours(bench, name="attention", ours_json=None):
    """The bench's summary rows (ROCMFORGE_BENCH_JSON), its table printed to stderr; or the rows
    a previous run wrote to `ours_json`."""
    if ours_json:
        with open(ours_json) as f:
            return json.load(f)
    out = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
    env = dict(os.environ, ROCMFORGE_BENCH_JSON=out, ROCMFORGE_BENCH_TABLE_ONLY="1")
    cmd = [bench, "--bench"] if bench else ["cargo", "bench", "--bench", name]
    subprocess.run(cmd, env=env, check=True, stdout=sys.stderr)
    with open(out) as f:
        return json.load(f)


def time_torch(torch, fn, iters=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters)
    times.sort()
    return times[len(times) // 2]


BACKENDS = ["FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH"]
SHORT = {"FLASH_ATTENTION": "flash", "CUDNN_ATTENTION": "cudnn", "EFFICIENT_ATTENTION": "effic", "MATH": "math"}
# What benches/attention.rs writes in each row (ROCMFORGE_BENCH_JSON) and this script reads.
ATTENTION_KEYS = ["case", "b", "hq", "hkv", "sq", "sk", "d", "dtype", "causal", "flops", "qkvo_bytes",
                  "floor_bytes_per_s", "floor_ms", "fused_ms", "unfused_ms", "fused_device_ms",
                  "unfused_device_ms", "fused_kernels"]


def check_attention_rows(rows):
    """Every row has the keys this script reads, so an older bench's JSON fails here, by name."""
    for row in rows:
        missing = [k for k in ATTENTION_KEYS if k not in row]
        if missing:
            sys.exit(f"{row.get('case', row)}: the bench's JSON lacks {missing}: rebuild the attention bench")
        if row["causal"] and row["sq"] != row["sk"]:
            # torch's is_causal aligns the mask top-left, ours bottom-right: only Sq = Sk agree.
            sys.exit(f"{row['case']}: causal with Sq != Sk has no torch equivalent here")


def time_graphed(torch, fn, iters=20):
    """Device time per call: `iters` calls captured in one CUDA graph, the graph replayed and
    timed with CUDA events, so Python's launch overhead is out of the measurement."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as capture requires
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    return time_torch(torch, graph.replay, iters=5) / iters


def torch_backends(torch, row, graphed=False):
    """Per backend: (eager ms, graphed ms or None, "g" or "r"), or None where it rejects the
    shape. With `torch` None (--no-torch) every backend is n/a."""
    if torch is None:
        return {name: None for name in BACKENDS}
    b, hq, hkv, sq, sk, d = (row[k] for k in ["b", "hq", "hkv", "sq", "sk", "d"])
    dtype = {"f16": torch.float16, "f32": torch.float32, "bf16": torch.bfloat16}[row["dtype"]]
    causal = row["causal"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype, generator=gen)
    k, v = (torch.randn(b, hkv, sk, d, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    # K/V repeated to the query heads (repeat_kv), made before timing: the fallback for a
    # backend that does not take enable_gqa; it then reads hq/hkv times the K/V bytes.
    kr, vr = (x.repeat_interleave(hq // hkv, dim=1) for x in (k, v)) if hq != hkv else (k, v)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    plain = lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=causal)
    if hq == hkv:
        ways = [("=", plain)]  # one K/V head per query head: nothing to group
    else:
        ways = [("g", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)),
                ("r", plain)]
    out = {}
    for name in BACKENDS:
        backend = getattr(SDPBackend, name, None)
        out[name] = None
        if backend is None:
            continue
        for kv, fn in ways:
            try:
                with sdpa_kernel(backend), torch.inference_mode():
                    eager = time_torch(torch, fn)
            except (RuntimeError, TypeError, ValueError, NotImplementedError):
                continue  # the backend does not take this shape, dtype or GQA form
            graph = None
            if graphed:
                try:
                    with sdpa_kernel(backend), torch.inference_mode():
                        graph = time_graphed(torch, fn)
                except Exception as e:  # capture is best-effort: the eager time stands alone
                    print(f"{row['case']} {name}: no CUDA graph: {type(e).__name__}: {e}", file=sys.stderr)
            out[name] = (eager, graph, kv)
            break
        torch.cuda.empty_cache()
    del q, k, v, kr, vr
    torch.cuda.empty_cache()
    return out


def time_cpu(fn, iters=20):
    """Median ms of `fn` on the CPU (five rounds of `iters` calls after three warm-ups)."""
    import time
    for _ in range(3):
        fn()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        times.append((time.perf_counter() - t) * 1e3 / iters)
    times.sort()
    return times[len(times) // 2]


def bert_variants(torch, model_dir, case, device="cuda"):
    """BertModel + pooling in eager, SDPA and compiled SDPA form, timed on `case`'s shape (on
    the CPU: eager and SDPA, wall-clock medians)."""
    from transformers import BertModel

    m = re.match(r"minilm_B(\d+)_S(\d+)_(\w+)$", case)
    b, s = int(m.group(1)), int(m.group(2))
    dtype = {"f16": torch.float16, "f32": torch.float32, "bf16": torch.bfloat16}[m.group(3)]
    gen = torch.Generator(device=device).manual_seed(0)
    out = {}
    variants = [("eager", "eager", None), ("sdpa", "sdpa", None), ("compile", "sdpa", "default"),
                ("compile-ro", "sdpa", "reduce-overhead")]
    if device == "cpu":
        variants = variants[:2]
    for name, attn, compiled in variants:
        model = BertModel.from_pretrained(model_dir, attn_implementation=attn).to(device=device, dtype=dtype).eval()
        ids = torch.randint(0, model.config.vocab_size, (b, s), device=device, generator=gen)
        mask = torch.ones(b, s, device=device, dtype=torch.long)

        def embed(ids=ids, mask=mask, model=model):
            h = model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
            mf = mask.unsqueeze(-1).float()
            pooled = (h * mf).sum(1) / mf.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

        # reduce-overhead: Inductor's kernels replayed from a CUDA graph (inputs copied into its
        # static buffers each call), the closest torch has to our replayed session.
        fn = torch.compile(embed, mode=compiled) if compiled else embed
        with torch.inference_mode():
            try:
                out[name] = time_cpu(fn) if device == "cpu" else time_torch(torch, fn)
            except Exception as e:  # a backend that cannot run here is reported, not fatal
                print(f"{case} {name}: {type(e).__name__}: {e}", file=sys.stderr)
                out[name] = None
        del model
        if device != "cpu":
            torch.cuda.empty_cache()
    return out


def models_cpu_table(torch, args):
    """--models --cpu: our models bench on the CPU (the fast CPU device, what `Device::best()`
    gives without a GPU) against BertModel on the CPU, both with `--threads` threads."""
    torch.set_num_threads(args.threads)
    os.environ["ROCMFORGE_THREADS"] = str(args.threads)
    ours = run_ours(args.bench, "models")
    print(f"rocmforge device: {ours['device']}; torch {torch.__version__} on the CPU, "
          f"{args.threads} threads each")
    print(f"{'case':<22} {'ours ms':>9} {'eager ms':>9} {'sdpa ms':>9} {'ours / best torch':>18}")
    for row in ours["rows"]:
        if not row["case"].startswith("minilm_"):
            continue
        t = bert_variants(torch, args.model, row["case"], device="cpu")
        best = min(x for x in t.values() if x is not None)
        print(f"{row['case']:<22} {row['fused_ms']:9.2f} {t['eager']:9.2f} {t['sdpa']:9.2f} "
              f"{row['fused_ms'] / best:17.2f}x")


def models_table(torch, args):
    ours = run_ours(args.bench, "models")
    print(f"rocmforge device: {ours['device']}")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    fmt = lambda x: f"{x:9.3f}" if x is not None else "      n/a"
    ratio = lambda t, f: f"{t / f:8.2f}x" if t is not None else "      n/a"
    torch_cols = ["eager", "sdpa", "compile", "compile-ro"]
    print(f"{'case':<22} {'fused ms':>9} {'replay ms':>9} {'unfus ms':>9} "
          + " ".join(f"{c:>10}" for c in torch_cols) + " " + " ".join(f"{'vs ' + c:>14}" for c in torch_cols))
    for row in ours["rows"]:
        f, u, r = row["fused_ms"], row["unfused_ms"], row.get("replay_ms")
        best = min(x for x in (f, r) if x is not None)
        if not row["case"].startswith("minilm_"):
            print(f"{row['case']:<22} {f:9.3f} {fmt(r)} {u:9.3f}")
            continue
        t = bert_variants(torch, args.model, row["case"])
        print(f"{row['case']:<22} {f:9.3f} {fmt(r)} {u:9.3f} " + " ".join(f"{fmt(t[c]):>10}" for c in torch_cols)
              + " " + " ".join(f"{ratio(t[c], best):>14}" for c in torch_cols))
    print("fused: plain launches in a warm session; replay: the warm session replaying its captured graph.")
    print("vs X: torch X's time over our best (above 1: ours is faster); compile-ro is"
          " torch.compile(mode='reduce-overhead').")


def torch_linear(torch, row):
    """torch's time (ms, CUDA-event median) for one GEMM row of our bench: x [M,K] @ W[N,K]^T."""
    dtype = {"f16": torch.float16, "f32": torch.float32, "bf16": torch.bfloat16}[row["dtype"]]
    m, n, k = row["m"], row["n"], row["k"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=dtype, generator=gen)
    if row["bias_gelu"]:
        b = torch.randn(n, device="cuda", dtype=dtype, generator=gen)
        fn = lambda: torch.nn.functional.gelu(torch.matmul(x, w.t()) + b)
    else:
        fn = lambda: torch.matmul(x, w.t())
    # Enough calls per timing that the M = 1 rows are not one launch's latency.
    iters = 200 if m * n * k < 1 << 30 else 20
    with torch.inference_mode():
        t = time_torch(torch, fn, iters=iters)
    del x, w
    torch.cuda.empty_cache()
    return t


def gemm_table(torch, args):
    # torch's default, stated rather than assumed: f32 matmuls in full f32, as ours are.
    torch.backends.cuda.matmul.allow_tf32 = False
    ours = run_ours(args.bench, "gemm")
    print(f"rocmforge device: {ours['device']}")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()} (allow_tf32={torch.backends.cuda.matmul.allow_tf32})")
    print(f"{'case':<30} {'layer':<18} {'ours ms':>9} {'torch ms':>9} {'torch/ours':>10} {'our TF':>8} {'torch TF':>8}  kernels")
    table = []
    for row in ours["rows"]:
        t = torch_linear(torch, row)
        o = row["ms"]
        flops = row["flops"]
        entry = dict(row, ours_ms=o, torch_ms=t, torch_over_ours=t / o, ours_tflops=flops / (o * 1e-3) / 1e12,
                     torch_tflops=flops / (t * 1e-3) / 1e12)
        table.append(entry)
        # A quantized row's weight is in blocks on our side but dense on torch's (cuBLAS has no
        # Q4_1/Q8_0): not the same work, and labelled so in the table and the JSON.
        entry["torch_baseline"] = f"dense {row['dtype']} cuBLAS" if row.get("quant") else "same dtype cuBLAS"
        layer = f"{row['model']} {row['layer']}"
        mark = f"  [ours {row['quant']} blocks vs torch dense {row['dtype']}]" if row.get("quant") else ""
        print(f"{row['case']:<30} {layer:<18} {o:9.4f} {t:9.4f} {t / o:9.3f}x {entry['ours_tflops']:8.2f} "
              f"{entry['torch_tflops']:8.2f}  {row['kernels']}{mark}")
    print("torch/ours: torch's time over ours (1.0 = equal, above 1: ours is faster). TF = TFLOP/s (2*M*N*K).")
    print("Rows marked [ours q… blocks vs torch dense …] compare our quantized-weight kernel with a dense"
          " cuBLAS GEMM of the activation dtype: different work (ours reads fewer weight bytes), not a like-for-like race.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": ours["device"], "torch": torch.__version__,
                       "gpu": torch.cuda.get_device_name(), "rows": table}, f, indent=2)


def attention_tables(torch, args):
    ours = run_ours(args.bench, ours_json=args.ours_json)
    check_attention_rows(ours["rows"])
    print(f"rocmforge device: {ours['device']}")
    if torch is None:
        print("torch: not run (--no-torch): its columns are n/a")
    else:
        print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    fmt = lambda x, w=9: f"{x:{w}.4f}" if x is not None else f"{'n/a':>{w}}"
    ratio = lambda num, den: f"{num / den:8.3f}x" if num is not None and den else f"{'n/a':>9}"
    eager = lambda t: t[0] if t else None
    table = []
    prefill = [r for r in ours["rows"] if r["sq"] != 1]
    decode = [r for r in ours["rows"] if r["sq"] == 1]
    if prefill:
        print(f"\n{'prefill':<32} {'fused ms':>9} {'unfus ms':>9} " + " ".join(f"{SHORT[c]:>9}" for c in BACKENDS)
              + f" {'fused/unf':>9} {'vs flash':>9} {'vs cudnn':>9} {'vs effic':>9} {'fused TF':>9}")
    for row in prefill:
        t = torch_backends(torch, row)
        f, u = row["fused_ms"], row["unfused_ms"]
        times = {c: eager(t[c]) for c in BACKENDS}
        print(f"{row['case']:<32} {f:9.4f} {u:9.4f} " + " ".join(fmt(times[c]) for c in BACKENDS)
              + f" {u / f:8.2f}x " + " ".join(ratio(times[c], f) for c in BACKENDS[:3])
              + f" {row['flops'] / (f * 1e-3) / 1e12:9.2f}")
        table.append(dict(row, torch_ms=times))
    if prefill:
        print("fused/unf: ours fused is this many times faster than ours unfused; vs X: torch X's time over "
              "ours fused, the fraction of X's speed we reach (1.0 = equal, above 1: ours is faster).")
    if decode:
        print(f"\n{'decode':<28} {'fused ms':>9} {'fus dev':>9} {'unfus ms':>9} "
              + " ".join(f"{SHORT[c]:>9}" for c in BACKENDS) + f" {'best':>15} {'best graph':>15} {'kv':>7}"
              + f" {'QKVO MB':>8} {'floor ms':>9} {'vs best':>9} {'vs bgr':>9} {'dev/floor':>9} {'bgr/floor':>9}")
    for row in decode:
        t = torch_backends(torch, row, graphed=True)
        f, dev = row["fused_ms"], row["fused_device_ms"]
        times = {c: eager(t[c]) for c in BACKENDS}
        graphs = {c: t[c][1] for c in BACKENDS if t[c] and t[c][1] is not None}
        best = min(((x, c) for c, x in times.items() if x is not None), default=None)
        best_graph = min(((x, c) for c, x in graphs.items()), default=None)
        named = lambda bc: f"{bc[0]:9.4f} {SHORT[bc[1]]:>5}" if bc else f"{'n/a':>15}"
        kv = "".join(t[c][2] if t[c] else "-" for c in BACKENDS)
        floor = row["floor_ms"]
        print(f"{row['case']:<28} {f:9.4f} {fmt(dev)} {row['unfused_ms']:9.4f} "
              + " ".join(fmt(times[c]) for c in BACKENDS)
              + f" {named(best)} {named(best_graph)} {kv:>7} {row['qkvo_bytes'] / 1e6:8.3f} {floor:9.5f} "
              + ratio(best[0] if best else None, f) + " " + ratio(best_graph[0] if best_graph else None, dev)
              + " " + ratio(dev, floor) + " "
              + ratio(best_graph[0] if best_graph else None, floor))
        table.append(dict(row, torch_ms=times, torch_graph_ms=graphs, torch_kv=kv,
                          torch_best=best and {"backend": best[1], "ms": best[0]},
                          torch_best_graph=best_graph and {"backend": best_graph[1], "ms": best_graph[0]}))
    if decode:
        print("fus dev: ours fused on the device's clock (host out of the way); best: torch's fastest backend, "
              "eager; best graph: its fastest replayed from a CUDA graph; kv: per backend (flash, cudnn, effic, "
              "math) g = enable_gqa, r = K/V repeated to the query heads, = = no grouping, - = n/a; floor: Q, K, V, O moved once "
              f"at {decode[0]['floor_bytes_per_s'] / 1e12:.2f} TB/s (H100 SXM); vs best: best's time over ours "
              "fused (both from the host); vs bgr: best graph's over ours on the device's clock; dev/floor, bgr/floor: ours (device) and best graph over the floor (1.0 = at the floor).")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": ours["device"], "torch": torch and torch.__version__,
                       "gpu": torch and torch.cuda.get_device_name(), "rows": table}, f, indent=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", help="rocmforge's staged bench executable (default: cargo bench)")
    ap.add_argument("--models", action="store_true", help="the models bench and MiniLM against BertModel")
    ap.add_argument("--gemm", action="store_true", help="the GEMM bench against torch.matmul (cuBLAS)")
    ap.add_argument("--json", help="with --gemm or attention: also write the table to this file")
    ap.add_argument("--ours-json", help="attention: read our rows from this file (the bench's ROCMFORGE_BENCH_JSON) "
                    "instead of running the bench")
    ap.add_argument("--cpu", action="store_true",
                    help="with --models: both sides on the CPU (torch with --threads threads, ours "
                         "the fast CPU device with ROCMFORGE_THREADS)")
    ap.add_argument("--threads", type=int, default=2, help="--cpu: threads on both sides")
    ap.add_argument("--no-torch", action="store_true",
                    help="attention: no torch (its columns n/a): checks the bench's JSON and the tables without a GPU")
    ap.add_argument("--model", help="the all-MiniLM-L6-v2 directory (with --models)",
                    default=os.path.expanduser("~/.cache/rocmforge/models/all-MiniLM-L6-v2"))
    args = ap.parse_args()
    if args.models and args.gemm:
        ap.error("--models and --gemm are two separate runs")
    if args.json and args.models:
        ap.error("--json goes with --gemm or attention")
    if (args.ours_json or args.no_torch) and (args.models or args.gemm):
        ap.error("--ours-json and --no-torch go with attention")
    if args.no_torch:
        return attention_tables(None, args)
    import torch

    if args.models:
        return models_cpu_table(torch, args) if args.cpu else models_table(torch, args)
    if args.gemm:
        return gemm_table(torch, args)
    return attention_tables(torch, args)


if __name__ == "__main__":
    main()
