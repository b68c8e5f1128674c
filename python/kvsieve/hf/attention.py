"""attention.py -- the attention function kvsieve-hf registers with transformers.

Why a function of our own: after compression every layer's cache holds its
own number of rows, at prompt positions that are no longer 0 .. K-1, so the
masks transformers builds (sized from one layer's length) do not fit. This
function needs no mask. kvsieve-hf runs one sequence at a time (batch 1, no
padding), and the cache appends the q new tokens of a forward call after the
K - q kept rows, so query i of the call sees keys [0, K - q + i]: causal
attention for the prefill (K == q) and for a suffix chunk, everything kept
for one decode token. transformers skips building a mask for an attention
implementation it has no mask function for, so none is computed either.

It also records the prefill's post-RoPE queries when the attention module
carries a recorder (module._kvsieve_recorder, set by the engine around the
prefill only): the methods that score with attention (SnapKV, H2O, LOOK-M,
MEDA) read them through libkvsieve.

Variants decoded together (engine.generate_batch) are one batch whose
caches are padded to the longest variant per layer; module._kvsieve_prefix
([V][P] bool, the real rows of each variant's P padded prefix rows) masks the
padding, and rows appended after the prefix follow the same causal rule.

What it is not: no sliding windows, logit soft-capping or attention sinks
(models that use them are refused when loaded, see engine.py), no padding of
prompts, no batches of different prompts.
"""
import torch

NAME = "kvsieve"


def attention_forward(module, query, key, value, attention_mask=None, dropout=0.0, scaling=None,
                      **kwargs):
    """query [1][Hq][q][d], key / value [1][Hkv][K][d] (the cache after its
    update) -> ([1][q][Hq][d], None), the layout transformers' attention
    modules expect back."""
    if kwargs.get("softcap") is not None:
        raise ValueError("kvsieve-hf: layer %s uses logit soft-capping, which this attention does not "
                         "implement" % getattr(module, "layer_idx", "?"))
    if kwargs.get("sliding_window") is not None:
        raise ValueError("kvsieve-hf: layer %s is a sliding-window layer, which this attention does not "
                         "implement" % getattr(module, "layer_idx", "?"))
    rec = getattr(module, "_kvsieve_recorder", None)
    if rec is not None:
        rec(module.layer_idx, query)
    q_len, k_len = query.shape[2], key.shape[2]
    mask, causal = None, False
    prefix = getattr(module, "_kvsieve_prefix", None)
    if prefix is not None:  # variants decoded as one batch: [V][P] valid rows of the padded prefix
        P = prefix.shape[1]
        i = torch.arange(q_len, device=query.device)[:, None]
        j = torch.arange(k_len - P, device=query.device)[None, :]
        tail = (j <= (k_len - P - q_len) + i)  # [q][A]: the rows this call and earlier steps appended
        mask = torch.cat([prefix[:, None, :].expand(-1, q_len, -1),
                          tail[None].expand(prefix.shape[0], -1, -1)], dim=2)[:, None]  # [V][1][q][K]
    elif query.shape[0] != 1:
        raise ValueError("kvsieve-hf: batch %d without a prefix mask; the engine runs one sequence "
                         "or one batch of variants" % query.shape[0])
    elif q_len > 1:
        if q_len == k_len:
            causal = True
        else:  # a chunk after kept rows: query i sees keys [0, k_len - q_len + i]
            i = torch.arange(q_len, device=query.device)[:, None]
            j = torch.arange(k_len, device=query.device)[None, :]
            mask = j <= (k_len - q_len) + i
    gqa = query.shape[1] != key.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key.to(query.dtype), value.to(query.dtype), attn_mask=mask, is_causal=causal,
        scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2).contiguous(), None


def register():
    """Make NAME a valid attn_implementation (idempotent; transformers keeps
    the table)."""
    from transformers import AttentionInterface
    AttentionInterface.register(NAME, attention_forward)
