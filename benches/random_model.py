#!/usr/bin/env python3
"""A model directory with random weights of the real file's names, shapes and dtypes, for timing on
a machine the real weights cannot be carried to (model.safetensors is over the device tool's 64 MiB).

    python3 benches/random_model.py skeleton SRC DST   # here: DST gets the small files and the
                                                        # safetensors header (model.safetensors.header)
    python3 benches/random_model.py fill DST            # there: DST/model.safetensors from the header,
                                                        # data random normal x 0.05 (seeded)
    python3 benches/random_model.py gguf-skeleton SRC.gguf DST   # here: DST holds SRC's header,
                                                        # metadata and tensor table (the tokenizer
                                                        # too: a few MB), DST.size its length
    python3 benches/random_model.py gguf-fill DST       # there: DST grown to that length with
                                                        # seeded random tensor bytes, each byte
                                                        # masked with 0x3B so no f16 scale is
                                                        # inf/NaN (same block types, same sizes)

Timing does not depend on the values; accuracy trials need the real weights.
"""
import json
import os
import shutil
import struct
import sys


def skeleton(src, dst):
    os.makedirs(dst, exist_ok=True)
    for root, _, files in os.walk(src):
        for f in files:
            if f == "model.safetensors":
                continue
            rel = os.path.relpath(os.path.join(root, f), src)
            os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
            shutil.copy(os.path.join(src, rel), os.path.join(dst, rel))
    with open(os.path.join(src, "model.safetensors"), "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = f.read(n)
    with open(os.path.join(dst, "model.safetensors.header"), "wb") as f:
        f.write(header)


def fill(dst):
    import numpy as np

    with open(os.path.join(dst, "model.safetensors.header"), "rb") as f:
        header = f.read()
    meta = json.loads(header)
    end = max(v["data_offsets"][1] for k, v in meta.items() if k != "__metadata__")
    data = bytearray(end)
    rng = np.random.default_rng(0)
    dtypes = {"F32": np.float32, "F16": np.float16, "BF16": None, "I64": np.int64}
    for name, v in meta.items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        count = 1
        for d in v["shape"]:
            count *= d
        dt = dtypes[v["dtype"]]
        if dt is np.int64:
            vals = np.zeros(count, dtype=np.int64)
        else:
            vals = (rng.standard_normal(count) * 0.05).astype(dt or np.float32)
            if dt is None:  # bf16: the high halves of f32
                vals = (vals.view(np.uint32) >> 16).astype(np.uint16)
        data[a:b] = vals.tobytes()
    with open(os.path.join(dst, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        f.write(data)


def gguf_data_offset(path):
    """Where a GGUF file's tensor data begins: past the header, the metadata and the tensor
    table, aligned to `general.alignment` (default 32). Standard library only: the GPU machine
    has no gguf package."""
    with open(path, "rb") as f:
        buf = f.read(64 << 20)
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("Q")
        s = buf[pos:pos + n]
        pos += n
        return s.decode("utf-8", "replace")

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(scalar[t])

    if buf[:4] != b"GGUF":
        sys.exit(f"error: {path} is not a GGUF file")
    pos = 4
    take("I")  # version
    n_tensors, n_kv = take("Q"), take("Q")
    alignment = 32
    for _ in range(n_kv):
        key = string()
        v = value(take("I"))
        if key == "general.alignment":
            alignment = v
    for _ in range(n_tensors):
        string()
        dims = take("I")
        for _ in range(dims):
            take("Q")
        take("I")
        take("Q")
    return (pos + alignment - 1) // alignment * alignment


def gguf_skeleton(src, dst):
    start = gguf_data_offset(src)
    with open(src, "rb") as f:
        head = f.read(start)
    with open(dst, "wb") as f:
        f.write(head)
    with open(dst + ".size", "w") as f:
        f.write(str(os.path.getsize(src)))
    print(f"{dst}: {start} bytes of {os.path.getsize(src)}")


def gguf_fill(dst):
    import numpy as np

    total = int(open(dst + ".size").read())
    have = os.path.getsize(dst)
    rng = np.random.default_rng(0)
    with open(dst, "ab") as f:
        left = total - have
        while left > 0:
            n = min(left, 16 << 20)
            f.write((rng.integers(0, 256, n, dtype=np.uint8) & 0x3B).tobytes())
            left -= n


if __name__ == "__main__":
    if sys.argv[1:2] == ["gguf-skeleton"] and len(sys.argv) == 4:
        gguf_skeleton(sys.argv[2], sys.argv[3])
        sys.exit(0)
    if sys.argv[1:2] == ["gguf-fill"] and len(sys.argv) == 3:
        gguf_fill(sys.argv[2])
        sys.exit(0)
    if sys.argv[1:2] == ["skeleton"] and len(sys.argv) == 4:
        skeleton(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["fill"] and len(sys.argv) == 3:
        fill(sys.argv[2])
    else:
        sys.exit(__doc__)
