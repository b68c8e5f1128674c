"""kvpress.py -- kvsieve's methods as kvpress presses (kvpress 0.5.5).

    from kvsieve.kvpress import KvsievePress
    press = KvsievePress("flashcache", compression_ratio=0.75, window=16)
    with press(model):
        model.model(input_ids=ids, past_key_values=cache)       # the prefill
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tok)
    pipe(context, question=q, press=press)

What it is: a kvpress BasePress whose prefill hook hands the layer's keys,
values and the post-RoPE queries the method reads to libkvsieve (the kvsieve
binding), then writes the plan's kept rows back into the transformers cache.
Any preset of `kvsieve methods` or a composition given as a dict
({"score": "snapkv", "allocate": "adakv", ...}) works, with its parameters as
keyword arguments. compression_ratio is kvpress's: the share REMOVED; kvsieve
is asked for the kept share 1 - compression_ratio (B = floor(rho N), at least
1, as everywhere in kvsieve), and 0 leaves the cache alone as kvpress does.

All layers in one plan: kvsieve's methods may split budgets across layers
(pyramid, FlashCache's DBA), so the press records each layer's queries as its
hook runs and compresses every layer at once in the LAST layer's hook. That
is exact (a layer's rows are only read by later forward calls) and gives the
same plan as kvsieve-hf on the same prompt; the price is that the prefill's
peak holds every layer's full cache, as kvsieve-hf's does. For that reason
the press cannot run inside presses that call it layer by layer
(ComposedPress, ChunkPress, ...): it refuses with an error saying so.

Ragged heads (head-adaptive plans: the adakv presets and `heads: adakv`
compositions): transformers' DynamicLayer holds one [B][H][n][d] tensor, so
heads with different counts do not fit it, and kvpress's own AdaKVPress keeps
every row and hides the evicted ones behind fake keys (no memory saved). Here
such a layer becomes a RaggedLayer: the kept rows of all heads packed in one
[sum_h c_h][d] tensor per K and V (the prompt's full tensors are freed), plus
the rows decoding appends ([1][H][t][d]). For each forward call it lays them
out padded ([1][H][max c_h + t][d], a temporary freed after the layer) and
marks the key tensor, so that the SDPA attention (wrapped here) masks each
head's padding; other attention implementations are refused for ragged plans.
Its `.keys` / `.values` are that padded view (zeros in the padding); setting
them to a slice of that view (kvpress's pipeline drops an answer that way)
truncates the appended rows. Batch 1 only (kvpress's pipeline).

What it is not: no decoding-time compression (DecodingPress), no
QuantizedCache, no images (kvpress's pipeline passes text: the modality mask
says text for every token, as kvsieve-hf's does for a text prompt), no batches of several prompts.
"""
import json
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from kvpress.presses.base_press import BasePress, is_prefilling
from kvpress.utils import get_prerope_query_states
from transformers import Gemma3ForConditionalGeneration, QuantizedCache
from transformers.cache_utils import DynamicLayer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import kvsieve


def kept_share(compression_ratio):
    """kvpress's compression_ratio (share removed) -> kvsieve's ratio (share kept)."""
    cr = float(compression_ratio)
    if not 0.0 <= cr < 1.0:
        raise ValueError("compression_ratio must be in [0, 1) (the share of the cache removed), got %r" % cr)
    return 1.0 - cr


def method_name(method):
    """A preset name as is; a composition dict as its JSON text (what libkvsieve reads)."""
    if isinstance(method, dict):
        return json.dumps(method, separators=(",", ":"))
    if isinstance(method, str):
        return method
    raise TypeError("method must be a preset name or a composition dict, not %s" % type(method).__name__)


@dataclass(init=False)
class KvsievePress(BasePress):
    """A kvsieve method as a kvpress press. method: a preset name or a
    composition dict; compression_ratio: the share removed (kvpress's);
    threads: libkvsieve worker threads; **params: the method's parameters
    by name. After a compression, .last holds its budgets per layer, head
    counts of ragged layers, compress_ms, merge and note."""

    method: object = "snapkv"
    compression_ratio: float = 0.0
    params: dict = field(default_factory=dict)
    threads: int = 1

    def __init__(self, method, compression_ratio=0.0, threads=1, **params):
        self.method = method
        self.compression_ratio = compression_ratio
        self.params = dict(params)
        self.threads = int(threads)
        kept_share(compression_ratio)
        kvsieve.queries_wanted(method_name(method), self.params, 1)  # unknown method / parameter: KvsError now
        self.last = None
        self._layer_ids = None   # the layers BasePress hooks, in order
        self._own_call = False   # set while our own __call__ holds the hooks
        self._queries = {}       # layer -> [1][Hq][nq][d] post-RoPE queries of this prefill
        self._modules = {}       # layer -> its attention module

    # -- kvpress's entry points ---------------------------------------------------------
    def post_init_from_model(self, model):
        lm = model.model.language_model if hasattr(model.model, "language_model") else model.model
        gemma3 = isinstance(model, Gemma3ForConditionalGeneration)
        self._layer_ids = [ly.self_attn.layer_idx for ly in lm.layers if not (gemma3 and ly.self_attn.is_sliding)]

    @contextmanager
    def __call__(self, model):
        self._own_call = True
        try:
            with super().__call__(model):
                yield
        finally:
            self._own_call = False
            self._queries = {}

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        raise NotImplementedError(
            "KvsievePress compresses all layers in one plan after the last layer's prefill (kvsieve's methods "
            "may allocate budgets across layers); it has no per-layer compress() for wrapper presses")

    def forward_hook(self, module, input, kwargs, output):
        hidden = kwargs["hidden_states"]
        if not is_prefilling(kwargs["cache_position"], hidden.shape[1]):
            return output
        if not self._own_call:
            raise RuntimeError("KvsievePress must be applied with its own `with press(model):` (or as the "
                               "pipeline's press), not inside ComposedPress or another press: it compresses "
                               "all layers in one plan")
        if self.compression_ratio == 0:
            return output
        cache = kwargs["past_key_values"]
        if isinstance(cache, QuantizedCache):
            raise NotImplementedError("KvsievePress: QuantizedCache is not supported (use a DynamicCache)")
        if hidden.shape[0] != 1:
            raise ValueError("KvsievePress: batch %d; kvsieve compresses one prompt at a time (batch 1)"
                             % hidden.shape[0])
        layer = module.layer_idx
        if layer == self._layer_ids[0]:
            self._queries, self._modules = {}, {}
        n = hidden.shape[1]
        nq = min(kvsieve.queries_wanted(method_name(self.method), self.params, n), n)
        self._modules[layer] = module
        if nq > 0:
            self._queries[layer] = _post_rope_queries(module, hidden[:, n - nq:], kwargs["position_embeddings"], nq)
        if layer == self._layer_ids[-1]:
            try:
                self._compress_all(cache, module.config)
            finally:
                self._queries, self._modules = {}, {}
        return output

    # -- the plan -------------------------------------------------------------------------
    def _compress_all(self, cache, config):
        ids = self._layer_ids
        layers = [cache.layers[l] for l in ids]
        rho = kept_share(self.compression_ratio)
        with kvsieve.Context(threads=self.threads) as ctx:
            ctx.begin(len(ids))
            for i, (l, ly) in enumerate(zip(ids, layers)):
                ctx.set_layer(i, ly.keys, ly.values, self._queries.get(l))
            ctx.set_modality(bytes(layers[0].keys.shape[2]))  # kvpress gives text: every token 0
            plan = ctx.compress(method_name(self.method), self.params, ratio=rho)
            try:
                info, budgets = plan.info(), plan.budgets
                counts = [plan.head_counts(i) for i in range(len(ids))]
                ragged = any(len(set(c)) > 1 for c in counts)
                if ragged:
                    impl = getattr(config, "_attn_implementation", None)
                    if impl != "sdpa":
                        raise ValueError("KvsievePress: %s keeps a different number of rows per KV head (ragged); "
                                         "its padded layout is masked in the SDPA attention only, and this model "
                                         "uses %r (load it with attn_implementation='sdpa')" % (self.method, impl))
                _install_mask_hook()
                new = []
                # a plan that zeroes key channels (ThinK) goes through libkvsieve's apply like a merging one
                how = info["merge_name"] if not info["key_channels"] else "key_channels"
                with torch.inference_mode():
                    for i, ly in enumerate(layers):
                        k, v = ly.keys, ly.values
                        if len(set(counts[i])) > 1:
                            new.append(_ragged_layer(ctx, plan, i, k, v, counts[i], how))
                        else:
                            new.append(_dense(ctx, plan, i, k, v, budgets[i], how))
            finally:
                plan.free()
        uneven = len(set(budgets)) > 1
        for l in ids:
            self._modules[l]._kvsieve_uneven = uneven
        for l, ly, nl in zip(ids, layers, new):
            if isinstance(nl, RaggedLayer):
                cache.layers[l] = nl
            else:
                ly.keys, ly.values = nl
        self.last = {"budgets": budgets, "head_counts": {ids[i]: c for i, c in enumerate(counts) if len(set(c)) > 1},
                     "compress_ms": info["compress_ms"], "merge": info["merge_name"], "note": info["note"],
                     "n_tokens": info["n_tokens"], "method": info["method"]}


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _post_rope_queries(module, hidden, position_embeddings, nq):
    """[1][Hq][nq][d] queries of the last nq positions, as the layer's attention
    sees them (projection and q-norm through kvpress's helper, then RoPE)."""
    q = get_prerope_query_states(module, hidden)
    cos, sin = position_embeddings
    cos, sin = cos[:, -nq:].unsqueeze(1), sin[:, -nq:].unsqueeze(1)
    return (q * cos + _rotate_half(q) * sin).detach()


def _dense(ctx, plan, layer, k, v, B, merge):
    """(keys, values) [1][H][B][d] of an equal-count layer."""
    H, d = k.shape[1], k.shape[3]
    if merge == "none":
        idx = plan.indices(layer, out=torch.empty((H, B), dtype=torch.int64, device=k.device))
        g = idx.view(1, H, B, 1).expand(1, H, B, d)
        return torch.gather(k, 2, g).contiguous(), torch.gather(v, 2, g).contiguous()
    odt = k.dtype if k.device.type == "cpu" else torch.float32  # libkvsieve merges in fp32 on a GPU
    kl = torch.empty((1, H, B, d), dtype=odt, device=k.device)
    vl = torch.empty((1, H, B, v.shape[3]), dtype=odt, device=k.device)
    ctx.apply(plan, layer, kl, vl)
    return kl.to(k.dtype), vl.to(v.dtype)


def _ragged_layer(ctx, plan, layer, k, v, counts, merge):
    H, d = k.shape[1], k.shape[3]
    if merge != "none":
        if k.device.type != "cpu":
            raise ValueError("KvsievePress: a ragged merging plan is applied per head on host caches only")
        ks, vs = [], []
        for h, c in enumerate(counts):
            kh = torch.empty((c, d), dtype=k.dtype)
            vh = torch.empty((c, v.shape[3]), dtype=v.dtype)
            ctx.apply_head(plan, layer, h, kh, vh)
            ks.append(kh)
            vs.append(vh)
        return RaggedLayer(torch.cat(ks), torch.cat(vs), counts)
    rows = torch.cat([torch.tensor(plan.head_indices(layer, h), dtype=torch.int64) + h * k.shape[2]
                      for h in range(H)]).to(k.device)
    return RaggedLayer(k[0].reshape(H * k.shape[2], d).index_select(0, rows),
                       v[0].reshape(H * v.shape[2], v.shape[3]).index_select(0, rows), counts)


class RaggedLayer(DynamicLayer):
    """A cache layer whose KV heads keep different numbers of prompt rows.
    k_rows / v_rows [sum c_h][d]: head 0's rows, then head 1's...; counts [H];
    rows appended later (decoding, a question) live in tail_k / tail_v
    [1][H][t][d]. update() returns the padded [1][H][max c + t][d] layout
    with its key tensor marked for the attention mask."""

    is_sliding = False

    def __init__(self, k_rows, v_rows, counts):  # no DynamicLayer.__init__: .keys is a property here
        self.k_rows, self.v_rows = k_rows, v_rows
        self.counts = list(counts)
        self.dtype, self.device = k_rows.dtype, k_rows.device
        self.is_initialized = True
        H, P = len(self.counts), max(self.counts)
        c = torch.tensor(self.counts, device=self.device)
        j = torch.arange(P, device=self.device)
        self.valid = j[None, :] < c[:, None]  # [H][P]
        self.dest = (torch.arange(H, device=self.device)[:, None] * P + j[None, :])[self.valid]  # [sum c]
        self.tail_k = k_rows.new_empty((1, H, 0, k_rows.shape[1]))
        self.tail_v = v_rows.new_empty((1, H, 0, v_rows.shape[1]))
        self._view = None  # weakref to the last padded key / value views handed out

    def nbytes(self):
        """Bytes this layer holds (rows, appended rows, mask and index)."""
        ts = (self.k_rows, self.v_rows, self.tail_k, self.tail_v, self.valid, self.dest)
        return sum(t.numel() * t.element_size() for t in ts)

    def _padded(self):
        H, P = self.valid.shape
        out = []
        for rows, tail in ((self.k_rows, self.tail_k), (self.v_rows, self.tail_v)):
            pre = rows.new_zeros((H * P, rows.shape[1])).index_copy_(0, self.dest, rows)
            out.append(torch.cat([pre.view(1, H, P, rows.shape[1]), tail], dim=2))
        out[0]._kvsieve_valid = self.valid
        self._view = (weakref.ref(out[0]), weakref.ref(out[1]))
        return out[0], out[1]

    def update(self, key_states, value_states, cache_kwargs=None):
        if key_states.shape[0] != 1:
            raise ValueError("RaggedLayer: batch %d; a ragged layer holds one sequence" % key_states.shape[0])
        self.tail_k = torch.cat([self.tail_k, key_states.to(self.dtype)], dim=2)
        self.tail_v = torch.cat([self.tail_v, value_states.to(self.dtype)], dim=2)
        return self._padded()

    def get_seq_length(self):
        return self.valid.shape[1] + self.tail_k.shape[2]

    def get_max_cache_shape(self):
        return -1

    def _set(self, which, t):
        view = self._view[which]() if self._view is not None else None
        if t is view:
            return
        if view is None or t._base is not view or t.shape[2] < self.valid.shape[1]:
            raise ValueError("RaggedLayer: .keys / .values can only be set to a slice [:, :, :n] (n >= %d) of "
                             "the padded view it handed out; the kept rows of a ragged layer are not "
                             "replaced" % self.valid.shape[1])
        n = t.shape[2] - self.valid.shape[1]
        if which == 0:
            self.tail_k = self.tail_k[:, :, :n]
        else:
            self.tail_v = self.tail_v[:, :, :n]

    @property
    def keys(self):
        return self._padded()[0]

    @keys.setter
    def keys(self, t):
        self._set(0, t)

    @property
    def values(self):
        return self._padded()[1]

    @values.setter
    def values(self, t):
        self._set(1, t)

    def crop(self, max_length):
        P = self.valid.shape[1]
        if max_length < 0:
            max_length = self.get_seq_length() + max_length
        if max_length < P:
            raise ValueError("RaggedLayer: cannot crop to %d rows, below the %d kept prompt rows" % (max_length, P))
        self.tail_k, self.tail_v = self.tail_k[:, :, :max_length - P], self.tail_v[:, :, :max_length - P]

    def reset(self):
        for t in (self.k_rows, self.v_rows, self.tail_k, self.tail_v):
            t.zero_()

    def _refuse(self, *args, **kwargs):
        raise NotImplementedError("RaggedLayer holds one sequence; beam search, batch reordering and "
                                  "offloading are not supported")

    reorder_cache = batch_repeat_interleave = batch_select_indices = offload = prefetch = _refuse


def _ragged_mask(valid, query, key):
    """[1][Hq][q][K] bool: each head's kept prefix rows, then the appended rows causally."""
    H, P = valid.shape
    Hq, q, K = query.shape[1], query.shape[2], key.shape[2]
    A = K - P
    pre = valid.repeat_interleave(Hq // H, dim=0)[None, :, None, :].expand(1, Hq, q, P)
    i = torch.arange(q, device=key.device)[:, None]
    j = torch.arange(A, device=key.device)[None, :]
    tail = (j <= (A - q) + i)[None, None].expand(1, Hq, q, A)
    return torch.cat([pre.to(key.device), tail], dim=3)


def _install_mask_hook():
    """Wrap the SDPA attention once: a RaggedLayer's key tensor brings its
    mask; and after a plan with different lengths per layer, a layer whose
    length is not the one transformers sized the mask from (layer 0's) gets
    its own causal mask for a chunk of several tokens (a question), where the
    model's mask would not fit (kvpress's own PyramidKVPress fails there with
    transformers 5.2's SDPA: "The size of tensor a ... must match")."""
    fn = ALL_ATTENTION_FUNCTIONS["sdpa"]
    if getattr(fn, "_kvsieve_ragged", False):
        return

    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        valid = getattr(key, "_kvsieve_valid", None)
        if valid is not None:
            if key.shape[0] != 1:
                raise ValueError("kvsieve ragged layer %s: batch %d" % (getattr(module, "layer_idx", "?"), key.shape[0]))
            attention_mask = _ragged_mask(valid, query, key)
            kwargs.pop("is_causal", None)
        elif (attention_mask is not None and attention_mask.shape[-1] != key.shape[2] and key.shape[0] == 1
              and getattr(module, "_kvsieve_uneven", False)):
            q, K = query.shape[2], key.shape[2]
            i = torch.arange(q, device=key.device)[:, None]
            j = torch.arange(K, device=key.device)[None, :]
            attention_mask = (j <= (K - q) + i)[None, None]
        return fn(module, query, key, value, attention_mask, *args, **kwargs)

    attention._kvsieve_ragged = True
    ALL_ATTENTION_FUNCTIONS["sdpa"] = attention
