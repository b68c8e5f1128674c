"""safetensors.py -- a minimal reader of safetensors files (kvsieve's cache
dumps), standard library only.

What it is: load(path) -> File with .tensors {name: Strided} pointing into
the file's bytes (no per-tensor copy) and .metadata (the __metadata__
strings); the dump layout is in formats/kvs_formats.h (layers.{l}.k/v/q,
modality, ...). What it is not: no writer, no validation of the dump's
semantics (libkvsieve checks shapes when the tensors are fed).
"""
import json
import struct

from ._tensor import Strided

_DTYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16", "U8": "u8", "BOOL": "u8", "I32": "i32",
           "I64": "i64"}
_SIZES = {"F32": 4, "F16": 2, "BF16": 2, "U8": 1, "BOOL": 1, "I32": 4, "I64": 8}


class File:
    def __init__(self, data, tensors, metadata, header):
        self.data = data
        self.tensors = tensors
        self.metadata = metadata
        self.header = header

    def __getitem__(self, name):
        return self.tensors[name]

    def __contains__(self, name):
        return name in self.tensors


def load(path):
    """Read a safetensors file; errors name the path and the tensor."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError("%s: shorter than the 8-byte header length" % path)
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError("%s: header length %d runs past the end of the file" % (path, n))
    header = json.loads(data[8:8 + n].decode("utf-8"))
    base = 8 + n
    body = memoryview(data)[base:]
    meta = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, t in header.items():
        dt = t.get("dtype")
        if dt not in _DTYPES:
            raise ValueError("%s: tensor %s: dtype %s is not supported" % (path, name, dt))
        b0, b1 = t["data_offsets"]
        shape = tuple(int(s) for s in t["shape"])
        count = 1
        for s in shape:
            count *= s
        if not 0 <= b0 <= b1 <= len(body) or b1 - b0 != count * _SIZES[dt]:
            raise ValueError("%s: tensor %s: data_offsets [%d, %d] do not hold %s %r"
                             % (path, name, b0, b1, dt, shape))
        tensors[name] = Strided(body[b0:b1], shape, _DTYPES[dt])
    return File(data, tensors, meta, header)
