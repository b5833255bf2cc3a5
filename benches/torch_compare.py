#!/usr/bin/env python3
"""rocmforge attention against PyTorch's scaled_dot_product_attention, on the same GPU, in one run.

Runs rocmforge's attention bench (the staged executable, or `cargo bench`), then SDPA with each
backend (FLASH, CUDNN, EFFICIENT, MATH) on the same shapes, and prints one table: shape, ours
fused, ours unfused, each torch backend, and the ratios.

    python3 benches/torch_compare.py --bench .gpu/bin/attention-bench     # on the GPU machine
    python3 benches/torch_compare.py                                        # here: cargo bench

With --models, the models bench instead, and all-MiniLM-L6-v2 (the rows named minilm_B*_S128_*)
against Hugging Face transformers' BertModel loaded from the same directory, with the
sentence-transformers pooling (mean over the mask, L2 normalisation): eager attention, SDPA
attention, and SDPA under torch.compile.

    python3 benches/torch_compare.py --models --bench .gpu/bin/models-bench --model DIR

With --gemm, the GEMM bench (benches/gemm.rs: linear layers x @ W^T of MiniLM and SmolLM2 at
M = 1, 16, 128, 4096) against torch.matmul (cuBLAS) on the same shapes and dtypes, the weight
stored [N, K] and read transposed as the models do; f32 under torch's defaults (no TF32), and
bias + GELU rows as torch.nn.functional.gelu(x @ W.T + b). --json FILE writes the table too.

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


def run_ours(bench, name="attention"):
    """The bench's summary rows (ROCMFORGE_BENCH_JSON), its table printed to stderr."""
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


def torch_backends(torch, case):
    m = re.match(r"B(\d+)_H(\d+)_S(\d+)_D(\d+)_(\w+?)(_causal)?$", case)
    b, h, s, d = (int(x) for x in m.group(1, 2, 3, 4))
    dtype = {"f16": torch.float16, "f32": torch.float32, "bf16": torch.bfloat16}[m.group(5)]
    causal = m.group(6) is not None
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    out = {}
    for name in ["FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH"]:
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            out[name] = None
            continue
        try:
            with sdpa_kernel(backend):
                fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                out[name] = time_torch(torch, fn)
        except RuntimeError:
            out[name] = None  # the backend does not support this shape or dtype
        torch.cuda.empty_cache()
    return out


def bert_variants(torch, model_dir, case):
    """BertModel + pooling in eager, SDPA and compiled SDPA form, timed on `case`'s shape."""
    from transformers import BertModel

    m = re.match(r"minilm_B(\d+)_S(\d+)_(\w+)$", case)
    b, s = int(m.group(1)), int(m.group(2))
    dtype = {"f16": torch.float16, "f32": torch.float32, "bf16": torch.bfloat16}[m.group(3)]
    gen = torch.Generator(device="cuda").manual_seed(0)
    out = {}
    for name, attn, compiled in [("eager", "eager", False), ("sdpa", "sdpa", False), ("compile", "sdpa", True)]:
        model = BertModel.from_pretrained(model_dir, attn_implementation=attn).to(device="cuda", dtype=dtype).eval()
        ids = torch.randint(0, model.config.vocab_size, (b, s), device="cuda", generator=gen)
        mask = torch.ones(b, s, device="cuda", dtype=torch.long)

        def embed(ids=ids, mask=mask, model=model):
            h = model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
            mf = mask.unsqueeze(-1).float()
            pooled = (h * mf).sum(1) / mf.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

        fn = torch.compile(embed) if compiled else embed
        with torch.inference_mode():
            try:
                out[name] = time_torch(torch, fn)
            except Exception as e:  # a backend that cannot run here is reported, not fatal
                print(f"{case} {name}: {type(e).__name__}: {e}", file=sys.stderr)
                out[name] = None
        del model
        torch.cuda.empty_cache()
    return out


def models_table(torch, args):
    ours = run_ours(args.bench, "models")
    print(f"rocmforge device: {ours['device']}")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    fmt = lambda x: f"{x:9.3f}" if x is not None else "      n/a"
    ratio = lambda t, f: f"{t / f:8.2f}x" if t is not None else "      n/a"
    print(f"{'case':<22} {'fused ms':>9} {'unfus ms':>9} {'eager':>9} {'sdpa':>9} {'compile':>9} {'vs eager':>9} {'vs sdpa':>9} {'vs comp':>9}")
    for row in ours["rows"]:
        f, u = row["fused_ms"], row["unfused_ms"]
        if not row["case"].startswith("minilm_"):
            print(f"{row['case']:<22} {f:9.3f} {u:9.3f}")
            continue
        t = bert_variants(torch, args.model, row["case"])
        print(f"{row['case']:<22} {f:9.3f} {u:9.3f} " + " ".join(fmt(t[c]) for c in ["eager", "sdpa", "compile"])
              + " " + " ".join(ratio(t[c], f) for c in ["eager", "sdpa", "compile"]))
    print("vs X: torch X's time over ours fused (above 1: ours is faster).")


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
        layer = f"{row['model']} {row['layer']}"
        print(f"{row['case']:<30} {layer:<18} {o:9.4f} {t:9.4f} {t / o:9.3f}x {entry['ours_tflops']:8.2f} "
              f"{entry['torch_tflops']:8.2f}  {row['kernels']}")
    print("torch/ours: torch's time over ours (1.0 = equal, above 1: ours is faster). TF = TFLOP/s (2*M*N*K).")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": ours["device"], "torch": torch.__version__,
                       "gpu": torch.cuda.get_device_name(), "rows": table}, f, indent=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", help="rocmforge's staged bench executable (default: cargo bench)")
    ap.add_argument("--models", action="store_true", help="the models bench and MiniLM against BertModel")
    ap.add_argument("--gemm", action="store_true", help="the GEMM bench against torch.matmul (cuBLAS)")
    ap.add_argument("--json", help="with --gemm: also write the table to this file")
    ap.add_argument("--model", help="the all-MiniLM-L6-v2 directory (with --models)",
                    default=os.path.expanduser("~/.cache/rocmforge/models/all-MiniLM-L6-v2"))
    args = ap.parse_args()
    import torch

    if args.models and args.gemm:
        ap.error("--models and --gemm are two separate runs")
    if args.json and not args.gemm:
        ap.error("--json goes with --gemm")
    if args.models:
        return models_table(torch, args)
    if args.gemm:
        return gemm_table(torch, args)
    ours = run_ours(args.bench)
    print(f"rocmforge device: {ours['device']}")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    cols = ["FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH"]
    fmt = lambda x: f"{x:9.3f}" if x is not None else "      n/a"
    print(f"{'shape':<32} {'fused ms':>9} {'unfus ms':>9} {'flash':>9} {'cudnn':>9} {'effic':>9} {'math':>9} {'fused/unf':>9} {'vs flash':>9} {'fused TF':>9}")
    for row in ours["rows"]:
        t = torch_backends(torch, row["case"])
        f, u = row["fused_ms"], row["unfused_ms"]
        flash = t.get("FLASH_ATTENTION")
        vs_flash = f"{flash / f:8.3f}x" if flash else "      n/a"
        tflops = row["flops"] / (f * 1e-3) / 1e12
        print(f"{row['case']:<32} {f:9.3f} {u:9.3f} " + " ".join(fmt(t[c]) for c in cols) + f" {u / f:8.2f}x {vs_flash} {tflops:9.2f}")
    print("fused/unf: ours fused is this many times faster than ours unfused; vs flash: fraction of torch FLASH's speed (1.0 = equal).")


if __name__ == "__main__":
    main()
