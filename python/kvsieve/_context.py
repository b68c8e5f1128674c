"""_context.py -- Context (one prompt's cache, compressed by any method) and
Plan (what a compression decided) over the C ABI.

What it is: thin objects that hold the library handles, keep the caller's
tensors alive while the library borrows them, and turn status codes into
KvsError with the library's message. What it is not: no compression logic
and no tensor library: outputs are Python lists unless the caller passes
its own tensors (torch, numpy, Strided) to be filled.
"""
import array
import ctypes
import json

from . import _lib
from ._tensor import Strided, describe


class Context:
    """A compression context (kvs_abi_ctx). threads: worker threads of
    compress / apply. Use as a context manager or call close()."""

    def __init__(self, threads=1):
        self._lib = _lib.lib()
        opts = _lib.new(_lib.CtxOpts)
        opts.threads = int(threads)
        handle = ctypes.c_void_p()
        err = ctypes.create_string_buffer(1024)
        _lib.check_buf(self._lib.kvs_abi_ctx_new(ctypes.byref(opts), ctypes.byref(handle), err,
                                                 len(err)), err)
        self._h = handle
        self._keep = {}   # layer -> objects the library borrows
        self._head_dims = {}  # layer -> d
        self._n_layers = 0

    # -- plumbing --------------------------------------------------------------
    def _check(self, status):
        if status != 0:
            raise _lib.KvsError(status, self._lib.kvs_abi_last_error(self._h).decode(errors="replace"))

    def _handle(self):
        if not self._h:
            raise _lib.KvsError(1, "context is closed")
        return self._h

    def close(self):
        if self._h:
            self._lib.kvs_abi_ctx_free(self._h)
            self._h = None
        self._keep = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- the cache ---------------------------------------------------------------
    def begin(self, n_layers):
        """Start a new cache of n_layers layers (forgets the previous one)."""
        self._keep = {}
        self._head_dims = {}
        self._n_layers = int(n_layers)
        self._check(self._lib.kvs_abi_cache_begin(self._handle(), self._n_layers))

    def set_layer(self, layer, k, v, q=None, dtype=None):
        """Layer `layer`'s K, V ([Hkv][N][d] or [1][Hkv][N][d]) and optional
        queries Q of the last Nq positions. The objects must stay unchanged
        until the next begin(); the context keeps references to them.
        dtype names the element type of raw 16-bit buffers."""
        tk, kk = describe(k, "layer %d: k" % layer, dtype)
        tv, kv = describe(v, "layer %d: v" % layer, dtype)
        tq, kq = describe(q, "layer %d: q" % layer, dtype) if q is not None else (None, None)
        self._check(self._lib.kvs_abi_cache_layer(self._handle(), int(layer), ctypes.byref(tk),
                                                  ctypes.byref(tv),
                                                  ctypes.byref(tq) if tq is not None else None))
        self._keep[layer] = (kk, kv, kq)
        self._head_dims[layer] = int(tk.shape[tk.ndim - 1])

    def set_modality(self, modality):
        """The modality mask [N] (0 text, 1 image, 2 video, 3 audio): a list,
        bytes, a host torch / numpy uint8 or bool tensor; None clears it.
        The library copies it."""
        if modality is None:
            self._check(self._lib.kvs_abi_cache_modality(self._handle(), None))
            return
        if isinstance(modality, (list, tuple)):
            modality = bytes(bytearray(int(x) for x in modality))
        if hasattr(modality, "data_ptr") and getattr(getattr(modality, "device", None), "type", "cpu") != "cpu":
            modality = modality.cpu()  # metadata: [N] bytes
        t, keep = describe(modality, "modality", None if hasattr(modality, "dtype") or
                           hasattr(modality, "__array_interface__") else "u8")
        self._check(self._lib.kvs_abi_cache_modality(self._handle(), ctypes.byref(t)))
        del keep

    def set_cache(self, layers, modality=None, dtype=None):
        """begin(len(layers)), then set_layer for each (k, v) or (k, v, q)."""
        self.begin(len(layers))
        for i, ly in enumerate(layers):
            if len(ly) not in (2, 3):
                raise ValueError("layer %d: give (k, v) or (k, v, q), not %d tensors" % (i, len(ly)))
            self.set_layer(i, *ly, dtype=dtype)
        if modality is not None:
            self.set_modality(modality)

    # -- compression ---------------------------------------------------------------
    def compress(self, method, params=None, ratio=None, tokens=None):
        """A Plan of `method` (parameters by name: dict or (name, value) list)
        for a budget of ratio in (0, 1] or tokens >= 1 per layer."""
        spec, keep = _lib.method_spec(method, params)
        b = _lib.new(_lib.Budget)
        b.ratio = float(ratio) if ratio is not None else 0.0
        b.tokens = int(tokens) if tokens is not None else 0
        handle = ctypes.c_void_p()
        self._check(self._lib.kvs_abi_compress(self._handle(), ctypes.byref(spec), ctypes.byref(b),
                                               ctypes.byref(handle)))
        del keep
        return Plan(self, handle)

    def apply(self, plan, layer, k_out, v_out):
        """Gather (and merge, for merging plans) layer `layer` into k_out,
        v_out ([Hkv][B_l][d] or [1][Hkv][B_l][d]; host F32/F16/BF16 for a host
        cache, CUDA F32 contiguous for a CUDA cache)."""
        tk, kk = describe(k_out, "layer %d: k_out" % layer, writable=True)
        tv, kv = describe(v_out, "layer %d: v_out" % layer, writable=True)
        self._check(self._lib.kvs_abi_apply(self._handle(), plan._handle(), int(layer), ctypes.byref(tk),
                                            ctypes.byref(tv)))
        del kk, kv

    def apply_head(self, plan, layer, head, k_out, v_out):
        """apply for one KV head of any plan (ragged or not): k_out, v_out
        [c_h][d] (or [1][c_h][d]), host F32/F16/BF16; host caches only."""
        tk, kk = describe(k_out, "layer %d: head %d: k_out" % (layer, head), writable=True)
        tv, kv = describe(v_out, "layer %d: head %d: v_out" % (layer, head), writable=True)
        self._check(self._lib.kvs_abi_apply_head(self._handle(), plan._handle(), int(layer), int(head),
                                                 ctypes.byref(tk), ctypes.byref(tv)))
        del kk, kv

    def apply_lists(self, plan, layer, dtype="f32"):
        """apply into fresh host buffers: (k, v) as flat array.array ('f' for
        f32, 'H' holding f16 / bf16 bits), [Hkv][B_l][d] row-major."""
        info = plan.info()
        B, H = plan.budgets[layer], info["n_kv_heads"]
        d = self._head_dims[layer]
        code = "f" if _dtype(dtype) == _lib.F32 else "H"
        k = array.array(code, bytes(H * B * d * array.array(code).itemsize))
        v = array.array(code, bytes(H * B * d * array.array(code).itemsize))
        self.apply(plan, layer, Strided(k, (H, B, d), dtype), Strided(v, (H, B, d), dtype))
        return k, v

    def stats(self):
        """Counters of the context: tensors fed / copied (bytes), calls, times."""
        s = _lib.new(_lib.Stats)
        self._check(self._lib.kvs_abi_ctx_stats(self._handle(), ctypes.byref(s)))
        return {f: getattr(s, f) for f, _ in _lib.Stats._fields_ if f not in ("struct_size", "reserved")}


def _dtype(d):
    from ._tensor import dtype_code
    return dtype_code(d)


class Plan:
    """A compression plan (kvs_abi_plan), made by Context.compress."""

    def __init__(self, ctx, handle):
        self._ctx = ctx
        self._h = handle
        self._info = None

    def _handle(self):
        if not self._h:
            raise _lib.KvsError(1, "plan is freed")
        return self._h

    def free(self):
        if self._h:
            self._ctx._lib.kvs_abi_plan_free(self._h)
            self._h = None

    def __del__(self):
        try:
            self.free()
        except Exception:
            pass

    def info(self):
        """n_layers, n_kv_heads, n_tokens, merge, device, key_channels (d when
        the plan zeroes pruned key channels at apply, else 0), total_kept,
        compress_ms, method, merge_name, note."""
        if self._info is None:
            i = _lib.new(_lib.PlanInfo)
            self._ctx._check(self._ctx._lib.kvs_abi_plan_get_info(self._ctx._handle(), self._handle(),
                                                                  ctypes.byref(i)))
            out = {}
            for f, _ in _lib.PlanInfo._fields_:
                if f in ("struct_size", "reserved"):
                    continue
                val = getattr(i, f)
                out[f] = val.decode() if isinstance(val, bytes) else val
            self._info = out
        return dict(self._info)

    @property
    def method(self):
        return self.info()["method"]

    @property
    def merge(self):
        return self.info()["merge_name"]

    @property
    def n_layers(self):
        return self.info()["n_layers"]

    @property
    def budgets(self):
        """Tokens kept per KV head, per layer."""
        L = self.n_layers
        out = (ctypes.c_int32 * L)()
        self._ctx._check(self._ctx._lib.kvs_abi_plan_budgets(self._ctx._handle(), self._handle(), out, L))
        return list(out)

    def head_counts(self, layer):
        """Tokens kept by each KV head of `layer` (all B_l unless the layer is
        ragged: head-adaptive methods such as adakv; they sum to Hkv * B_l)."""
        H = self.info()["n_kv_heads"]
        out = (ctypes.c_int32 * H)()
        self._ctx._check(self._ctx._lib.kvs_abi_plan_head_counts(self._ctx._handle(), self._handle(), int(layer),
                                                                 out, H))
        return list(out)

    def head_indices(self, layer, head):
        """Kept token indices of one KV head (ascending), any plan."""
        if not 0 <= layer < self.n_layers:
            raise _lib.KvsError(1, "plan of %s: layer %d outside [0, %d)" % (self.method, layer, self.n_layers))
        c = self.head_counts(layer)[head] if 0 <= head < self.info()["n_kv_heads"] else 1
        buf = array.array("i", bytes(4 * c))
        t, keep = describe(Strided(buf, (c,), "i32"), "head indices out", writable=True)
        self._ctx._check(self._ctx._lib.kvs_abi_plan_head_indices(self._ctx._handle(), self._handle(), int(layer),
                                                                  int(head), ctypes.byref(t)))
        del keep
        return list(buf)

    def indices(self, layer, out=None):
        """Kept token indices of `layer`: [Hkv][B_l] lists (each ascending), or
        written into `out` (a torch / numpy / Strided int32 or int64 tensor of
        that shape, host or CUDA), which is returned. A ragged layer (heads
        with different counts) returns lists of each head's own length and
        refuses `out` (no [Hkv][B_l] shape holds it)."""
        if out is not None:
            t, keep = describe(out, "layer %d: indices out" % layer, writable=True)
            self._ctx._check(self._ctx._lib.kvs_abi_plan_indices(self._ctx._handle(), self._handle(),
                                                                 int(layer), ctypes.byref(t)))
            del keep
            return out
        if not 0 <= layer < self.n_layers:  # the library would say so too; B_l is needed first
            raise _lib.KvsError(1, "plan of %s: layer %d outside [0, %d)" % (self.method, layer, self.n_layers))
        H, B = self.info()["n_kv_heads"], self.budgets[layer]
        counts = self.head_counts(layer)
        if any(c != B for c in counts):
            return [self.head_indices(layer, h) for h in range(H)]
        buf = array.array("i", bytes(4 * H * B))
        self.indices(layer, Strided(buf, (H, B), "i32"))
        return [list(buf[h * B:(h + 1) * B]) for h in range(H)]

    def merge_map(self, layer, head):
        """[N]: -1 kept; the kept slot an evicted token merges into; -2 dropped."""
        N = self.info()["n_tokens"]
        buf = array.array("i", bytes(4 * N))
        t, keep = describe(Strided(buf, (N,), "i32"), "merge map out", writable=True)
        self._ctx._check(self._ctx._lib.kvs_abi_plan_merge_map(self._ctx._handle(), self._handle(),
                                                               int(layer), int(head), ctypes.byref(t)))
        del keep
        return list(buf)

    def to_json(self):
        """The plan as `kvsieve compress --plan` writes it (same text)."""
        lib, ch = self._ctx._lib, self._ctx._handle()
        n = ctypes.c_size_t(0)
        self._ctx._check(lib.kvs_abi_plan_json(ch, self._handle(), None, 0, ctypes.byref(n)))
        buf = ctypes.create_string_buffer(n.value)
        self._ctx._check(lib.kvs_abi_plan_json(ch, self._handle(), buf, n.value, ctypes.byref(n)))
        return buf.value.decode()

    def to_dict(self):
        return json.loads(self.to_json())
