"""quant.py -- the Q8_0 / Q4_0 KV cache of kvsieve-hf (`--cache-type`), in torch.

What it is: GGUF's blocks of 32 values and an fp16 scale, as the engine's KV
cache stores them (backend/cpu/quant.c's reference quantiser, what
kvs_cache_from_f32 writes): Q8_0 d = amax / 127, q = round(x / d) in [-127,
127]; Q4_0 d = m / -8 with m the value of largest magnitude (the first of
equal ones), q = round(x / d) + 8 in [0, 15]; round half to even in fp32 (x
times the fp32 reciprocal of d), d stored as fp16 and read back as d16 * q
(Q4_0: d16 * (q - 8)). `blocks` gives the bytes of the C layout, `round_trip`
the values a read gives back; both are tested against the C kernels byte for
byte and element for element (python/tests/test_hf_quant.py through
tests/backend/kvquant_tool.c).

QuantCache is transformers' DynamicCache whose every update (the kept rows of
a compression, then each decoded token's row) is stored round-tripped: what
the engine's cache holds, kept in the cache's dtype. Why not transformers'
own QuantizedCache: it needs the optimum-quanto or hqq packages, which the
kvsieve-hf venv does not install, and neither stores GGUF's blocks.

Differences from `kvsieve serve --cache-type` (stated in every response's kv
stats, "cache_quant"): the prefill attends over the prompt in the model's
dtype (the engine's prefill reads the quantised rows it has written); the
round-tripped values are cast to the cache dtype (bf16 / fp16 / fp32) where
the engine reads them in fp32. What it is not: no packed storage (the memory
used is the dtype's; the bytes reported are the blocks'), no KIVI (kivi.py).
"""
import torch

TYPES = ("f16", "q8_0", "q4_0")
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18}  # per 32 values


def row_bytes(ctype, d, dtype_bytes=2):
    """Bytes of one row of d values in ctype (f16: the cache dtype's element size)."""
    if ctype in BLOCK_BYTES:
        if d % 32:
            raise ValueError("cache type %s: head size %d is not a multiple of 32" % (ctype, d))
        return d // 32 * BLOCK_BYTES[ctype]
    return d * dtype_bytes


def _scales(x, ctype):
    """x [..., nb, 32] fp32 -> (d fp32 [..., nb, 1], d16 as fp32, 1 / d)."""
    if ctype == "q8_0":
        d = x.abs().amax(dim=-1, keepdim=True) / 127.0
    else:
        i = x.abs().argmax(dim=-1, keepdim=True)  # the first of equal magnitudes, as the C loop's strict >
        d = torch.gather(x, -1, i) / -8.0
    inv = torch.where(d != 0, 1.0 / torch.where(d != 0, d, torch.ones_like(d)), torch.zeros_like(d))
    return d, d.to(torch.float16).to(torch.float32), inv


def _codes(x, ctype):
    """x [..., nb, 32] fp32 -> (int codes as stored, d16 fp32 [..., nb, 1])."""
    _d, d16, inv = _scales(x, ctype)
    r = torch.round(x * inv)  # half to even, as lrintf
    if ctype == "q8_0":
        return r.clamp(-127, 127).to(torch.int32), d16
    return (r + 8).clamp(0, 15).to(torch.int32), d16


def _check(x, ctype):
    if ctype not in BLOCK_BYTES:
        raise ValueError("cache type %r: use q8_0 or q4_0 (f16 needs no round trip)" % (ctype,))
    if x.shape[-1] % 32:
        raise ValueError("cache type %s: rows of %d values are not whole blocks of 32" % (ctype, x.shape[-1]))


def round_trip(x, ctype):
    """x [..., n] (n a multiple of 32) -> the values a ctype row gives back, fp32."""
    _check(x, ctype)
    xb = x.to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    q, d16 = _codes(xb, ctype)
    val = q.to(torch.float32) if ctype == "q8_0" else (q - 8).to(torch.float32)
    return (d16 * val).reshape(x.shape)


def blocks(x, ctype):
    """x [rows, n] -> bytes [rows, n / 32 * block bytes] (uint8), GGUF's layout:
    the fp16 d little-endian, then Q8_0's 32 int8 or Q4_0's 16 bytes whose low
    nibbles are elements 0..15 and high nibbles 16..31."""
    _check(x, ctype)
    rows, n = x.shape
    xb = x.to(torch.float32).reshape(rows, n // 32, 32)
    q, d16 = _codes(xb, ctype)
    dbytes = d16.to(torch.float16).view(torch.int16).to(torch.int32)
    head = torch.cat([dbytes & 0xFF, (dbytes >> 8) & 0xFF], dim=-1)
    body = q & 0xFF if ctype == "q8_0" else q[..., :16] | (q[..., 16:] << 4)
    return torch.cat([head, body], dim=-1).to(torch.uint8).reshape(rows, -1)


_CACHE_CLASS = []  # made on first use: importing this module does not import transformers


def QuantCache(k_type, v_type, **kw):
    """A transformers DynamicCache (kw: its arguments) that stores every
    update's keys as k_type and values as v_type ("f16": as given),
    round-tripped through the block format."""
    if not _CACHE_CLASS:
        import transformers

        class _QuantCache(transformers.DynamicCache):
            def __init__(self, k_type, v_type, **kw):
                super().__init__(**kw)
                self.k_type, self.v_type = k_type, v_type

            def update(self, key_states, value_states, layer_idx, *args, **kwargs):
                def rt(x, t):
                    return x if t not in BLOCK_BYTES else round_trip(x, t).to(x.dtype)
                return super().update(rt(key_states, self.k_type), rt(value_states, self.v_type), layer_idx,
                                      *args, **kwargs)

        _CACHE_CLASS.append(_QuantCache)
    return _CACHE_CLASS[0](k_type, v_type, **kw)
