"""server.py -- kvsieve-hf's HTTP server: the API of `kvsieve serve` over a
transformers model (engine.py).

What it is: the same endpoints, fields and error shapes as the C server
(backend/server): GET /health, /v1/models, /metrics, /tokenizer_info (vLLM's);
POST /tokenize, /detokenize (llama-server's and vLLM's fields),
/completion (llama-server shape), /v1/completions (OpenAI shape; with echo,
logprobs or several prompts vLLM's, scoring.py), /v1/chat/completions and
/kv/dump (a safetensors cache dump). kv_compression.chunk: chunked prefill
compression (chunked.py). --api-key: every endpoint but /health
needs `Authorization: Bearer KEY` (or X-Api-Key), else 401 before the body is
read. --kv-compression: the variant of requests that carry no kv_compression.
The kvsieve extension: `kv_compression` (one {method, ratio | tokens,
params, suffix} or {variants: [...]}: one prefill, every variant compressed
from it), `kv_spans`, and per variant a `kv` object of statistics. Images:
llama-server's `multimodal_data` (base64 images, one `<__media__>` marker
per image in the prompt; the prompt may also be {prompt_string,
multimodal_data}) and OpenAI `image_url` content parts with data URLs.

Variants are compressed one after another from the one prefill, then
decoded together, up to --variant-batch (8) of them per forward pass (their
ragged caches padded and masked, engine.generate_batch); a variant's
predicted_ms is its batch's.

Careless clients: the model runs one request at a time; at most --queue
requests wait (more get 503 with Retry-After); bodies over --max-body bytes
get 413; a client that disconnects cancels its request between two decode
steps; SIGTERM stops accepting, lets the running request finish for at most
--drain-timeout seconds, then cancels it. Connections are served by threads
(at most --max-conn at once); idle sockets time out.

What it is not: no streaming (stream: true is refused), no batching across
requests.
"""
import hmac
import json
import os
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import kvsieve
import torch

from . import chunked, quant, scoring
from .fields import _bool, _num, _str
from .engine import IMAGE_MARKER, Cancelled, Prefill, RequestError, decode_image

KNOWN_VARIANT = ("method", "ratio", "tokens", "params", "compress_local", "name", "suffix", "chunk")


class Variant:
    def __init__(self, field, name, method, params, ratio, tokens, suffix, chunk=0):
        self.field, self.name, self.method, self.params = field, name, method, params
        self.ratio, self.tokens, self.suffix, self.chunk = ratio, tokens, suffix, chunk  # chunk 0: none


class GenSettings:
    def __init__(self):
        self.temperature, self.top_k, self.top_p, self.seed = 0.0, 0, 1.0, 0
        self.n_predict, self.limit, self.ignore_eos, self.stop = -1, 0, False, []


class Server:
    """The server state: engine, limits, counters. serve_forever() runs it."""

    def __init__(self, engine, host="127.0.0.1", port=8080, queue=16, n_predict_max=4096,
                 drain_timeout=10.0, max_body=256 << 20, max_conn=256, io_timeout=60.0, variant_batch=8,
                 api_key=None, kv_compression=None):
        """api_key: the key every endpoint but /health requires (None: open).
        kv_compression: the default variant(s), the JSON value of a request's
        kv_compression field (a JSON text or its parsed value); ValueError if bad."""
        self.engine = engine
        self.api_key = api_key or None
        self.default_kc = None
        if kv_compression is not None:
            kc = json.loads(kv_compression) if isinstance(kv_compression, str) else kv_compression
            try:
                self.parse_variants({"kv_compression": kc})
            except RequestError as exc:
                raise ValueError("--kv-compression: %s" % exc.message)
            self.default_kc = kc
        self.variant_batch = max(1, int(variant_batch))
        self.queue, self.n_predict_max = int(queue), int(n_predict_max)
        self.drain_timeout, self.max_body = float(drain_timeout), int(max_body)
        self.io_timeout = float(io_timeout)
        self.model_lock = threading.Lock()   # one request on the model at a time
        self.state_lock = threading.Lock()   # counters and the waiting count
        self.waiting = 0
        self.processing = 0
        self.draining = False
        self.shutdown_cancel = threading.Event()
        self.conn_slots = threading.BoundedSemaphore(int(max_conn))
        self.started = int(time.time())
        self.m = {"requests": {}, "errors4": {}, "errors5": {}, "prefills": 0, "compressions": 0,
                  "prompt_tokens": 0, "predicted_tokens": 0, "prompt_ms": 0.0, "predicted_ms": 0.0,
                  "compress_ms": 0.0, "handoff_ms": 0.0, "gather_ms": 0.0, "rejected_queue": 0,
                  "rejected_draining": 0, "cancel_disconnect": 0, "cancel_shutdown": 0, "images": 0,
                  "bytes_copied": 0}
        self.httpd = _HTTPServer((host, port), _Handler, self)

    @property
    def port(self):
        return self.httpd.server_address[1]

    def count(self, key, n=1, sub=None):
        with self.state_lock:
            if sub is None:
                self.m[key] += n
            else:
                self.m[key][sub] = self.m[key].get(sub, 0) + n

    def serve_forever(self):
        self.httpd.serve_forever(poll_interval=0.2)

    def drain_and_stop(self):
        """SIGTERM: refuse new work, wait up to drain_timeout for the running
        and queued requests, cancel what is left, stop."""
        self.draining = True
        t_end = time.monotonic() + self.drain_timeout
        while time.monotonic() < t_end:
            with self.state_lock:
                busy = self.processing + self.waiting
            if busy == 0:
                break
            time.sleep(0.05)
        self.shutdown_cancel.set()
        t_end = time.monotonic() + 5.0
        while time.monotonic() < t_end:
            with self.state_lock:
                if self.processing + self.waiting == 0:
                    break
            time.sleep(0.05)
        self.httpd.shutdown()
        self.httpd.server_close()

    # ---- running model work ------------------------------------------------------------
    def run_exclusive(self, fn, client):
        """Run fn(cancelled) on the model once it is free, as one queued request."""
        with self.state_lock:
            if self.draining:
                self.m["rejected_draining"] += 1
                raise RequestError(503, "", "the server is shutting down")
            if self.waiting >= self.queue:
                self.m["rejected_queue"] += 1
                err = RequestError(503, "", "the queue is full (%d waiting); retry later" % self.waiting)
                err.retry_after = 1
                raise err
            self.waiting += 1
        got = False
        try:
            while not got:
                got = self.model_lock.acquire(timeout=0.1)
                if not got and (_gone(client) or self.shutdown_cancel.is_set()):
                    self.count("cancel_disconnect" if not self.shutdown_cancel.is_set() else "cancel_shutdown")
                    raise Cancelled()
        finally:
            with self.state_lock:
                self.waiting -= 1
                if got:
                    self.processing += 1

        def cancelled():
            if self.shutdown_cancel.is_set():
                self.count("cancel_shutdown")
                return True
            if _gone(client):
                self.count("cancel_disconnect")
                return True
            return False

        try:
            return fn(cancelled)
        finally:
            with self.state_lock:
                self.processing -= 1
            self.model_lock.release()

    # ---- requests ------------------------------------------------------------------------
    def parse_variants(self, root):
        kc = root.get("kv_compression")
        if kc is None:
            kc = self.default_kc  # --kv-compression
        if kc is None:
            return [Variant("kv_compression", "", "full", {}, 1.0, None, "")], False
        base, lst = "kv_compression", None
        if isinstance(kc, list):
            lst = kc
        elif isinstance(kc, dict):
            if "variants" in kc:
                base = "kv_compression.variants"
                if len(kc) != 1:
                    raise RequestError(400, "kv_compression", "kv_compression: give either variants or one "
                                       "{method, ratio | tokens, params}, not both")
                lst = kc["variants"]
                if not isinstance(lst, list):
                    raise RequestError(400, base, "%s must be an array" % base)
        else:
            raise RequestError(400, "kv_compression", "kv_compression must be an object {method, ratio | "
                               "tokens, params} or {variants: [...]}")
        if lst is None:
            return [self.parse_variant(kc, "kv_compression")], False
        if not lst:
            raise RequestError(400, base, "%s must not be empty" % base)
        if len(lst) > 64:
            raise RequestError(400, base, "%s: at most 64 variants, got %d" % (base, len(lst)))
        out = [self.parse_variant(o, "%s[%d]" % (base, i)) for i, o in enumerate(lst)]
        for v in out:
            if v.chunk:
                raise RequestError(400, v.field + ".chunk", "%s.chunk: chunked compression runs one variant per "
                                   "request (each variant would need its own prefill)" % v.field)
        return out, True

    def parse_variant(self, o, field):
        if not isinstance(o, dict):
            raise RequestError(400, field, "%s must be an object {method, ratio | tokens, params}" % field)
        for k in o:
            if k not in KNOWN_VARIANT:
                raise RequestError(400, "%s.%s" % (field, k), "%s.%s: unknown field (known: %s)"
                                   % (field, k, ", ".join(KNOWN_VARIANT)))
        name = _str(o, "name", "", field + ".name")
        method = o.get("method")
        if not isinstance(method, str):
            raise RequestError(400, field + ".method", "%s.method is required (a string)" % field)
        params = o.get("params") or {}
        if not isinstance(params, dict):
            raise RequestError(400, field + ".params", "%s.params must be an object {name: value}" % field)
        for k, v in params.items():
            if not isinstance(v, (int, float, str, bool)):
                raise RequestError(400, "%s.params.%s" % (field, k), "%s.params.%s must be a number, a boolean "
                                   "or a string" % (field, k))
        ratio, tokens = o.get("ratio"), o.get("tokens")
        if ratio is not None and tokens is not None:
            raise RequestError(400, field + ".ratio", "%s: give ratio or tokens, not both" % field)
        if ratio is not None:
            if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
                raise RequestError(400, field + ".ratio", "%s.ratio must be in (0, 1], got %r" % (field, ratio))
            ratio = float(ratio)
        elif tokens is not None:
            if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
                raise RequestError(400, field + ".tokens", "%s.tokens must be an integer >= 1" % field)
        elif method == "full":
            ratio = 1.0
        else:
            raise RequestError(400, field + ".ratio", "%s: a budget is required: ratio in (0, 1] or tokens >= 1"
                               % field)
        _bool(o, "compress_local", False, field + ".compress_local")  # no local layers here
        chunk = _num(o, "chunk", 0, 1, 1 << 30, True, field + ".chunk")
        suffix = _str(o, "suffix", "", field + ".suffix")
        if method.startswith("kvpress:"):  # a kvpress press as a row (hf/kvpress_rows.py)
            self.engine.check_kvpress(method, params, ratio, tokens, field + ".method")
            return Variant(field, name, method, params, ratio, tokens, suffix)
        # validate the method, then each parameter on its own (so the error names it), with
        # libkvsieve's own messages
        for f, ps in [(field + ".method", {})] + [("%s.params.%s" % (field, k), {k: v}) for k, v in params.items()]:
            try:
                kvsieve.queries_wanted(method, ps, 1)
            except kvsieve.KvsError as exc:
                raise RequestError(400, f, "%s: %s" % (f, exc.message))
        needs = {m["name"]: m["needs"] for m in kvsieve.methods()}.get(method, [])
        if "recon" in needs:  # KVzip: the statistic comes from a model pass only the kvsieve engine runs
            raise RequestError(400, field + ".method", "%s.method: method %s needs the context-reconstruction "
                               "statistic (an extra forward pass of the model over the prompt), which kvsieve-hf "
                               "does not run; use `kvsieve serve` or `kvsieve generate`" % (field, method))
        return Variant(field, name, method, params, ratio, tokens, suffix, chunk)

    def parse_settings(self, root, oai):
        g = GenSettings()
        if _bool(root, "stream", False):
            raise RequestError(400, "stream", "stream: true is not supported; ask without streaming")
        if root.get("n") is not None:
            _num(root, "n", 1, 1, 1, True)
        g.temperature = _num(root, "temperature", 0.0, 0.0, 1e6)
        g.top_k = _num(root, "top_k", 0, 0, 2 ** 31 - 1, True)
        g.top_p = _num(root, "top_p", 1.0, 0.0, 1.0)
        seed = _num(root, "seed", -1, -1, 2 ** 53 - 1, True)
        g.seed = seed if seed >= 0 else int(time.time() * 1e6) & ((1 << 53) - 1)
        if oai:
            npf = "max_completion_tokens" if root.get("max_completion_tokens") is not None else "max_tokens"
        else:
            npf = "n_predict"
        np_ = _num(root, npf, -1, -1, 2 ** 31 - 1, True)
        if np_ > self.n_predict_max:
            raise RequestError(400, npf, "%s = %d is above this server's cap of %d tokens (--n-predict-max); ask "
                               "for at most that, or -1 for up to the cap" % (npf, np_, self.n_predict_max))
        g.n_predict = np_
        g.limit = self.n_predict_max if np_ < 0 else np_
        g.ignore_eos = _bool(root, "ignore_eos", False)
        st = root.get("stop")
        if isinstance(st, str):
            g.stop = [st] if st else []
        elif isinstance(st, list):
            for i, s in enumerate(st):
                if not isinstance(s, str):
                    raise RequestError(400, "stop[%d]" % i, "stop[%d] must be a string" % i)
            g.stop = [s for s in st if s]
        elif st is not None:
            raise RequestError(400, "stop", "stop must be a string or an array of strings")
        return g

    def parse_spans(self, root, prompt_is_text):
        sp = root.get("kv_spans")
        if sp is None:
            return None
        if not prompt_is_text:
            raise RequestError(400, "kv_spans", "kv_spans needs a string prompt (byte offsets into it)")
        if not isinstance(sp, list):
            raise RequestError(400, "kv_spans", "kv_spans must be an array of {start, end}")
        if len(sp) > 64:
            raise RequestError(400, "kv_spans", "kv_spans: at most 64 spans, got %d" % len(sp))
        out = []
        for i, o in enumerate(sp):
            f = "kv_spans[%d]" % i
            if not isinstance(o, dict):
                raise RequestError(400, f, "%s must be an object {start, end}" % f)
            b0, b1 = o.get("start"), o.get("end")
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in (b0, b1)) or not 0 <= b0 <= b1:
                raise RequestError(400, f, "%s must have integers 0 <= start <= end" % f)
            out.append((b0, b1))
        return out

    def images(self, lst, field):
        if lst is None:
            return []
        if not isinstance(lst, list):
            raise RequestError(400, field, "%s must be an array of base64 images" % field)
        return [decode_image(b, "%s[%d]" % (field, i)) for i, b in enumerate(lst)]

    def parse_prompt(self, root):
        """(Prompt, text or None) from prompt / multimodal_data."""
        eng = self.engine
        p = root.get("prompt")
        mm = root.get("multimodal_data")
        if isinstance(p, dict):  # llama-server's {prompt_string, multimodal_data}
            if mm is not None:
                raise RequestError(400, "multimodal_data", "give multimodal_data inside prompt or at the top, "
                                   "not both")
            mm = p.get("multimodal_data")
            mm_field = "prompt.multimodal_data"
            p = p.get("prompt_string")
            if not isinstance(p, str):
                raise RequestError(400, "prompt.prompt_string", "prompt.prompt_string must be a string")
        else:
            mm_field = "multimodal_data"
        if p is None:
            raise RequestError(400, "prompt", "prompt is required")
        if isinstance(p, list) and p and isinstance(p[0], str):
            if len(p) != 1:
                raise RequestError(400, "prompt", "prompt: only one prompt per request is supported, got %d"
                                   % len(p))
            p = p[0]
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], list):  # lm-eval's [[ids]]
            p = p[0]
        if isinstance(p, str):
            imgs = self.images(mm, mm_field)
            self.count("images", len(imgs))
            spans = self.parse_spans(root, not imgs)
            return eng.encode(p, imgs, spans), p
        if isinstance(p, list):
            if mm:
                raise RequestError(400, mm_field, "multimodal_data needs a text prompt with %s markers" % IMAGE_MARKER)
            if root.get("kv_spans") is not None:
                self.parse_spans(root, False)
            return eng.encode_ids(p), None
        raise RequestError(400, "prompt", "prompt must be a string or an array of token ids")

    def parse_messages(self, root):
        msgs = root.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise RequestError(400, "messages", "messages must be a non-empty array")
        out, images = [], []
        for i, m in enumerate(msgs):
            f = "messages[%d]" % i
            if not isinstance(m, dict):
                raise RequestError(400, f, "%s must be an object {role, content}" % f)
            role = m.get("role")
            if role not in ("system", "user", "assistant"):
                raise RequestError(400, f + ".role", "%s.role must be system, user or assistant" % f)
            c = m.get("content")
            parts = []
            if isinstance(c, str):
                parts.append({"type": "text", "text": c})
            elif isinstance(c, list):
                for j, part in enumerate(c):
                    pf = "%s.content[%d]" % (f, j)
                    t = part.get("type") if isinstance(part, dict) else None
                    if t == "text":
                        parts.append({"type": "text", "text": _str(part, "text", "", pf + ".text")})
                    elif t == "image_url":
                        iu = part.get("image_url")
                        url = iu.get("url") if isinstance(iu, dict) else iu
                        if not isinstance(url, str) or not url.startswith("data:"):
                            raise RequestError(400, pf + ".image_url", "%s.image_url: only data: URLs with base64 "
                                               "images are accepted (no downloads)" % pf)
                        images.append(decode_image(url, pf + ".image_url"))
                        parts.append({"type": "image"})
                    else:
                        raise RequestError(400, pf + ".type", "%s.type must be text or image_url" % pf)
            else:
                raise RequestError(400, f + ".content", "%s.content must be a string or an array of parts" % f)
            out.append({"role": role, "content": parts})
        self.count("images", len(images))
        return self.engine.encode_chat(out, images)

    # ---- the generation work ---------------------------------------------------------------
    def generate(self, prompt, variants, gen, client, want_plan=False):
        eng = self.engine
        if variants[0].chunk and variants[0].method != "full":
            v = variants[0]
            if eng.quantised():
                raise RequestError(400, v.field, "%s: chunk is not available with --cache-type %s (chunked "
                                   "prefill keeps transformers' own cache)" % (v.field, eng.cache_type_name()))
            if prompt.span_sets:
                raise RequestError(400, "kv_spans", "kv_spans: not available with kv_compression.chunk (several plans)")
            if want_plan:
                raise RequestError(400, "kv_plan", "kv_plan: not available with kv_compression.chunk (several plans)")
            return self.run_exclusive(lambda cancelled: self.generate_chunked(prompt, v, gen, cancelled), client)

        def work(cancelled):
            nq = eng.queries_wanted(variants, prompt.n_tokens)
            pre = eng.prefill(prompt, nq)
            self.count("prefills")
            self.count("prompt_tokens", prompt.n_tokens)
            self.count("prompt_ms", pre.ms)
            ctx, handoff_ms = eng.new_context(pre) if any(v.method != "full" for v in variants) else (None, 0.0)
            self.count("handoff_ms", handoff_ms)
            outs, pending = [], []
            try:
                for v in variants:
                    if cancelled():
                        raise Cancelled()
                    try:
                        plan, cache, st = eng.compress(ctx, pre, v)
                    except kvsieve.KvsError as exc:
                        status = 400 if exc.status_name in ("invalid", "notfound") else 500
                        raise RequestError(status, v.field if status == 400 else "", "%s: %s" % (v.field, exc.message))
                    span_kept = _span_kept(prompt, plan, eng.n_layers) if prompt.span_sets else None
                    if want_plan:
                        st["plan"] = plan.to_dict() if plan is not None else None
                    if plan is not None:
                        plan.free()
                    self.count("compressions", 1 if v.method != "full" else 0)
                    self.count("compress_ms", st["compress_ms"])
                    self.count("gather_ms", st["gather_ms"])
                    pending.append((v, st, cache, span_kept))
                    del cache
                # decode: up to --variant-batch variants with the same suffix as one batch
                i = 0
                while i < len(pending):
                    j = i + 1
                    while j < len(pending) and j - i < self.variant_batch and pending[j][0].suffix == pending[i][0].suffix:
                        j += 1
                    group = pending[i:j]
                    sfx = eng.tokenize(group[0][0].suffix, add_special=False) if group[0][0].suffix else []
                    caches = [c for _v, _st, c, _sk in group]
                    for k in range(i, j):  # the batch owns the caches now
                        pending[k] = pending[k][:2] + (None,) + pending[k][3:]
                    gens = eng.generate_batch(pre, caches, sfx, gen, cancelled)
                    for (v, st, _c, span_kept), g in zip(group, gens):
                        self.count("predicted_tokens", len(g.toks))
                        outs.append((v, st, g, span_kept))
                    self.count("predicted_ms", gens[0].ms)
                    i = j
                copies = ctx.stats() if ctx is not None else None
            finally:
                if ctx is not None:
                    ctx.close()
            if copies:
                self.count("bytes_copied", copies["bytes_copied"])
            return pre, outs, handoff_ms, copies

        return self.run_exclusive(work, client)

    def generate_chunked(self, prompt, v, gen, cancelled):
        """generate()'s work for one variant with chunk: chunked.prefill, then
        decoding from its cache. Returns what generate() returns."""
        eng = self.engine
        res = chunked.prefill(eng, prompt, v)
        self.count("prefills")
        self.count("prompt_tokens", prompt.n_tokens)
        self.count("prompt_ms", res.ms)
        self.count("compressions", len(res.chunks))
        self.count("compress_ms", res.compress_ms)
        self.count("gather_ms", res.gather_ms)
        # kv_json reads each layer's prompt shape from pre.layers: meta tensors of the uncompressed [1][H][N][d]
        layers = []
        for l in range(eng.n_layers):
            k = res.cache.layers[l].keys
            layers.append((torch.empty((1, k.shape[1], prompt.n_tokens, k.shape[3]), dtype=k.dtype, device="meta"),
                           None, None))
        pre = Prefill(prompt, layers, res.logits, res.ms, None)
        st = {"compress_ms": res.compress_ms, "gather_ms": res.gather_ms, "note": "", "merge": res.merge,
              "budgets": [res.cache.layers[l].keys.shape[2] for l in range(eng.n_layers)],
              "chunk": v.chunk, "chunks": res.chunks}
        sfx = eng.tokenize(v.suffix, add_special=False) if v.suffix else []
        g = eng.generate_batch(pre, [res.cache], sfx, gen, cancelled)[0]
        self.count("predicted_tokens", len(g.toks))
        self.count("predicted_ms", g.ms)
        return pre, [(v, st, g, None)], 0.0, None

    def kv_json(self, pre, v, st, g, span_kept, handoff_ms, copies):
        eng = self.engine
        layers, tb, ta, bb, ba = [], 0, 0, 0, 0
        for l, (k, _v, _q) in enumerate(pre.layers):
            H, N, d = k.shape[1], k.shape[2], k.shape[3]
            # bytes of one position: K and V of every KV head in their cache types (quant.py's blocks)
            row = H * sum(quant.row_bytes(t, d, k.element_size()) for t in eng.cache_type)
            B = st["budgets"][l]
            layers.append({"layer": l, "local": False, "compressed": v.method != "full",
                           "tokens_before": N, "tokens_after": B, "bytes_before": N * row, "bytes_after": B * row})
            tb, ta, bb, ba = tb + N, ta + B, bb + N * row, ba + B * row
        kv = {"method": v.method, "params": v.params,
              "budget": {"tokens": v.tokens} if v.tokens else {"ratio": v.ratio},
              "compress_local": False, "compress_ms": st["compress_ms"], "gather_ms": st["gather_ms"],
              "handoff_ms": handoff_ms, "copy_ms": st["gather_ms"], "merge": st["merge"],
              "n_prompt": pre.prompt.n_tokens, "n_image_tokens": int((pre.prompt.modality == 1).sum()),
              "modality_positions": _runs(pre.prompt.modality),
              "tokens_before": tb, "tokens_after": ta, "bytes_before": bb, "bytes_after": ba,
              "bytes_before_global": bb, "bytes_after_global": ba, "bytes_before_local": 0, "bytes_after_local": 0,
              "note": st["note"], "layers": layers, "device": str(eng.device),
              "cache_type": eng.cache_type_name(), "cache_quant": eng.cache_quant()}
        if "plan" in st:
            kv["plan"] = st["plan"]
        if "chunks" in st:  # chunked: what each compression kept (rows of a layer per KV head)
            kv["chunk"], kv["chunks"] = st["chunk"], st["chunks"]
        if copies is not None:
            kv["tensors_copied"] = copies["tensors_copied"]
            kv["bytes_copied"] = copies["bytes_copied"]
        if span_kept is not None:
            kv["span_kept"] = span_kept
        return kv


def _span_kept(prompt, plan, n_layers):
    """Per span, per layer: the share of the span's tokens kept, averaged over KV heads."""
    out = []
    for toks in prompt.span_sets:
        row = []
        for l in range(n_layers):
            if plan is None or not toks:
                row.append(1.0)
                continue
            heads = plan.indices(l)
            kept = sum(sum(1 for i in h if i in toks) for h in heads)
            row.append(kept / (len(heads) * len(toks)))
        out.append(row)
    return out


def _runs(mod):
    """[[start, end, modality], ...] runs of non-text positions."""
    out, start, cur = [], None, 0
    vals = mod.tolist()
    for i, m in enumerate(vals + [0]):
        if m != cur:
            if cur != 0:
                out.append([start, i, cur])
            start, cur = i, m
    return out


def _gone(sock):
    """The client closed its side (EOF readable without data)."""
    if sock is None:
        return False
    try:
        r, _, _ = select.select([sock], [], [], 0)
        if not r:
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


# ---- HTTP ------------------------------------------------------------------------------------

class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, addr, handler, app):
        self.app = app
        super().__init__(addr, handler)

    def process_request(self, request, client_address):
        if not self.app.conn_slots.acquire(blocking=False):  # --max-conn: refuse, do not spawn a thread
            try:
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n"
                                b"Connection: close\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.app.conn_slots.release()


ENDPOINTS = {("GET", "/health"), ("GET", "/v1/health"), ("GET", "/v1/models"), ("GET", "/metrics"),
             ("POST", "/tokenize"), ("POST", "/detokenize"), ("POST", "/completion"),
             ("POST", "/completions"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
             ("POST", "/kv/dump"), ("GET", "/tokenizer_info")}
OPEN = ("/health", "/v1/health")  # answered without the API key


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "kvsieve-hf"

    def setup(self):
        super().setup()
        self.connection.settimeout(self.server.app.io_timeout)

    def log_message(self, fmt, *args):  # quiet: the C server logs nothing per request either
        pass

    def _send(self, status, body, ctype="application/json", retry_after=None):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            if retry_after:
                self.send_header("Retry-After", str(retry_after))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the client left

    def _error(self, err):
        app = self.server.app
        status = err.status
        typ = ("server_error" if status >= 500 and status != 503 else "not_found_error" if status == 404
               else "unavailable_error" if status == 503 else "authentication_error" if status == 401
               else "invalid_request_error")
        e = {"message": err.message, "type": typ, "code": status}
        if err.field:
            e["field"] = err.field
        app.count("errors5" if status >= 500 else "errors4", 1, self.path.split("?")[0])
        self._send(status, {"error": e}, retry_after=getattr(err, "retry_after", None))

    def _body(self):
        n = self.headers.get("Content-Length")
        if n is None:
            raise RequestError(411, "", "a Content-Length header is required")
        try:
            n = int(n)
        except ValueError:
            raise RequestError(400, "", "Content-Length is not a number")
        if n > self.server.app.max_body:
            self.close_connection = True
            raise RequestError(413, "", "request body of %d bytes is over this server's limit of %d "
                               "(--max-body)" % (n, self.server.app.max_body))
        raw = self.rfile.read(n)
        try:
            root = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise RequestError(400, "", "the body is not valid JSON: %s" % exc)
        if not isinstance(root, dict):
            raise RequestError(400, "", "the body must be a JSON object")
        return root

    def do_GET(self):
        self._route("GET")

    def do_POST(self):
        self._route("POST")

    def _route(self, verb):
        app = self.server.app
        path = self.path.split("?")[0]
        app.count("requests", 1, path if (verb, path) in ENDPOINTS else "other")
        try:
            if app.api_key and path not in OPEN:
                self._authorize(app.api_key)
            if (verb, path) not in ENDPOINTS:
                raise RequestError(404, "path", "no endpoint %s %s (known: %s)" % (
                    verb, path, ", ".join("%s %s" % e for e in sorted(ENDPOINTS))))
            if path in ("/health", "/v1/health"):
                return self._send(200, {"status": "draining" if app.draining else "ok",
                                        "requests_processing": app.processing, "requests_waiting": app.waiting,
                                        "kv_compression": app.default_kc})  # what requests without one get
            if path == "/v1/models":
                info = app.engine.info()
                return self._send(200, {"object": "list", "data": [{
                    "id": app.engine.alias, "object": "model", "created": app.started, "owned_by": "kvsieve",
                    "meta": dict(info, backend="kvsieve-hf", kv_compression=app.default_kc)}]})
            if path == "/metrics":
                return self._send(200, _metrics(app).encode(), "text/plain; version=0.0.4")
            if path == "/tokenizer_info":
                return self._send(200, _tokenizer_info(app.engine))
            root = self._body()
            if path == "/tokenize":
                return self._send(200, _tokenize(app.engine, root))
            if path == "/detokenize":
                return self._send(200, _detokenize(app.engine, root))
            if path == "/kv/dump":
                from .dump import dump_bytes
                return self._send(200, dump_bytes(app, root, self.connection), "application/octet-stream")
            return self._generate(path, root)
        except RequestError as err:
            self._error(err)
        except Cancelled:
            self.close_connection = True
        except Exception as exc:  # a bug or a model failure: 500, the server stays up
            self._error(RequestError(500, "", "%s: %s" % (type(exc).__name__, exc)))

    def _authorize(self, key):
        """401 unless the request presents the key (Authorization: Bearer KEY,
        the scheme in any case, or X-Api-Key); the body is not read, so the
        connection closes after the answer."""
        auth = self.headers.get("Authorization")
        if auth:
            given = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        else:
            given = self.headers.get("X-Api-Key")
        if given is None or not hmac.compare_digest(given.encode(), key.encode()):
            self.close_connection = True
            raise RequestError(401, "authorization", "invalid API key" if given is not None else
                               "missing API key (send the header `Authorization: Bearer KEY`)")

    def _generate(self, path, root):
        app = self.server.app
        if path in ("/v1/completions", "/completions") and scoring.wants_scoring(root):
            req = scoring.parse(app, root)
            scored = app.run_exclusive(lambda cancelled: scoring.run(app, req, cancelled), self.connection)
            return self._send(200, scoring.answer(app, req, scored))
        oai = path != "/completion"
        gen = app.parse_settings(root, oai)
        variants, several = app.parse_variants(root)
        if path == "/v1/chat/completions":
            prompt, text = app.parse_messages(root), None
        else:
            prompt, text = app.parse_prompt(root)
        want_plan = _bool(root, "kv_plan", False)
        pre, outs, handoff_ms, copies = app.generate(prompt, variants, gen, self.connection, want_plan)
        vjson = []
        for i, (v, st, g, span_kept) in enumerate(outs):
            timings = {"prompt_n": prompt.n_tokens, "prompt_ms": pre.ms,
                       "prompt_per_token_ms": pre.ms / prompt.n_tokens,
                       "prompt_per_second": 1e3 * prompt.n_tokens / pre.ms if pre.ms > 0 else 0.0,
                       "predicted_n": len(g.toks), "predicted_ms": g.ms,
                       "predicted_per_token_ms": g.ms / len(g.toks) if g.toks else 0.0,
                       "predicted_per_second": 1e3 * len(g.toks) / g.ms if g.ms > 0 and g.toks else 0.0,
                       "compress_ms": st["compress_ms"], "suffix_ms": g.suffix_ms}
            finish = "stop" if g.stop_type in ("eos", "word") else "length"
            vjson.append({"index": i, "name": v.name or v.method, "content": g.text, "tokens": g.toks,
                          "stop_type": g.stop_type, "stopping_word": g.word, "finish_reason": finish,
                          "tokens_predicted": len(g.toks), "timings": timings,
                          "kv": app.kv_json(pre, v, st, g, span_kept, handoff_ms, copies)})
        first = vjson[0]
        settings = {"n_predict": gen.n_predict, "n_predict_max": app.n_predict_max, "ignore_eos": gen.ignore_eos,
                    "temperature": gen.temperature, "top_k": gen.top_k, "top_p": gen.top_p, "seed": gen.seed,
                    "stop": gen.stop, "n_ctx": app.engine.n_ctx}
        if path == "/completion":
            out = {"content": first["content"], "tokens": first["tokens"], "id_slot": 0, "stop": True,
                   "model": app.engine.alias, "tokens_predicted": first["tokens_predicted"],
                   "tokens_evaluated": prompt.n_tokens, "generation_settings": settings, "truncated": False,
                   "stop_type": first["stop_type"], "stopping_word": first["stopping_word"],
                   "tokens_cached": prompt.n_tokens + first["tokens_predicted"], "timings": first["timings"],
                   "kv": first["kv"]}
        else:
            chat = path == "/v1/chat/completions"
            choice = {"index": 0, "finish_reason": first["finish_reason"]}
            if chat:
                choice["message"] = {"role": "assistant", "content": first["content"]}
            else:
                choice["text"] = first["content"]
            out = {"id": "kvs-%d" % int(time.time() * 1e6), "object": "chat.completion" if chat else "text_completion",
                   "created": int(time.time()), "model": app.engine.alias, "choices": [choice],
                   "usage": {"prompt_tokens": prompt.n_tokens, "completion_tokens": first["tokens_predicted"],
                             "total_tokens": prompt.n_tokens + first["tokens_predicted"]},
                   "timings": first["timings"], "kv": first["kv"]}
        if several:
            out["variants"] = vjson
        out["backend"] = "kvsieve-hf"
        self._send(200, out)


def _tokenize(eng, root):
    """llama-server's {content, add_special=false} or vLLM's {prompt,
    add_special_tokens=true} (then the answer also has count and max_model_len)."""
    vllm = "content" not in root and "prompt" in root
    field = "prompt" if vllm else "content"
    text = root.get(field)
    if text is None:
        raise RequestError(400, "content", "content (llama-server) or prompt (vLLM) is required (the text to tokenize)")
    if not isinstance(text, str):
        raise RequestError(400, field, "%s must be a string" % field)
    add = _bool(root, "add_special_tokens" if vllm else "add_special", vllm)
    with_pieces = _bool(root, "with_pieces", False)
    ids = eng.tokenize(text, add)
    out = {"tokens": [{"id": t, "piece": eng.detokenize([t])} for t in ids] if with_pieces else ids}
    if vllm:
        out["count"], out["max_model_len"] = len(ids), eng.n_ctx
    return out


def _detokenize(eng, root):
    toks = root.get("tokens")
    if toks is None:
        raise RequestError(400, "tokens", "tokens is required (an array of token ids)")
    if not isinstance(toks, list):
        raise RequestError(400, "tokens", "tokens must be an array of token ids")
    n_vocab = len(eng.tokenizer)
    for i, t in enumerate(toks):
        f = "tokens[%d]" % i
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t != int(t):
            raise RequestError(400, f, "%s must be an integer token id" % f)
        if not 0 <= t < n_vocab:
            raise RequestError(400, f, "%s = %s is not a token id (vocabulary has %d)" % (f, t, n_vocab))
    text = eng.detokenize([int(t) for t in toks])
    return {"content": text, "prompt": text}  # llama-server's name, vLLM's


def _tokenizer_info(eng):
    """vLLM's /tokenizer_info as lm-evaluation-harness's remote tokenizer reads
    it (special tokens as text; it finds their ids through /tokenize) and the
    same fields as kvsieve serve; the tokenizer's chat template when it has one."""
    tok = eng.tokenizer
    out = {"tokenizer_class": type(tok).__name__}
    for name in ("eos", "bos", "pad", "unk", "eot"):
        text = getattr(tok, name + "_token", None) if name != "eot" else None
        tid = tok.convert_tokens_to_ids(text) if isinstance(text, str) else None
        ok = isinstance(tid, int) and tid >= 0
        out[name + "_token"], out[name + "_token_id"] = (text, tid) if ok else (None, None)
    with_sp, without = eng.tokenize("a", True), eng.tokenize("a", False)
    out["add_bos_token"] = bool(out["bos_token_id"] is not None and len(with_sp) > len(without)
                                and with_sp[0] == out["bos_token_id"])
    out["vocab_size"] = len(tok)
    out["model_max_length"] = out["max_model_len"] = eng.n_ctx
    tmpl = getattr(tok, "chat_template", None)
    if isinstance(tmpl, str) and tmpl:
        out["chat_template"] = tmpl
    return out


def _metrics(app):
    with app.state_lock:
        m = {k: (dict(v) if isinstance(v, dict) else v) for k, v in app.m.items()}
        waiting, processing = app.waiting, app.processing
    lines = []
    for ep, n in sorted(m["requests"].items()):
        lines.append('kvsieve_requests_total{endpoint="%s"} %d' % (ep, n))
    for key, cls in (("errors4", "4xx"), ("errors5", "5xx")):
        for ep, n in sorted(m[key].items()):
            lines.append('kvsieve_request_errors_total{endpoint="%s",class="%s"} %d' % (ep, cls, n))
    for name, key in (("prefills_total", "prefills"), ("compressions_total", "compressions"),
                      ("prompt_tokens_total", "prompt_tokens"), ("predicted_tokens_total", "predicted_tokens"),
                      ("images_total", "images"), ("requests_rejected_queue_full_total", "rejected_queue"),
                      ("requests_rejected_draining_total", "rejected_draining"),
                      ("abi_bytes_copied_total", "bytes_copied")):
        lines.append("kvsieve_%s %d" % (name, m[key]))
    for name, key in (("prompt_ms_total", "prompt_ms"), ("predicted_ms_total", "predicted_ms"),
                      ("compress_ms_total", "compress_ms"), ("handoff_ms_total", "handoff_ms"),
                      ("gather_ms_total", "gather_ms")):
        lines.append("kvsieve_%s %.3f" % (name, m[key]))
    lines.append('kvsieve_requests_cancelled_total{reason="disconnect"} %d' % m["cancel_disconnect"])
    lines.append('kvsieve_requests_cancelled_total{reason="shutdown"} %d' % m["cancel_shutdown"])
    lines.append("kvsieve_requests_processing %d" % processing)
    lines.append("kvsieve_requests_waiting %d" % waiting)
    lines.append("kvsieve_queue_capacity %d" % app.queue)
    return "\n".join(lines) + "\n"
