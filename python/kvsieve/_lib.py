"""_lib.py -- loading libkvsieve.so and the ctypes mirror of abi/kvsieve_abi.h.

What it is: the struct layouts, function prototypes, the library search,
the error type, and the context-free facts (version, methods, CUDA devices,
queries wanted). What it is not: no tensor handling (_tensor.py), no
context or plan objects (_context.py).
"""
import ctypes
import ctypes.util
import json
import os

ABI_MAJOR = 1  # the major version this binding speaks (SONAME libkvsieve.so.1)
MAX_DIMS = 8

F32, F16, BF16, U8, I32, I64 = 0, 1, 2, 3, 4, 5
DTYPE_NAMES = {F32: "f32", F16: "f16", BF16: "bf16", U8: "u8", I32: "i32", I64: "i64"}
DTYPE_SIZES = {F32: 4, F16: 2, BF16: 2, U8: 1, I32: 4, I64: 8}
HOST, CUDA = 0, 1
MERGE_NAMES = {0: "none", 1: "pivotal", 2: "average", 3: "weighted"}
STATUS_NAMES = {0: "ok", 1: "invalid", 2: "nomem", 3: "io", 4: "format", 5: "numeric",
                6: "unsupported", 7: "notfound", 8: "internal"}


class KvsError(Exception):
    """A libkvsieve call failed: .status (the kvs_status number), .status_name,
    and the library's message (which names the layer / tensor / field)."""

    def __init__(self, status, message):
        self.status = int(status)
        self.status_name = STATUS_NAMES.get(self.status, "unknown")
        self.message = message
        super().__init__("%s (%s)" % (message, self.status_name))


class Tensor(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("dtype", ctypes.c_int32),
                ("device", ctypes.c_int32), ("device_index", ctypes.c_int32),
                ("data", ctypes.c_void_p), ("ndim", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("shape", ctypes.c_int64 * MAX_DIMS), ("strides", ctypes.c_int64 * MAX_DIMS)]


class MethodSpec(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("method", ctypes.c_char_p),
                ("n_params", ctypes.c_int32), ("param_names", ctypes.POINTER(ctypes.c_char_p)),
                ("param_values", ctypes.POINTER(ctypes.c_char_p))]


class Budget(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("ratio", ctypes.c_double),
                ("tokens", ctypes.c_int64)]


class CtxOpts(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("threads", ctypes.c_int32)]


class PlanInfo(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("n_layers", ctypes.c_int32),
                ("n_kv_heads", ctypes.c_int32), ("n_tokens", ctypes.c_int32),
                ("merge", ctypes.c_int32), ("device", ctypes.c_int32), ("key_channels", ctypes.c_int32),
                ("total_kept", ctypes.c_int64), ("compress_ms", ctypes.c_double),
                ("method", ctypes.c_char * 32), ("merge_name", ctypes.c_char * 16),
                ("note", ctypes.c_char * 256)]


class Stats(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("reserved", ctypes.c_int32),
                ("tensors_fed", ctypes.c_int64), ("tensors_copied", ctypes.c_int64),
                ("bytes_copied", ctypes.c_int64), ("compress_calls", ctypes.c_int64),
                ("apply_calls", ctypes.c_int64), ("compress_ms", ctypes.c_double),
                ("apply_ms", ctypes.c_double)]


def new(struct_type):
    """A zeroed ABI struct with its struct_size set (KVS_ABI_INIT)."""
    s = struct_type()
    s.struct_size = ctypes.sizeof(struct_type)
    return s


_P = ctypes.c_void_p
_I32 = ctypes.c_int32
_PT = ctypes.POINTER(Tensor)
_SIG = {
    "kvs_abi_version": (None, [ctypes.POINTER(_I32)] * 3),
    "kvs_abi_build_info": (ctypes.c_char_p, []),
    "kvs_abi_status_name": (ctypes.c_char_p, [_I32]),
    "kvs_abi_cuda_devices": (_I32, [ctypes.POINTER(_I32), ctypes.c_char_p, ctypes.c_size_t]),
    "kvs_abi_methods_json": (_I32, [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t),
                                    ctypes.c_char_p, ctypes.c_size_t]),
    "kvs_abi_queries_wanted": (_I32, [ctypes.POINTER(MethodSpec), ctypes.c_int64,
                                      ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p, ctypes.c_size_t]),
    "kvs_abi_ctx_new": (_I32, [ctypes.POINTER(CtxOpts), ctypes.POINTER(_P), ctypes.c_char_p,
                               ctypes.c_size_t]),
    "kvs_abi_ctx_free": (None, [_P]),
    "kvs_abi_last_error": (ctypes.c_char_p, [_P]),
    "kvs_abi_ctx_stats": (_I32, [_P, ctypes.POINTER(Stats)]),
    "kvs_abi_cache_begin": (_I32, [_P, _I32]),
    "kvs_abi_cache_layer": (_I32, [_P, _I32, _PT, _PT, _PT]),
    "kvs_abi_cache_modality": (_I32, [_P, _PT]),
    "kvs_abi_compress": (_I32, [_P, ctypes.POINTER(MethodSpec), ctypes.POINTER(Budget),
                                ctypes.POINTER(_P)]),
    "kvs_abi_plan_free": (None, [_P]),
    "kvs_abi_plan_get_info": (_I32, [_P, _P, ctypes.POINTER(PlanInfo)]),
    "kvs_abi_plan_budgets": (_I32, [_P, _P, ctypes.POINTER(_I32), ctypes.c_int64]),
    "kvs_abi_plan_indices": (_I32, [_P, _P, _I32, _PT]),
    "kvs_abi_plan_merge_map": (_I32, [_P, _P, _I32, _I32, _PT]),
    "kvs_abi_plan_head_counts": (_I32, [_P, _P, _I32, ctypes.POINTER(_I32), ctypes.c_int64]),
    "kvs_abi_plan_head_indices": (_I32, [_P, _P, _I32, _I32, _PT]),
    "kvs_abi_apply_head": (_I32, [_P, _P, _I32, _I32, _PT, _PT]),
    "kvs_abi_plan_json": (_I32, [_P, _P, ctypes.c_char_p, ctypes.c_size_t,
                                 ctypes.POINTER(ctypes.c_size_t)]),
    "kvs_abi_apply": (_I32, [_P, _P, _I32, _PT, _PT]),
}

_state = {"lib": None, "path": None}


def _candidates():
    env = os.environ.get("KVSIEVE_LIBRARY")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    name = "libkvsieve.so.%d" % ABI_MAJOR
    out = [os.path.join(here, name)]  # a copy installed next to the package
    repo = os.path.dirname(os.path.dirname(here))  # python/kvsieve -> the checkout
    for build in sorted(os.listdir(repo)) if os.path.isdir(repo) else []:
        if build.startswith("build"):
            out.append(os.path.join(repo, build, "lib", name))
    found = ctypes.util.find_library("kvsieve")
    if found:
        out.append(found)
    return out


def lib():
    """The loaded library (loaded on first use). KVSIEVE_LIBRARY names the file;
    otherwise the package folder, the checkout's build*/lib, then the system
    search path are tried. Refuses a library of another ABI major version."""
    if _state["lib"] is not None:
        return _state["lib"]
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path + " (missing)")
            continue
        try:
            handle = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
            continue
        for name, (res, args) in _SIG.items():
            fn = getattr(handle, name)
            fn.restype = res
            fn.argtypes = args
        major, minor, patch = _I32(), _I32(), _I32()
        handle.kvs_abi_version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(patch))
        if major.value != ABI_MAJOR:
            raise KvsError(6, "%s has ABI %d.%d.%d; this binding needs major %d"
                           % (path, major.value, minor.value, patch.value, ABI_MAJOR))
        _state["lib"], _state["path"] = handle, path
        return handle
    raise KvsError(7, "libkvsieve.so.%d not found (set KVSIEVE_LIBRARY to its path); tried: %s"
                   % (ABI_MAJOR, "; ".join(tried) or "nothing"))


def library_path():
    lib()
    return _state["path"]


def abi_version():
    """(major, minor, patch) of the loaded library."""
    major, minor, patch = _I32(), _I32(), _I32()
    lib().kvs_abi_version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(patch))
    return (major.value, minor.value, patch.value)


def build_info():
    return lib().kvs_abi_build_info().decode()


def check_buf(status, err):
    """Raise for a context-free call that failed with its message in err."""
    if status != 0:
        raise KvsError(status, err.value.decode(errors="replace"))


def _text(call):
    """A JSON text from a size-query style call: call(buf, cap, len_ptr, err, err_cap)."""
    err = ctypes.create_string_buffer(1024)
    n = ctypes.c_size_t(0)
    check_buf(call(None, 0, ctypes.byref(n), err, len(err)), err)
    buf = ctypes.create_string_buffer(n.value)
    check_buf(call(buf, n.value, ctypes.byref(n), err, len(err)), err)
    return buf.value.decode()


def methods():
    """Every registered method: a list of dicts (name, summary, needs,
    keeps_all, params: name, type, default, min, max, choices, help)."""
    return json.loads(_text(lib().kvs_abi_methods_json))


def method_spec(method, params=None):
    """A MethodSpec and the objects that keep its strings alive. params: a
    dict (values as text, numbers or bools), or a list of (name, value)."""
    items = list(params.items()) if isinstance(params, dict) else list(params or [])
    def text(v):
        if isinstance(v, bool):
            return b"true" if v else b"false"
        return str(v).encode()
    names = (ctypes.c_char_p * max(1, len(items)))(*[str(k).encode() for k, _ in items])
    values = (ctypes.c_char_p * max(1, len(items)))(*[text(v) for _, v in items])
    spec = new(MethodSpec)
    spec.method = str(method).encode()
    spec.n_params = len(items)
    spec.param_names = ctypes.cast(names, ctypes.POINTER(ctypes.c_char_p))
    spec.param_values = ctypes.cast(values, ctypes.POINTER(ctypes.c_char_p))
    return spec, (names, values)


def queries_wanted(method, params=None, n_tokens=1):
    """How many of the last query rows the method reads for a prompt of n_tokens."""
    spec, keep = method_spec(method, params)
    out = ctypes.c_int64(0)
    err = ctypes.create_string_buffer(1024)
    check_buf(lib().kvs_abi_queries_wanted(ctypes.byref(spec), int(n_tokens), ctypes.byref(out), err,
                                           len(err)), err)
    del keep
    return out.value


def cuda_device_count():
    """Usable CUDA devices; raises KvsError (unsupported) when the library was
    built without CUDA or no device works."""
    n = _I32(0)
    err = ctypes.create_string_buffer(1024)
    check_buf(lib().kvs_abi_cuda_devices(ctypes.byref(n), err, len(err)), err)
    return n.value
