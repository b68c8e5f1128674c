"""kivi.py -- KIVI-style quantisation of a gathered cache for kvsieve-hf, in torch.

What it is: the "fake" path of kernels/kivi.c (docs/methods.md, "KIVI"): a
layer's kept keys and values [..., T, d] are quantised with the same groups,
fp16 zero points and steps, rounding and window rule as the C store, and read
back (dequantised) into the cache's dtype, so transformers' attention runs on
what the quantised store would answer. Provenance: a torch re-implementation,
tested element for element against the C store (tests/hf/test_hf_kivi.py
through tests/kernels/kivi_tool.c); bytes are the C layout's
(kivi_bytes), not the memory this fake path uses (it holds dequantised
tensors).

Differences from the C store's reads: the dequantised fp32 values are cast to
the cache dtype (bf16 / fp16) before attention; the C store reads them in
fp32. The window keeps its tokens in `window_dtype`.

What it is not: no packed storage, no attention kernel, no decode-time
quantisation of new tokens (the tokens decoded after the prefill stay in the
cache's dtype; the state quantised is the store after the prefill and a
flush).
"""
import torch

GROUP = 32      # KVS_KIVI_GROUP
RESIDUAL = 128  # KVS_KIVI_RESIDUAL
FP16_MAX = 65504.0


def _f16_bits_step(h, up):
    """The fp16 neighbour of fp16 bit patterns h (int16): above (up) or below."""
    zero = (h == 0) | (h == -32768)
    neg = h < 0
    if up:
        out = torch.where(neg, h - 1, h + 1)
        return torch.where(zero, torch.ones_like(h), out)
    out = torch.where(neg, h + 1, h - 1)
    return torch.where(zero, torch.full_like(h, -32767), out)


def _f16_round(x, up):
    """x (fp32) rounded to fp16 towards +inf (up) or -inf, as fp32 values."""
    h = x.to(torch.float16)
    f = h.to(torch.float32)
    wrong = (f < x) if up else (f > x)
    stepped = _f16_bits_step(h.view(torch.int16), up).view(torch.float16).to(torch.float32)
    return torch.where(wrong, stepped, f)


def _quant_groups(x, bits):
    """x [..., n_groups, m] fp32: every row a group; its dequantised values
    and steps [..., n_groups]."""
    qmax = float((1 << bits) - 1)
    mn = x.amin(dim=-1, keepdim=True)
    mx = x.amax(dim=-1, keepdim=True)
    z = _f16_round(mn, up=False)
    s = torch.where(mx > z, _f16_round((mx - z) / qmax, up=True), torch.zeros_like(z))
    safe = torch.where(s > 0, s, torch.ones_like(s))
    code = torch.floor((x - z) / safe + 0.5).clamp_(0.0, qmax)
    code = torch.where(s > 0, code, torch.zeros_like(code))
    return z + code * s, s.squeeze(-1)


def quantized_prefix(T, residual=RESIDUAL, flushed=True):
    """(kq, vq): how many keys and values of T tokens are quantised."""
    if T <= 0:
        return 0, 0
    if flushed:
        return residual * (T // residual), max(0, T - residual)
    return residual * ((T - 1) // residual), max(0, T - residual - 1)


def quantize_dequantize(k, v, k_bits=2, v_bits=2, group=GROUP, residual=RESIDUAL,
                        window_dtype=torch.float16, flushed=True):
    """k, v [..., T, d] -> (k^, v^) in k's and v's dtypes, as a KIVI store of
    each head holding the T rows would read them back."""
    if k_bits not in (2, 4) or v_bits not in (2, 4):
        raise ValueError("kivi: bits must be 2 or 4 (k_bits %r, v_bits %r)" % (k_bits, v_bits))
    if group < 1 or residual < group or residual % group:
        raise ValueError("kivi: residual %d must be a positive multiple of group %d" % (residual, group))
    if k.shape != v.shape:
        raise ValueError("kivi: K %s and V %s differ in shape" % (tuple(k.shape), tuple(v.shape)))
    T, d = k.shape[-2], k.shape[-1]
    # as the C store: inputs enter the window's dtype first, and are checked
    kw = k.to(window_dtype).to(torch.float32)
    vw = v.to(window_dtype).to(torch.float32)
    for name, x in (("K", kw), ("V", vw)):
        bad = ~(x.abs() <= FP16_MAX)
        if bool(bad.any()):
            raise ValueError("kivi: %s holds NaN, Inf or values beyond +-65504 (fp16 zero points)" % name)
    kq, vq = quantized_prefix(T, residual, flushed)
    ko, vo = kw.clone(), vw.clone()
    if kq:
        lead = kw.shape[:-2]
        blk = kw[..., :kq, :].reshape(*lead, kq // group, group, d).transpose(-1, -2)
        deq, _ = _quant_groups(blk, k_bits)  # [..., blocks, d, G]
        ko[..., :kq, :] = deq.transpose(-1, -2).reshape(*lead, kq, d)
    if vq:
        ng = (d + group - 1) // group
        for g in range(ng):  # the last group may be shorter
            c0, c1 = g * group, min(d, (g + 1) * group)
            deq, _ = _quant_groups(vw[..., :vq, c0:c1].unsqueeze(-2), v_bits)
            vo[..., :vq, c0:c1] = deq.squeeze(-2)
    return ko.to(k.dtype), vo.to(v.dtype)


def kivi_bytes(T, d, k_bits=2, v_bits=2, group=GROUP, residual=RESIDUAL, window_bytes=2, flushed=True):
    """Bytes of one head's store holding T tokens (kvs_kivi_size's layout)."""
    kq, vq = quantized_prefix(T, residual, flushed)
    ng = (d + group - 1) // group
    k_codes = kq // group * ((d * group * k_bits + 7) // 8)
    k_params = kq // group * d * 4
    v_codes = vq * ((d * v_bits + 7) // 8)
    v_params = vq * ng * 4
    window = (2 * T - kq - vq) * d * window_bytes
    return k_codes + k_params + v_codes + v_params + window
