"""chunked.py -- kv_compression.chunk in kvsieve-hf: chunked prefill compression,
as `kvsieve serve` defines it (backend/server/chunked.c).

What it is: the prompt enters the model C tokens at a time and the cache is
compressed after each chunk (the last one included), as StreamingLLM's
perplexity runs and kvpress's chunked presses do, so later positions are
computed, and scored, over a cache the method already compressed. Budget
after a chunk ending at position `seen`: the variant's tokens, or
floor(ratio * seen), within [1, seen]; a compression is skipped when the
layers hold no more rows. A method that observes queries sees those of the
chunk's last positions (what it wants for the rows held; more than the chunk
holds is a 400); a last chunk shorter than the queries the method would want
joins the one before. Each compression is libkvsieve's plan on the rows held
(engine.compress: gather, or apply for merging methods), in their order.

What it is not: images, M-RoPE models, several variants, kv_spans (refused by
the callers or here, 400); methods whose budgets differ per layer or per KV
head after a compression (the next compression is refused, 400).
"""
import math
import time
from types import SimpleNamespace

import torch

import kvsieve
from .engine import RequestError

ALL = 1 << 30  # a prompt length no method caps: queries_wanted(ALL) == ALL means every query


def budget(v, seen):
    k = v.tokens if v.tokens else int(math.floor(v.ratio * seen))
    return max(1, min(k, seen))


class Chunked:
    """The result: cache (a DynamicCache, every layer its kept rows), logits
    [V] of the last position (fp32), all_logits [N][V] or None, chunks [{seen,
    rows_before, rows_after}], compress_ms, gather_ms, ms (model time), merge
    (the method's merge rule name)."""


def prefill(eng, prompt, v, all_logits=False):
    import transformers
    if eng.mrope or set(prompt.batch) - {"input_ids"}:
        raise RequestError(400, v.field + ".chunk", "%s.chunk: chunked prefill takes a text prompt on a model "
                           "without M-RoPE in kvsieve-hf" % v.field)
    ids = prompt.batch["input_ids"].to(eng.device)
    n = prompt.n_tokens
    C = v.chunk
    compress = v.method != "full"
    every_q = compress and kvsieve.queries_wanted(v.method, v.params, ALL) >= ALL
    cache = transformers.DynamicCache(config=eng.model.config)
    res = Chunked()
    res.chunks, res.compress_ms, res.gather_ms, res.ms, rows = [], 0.0, 0.0, 0.0, []
    res.merge = "none"
    held, a = 0, 0
    while a < n:
        b = min(a + C, n)
        if compress and b < n and not every_q and \
                kvsieve.queries_wanted(v.method, v.params, budget(v, b) + (n - b)) > n - b:
            b = n  # the last chunk would be shorter than the queries the method observes: one chunk
        nq = kvsieve.queries_wanted(v.method, v.params, held + (b - a)) if compress else 0
        if nq > b - a:
            why = ("observes the queries of every position, which no chunk holds after the first; it cannot be "
                   "chunked" if every_q else "observes the last %d queries, more than a chunk of %d positions "
                   "holds; use chunk >= %d" % (nq, b - a, nq))
            raise RequestError(400, v.field + ".chunk", "%s.chunk: method %s %s" % (v.field, v.method, why))
        recorded = {}

        def record(layer, q, nq=nq):  # q [1][Hq][chunk][d], post-RoPE
            recorded[layer] = q[:, :, q.shape[2] - nq:, :].detach()

        if nq > 0:
            for m in eng.attn_modules:
                m._kvsieve_recorder = record
        t0 = time.perf_counter()
        try:
            with torch.inference_mode():
                out = eng.model(input_ids=ids[:, a:b], position_ids=eng._positions(a, b - a), **{eng.cache_kw: cache},
                                use_cache=True, logits_to_keep=0 if all_logits else 1)
        finally:
            for m in eng.attn_modules:
                m._kvsieve_recorder = None
        res.ms += (time.perf_counter() - t0) * 1e3
        if all_logits:
            rows.append(out.logits[0])
        res.logits = out.logits[0, -1].float()
        if compress:
            cache, held = _compress(eng, cache, v, b, recorded, res)
        a = b
    res.cache = cache
    res.all_logits = torch.cat(rows) if all_logits else None
    return res


def _compress(eng, cache, v, seen, recorded, res):
    """Compress the rows held to budget(v, seen), unless they are no more.
    Returns (cache, rows held per layer)."""
    lens = [cache.layers[l].keys.shape[2] for l in range(eng.n_layers)]
    B = budget(v, seen)
    if max(lens) <= B:
        return cache, max(lens)
    if len(set(lens)) > 1:
        raise RequestError(400, v.field + ".chunk", "%s.chunk: chunk ending at position %d: method %s kept "
                           "different counts per layer (%d..%d); its plan cannot be compressed again"
                           % (v.field, seen, v.method, min(lens), max(lens)))
    held = lens[0]
    layers = [(cache.layers[l].keys, cache.layers[l].values, recorded.get(l)) for l in range(eng.n_layers)]
    # engine.new_context / compress read the rows held as a prompt of `held` text positions
    pre = SimpleNamespace(layers=layers, prompt=SimpleNamespace(modality=torch.zeros(held, dtype=torch.uint8),
                                                                n_tokens=held))
    ctx, _ms = eng.new_context(pre)
    try:
        plan, out, st = eng.compress(ctx, pre, SimpleNamespace(method=v.method, params=v.params, ratio=None,
                                                                tokens=B))
        plan.free()
    except kvsieve.KvsError as exc:
        status = 400 if exc.status_name in ("invalid", "notfound") else 500
        raise RequestError(status, v.field if status == 400 else "", "%s.chunk: chunk ending at position %d: %s"
                           % (v.field, seen, exc.message))
    except ValueError as exc:  # ragged heads: transformers' cache holds equal lengths per head
        raise RequestError(400, v.field + ".chunk", "%s.chunk: chunk ending at position %d: %s" % (v.field, seen, exc))
    finally:
        ctx.close()
    res.compress_ms += st["compress_ms"]
    res.gather_ms += st["gather_ms"]
    res.merge = st["merge"]
    after = out.layers[0].keys.shape[2]
    res.chunks.append({"seen": seen, "rows_before": held, "rows_after": after})
    return out, after
