"""kvpress_rows.py -- kvpress presses as kvsieve-hf variants.

    {"kv_compression": {"variants": [
        {"method": "snapkv", "ratio": 0.25, "params": {"window": 64}},
        {"method": "kvpress:SnapKVPress(window_size=64, kernel_size=5)", "ratio": 0.25}]}}

What it is: a variant whose method is `kvpress:<PressClass>(args)` runs that
kvpress (0.5.5) press on the same request: the prompt is prefilled again
inside `with press(model):` (kvpress compresses in its per-layer prefill
hooks, so it cannot reuse the engine's prefill), and the compressed cache is
decoded by the engine like any variant, positions continuing at N as for
kvsieve's own rows. args are keyword arguments with Python literal values
or nested presses from kvpress's namespace (`kvpress:ChunkKVPress(
press=SnapKVPress(), chunk_length=20)`); the variant's params are added as
keyword arguments of the outer press. The budget is the variant's `ratio`
(the kept share, as for every kvsieve row): the press gets compression_ratio
= 1 - ratio. The row's compress_ms is that second prefill, compression
included (the note says so); budgets are the layers' kept lengths.

What it is not: no token budgets (kvpress has none), no kv_spans (kvpress
does not say which tokens it kept), no presses that mask rows per head
instead of removing them (AdaKVPress and friends leave
module.masked_key_indices; the engine's batched cache needs equal lengths
per head, as for kvsieve's own ragged methods), none that compress while
decoding or move positions (DecodingPress, PrefillDecodingPress,
KeyRerotationPress, FinchPress with rerotate_keys, RestoreKVPress,
DMSPress). Needs kvpress and the transformers it supports (< 5.3; see
docs/python.md): without it such a variant is refused with that message.
"""
import ast

PREFIX = "kvpress:"
_NOT_HERE = ("DecodingPress", "PrefillDecodingPress", "KeyRerotationPress", "RestoreKVPress", "DMSPress",
             "KvsievePress")


class RequestError(Exception):
    """A variant this module refuses: the JSON field and the message (the
    engine turns it into its own 400 RequestError)."""

    def __init__(self, status, field, message):
        super().__init__(message)
        self.status, self.field, self.message = status, field, message


def is_kvpress(method):
    return isinstance(method, str) and method.startswith(PREFIX)


def _kvpress(field):
    try:
        import kvpress
    except ImportError as exc:
        raise RequestError(400, field, "%s: kvpress is not installed in this Python (%s); run kvsieve-hf from "
                           "the kvpress environment (scripts/install_kvpress.sh)" % (field, exc))
    return kvpress


def build(method, params, ratio, tokens, field="method"):
    """The press a variant describes, or a RequestError naming the field."""
    kvpress = _kvpress(field)
    if tokens is not None:
        raise RequestError(400, field, "%s: kvpress presses take a ratio (kept share), not tokens" % field)
    src = method[len(PREFIX):].strip()
    try:
        node = ast.parse(src, mode="eval").body
    except SyntaxError as exc:
        raise RequestError(400, field, "%s: %r is not PressClass(name=value, ...): %s" % (field, src, exc.msg))
    if isinstance(node, ast.Name):
        node = ast.Call(func=node, args=[], keywords=[])

    def make(n, extra=None):
        if not isinstance(n, ast.Call) or not isinstance(n.func, ast.Name):
            raise RequestError(400, field, "%s: expected PressClass(...), got %r" % (field, ast.unparse(n)))
        name = n.func.id
        cls = getattr(kvpress, name, None)
        if not isinstance(cls, type) or not issubclass(cls, kvpress.BasePress):
            raise RequestError(400, field, "%s: %s is not a press class of kvpress" % (field, name))
        if name in _NOT_HERE:
            raise RequestError(400, field, "%s: %s is not supported as a kvsieve-hf row (it compresses while "
                               "decoding, moves positions, or is kvsieve's own method)" % (field, name))
        args = [value(a) for a in n.args]
        kw = {k.arg: value(k.value) for k in n.keywords if k.arg is not None}
        if len(kw) != len(n.keywords):
            raise RequestError(400, field, "%s: **kwargs are not accepted" % field)
        if "compression_ratio" in kw:
            raise RequestError(400, field, "%s: give the budget as the variant's ratio (kept share), not "
                               "compression_ratio" % field)
        kw.update(extra or {})
        try:
            return cls(*args, **kw)
        except (TypeError, ValueError, AssertionError) as exc:
            raise RequestError(400, field, "%s: %s(...): %s" % (field, name, exc))

    def value(n):
        if isinstance(n, ast.Call):
            return make(n)
        try:
            return ast.literal_eval(n)
        except ValueError:
            raise RequestError(400, field, "%s: %r is neither a literal nor a press" % (field, ast.unparse(n)))

    press = make(node, params)
    if isinstance(press, kvpress.FinchPress) and press.rerotate_keys:
        raise RequestError(400, field, "%s: FinchPress with rerotate_keys moves positions; use rerotate_keys=False"
                           % field)
    if not hasattr(press, "compression_ratio"):
        raise RequestError(400, field, "%s: %s has no compression_ratio to set from the variant's ratio"
                           % (field, type(press).__name__))
    try:
        press.compression_ratio = 1.0 - float(ratio)
    except (AssertionError, ValueError) as exc:
        raise RequestError(400, field, "%s: compression_ratio %g: %s" % (field, 1.0 - float(ratio), exc))
    return press


def compress(engine, pre, variant):
    """(None, cache, stats) of a kvpress variant: the prompt prefilled again
    under the press, its compressed cache ready for engine.generate_batch."""
    import torch
    import transformers
    if pre.prompt.span_sets:
        raise RequestError(400, "kv_spans", "kv_spans: a kvpress variant (%s) does not report which tokens it kept"
                           % variant.field)
    press = build(variant.method, variant.params, variant.ratio, variant.tokens, variant.field + ".method")
    try:
        with press(engine.model):
            again = engine.prefill(pre.prompt, 0)
        masked = [m for m in engine.attn_modules if getattr(m, "masked_key_indices", None) is not None]
    finally:
        for m in engine.attn_modules:
            if hasattr(m, "masked_key_indices"):
                m.masked_key_indices = None
    if masked:
        raise RequestError(400, variant.field + ".method", "%s: %s masks rows per KV head (ragged) instead of "
                           "removing them; kvsieve-hf's cache needs equal lengths per head" % (variant.field,
                                                                                             type(press).__name__))
    cache = transformers.DynamicCache(config=engine.model.config)
    budgets = []
    with torch.inference_mode():
        for l, (k, v, _q) in enumerate(again.layers):
            cache.update(k, v, l)
            budgets.append(int(k.shape[2]))
    note = "kvpress %s: compressed inside its own prefill (compress_ms includes that forward pass)" % press
    return None, cache, {"compress_ms": again.ms, "gather_ms": 0.0, "budgets": budgets, "note": note[:255],
                         "merge": "none"}
