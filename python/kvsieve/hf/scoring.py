"""scoring.py -- kvsieve-hf's /v1/completions with echo, logprobs and several
prompts, in vLLM's shape (what lm-evaluation-harness's local-completions
reads), as `kvsieve serve` answers it (backend/server/logprobs.c).

What it is: the request parser (prompts as text, [text], [ids] or [[ids]];
logprobs N in [0, 20] or true; echo; max_tokens, default 16 as OpenAI's), the
model work (per prompt one prefill keeping every position's logits, then a
greedy continuation of max_tokens from the variant's cache) and the answer.
Log-probabilities are log-softmax of the engine's fp32-cast logits computed
in float64 (x - max - log(sum exp(x - max))), -inf clamped to -9999.0 as vLLM
does; the chosen token's value is one Python float written both in
token_logprobs and in its top_logprobs entry, and JSON prints floats so they
read back exactly, so lm-eval's greedy test (token_logprob == max(top)) is
exact. A kv_compression variant (the request's, else the server's default)
is applied after the prefill: prompt positions are scored on the full
prefill, the continuation is decoded from the compressed cache; with its
`chunk`, every position is scored over the cache compressed so far
(chunked.py), so log-likelihoods of long texts see the compression.

What it is not: sampling (temperature must be 0), stop strings, streaming,
several variants or a suffix, images (each refused with 400 naming the field); more than
64 prompts or 32,768 tokens with max_tokens per request.
"""
import time

import torch

import kvsieve
from . import chunked
from .engine import Cancelled, RequestError
from .fields import _bool, _num

MAX_PROMPTS = 64
MAX_TOP = 20
MAX_TOKENS = 32768
FLOOR = -9999.0  # vLLM's clamp of -inf
ROWS = 256       # positions per log-softmax block (bounds the float64 copy)


def wants_scoring(root):
    """echo, logprobs, or several prompts: this path instead of the plain one."""
    lp = root.get("logprobs")
    if root.get("echo") is True or (lp is not None and lp is not False):
        return True
    p = root.get("prompt")
    return isinstance(p, list) and len(p) > 1 and isinstance(p[0], (str, list))


class ScoreRequest:
    def __init__(self):
        self.prompts = []   # engine Prompts
        self.n_top = -1     # logprobs N (-1: none asked)
        self.echo = False
        self.max_tokens = 16
        self.variant = None


def parse(app, root):
    """A ScoreRequest from the body, or RequestError naming the field."""
    r = ScoreRequest()
    if _bool(root, "stream", False):
        raise RequestError(400, "stream", "stream: streaming responses are not supported")
    _num(root, "n", 1, 1, 1, True)
    if _num(root, "temperature", 0.0, 0.0, 1e6) != 0:
        raise RequestError(400, "temperature", "temperature: echo, logprobs and several prompts are served "
                           "greedily; send temperature 0")
    st = root.get("stop")
    if st is not None and st != [] and st != "":
        raise RequestError(400, "stop", "stop strings are not supported with echo, logprobs or several prompts")
    for k in ("multimodal_data", "kv_spans"):
        if root.get(k) not in (None, []):
            raise RequestError(400, k, "%s is not supported with echo, logprobs or several prompts" % k)
    r.echo = _bool(root, "echo", False)
    lp = root.get("logprobs")
    if lp is True:
        r.n_top = 0  # a bare true (chat style): the chosen token only
    elif lp is not None and lp is not False:
        r.n_top = _num(root, "logprobs", 0, 0, MAX_TOP, True)
    r.max_tokens = _num(root, "max_tokens", 16, 0, app.n_predict_max, True)
    if not r.echo and r.max_tokens == 0:
        raise RequestError(400, "max_tokens", "max_tokens: 0 is only meaningful with echo: true")
    variants, several = app.parse_variants(root)
    if several:
        raise RequestError(400, "kv_compression", "kv_compression: one variant only with echo, logprobs or "
                           "several prompts (each prompt is its own prefill)")
    r.variant = variants[0]
    if r.variant.suffix:
        raise RequestError(400, r.variant.field + ".suffix", "%s.suffix is not supported with echo, logprobs or "
                           "several prompts" % r.variant.field)
    p = root.get("prompt")
    if p is None:
        raise RequestError(400, "prompt", "prompt is required")
    lst = isinstance(p, list) and bool(p) and isinstance(p[0], (str, list))
    items = p if lst else [p]
    if not items or (isinstance(p, list) and not p):
        raise RequestError(400, "prompt", "prompt is empty")
    if len(items) > MAX_PROMPTS:
        raise RequestError(400, "prompt", "prompt: %d prompts, at most %d per request" % (len(items), MAX_PROMPTS))
    total = 0
    for i, it in enumerate(items):
        f = "prompt[%d]" % i if lst else "prompt"
        if isinstance(it, str):
            pr = _field(f, lambda: app.engine.encode(it))
        elif isinstance(it, list):
            pr = _field(f, lambda: app.engine.encode_ids(it))
        else:
            raise RequestError(400, f, "%s must be a string or an array of token ids" % f)
        if pr.n_tokens + r.max_tokens > app.engine.n_ctx:
            raise RequestError(400, f, "%s: %d tokens + max_tokens %d exceed the context of %d; it is not truncated"
                               % (f, pr.n_tokens, r.max_tokens, app.engine.n_ctx))
        total += pr.n_tokens + r.max_tokens
        if total > MAX_TOKENS:
            raise RequestError(400, "prompt", "prompt: the prompts and max_tokens add up to more than %d tokens in "
                               "one request; split the request" % MAX_TOKENS)
        r.prompts.append(pr)
    return r


def _field(f, fn):
    """Run an engine encode, renaming its error's field to this prompt's."""
    try:
        return fn()
    except RequestError as exc:
        field = exc.field.replace("prompt", f, 1) if exc.field.startswith("prompt") else f
        raise RequestError(exc.status, field, exc.message.replace("prompt", f, 1))


class Scored:
    """One prompt's record: toks (prompt then generated), lp[i] the log-prob
    of toks[i] (None at 0), top[i] [(id, logprob)] the top N at i."""

    def __init__(self, ids):
        self.toks, self.n_prompt = list(ids), len(ids)
        self.lp, self.top = [None] * len(ids), [None] * len(ids)
        self.eog, self.kv = False, None


def _record(rows, chosen, n_top):
    """Log-probs of rows [n][V] (any float dtype): per row (chosen's value,
    [(id, value)] top n_top, ties: the lower id first)."""
    x = rows.to(torch.float64)
    if torch.isnan(x).any():
        raise RequestError(500, "", "the model produced a NaN logit")
    m = x.max(dim=-1, keepdim=True).values
    z = m + torch.log(torch.exp(x - m).sum(dim=-1, keepdim=True))
    lp = (x - z).clamp(min=FLOOR)  # -inf -> -9999.0
    ch = lp.gather(1, torch.tensor(chosen, dtype=torch.long, device=lp.device).view(-1, 1))[:, 0].tolist()
    tops = [[] for _ in chosen]
    if n_top > 0:
        k = min(n_top + 1, x.shape[1])
        v, ix = torch.topk(rows.float(), k, dim=-1)  # on the logits the engine sampled from
        v, ix = v.tolist(), ix.tolist()
        for r in range(len(chosen)):
            cand = sorted(zip(v[r], ix[r]), key=lambda t: (-t[0], t[1]))[:n_top]
            ids = [i for _v, i in cand]
            vals = lp[r, ids].tolist()
            tops[r] = [(i, ch[r] if i == chosen[r] else val) for i, val in zip(ids, vals)]
    return ch, tops


def run(app, req, cancelled):
    """The model work of a ScoreRequest (on the model lock): [Scored]."""
    eng, v = app.engine, req.variant
    out = []
    for pr in req.prompts:
        if cancelled():
            raise Cancelled()
        q = Scored(pr.ids)
        if v.chunk and v.method != "full":  # every position scored over the cache compressed so far
            res = chunked.prefill(eng, pr, v, all_logits=req.echo)
            app.count("compressions", len(res.chunks))
            app.count("compress_ms", res.compress_ms)
            cache, logits, all_logits, ms, rope_deltas = res.cache, res.logits, res.all_logits, res.ms, None
            q.kv = _kv(v, res.compress_ms, res.chunks)
        else:
            cache, logits, all_logits, ms, rope_deltas = _prefill(app, pr, v, req.echo, q)
        app.count("prefills")
        app.count("prompt_tokens", pr.n_tokens)
        app.count("prompt_ms", ms)
        if req.echo:  # logits of position i predict token i + 1
            for a in range(0, pr.n_tokens - 1, ROWS):
                b = min(a + ROWS, pr.n_tokens - 1)
                ch, tops = _record(all_logits[a:b], q.toks[a + 1:b + 1], req.n_top)
                q.lp[a + 1:b + 1], q.top[a + 1:b + 1] = ch, tops
        del all_logits
        if eng.mrope:
            eng.model.model.rope_deltas = rope_deltas
        t0 = time.perf_counter()
        for g in range(req.max_tokens):
            best = int(torch.argmax(logits).item())
            ch, tops = _record(logits.view(1, -1), [best], req.n_top)
            q.toks.append(best)
            q.lp.append(ch[0])
            q.top.append(tops[0])
            if best in eng.eos_ids:
                q.eog = True
                break
            if g + 1 < req.max_tokens:
                if cancelled():
                    raise Cancelled()
                logits = eng._step([best], pr.n_tokens + g, cache)
        del cache
        app.count("predicted_tokens", len(q.toks) - q.n_prompt)
        app.count("predicted_ms", (time.perf_counter() - t0) * 1e3)
        out.append(q)
    return out


def _prefill(app, pr, v, echo, q):
    """One prefill, then the variant's compression (none for full): (cache,
    last logits, all logits or None, prefill ms, M-RoPE deltas)."""
    eng = app.engine
    nq = eng.queries_wanted([v], pr.n_tokens) if v.method != "full" else 0
    pre = eng.prefill(pr, nq, all_logits=echo)
    ctx = eng.new_context(pre)[0] if v.method != "full" else None
    try:
        try:
            plan, cache, st = eng.compress(ctx, pre, v)
        except kvsieve.KvsError as exc:
            status = 400 if exc.status_name in ("invalid", "notfound") else 500
            raise RequestError(status, v.field if status == 400 else "", "%s: %s" % (v.field, exc.message))
        if plan is not None:
            plan.free()
            app.count("compressions")
            app.count("compress_ms", st["compress_ms"])
            q.kv = _kv(v, st["compress_ms"], [{"seen": pr.n_tokens, "rows_before": pr.n_tokens,
                                                "rows_after": st["budgets"][0]}])
    finally:
        if ctx is not None:
            ctx.close()
    return cache, pre.logits, pre.all_logits, pre.ms, pre.rope_deltas


def _kv(v, compress_ms, chunks):
    """The compression a prompt ran under, as kvsieve serve reports it per choice."""
    kv = {"method": v.method}
    if v.tokens:
        kv["tokens"] = v.tokens
    else:
        kv["ratio"] = v.ratio
    kv.update({"chunk": v.chunk, "compress_ms": compress_ms, "chunks": chunks})
    return kv


def choice_json(eng, req, q, index):
    first, end = (0 if req.echo else q.n_prompt), len(q.toks)
    c = {"index": index, "text": eng.detokenize(q.toks[first:end - (1 if q.eog else 0)])}
    if req.n_top < 0:
        c["logprobs"] = None
    else:
        toks, tlp, top, off, at = [], [], [], [], 0
        for i in range(first, end):
            p = eng.detokenize([q.toks[i]])
            toks.append(p)
            off.append(at)
            at += len(p)
            tlp.append(q.lp[i])
            if q.lp[i] is None:  # nothing predicts the first prompt token
                top.append(None)
                continue
            d = {p: q.lp[i]}
            for tid, val in q.top[i]:
                tp = eng.detokenize([tid])
                if tp not in d or val > d[tp]:  # a text two tokens share keeps the larger value
                    d[tp] = val
            top.append(d)
        c["logprobs"] = {"tokens": toks, "token_logprobs": tlp, "top_logprobs": top, "text_offset": off}
    c["finish_reason"] = "stop" if q.eog else "length"
    if q.kv is not None:
        c["kv"] = q.kv
    return c


def answer(app, req, scored):
    eng = app.engine
    n_prompt = sum(q.n_prompt for q in scored)
    n_gen = sum(len(q.toks) - q.n_prompt for q in scored)
    return {"id": "cmpl-%d" % int(time.time() * 1e6), "object": "text_completion", "created": int(time.time()),
            "model": eng.alias, "choices": [choice_json(eng, req, q, i) for i, q in enumerate(scored)],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_gen, "total_tokens": n_prompt + n_gen},
            "system_fingerprint": "kvsieve-hf", "backend": "kvsieve-hf"}
