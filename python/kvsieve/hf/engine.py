"""engine.py -- one transformers model, one prefill, many compressed variants.

What it is: the model work of kvsieve-hf. Load a causal LM or a
vision-language model with its tokenizer / processor; turn a prompt (text
with image markers, or chat messages with images) into model inputs and a
modality mask; run ONE prefill that records the post-RoPE queries the
requested methods need; then per variant ask libkvsieve for a plan on the
model's own cache tensors (kvsieve.Context over torch tensors: the CUDA
kernels for CUDA tensors, the CPU path otherwise) and build that variant's
cache by gathering each layer's kept rows per KV head (torch.gather on the
cache's device; libkvsieve's apply for the merging methods), every layer with
its own length; run the variant's suffix as one chunk and decode greedily
(or sampled) at positions that continue at the prompt's length N, whatever
the cache kept (Qwen2-VL's M-RoPE deltas included).

The invariant that makes this exact: a layer's cache rows are post-RoPE keys
and values of the prompt; dropping rows is the same as masking those tokens
for every later query. tests/test_hf_server.py checks decoding from the
gathered cache against a decode on the full cache with those tokens masked.

What it is not: no HTTP (server.py), no batching across variants or requests
(variants run one after another), no sliding-window or soft-capped models
(refused at load), no streaming.
"""
import base64
import inspect
import io
import os
import threading
import time

import torch

import kvsieve
from . import attention, kvpress_rows, quant

IMAGE_MARKER = "<__media__>"  # llama-server's default media marker in a prompt


class RequestError(Exception):
    """A request the engine cannot serve: HTTP status, the JSON field, message."""

    def __init__(self, status, field, message):
        super().__init__(message)
        self.status, self.field, self.message = status, field, message


class Cancelled(Exception):
    """The client went away; the work was stopped between two model calls."""


def _now():
    return time.perf_counter() * 1e3


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


DTYPES = {"auto": "auto", "float32": torch.float32, "fp32": torch.float32, "f32": torch.float32,
          "float16": torch.float16, "fp16": torch.float16, "f16": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


class Engine:
    """model: a local folder or hub id (transformers' from_pretrained), or a
    .gguf file (loaded through transformers' GGUF reader, dequantised).
    device: "cpu", "cuda" or "cuda:N". dtype: auto | float32 | float16 |
    bfloat16. threads: libkvsieve worker threads for compress / apply."""

    def __init__(self, model, device="cpu", dtype="auto", threads=1, alias=None, cache_type_k="f16",
                 cache_type_v=None):
        import transformers
        if dtype not in DTYPES:
            raise ValueError("--dtype %r: use one of %s" % (dtype, ", ".join(DTYPES)))
        cache_type_v = cache_type_v or cache_type_k
        for flag, t in (("--cache-type-k", cache_type_k), ("--cache-type-v", cache_type_v)):
            if t not in quant.TYPES:
                raise ValueError("%s %r: use one of %s" % (flag, t, ", ".join(quant.TYPES)))
        # K and V cache types: "f16" keeps the cache dtype; q8_0 / q4_0 store the rows through quant.py
        self.cache_type = (cache_type_k, cache_type_v)
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device %s: torch sees no CUDA device" % device)
        attention.register()
        self.path = model
        kw = {"dtype": DTYPES[dtype]}
        gguf = None
        if str(model).endswith(".gguf"):
            if not os.path.isfile(model):
                raise ValueError("--model %s: no such GGUF file" % model)
            gguf = os.path.basename(model)
            model = os.path.dirname(os.path.abspath(model))
            kw["gguf_file"] = gguf
            if dtype == "auto":
                kw["dtype"] = torch.float32  # the reader dequantises; keep it exact
        config = transformers.AutoConfig.from_pretrained(model, **({"gguf_file": gguf} if gguf else {}))
        self.multimodal = hasattr(config, "vision_config")
        if self.multimodal:
            self.processor = transformers.AutoProcessor.from_pretrained(model)
            self.tokenizer = self.processor.tokenizer
            self.model = transformers.AutoModelForImageTextToText.from_pretrained(model, **kw)
        else:
            self.processor = None
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(model, **(
                {"gguf_file": gguf} if gguf else {}))
            self.model = transformers.AutoModelForCausalLM.from_pretrained(model, **kw)
        self.model.to(self.device).eval()
        self.text_config = self.model.config.get_text_config()
        self._refuse_unsupported()
        # our attention for the language model only; the vision tower keeps its own
        if self.multimodal:
            self.model.set_attn_implementation({"text_config": attention.NAME})
        else:
            self.model.set_attn_implementation(attention.NAME)
        self.attn_modules = [m for m in self.model.modules()
                             if getattr(m, "layer_idx", None) is not None and hasattr(m, "num_key_value_groups")]
        self.n_layers = self.text_config.num_hidden_layers
        if len(self.attn_modules) != self.n_layers:
            raise ValueError("%s: found %d attention modules with a layer_idx, the config says %d layers"
                             % (self.path, len(self.attn_modules), self.n_layers))
        cfg = self.model.config
        self.image_token_id = _first_attr(cfg, "image_token_id", "image_token_index")
        self.video_token_id = _first_attr(cfg, "video_token_id", "video_token_index")
        self.mrope = hasattr(getattr(self.model, "model", None), "rope_deltas")
        self.eos_ids = self._eos_ids()
        self.threads = max(1, int(threads))
        # a fast tokenizer mutates its own state (padding / truncation) on every call and raises
        # "Already borrowed" when two threads meet in it: every tokenizer / processor call takes this
        self.tok_lock = threading.Lock()
        self.alias = alias or os.path.basename(os.path.normpath(str(self.path)))
        self.n_ctx = int(getattr(self.text_config, "max_position_embeddings", 32768) or 32768)
        self.arch = getattr(cfg, "model_type", "?")
        self.cache_kw = cache_keyword(self.model)
        if self.quantised():
            d = getattr(self.text_config, "head_dim", None) or self.text_config.hidden_size // \
                self.text_config.num_attention_heads
            for t in self.cache_type:
                quant.row_bytes(t, d)  # head sizes that are not whole blocks are refused here, not per request

    # -- facts ---------------------------------------------------------------------
    def quantised(self):
        return any(t != "f16" for t in self.cache_type)

    def cache_type_name(self):
        k, v = self.cache_type
        return k if k == v else "%s/%s" % (k, v)

    def cache_quant(self):
        """The response's statement of how the cache type is applied (quant.py)."""
        if not self.quantised():
            return "none: the cache keeps the model dtype"
        return ("kvsieve-hf quant.py: GGUF Q8_0 / Q4_0 blocks round-tripped in torch (byte-identical to the "
                "engine's rows) on every row stored after the prefill (the kept rows, then each decoded "
                "token's), held in the cache dtype; the prefill attends in the model dtype; transformers' "
                "QuantizedCache needs optimum-quanto or hqq, not installed")

    def new_cache(self):
        """A DynamicCache, or a QuantCache storing rows in the cache types."""
        import transformers
        if self.quantised():
            return quant.QuantCache(*self.cache_type, config=self.model.config)
        return transformers.DynamicCache(config=self.model.config)

    def _refuse_unsupported(self):
        tc = self.text_config
        types = getattr(tc, "layer_types", None) or []
        if any(t != "full_attention" for t in types):
            raise ValueError("%s: layer types %s: kvsieve-hf serves models whose layers all use full "
                             "attention (no sliding-window or linear layers yet)" % (self.path, sorted(set(types))))
        if getattr(tc, "use_sliding_window", False) and getattr(tc, "sliding_window", None):
            raise ValueError("%s: use_sliding_window is set; kvsieve-hf serves full-attention models only" % self.path)
        for k in ("attn_logit_softcapping", "final_logit_softcapping"):
            if getattr(tc, k, None):
                raise ValueError("%s: %s is set; kvsieve-hf's attention has no soft-capping" % (self.path, k))

    def _eos_ids(self):
        ids = set()
        for src in (getattr(self.model, "generation_config", None), self.text_config, self.tokenizer):
            e = getattr(src, "eos_token_id", None)
            if isinstance(e, int):
                ids.add(e)
            elif isinstance(e, (list, tuple)):
                ids.update(int(x) for x in e)
        return ids

    def info(self):
        """/v1/models meta. A single-file model (GGUF) reports its size, so
        the runner hashes the file itself into the cells' model identity."""
        size = {"size": os.path.getsize(self.path)} if os.path.isfile(str(self.path)) else {}
        return {**size, "model": self.alias, "path": str(self.path), "arch": self.arch, "n_layers": self.n_layers,
                "n_ctx": self.n_ctx, "multimodal": self.multimodal, "device": str(self.device),
                "dtype": str(self.model.dtype).replace("torch.", ""), "n_vocab": len(self.tokenizer),
                "image_token_id": self.image_token_id, "kvsieve": kvsieve.build_info(),
                "cache_type": self.cache_type_name(), "cache_type_k": self.cache_type[0],
                "cache_type_v": self.cache_type[1], "cache_quant": self.cache_quant(),
                "transformers": __import__("transformers").__version__, "torch": torch.__version__}

    # -- inputs --------------------------------------------------------------------------
    def tokenize(self, text, add_special=True):
        with self.tok_lock:
            return self.tokenizer(text, add_special_tokens=add_special)["input_ids"]

    def detokenize(self, ids, skip_special=False):
        with self.tok_lock:
            return self.tokenizer.decode(ids, skip_special_tokens=skip_special)

    def image_placeholder(self):
        """What one image marker becomes in the text given to the processor."""
        tok = getattr(self.processor, "image_token", None) or "<image>"
        vocab = self.tokenizer.get_vocab()
        if self.mrope and "<|vision_start|>" in vocab:  # Qwen2-VL family: the processor expects the frame
            return "<|vision_start|>%s<|vision_end|>" % tok
        return tok

    def encode(self, text, images=(), spans=None):
        """Model inputs for a prompt. text: the prompt, with one IMAGE_MARKER
        per image (in order); images: PIL images. Returns a Prompt."""
        with self.tok_lock:
            return self._encode(text, images, spans)

    def _encode(self, text, images, spans):
        n_mark = text.count(IMAGE_MARKER)
        if images or n_mark:
            if not self.multimodal:
                raise RequestError(400, "multimodal_data", "this model (%s) is text-only; it cannot take "
                                   "images" % self.alias)
            if n_mark != len(images):
                raise RequestError(400, "multimodal_data", "the prompt has %d %s markers but %d images were "
                                   "given; put one marker where each image goes" % (n_mark, IMAGE_MARKER, len(images)))
            if spans:
                raise RequestError(400, "kv_spans", "kv_spans are byte offsets into a text prompt; they "
                                   "cannot be placed in a prompt with images")
            text = text.replace(IMAGE_MARKER, self.image_placeholder())
            batch = self.processor(text=[text], images=list(images), return_tensors="pt")
            return self._prompt(batch, None)
        if self.multimodal:
            batch = self.processor(text=[text], return_tensors="pt")
        else:
            batch = self.tokenizer(text, return_tensors="pt")
        span_sets = _span_tokens(self.tokenizer, text, spans) if spans else None
        return self._prompt(batch, span_sets)

    def encode_chat(self, messages, images):
        """Chat messages (content parts already turned into {"type": "text" |
        "image"}) -> a Prompt through the model's chat template."""
        with self.tok_lock:
            return self._encode_chat(messages, images)

    def _encode_chat(self, messages, images):
        owner = self.processor if self.multimodal else self.tokenizer
        if not getattr(owner, "chat_template", None) and not getattr(self.tokenizer, "chat_template", None):
            raise RequestError(400, "messages", "model %s has no chat template; use /completion with a "
                               "prompt" % self.alias)
        if images and not self.multimodal:
            raise RequestError(400, "messages", "this model (%s) is text-only; it cannot take images" % self.alias)
        if self.multimodal:
            text = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            batch = self.processor(text=[text], images=list(images) or None, return_tensors="pt")
        else:
            flat = [{"role": m["role"], "content": "".join(p.get("text", "") for p in m["content"])}
                    for m in messages]
            text = self.tokenizer.apply_chat_template(flat, tokenize=False, add_generation_prompt=True)
            batch = self.tokenizer(text, return_tensors="pt", add_special_tokens=False)
        return self._prompt(batch, None)

    def encode_ids(self, ids):
        n_vocab = len(self.tokenizer)
        for i, t in enumerate(ids):
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < n_vocab:
                raise RequestError(400, "prompt[%d]" % i, "prompt[%d] must be a token id in [0, %d)" % (i, n_vocab))
        return self._prompt({"input_ids": torch.tensor([ids], dtype=torch.long)}, None)

    def _prompt(self, batch, span_sets):
        batch = dict(batch)
        batch.pop("offset_mapping", None)
        ids = batch["input_ids"]
        if ids.shape[1] < 1:
            raise RequestError(400, "prompt", "prompt is empty (no tokens)")
        if ids.shape[1] > self.n_ctx:
            raise RequestError(400, "prompt", "prompt has %d tokens, more than the context of %d; it is not "
                               "truncated" % (ids.shape[1], self.n_ctx))
        mod = torch.zeros(ids.shape[1], dtype=torch.uint8)
        if self.image_token_id is not None:
            mod[ids[0] == self.image_token_id] = 1
        if self.video_token_id is not None:
            mod[ids[0] == self.video_token_id] = 2
        batch.pop("attention_mask", None)  # one sequence, no padding: the attention needs no mask
        return Prompt(batch, mod, span_sets)

    # -- model calls ---------------------------------------------------------------------
    def _positions(self, start, n):
        """Position ids of n tokens after `start` logical positions."""
        pos = torch.arange(start, start + n, device=self.device)
        if self.mrope:
            deltas = self.model.model.rope_deltas
            if deltas is None:
                deltas = torch.zeros(1, 1, dtype=torch.long, device=self.device)
            return pos.view(1, 1, n).expand(3, 1, n) + deltas.to(self.device).view(1, -1, 1)
        return pos.view(1, n)

    def prefill(self, prompt, n_queries, all_logits=False):
        """One forward pass over the prompt. n_queries: how many of the last
        query rows to record per layer (0: none). all_logits: keep every
        position's logits (pre.all_logits [N][V], the model's dtype; scoring.py).
        Returns a Prefill."""
        import transformers
        N = prompt.n_tokens
        nq = min(int(n_queries), N)
        recorded = {}

        def record(layer, q):  # q [1][Hq][N][d], post-RoPE
            recorded[layer] = q[:, :, N - nq:, :].detach()

        if nq > 0:
            for m in self.attn_modules:
                m._kvsieve_recorder = record
        inputs = {k: (v.to(self.device) if torch.is_tensor(v) else v) for k, v in prompt.batch.items()}
        if self.mrope:
            self.model.model.rope_deltas = None  # computed again from this prompt's images
        else:
            inputs["position_ids"] = self._positions(0, N)
        cache = transformers.DynamicCache(config=self.model.config)
        _sync(self.device)
        t0 = _now()
        try:
            with torch.inference_mode():
                out = self.model(**inputs, **{self.cache_kw: cache}, use_cache=True,
                                 logits_to_keep=0 if all_logits else 1)
        finally:
            for m in self.attn_modules:
                m._kvsieve_recorder = None
        _sync(self.device)
        ms = _now() - t0
        layers = [(cache.layers[l].keys, cache.layers[l].values, recorded.get(l)) for l in range(self.n_layers)]
        deltas = self.model.model.rope_deltas.clone() if self.mrope and self.model.model.rope_deltas is not None else None
        pre = Prefill(prompt, layers, out.logits[0, -1].float(), ms, deltas)
        pre.all_logits = out.logits[0] if all_logits else None
        return pre

    # -- compression ------------------------------------------------------------------------
    def queries_wanted(self, variants, n_tokens):
        return max([kvsieve.queries_wanted(v.method, v.params, n_tokens) for v in variants
                    if not kvpress_rows.is_kvpress(v.method)] + [0])

    def check_kvpress(self, method, params, ratio, tokens, field):
        """Refuse a `kvpress:<Press>(args)` variant that cannot run (kvpress_rows.py)."""
        try:
            kvpress_rows.build(method, params, ratio, tokens, field)
        except kvpress_rows.RequestError as exc:
            raise RequestError(exc.status, exc.field, exc.message)

    def new_context(self, pre):
        """A libkvsieve context over the prefill's cache tensors (borrowed,
        no copy where the layout allows). Returns (ctx, handoff_ms)."""
        t0 = _now()
        ctx = kvsieve.Context(threads=self.threads)
        ctx.begin(self.n_layers)
        for l, (k, v, q) in enumerate(pre.layers):
            ctx.set_layer(l, k, v, q)
        ctx.set_modality(pre.prompt.modality)
        return ctx, _now() - t0

    def compress(self, ctx, pre, variant):
        """The variant's plan and cache: (plan or None for full, cache, stats)."""
        import transformers
        if kvpress_rows.is_kvpress(variant.method):  # a kvpress press on the same request
            if self.quantised():
                raise RequestError(400, variant.field, "%s: kvpress rows run on transformers' own cache; "
                                   "not available with --cache-type %s" % (variant.field, self.cache_type_name()))
            try:
                return kvpress_rows.compress(self, pre, variant)
            except kvpress_rows.RequestError as exc:
                raise RequestError(exc.status, exc.field, exc.message)
        N = pre.prompt.n_tokens
        cache = self.new_cache()  # the kept rows enter it through update(): quantised there
        if variant.method == "full":
            for l, (k, v, _q) in enumerate(pre.layers):
                cache.update(k, v, l)  # shares the prefill's tensors: update() concatenates, never writes in place
            return None, cache, {"compress_ms": 0.0, "gather_ms": 0.0, "budgets": [N] * self.n_layers,
                                 "note": "", "merge": "none"}
        plan = ctx.compress(variant.method, variant.params, ratio=variant.ratio, tokens=variant.tokens)
        info = plan.info()
        budgets = plan.budgets
        for l in range(self.n_layers):
            if len(set(plan.head_counts(l))) > 1:
                # transformers' cache holds [1, H, B, d] per layer: equal lengths per head. Padding with a
                # per-head mask would report padded bytes; the kvsieve engine stores ragged heads instead.
                raise ValueError("kvsieve-hf: plan of %s keeps different counts per KV head in layer %d "
                                 "(ragged); transformers' cache needs equal lengths per head; run it with "
                                 "`kvsieve generate` / `kvsieve serve`, whose engine stores ragged heads"
                                 % (variant.method, l))
        _sync(self.device)
        t0 = _now()
        with torch.inference_mode():
            for l, (k, v, _q) in enumerate(pre.layers):
                H, d, B = k.shape[1], k.shape[3], budgets[l]
                if info["merge_name"] == "none" and not info["key_channels"]:
                    idx = plan.indices(l, out=torch.empty((H, B), dtype=torch.int64, device=k.device))
                    g = idx.view(1, H, B, 1).expand(1, H, B, d)
                    kl, vl = torch.gather(k, 2, g), torch.gather(v, 2, g)
                else:  # merged rows or zeroed key channels (ThinK): libkvsieve computes them (fp32 on a GPU)
                    odt = k.dtype if k.device.type == "cpu" else torch.float32
                    kl = torch.empty((1, H, B, d), dtype=odt, device=k.device)
                    vl = torch.empty((1, H, B, d), dtype=odt, device=k.device)
                    ctx.apply(plan, l, kl, vl)
                    kl, vl = kl.to(k.dtype), vl.to(v.dtype)
                cache.update(kl, vl, l)
        _sync(self.device)
        gather_ms = _now() - t0
        stats = {"compress_ms": info["compress_ms"], "gather_ms": gather_ms, "budgets": budgets,
                 "note": info["note"], "merge": info["merge_name"]}
        return plan, cache, stats

    # -- decoding ---------------------------------------------------------------------------
    def generate(self, pre, cache, suffix_ids, gen, cancelled):
        """Greedy (temperature 0) or sampled decoding from a variant's cache.
        The first token comes from the prefill's logits, or from the suffix's
        when there is one. Returns a Generation. (generate_batch with one
        variant: the same loop, no padding and no prefix mask.)"""
        return self.generate_batch(pre, [cache], suffix_ids, gen, cancelled)[0]

    def generate_batch(self, pre, caches, suffix_ids, gen, cancelled):
        """generate() for several variants of one prefill at once: their
        caches (each batch 1, every layer its own length) are padded per layer
        to the longest, stacked into one batch and masked (attention.py), so
        each step is one forward pass over V tokens. Same tokens as V calls of
        generate() up to the float rounding of batched matrix products (tested). The
        per-variant caches are consumed. Returns one Generation per variant
        (decode and suffix times are the batch's, shared)."""
        import transformers
        V = len(caches)
        N = pre.prompt.n_tokens
        valid = None  # one variant: its own cache as it is, nothing to pad or mask
        if V == 1:
            cache = caches[0]
        else:
            cache = self.new_cache()  # the decoded rows are quantised as they enter
            valid = []
        for l in range(self.n_layers if V > 1 else 0):
            ks = [c.layers[l].keys for c in caches]
            vs = [c.layers[l].values for c in caches]
            P = max(k.shape[2] for k in ks)
            H, d = ks[0].shape[1], ks[0].shape[3]
            K = ks[0].new_zeros((V, H, P, d))
            Vv = vs[0].new_zeros((V, H, P, vs[0].shape[3]))
            ok = torch.zeros((V, P), dtype=torch.bool, device=ks[0].device)
            for b, (k, v) in enumerate(zip(ks, vs)):
                K[b, :, :k.shape[2]] = k[0]
                Vv[b, :, :v.shape[2]] = v[0]
                ok[b, :k.shape[2]] = True
            transformers.DynamicCache.update(cache, K, Vv, l)  # rows already stored in the cache types
            valid.append(ok)
        caches.clear()
        if self.mrope:
            self.model.model.rope_deltas = pre.rope_deltas
        rngs = [None] * V
        if gen.temperature > 0:
            rngs = [torch.Generator(device="cpu") for _ in range(V)]
            for r in rngs:
                r.manual_seed(int(gen.seed))
        if valid is not None:
            for m in self.attn_modules:
                m._kvsieve_prefix = valid[m.layer_idx]
        toks = [[] for _ in range(V)]
        texts, stops, words = [""] * V, ["limit"] * V, [""] * V
        done = [gen.limit <= 0] * V
        pos, sfx_ms = N, 0.0
        try:
            logits = pre.logits.expand(V, -1)
            if suffix_ids:
                _sync(self.device)
                t0 = _now()
                logits = self._step_batch([list(suffix_ids)] * V, pos, cache)
                _sync(self.device)
                sfx_ms = _now() - t0
                pos += len(suffix_ids)
            _sync(self.device)
            t0 = _now()
            while not all(done):
                if cancelled():
                    raise Cancelled()
                feed = []
                for b in range(V):
                    if done[b]:
                        feed.append([toks[b][-1] if toks[b] else 0])  # keeps the batch shape; ignored
                        continue
                    tok = _sample(logits[b], gen, rngs[b])
                    if tok in self.eos_ids and not gen.ignore_eos:
                        stops[b], done[b] = "eos", True
                        feed.append([tok])
                        continue
                    toks[b].append(tok)
                    if gen.stop:
                        text = self.detokenize(toks[b], skip_special=True)
                        hit = _find_stop(text, gen.stop)
                        if hit is not None:
                            texts[b], words[b], stops[b], done[b] = text[:hit[0]], hit[1], "word", True
                    if len(toks[b]) >= gen.limit:
                        done[b] = True
                    feed.append([tok])
                if all(done):
                    break
                logits = self._step_batch(feed, pos, cache)
                pos += 1
            _sync(self.device)
            ms = _now() - t0
        finally:
            for m in self.attn_modules:
                m._kvsieve_prefix = None
        out = []
        for b in range(V):
            text = texts[b] if stops[b] == "word" else self.detokenize(toks[b], skip_special=True)
            out.append(Generation(toks[b], text, stops[b], words[b], ms, sfx_ms))
        return out

    def _step(self, ids, start, cache):
        """One forward call of one sequence: logits of its last position."""
        return self._step_batch([ids], start, cache)[0]

    def _step_batch(self, ids, start, cache):
        V, n = len(ids), len(ids[0])
        inp = torch.tensor(ids, dtype=torch.long, device=self.device)
        pos = self._positions(start, n)
        pos = pos.expand(3, V, n) if self.mrope else pos.expand(V, n)
        with torch.inference_mode():
            out = self.model(input_ids=inp, position_ids=pos, **{self.cache_kw: cache}, use_cache=True,
                             logits_to_keep=1)
        return out.logits[:, -1].float()


def cache_keyword(model):
    """The name of the model call's cache argument: `cache` in transformers
    5.24 (past_key_values a deprecated alias), `past_key_values` in 5.2 (the
    one kvpress 0.5.5 runs on); an unknown keyword would vanish into **kwargs."""
    params = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    raise ValueError("%s: its forward() takes neither `cache` nor `past_key_values`" % type(model).__name__)


def _sample(logits, gen, rng):
    if gen.temperature <= 0:
        return int(torch.argmax(logits).item())
    x = logits / gen.temperature
    if gen.top_k and gen.top_k > 0:
        kth = torch.topk(x, min(gen.top_k, x.numel())).values[-1]
        x = torch.where(x < kth, torch.full_like(x, float("-inf")), x)
    p = torch.softmax(x, dim=-1)
    if gen.top_p < 1.0:
        sp, si = torch.sort(p, descending=True)
        keep = torch.cumsum(sp, 0) - sp < gen.top_p
        mask = torch.zeros_like(p, dtype=torch.bool)
        mask[si[keep]] = True
        p = torch.where(mask, p, torch.zeros_like(p))
        p = p / p.sum()
    return int(torch.multinomial(p.cpu(), 1, generator=rng).item())


def _find_stop(text, stops):
    best = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, s)
    return best


def _first_attr(obj, *names):
    for n in names:
        v = getattr(obj, n, None)
        if isinstance(v, int):
            return v
    return None


def _span_tokens(tokenizer, text, spans):
    """kv_spans (byte offsets into the UTF-8 prompt) -> per span the set of
    token indices whose characters overlap it (as kvsieve serve counts)."""
    enc = tokenizer(text, return_offsets_mapping=True)
    offs = enc["offset_mapping"]
    char_of_byte = []
    for ci, ch in enumerate(text):
        char_of_byte.extend([ci] * len(ch.encode("utf-8")))
    char_of_byte.append(len(text))
    nb = len(char_of_byte) - 1
    out = []
    for i, (b0, b1) in enumerate(spans):
        if not (0 <= b0 <= b1 <= nb):
            raise RequestError(400, "kv_spans[%d]" % i, "kv_spans[%d] = [%d, %d) is outside the prompt's %d bytes"
                               % (i, b0, b1, nb))
        c0, c1 = char_of_byte[b0], char_of_byte[b1]
        out.append({t for t, (s, e) in enumerate(offs) if e > s and s < c1 and e > c0})
    return out


def decode_image(b64, field):
    """A base64 image (or a data: URL) -> PIL image, or a RequestError naming field."""
    from PIL import Image
    if not isinstance(b64, str):
        raise RequestError(400, field, "%s must be a base64 string" % field)
    if b64.startswith("data:"):
        head, _, b64 = b64.partition(",")
        if ";base64" not in head:
            raise RequestError(400, field, "%s: only base64 data URLs are accepted" % field)
    try:
        raw = base64.b64decode(b64, validate=True)
    except ValueError as exc:
        raise RequestError(400, field, "%s is not valid base64: %s" % (field, exc))
    try:
        img = Image.open(io.BytesIO(raw))
        img.load()
    except Exception as exc:  # PIL raises many types for bad images
        raise RequestError(400, field, "%s is not an image PIL can read: %s" % (field, exc))
    return img.convert("RGB")


class Prompt:
    """Model inputs of one prompt: batch (input_ids [1][N], pixel inputs,
    ...), modality [N] uint8 (0 text, 1 image, 2 video), and per kv_span the
    set of its token indices (or None)."""

    def __init__(self, batch, modality, span_sets):
        self.batch, self.modality, self.span_sets = batch, modality, span_sets
        self.n_tokens = int(batch["input_ids"].shape[1])
        self.ids = batch["input_ids"][0].tolist()


class Prefill:
    """layers: per layer (k, v, q) as the model's cache holds them ([1][Hkv][N][d]
    and the recorded [1][Hq][Nq][d] queries or None); logits of the last
    position; prefill time; Qwen2-VL's M-RoPE deltas (or None)."""

    def __init__(self, prompt, layers, logits, ms, rope_deltas):
        self.prompt, self.layers, self.logits, self.ms, self.rope_deltas = prompt, layers, logits, ms, rope_deltas


class Generation:
    def __init__(self, toks, text, stop_type, word, ms, suffix_ms):
        self.toks, self.text, self.stop_type, self.word = toks, text, stop_type, word
        self.ms, self.suffix_ms = ms, suffix_ms
