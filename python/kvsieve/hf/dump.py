"""dump.py -- a prompt's cache as a kvsieve dump (safetensors), from a
transformers model.

What it is: the tensors `kvsieve compress`, `kvsieve fidelity` and the
`overhead` experiment kind read (layout in formats/kvs_formats.h):
layers.{l}.k / .v [Hkv][N][d] post-RoPE, layers.{l}.q [Hq][Nq][d] the
queries of the last Nq positions (optional), modality [N] U8 (0 text,
1 image, 2 video), with __metadata__ naming the generator, model and
prompt length. Written with the safetensors package. Used by POST /kv/dump
and by `kvsieve-hf dump`.
What it is not: no compression; no probe queries (fidelity's probes come
from kvsieve's own synthetic caches).
"""
import torch

from .engine import RequestError

_DT = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def dump_tensors(engine, prompt, n_queries, dtype="F32"):
    """({name: tensor}, metadata) of the prompt's prefill cache. n_queries:
    0 none, -1 (or more than N) every position, else the last n."""
    if dtype not in _DT:
        raise RequestError(400, "dtype", "dtype must be F32, F16 or BF16, got %r" % (dtype,))
    N = prompt.n_tokens
    nq = N if n_queries < 0 or n_queries > N else int(n_queries)
    pre = engine.prefill(prompt, nq)
    out = {}
    for l, (k, v, q) in enumerate(pre.layers):
        out["layers.%d.k" % l] = k[0].to(_DT[dtype]).contiguous().cpu()
        out["layers.%d.v" % l] = v[0].to(_DT[dtype]).contiguous().cpu()
        if q is not None:
            out["layers.%d.q" % l] = q[0].to(_DT[dtype]).contiguous().cpu()
    out["modality"] = prompt.modality.contiguous()
    meta = {"generator": "kvsieve-hf /kv/dump", "model": engine.alias, "arch": engine.arch,
            "n_prompt": str(N), "layer_map": ",".join(str(l) for l in range(engine.n_layers)),
            "n_image_tokens": str(int((prompt.modality == 1).sum()))}
    return out, meta


def dump_bytes(app, root, client):
    """POST /kv/dump: {prompt (+ multimodal_data), queries, dtype} -> bytes."""
    from safetensors.torch import save
    dtype = root.get("dtype", "F32")
    nq = root.get("queries", 0)
    if isinstance(nq, bool) or not isinstance(nq, int) or nq < -1:
        raise RequestError(400, "queries", "queries must be an integer >= -1 (-1: every position)")
    prompt, _text = app.parse_prompt(root)

    def work(_cancelled):
        t, meta = dump_tensors(app.engine, prompt, nq, dtype)
        return save(t, metadata=meta)

    return app.run_exclusive(work, client)


def write(path, engine, prompt, n_queries, dtype="F32"):
    from safetensors.torch import save_file
    t, meta = dump_tensors(engine, prompt, n_queries, dtype)
    save_file(t, path, metadata=meta)
    return t, meta
