#!/usr/bin/env python3
"""Quantizes a Hugging Face LLaMA-family directory's linear weights to OCP MXFP6 blocks, in the
safetensors convention rocmforge reads (src/frontend/safetensors.rs, `QUANT_KEY`):

  python3 scripts/quantize-safetensors.py SRC DST [--scheme mxfp6_e2m3|mxfp6_e3m2] [--reference]

Each 2-D `*_proj.weight` tensor whose rows are whole blocks of 32 becomes a U8 tensor of shape
[rows, K / 32 * 25] (per block: the E8M0 scale byte, then 32 six-bit codes as a little-endian bit
stream: code i at bits 6i .. 6i + 6), marked in the header's __metadata__ by
`"rocmforge.quant.<name>": "<scheme>"`. Embeddings, norms and the LM head stay as they were. The
other files (config, tokenizer, templates) are copied; shards are written as one
model.safetensors.

Blocks follow the OCP Microscaling Formats v1.0 recipe: the shared scale is
2^(floor(log2(max |x|)) - emax) with emax 2 (E2M3, largest element 7.5) or 4 (E3M2, 28), each
element x / scale rounded to the nearest representable value (ties to the even code), saturating
at the largest. With --reference, DST/../<DST name>-reference.json holds transformers' f32
logits (and greedy tokens) of the source model with each quantized weight replaced by its
dequantized values (computed here in numpy from the codes, independently of rocmforge), in the
format of scripts/tiny_models.py's references. Needs numpy and safetensors (and torch +
transformers for --reference).
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

BLOCK = 32
BLOCK_BYTES = 25
QUANT_KEY = "rocmforge.quant."
# (exponent bits, mantissa bits, exponent bias, emax: the largest normal's exponent)
FORMATS = {"mxfp6_e2m3": (2, 3, 1, 2), "mxfp6_e3m2": (3, 2, 3, 4)}


def magnitudes(scheme):
    """The 32 non-negative element values, by code (sign bit clear)."""
    ebits, mbits, bias, _ = FORMATS[scheme]
    out = []
    for code in range(32):
        e, m = code >> mbits, code & ((1 << mbits) - 1)
        if e == 0:
            out.append(m / (1 << mbits) * 2.0 ** (1 - bias))
        else:
            out.append((1 + m / (1 << mbits)) * 2.0 ** (e - bias))
    return np.array(out, dtype=np.float64)


def quantize(w, scheme):
    """[rows, K] float -> ([rows, K/32*25] uint8 blocks, [rows, K] float32 dequantized)."""
    _, _, _, emax = FORMATS[scheme]
    table = magnitudes(scheme)
    rows, k = w.shape
    x = w.astype(np.float64).reshape(rows, k // BLOCK, BLOCK)
    amax = np.abs(x).max(axis=-1)
    with np.errstate(divide="ignore"):
        shared = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - emax, -127)
    shared = np.clip(shared, -127, 127)
    scale = np.exp2(shared)[..., None]
    q = np.abs(x) / scale
    d = np.abs(q[..., None] - table)  # [rows, blocks, 32, 32 codes]
    nearest = d == d.min(axis=-1, keepdims=True)
    even = (np.arange(32) % 2 == 0)
    # Among the nearest (a tie has two, adjacent), the even code; saturation falls out (the
    # largest magnitude is nearest to anything above it).
    code = np.argmax(nearest * 2 + even, axis=-1)
    code = code | np.where((x < 0) & (code != 0), 32, 0)
    deq = (np.where(code & 32, -1.0, 1.0) * table[code & 31] * scale).astype(np.float32)
    # Pack: the scale byte, then 4 codes per 3 bytes, little-endian.
    e8m0 = (shared + 127).astype(np.uint8)
    c = code.astype(np.uint32).reshape(rows, k // BLOCK, BLOCK // 4, 4)
    word = c[..., 0] | (c[..., 1] << 6) | (c[..., 2] << 12) | (c[..., 3] << 18)
    packed = np.stack([(word >> (8 * i)) & 0xFF for i in range(3)], axis=-1).astype(np.uint8)
    blocks = np.concatenate([e8m0[..., None], packed.reshape(rows, k // BLOCK, 24)], axis=-1)
    return blocks.reshape(rows, -1), deq.reshape(rows, k)


def quantizable(name, t):
    return name.endswith("_proj.weight") and t.ndim == 2 and t.shape[1] % BLOCK == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--scheme", default="mxfp6_e2m3", choices=sorted(FORMATS))
    ap.add_argument("--reference", action="store_true")
    a = ap.parse_args()
    if os.path.abspath(a.src) == os.path.abspath(a.dst):
        sys.exit("error: DST must differ from SRC")
    shards = sorted(f for f in os.listdir(a.src) if f.endswith(".safetensors"))
    if not shards:
        sys.exit(f"error: no .safetensors files in {a.src}")
    tensors = {}
    for f in shards:
        for name, t in load_file(os.path.join(a.src, f)).items():
            if t.dtype == np.uint16:  # bf16 as read by safetensors.numpy is not supported there
                sys.exit(f"error: {f}: `{name}` is bf16; convert the directory to f32 or f16 first")
            tensors[name] = t
    os.makedirs(a.dst, exist_ok=True)
    for f in os.listdir(a.src):
        if not f.endswith(".safetensors") and f != "model.safetensors.index.json":
            p = os.path.join(a.src, f)
            if os.path.isfile(p):
                shutil.copy(p, os.path.join(a.dst, f))
    out, meta, dequantized = {}, {}, {}
    for name, t in sorted(tensors.items()):
        if quantizable(name, t):
            blocks, deq = quantize(t, a.scheme)
            out[name] = blocks
            meta[QUANT_KEY + name] = a.scheme
            dequantized[name] = deq
        else:
            out[name] = t
    save_file(out, os.path.join(a.dst, "model.safetensors"), metadata=meta)
    print(f"{a.dst}: {len(dequantized)} of {len(tensors)} tensors in {a.scheme} blocks")
    if a.reference:
        import torch
        import transformers as T
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from tiny_models import reference
        model = T.AutoModelForCausalLM.from_pretrained(a.src, dtype=torch.float32).eval()
        state = model.state_dict()
        with torch.no_grad():
            for name, deq in dequantized.items():
                state[name].copy_(torch.from_numpy(deq))
        ref = reference(model, T.AutoTokenizer.from_pretrained(a.src))
        ref.update({"scheme": a.scheme, "quantized_tensors": len(dequantized)})
        path = os.path.join(os.path.dirname(os.path.abspath(a.dst)),
                            os.path.basename(os.path.abspath(a.dst)) + "-reference.json")
        json.dump(ref, open(path, "w"))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
