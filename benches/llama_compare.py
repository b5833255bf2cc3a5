#!/usr/bin/env python3
"""SmolLM2-135M-shaped decoding in Hugging Face transformers, on the GPU, for the table beside ours.

Builds LlamaForCausalLM with SmolLM2-135M's configuration (30 layers, hidden 576, FFN 1536, 9
query and 3 K/V heads of 64, rope theta 100000, vocabulary 49152, tied embeddings) and random
weights in f16 (speed does not depend on the values), then times, with CUDA events:
  - prefill: one forward pass over P prompt tokens (default 1024), the logits of the last;
  - decode: ms per generated token at contexts 128, 512 and 2048, as the difference between
    generate() with 64 and with 16 new tokens over a prompt of that length, divided by 48
    (so the prefill cancels out); greedy, eager, transformers' default dynamic cache.
  - with --static, also decode through a static cache under torch.compile(mode="reduce-overhead")
    (CUDA graphs), transformers' fastest documented path; it compiles for minutes.

    python3 benches/llama_compare.py [--json FILE] [--ours FILE]

--ours FILE reads the rows our bench wrote (benches/llama.rs, ROCMFORGE_BENCH_JSON) and prints
them side by side with ratios.
"""
import argparse
import json
import sys


def config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True, hidden_act="silu",
        bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )


def events(torch, fn, repeats=5):
    """Median ms of `fn` over `repeats` timed calls, after two warm-ups."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefill", type=int, default=1024)
    ap.add_argument("--contexts", default="128,512,2048")
    ap.add_argument("--static", action="store_true", help="also the static cache under torch.compile")
    ap.add_argument("--json", help="write the rows to this file")
    ap.add_argument("--ours", help="our bench's JSON rows, printed beside")
    args = ap.parse_args()
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(config()).to(device="cuda", dtype=torch.float16).eval()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    with torch.inference_mode():
        ids = torch.randint(3, 49152, (1, args.prefill), device="cuda", generator=gen)
        ms = events(torch, lambda: model(input_ids=ids, logits_to_keep=1).logits)
        rows.append({"case": f"prefill_{args.prefill}", "hf_ms": ms})
        for ctx in [int(c) for c in args.contexts.split(",")]:
            prompt = torch.randint(3, 49152, (1, ctx), device="cuda", generator=gen)

            def generate(n, **kw):
                return lambda: model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, **kw)

            per_token = (events(torch, generate(64), 3) - events(torch, generate(16), 3)) / 48
            row = {"case": f"decode_ctx{ctx}", "hf_ms": per_token}
            if args.static:
                # The compiled forward is this row's only: the next context's eager row must run
                # the eager forward again (it used to stay compiled for every later row).
                eager_forward = model.forward
                try:
                    model.generation_config.cache_implementation = "static"
                    model.forward = torch.compile(eager_forward, mode="reduce-overhead")
                    st = (events(torch, generate(64), 3) - events(torch, generate(16), 3)) / 48
                    row["hf_static_compiled_ms"] = st
                except Exception as e:  # reported, not fatal: the eager figure stands alone
                    print(f"decode_ctx{ctx} static: {type(e).__name__}: {e}", file=sys.stderr)
                finally:
                    model.generation_config.cache_implementation = None
                    model.forward = eager_forward
            rows.append(row)
    ours = {}
    if args.ours:
        with open(args.ours) as f:
            ours = {r["case"]: r for r in json.load(f)["rows"]}
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    print(f"{'case':<16} {'HF ms':>9} {'HF static':>10} {'ours ms':>9} {'HF/ours':>8}")
    for r in rows:
        o = ours.get(r["case"], {}).get("ms")
        st = r.get("hf_static_compiled_ms")
        print(f"{r['case']:<16} {r['hf_ms']:9.3f} "
              + (f"{st:10.3f} " if st is not None else f"{'n/a':>10} ")
              + (f"{o:9.3f} {r['hf_ms'] / o:7.2f}x" if o else f"{'n/a':>9} {'n/a':>8}"))
    print("decode: ms per generated token (generate(64) - generate(16)) / 48; prefill: one forward.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
