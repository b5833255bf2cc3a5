#!/usr/bin/env python3
"""A model directory with random weights of the real file's names, shapes and dtypes, for timing on
a machine the real weights cannot be carried to (model.safetensors is over the device tool's 64 MiB).

    python3 benches/random_model.py skeleton SRC DST   # here: DST gets the small files and the
                                                        # safetensors header (model.safetensors.header)
    python3 benches/random_model.py fill DST            # there: DST/model.safetensors from the header,
                                                        # data random normal x 0.05 (seeded)

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


if __name__ == "__main__":
    if sys.argv[1:2] == ["skeleton"] and len(sys.argv) == 4:
        skeleton(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["fill"] and len(sys.argv) == 3:
        fill(sys.argv[2])
    else:
        sys.exit(__doc__)
