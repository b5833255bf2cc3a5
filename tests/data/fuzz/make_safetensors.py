#!/usr/bin/env python3
"""Writes safetensors/: small seeds for the safetensors fuzz target, one tensor of every dtype
rocmforge reads (and edge shapes: a scalar, a zero-size tensor), an empty header, and a header
with metadata only. Run from tests/data/fuzz/ (python3 make_safetensors.py); the outputs are
committed."""
import json
import struct


def write(path, tensors, metadata=None):
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, blob in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    hdr = json.dumps(header, separators=(",", ":")).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr + data)


write("safetensors/every_dtype.safetensors", [
    ("f32", "F32", [2, 3], struct.pack("<6f", 1.5, -2.0, 0.0, 3.25, -0.0, 1e-3)),
    ("f16", "F16", [4], struct.pack("<4e", 1.0, -65504.0, 6e-8, 0.5)),
    ("bf16", "BF16", [2, 2], b"".join(struct.pack("<f", v)[2:] for v in [1.0, -2.0, 3.0e38, 0.125])),
    ("i32", "I32", [3], struct.pack("<3i", -1, 0, 2**31 - 1)),
    ("i64", "I64", [2], struct.pack("<2q", -(2**63), 2**63 - 1)),
    ("bool", "BOOL", [5], bytes([0, 1, 1, 0, 1])),
], metadata={"format": "pt"})
write("safetensors/scalar_and_empty.safetensors", [
    ("scalar", "F32", [], struct.pack("<f", 42.0)),
    ("empty", "F16", [0, 4], b""),
    ("row", "F32", [1, 1, 1], struct.pack("<f", -1.0)),
])
write("safetensors/empty_header.safetensors", [])
write("safetensors/metadata_only.safetensors", [], metadata={"note": "no tensors", "n": "0"})
