#!/usr/bin/env python3
"""Writes the reference data of tests/quant_formats.rs: seeded random blocks of every block
scheme rocmforge reads, and their values as the `gguf` package (llama.cpp's gguf-py, the
Python twin of ggml's `dequantize_row_*`) dequantizes them.

    pip install gguf numpy
    scripts/quant-reference.py            # writes tests/data/quant/

For each scheme NAME: `NAME.bin` (whole blocks, as a GGUF file stores them) and `NAME.f32`
(their values, little-endian f32). Q8_K has no dequantizer in `gguf` and MXFP6 is not a GGUF
type (OCP MX spec v1.0, our layout: see docs/ops.md): their values are computed below from the
definitions, with numpy, independently of the Rust code.

Most blocks get finite scales drawn over a wide range of f16 (subnormals included), every other
byte uniformly random; the last blocks of each file are random bytes throughout, so NaN and
infinite scales occur too (the test compares NaN as NaN, everything else bit for bit).
"""
import os
import sys

import numpy as np

try:
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize
except ImportError:
    sys.exit("needs the gguf package: pip install gguf numpy")

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "quant")
SEED = 25

# name: (gguf type or None, values per block, bytes per block, f16 scale offsets, f32 scale
# offsets, e8m0 scale offsets)
SCHEMES = {
    "q8_0": (T.Q8_0, 32, 34, [0], [], []),
    "q4_0": (T.Q4_0, 32, 18, [0], [], []),
    "q4_1": (T.Q4_1, 32, 20, [0, 2], [], []),
    "q5_0": (T.Q5_0, 32, 22, [0], [], []),
    "q5_1": (T.Q5_1, 32, 24, [0, 2], [], []),
    "iq4_nl": (T.IQ4_NL, 32, 18, [0], [], []),
    "q2_k": (T.Q2_K, 256, 84, [80, 82], [], []),
    "q3_k": (T.Q3_K, 256, 110, [108], [], []),
    "q4_k": (T.Q4_K, 256, 144, [0, 2], [], []),
    "q5_k": (T.Q5_K, 256, 176, [0, 2], [], []),
    "q6_k": (T.Q6_K, 256, 210, [208], [], []),
    "q8_k": (None, 256, 292, [], [0], []),
    "mxfp4": (T.MXFP4, 32, 17, [], [], [0]),
    "mxfp6_e2m3": (None, 32, 25, [], [], [0]),
    "mxfp6_e3m2": (None, 32, 25, [], [], [0]),
}


def blocks(rng, elems, size, f16s, f32s, e8m0s):
    n = 24 if elems == 32 else 6
    wild = 4 if elems == 32 else 2
    b = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    for i in range(n - wild):
        for at in f16s:
            # sign · 2^[-20, 6): subnormal to large, never inf or NaN in f16.
            v = np.float16(rng.choice([-1, 1]) * 2.0 ** rng.uniform(-20, 6))
            b[i, at:at + 2] = np.frombuffer(v.tobytes(), dtype=np.uint8)
        for at in f32s:
            v = np.float32(rng.choice([-1, 1]) * 2.0 ** rng.uniform(-30, 10))
            b[i, at:at + 4] = np.frombuffer(v.tobytes(), dtype=np.uint8)
        for at in e8m0s:
            b[i, at] = rng.integers(100, 150)
    return b


def q8_k(b):
    d = b[:, 0:4].copy().view(np.float32)
    q = b[:, 4:260].view(np.int8).astype(np.float32)
    return d * q


def fp6_table(mbits, bias):
    """The 64 values of a six-bit float code: sign, 5 − mbits exponent bits, mbits mantissa."""
    out = np.zeros(64, dtype=np.float32)
    for code in range(64):
        s = -1.0 if code & 0x20 else 1.0
        e = (code & 0x1F) >> mbits
        m = code & ((1 << mbits) - 1)
        # An integer significand times a power of two, exact.
        sig, ex = (m, 1) if e == 0 else ((1 << mbits) | m, e)
        out[code] = s * np.ldexp(float(sig), ex - bias - mbits)
    return out


def mxfp6(b, mbits, bias):
    e = b[:, 0].astype(np.int32)
    x = np.where(e == 255, np.float32(np.nan), np.ldexp(np.float32(1), e - 127).astype(np.float32))
    x = x.astype(np.float32).reshape(-1, 1)
    # 24 bytes as a little-endian bit stream: code i is bits 6i .. 6i + 6.
    bits = np.unpackbits(b[:, 1:], axis=1, bitorder="little").reshape(-1, 32, 6)
    codes = (bits.astype(np.uint8) << np.arange(6, dtype=np.uint8)).sum(axis=2)
    return x * fp6_table(mbits, bias)[codes]


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(SEED)
    total = 0
    for name, (qtype, elems, size, f16s, f32s, e8m0s) in SCHEMES.items():
        b = blocks(rng, elems, size, f16s, f32s, e8m0s)
        with np.errstate(all="ignore"):
            if qtype is not None:
                v = dequantize(b, qtype)
            elif name == "q8_k":
                v = q8_k(b)
            elif name == "mxfp6_e2m3":
                v = mxfp6(b, 3, 1)
            else:
                v = mxfp6(b, 2, 3)
        v = np.ascontiguousarray(v, dtype=np.float32).reshape(-1)
        assert v.size == b.shape[0] * elems, name
        b.tofile(os.path.join(OUT, name + ".bin"))
        v.astype("<f4").tofile(os.path.join(OUT, name + ".f32"))
        total += b.size + v.nbytes
        print(f"{name}: {b.shape[0]} blocks, {b.size + v.nbytes} bytes")
    print(f"total {total} bytes in {OUT}")


if __name__ == "__main__":
    main()
