"""_tensor.py -- turning Python objects into kvs_abi_tensor descriptors.

What it is: one function, describe(), that accepts
  - torch tensors (duck-typed: data_ptr(), stride(), shape, dtype, device),
    host or CUDA, any strides; torch is never imported;
  - numpy arrays and anything else with __array_interface__ (byte strides
    converted to element strides); numpy is never imported;
  - Strided(buffer, shape, dtype, strides, offset): any object exposing the
    buffer protocol (array.array, bytes, bytearray, memoryview, mmap) seen
    as a strided tensor; plain buffers with a known format ('f', 'e', 'B',
    'i', 'q') need no wrapper when they are 1-D.
No data is copied here: the descriptor points at the object's memory, and
the caller keeps the returned keep-alive object as long as the library may
read or write it. What it is not: no layout decisions (the library copies
what it cannot read in place and counts it).
"""
import ctypes

from . import _lib

_TORCH = {"torch.float32": _lib.F32, "torch.float16": _lib.F16, "torch.bfloat16": _lib.BF16,
          "torch.uint8": _lib.U8, "torch.bool": _lib.U8, "torch.int32": _lib.I32,
          "torch.int64": _lib.I64}
_TYPESTR = {"f4": _lib.F32, "f2": _lib.F16, "u1": _lib.U8, "b1": _lib.U8, "i4": _lib.I32,
            "i8": _lib.I64}
_NAMES = {"f32": _lib.F32, "float32": _lib.F32, "f16": _lib.F16, "float16": _lib.F16,
          "bf16": _lib.BF16, "bfloat16": _lib.BF16, "u8": _lib.U8, "uint8": _lib.U8,
          "bool": _lib.U8, "i32": _lib.I32, "int32": _lib.I32, "i64": _lib.I64, "int64": _lib.I64}
# memoryview formats -> dtype ('H' is 16-bit storage: f16 or bf16 must be named)
_FORMATS = {"f": _lib.F32, "e": _lib.F16, "B": _lib.U8, "?": _lib.U8, "b": _lib.U8}


def dtype_code(d):
    """A dtype given as a name ('f16', 'bfloat16', ...) or an ABI code."""
    if isinstance(d, int) and d in _lib.DTYPE_NAMES:
        return d
    key = str(d).lower().replace("torch.", "").replace("numpy.", "")
    if key in _NAMES:
        return _NAMES[key]
    raise ValueError("unknown dtype %r (use one of %s)" % (d, ", ".join(sorted(set(_NAMES)))))


class Strided:
    """A buffer-protocol object seen as a tensor: shape, dtype (name or ABI
    code; default from the buffer's format), strides in elements (default
    C-contiguous) and an element offset. The buffer must be contiguous
    bytes; every element the shape and strides reach must lie inside it."""

    def __init__(self, buffer, shape, dtype=None, strides=None, offset=0):
        self.buffer = buffer
        self.shape = tuple(int(s) for s in shape)
        mv = memoryview(buffer)
        if dtype is None:
            fmt = mv.format.lstrip("@=<")
            if fmt in _FORMATS:
                dtype = _FORMATS[fmt]
            elif fmt in ("i", "l", "q") and mv.itemsize in (4, 8):
                dtype = _lib.I32 if mv.itemsize == 4 else _lib.I64
            else:
                raise ValueError("buffer format %r: name the dtype (e.g. dtype='f16' or 'bf16' for "
                                 "16-bit storage)" % mv.format)
        self.dtype = dtype_code(dtype)
        if strides is None:
            strides, acc = [], 1
            for s in reversed(self.shape):
                strides.append(acc)
                acc *= s
            strides = list(reversed(strides))
        self.strides = tuple(int(s) for s in strides)
        self.offset = int(offset)
        if len(self.strides) != len(self.shape):
            raise ValueError("strides %r do not match shape %r" % (self.strides, self.shape))


class _BufAddr(ctypes.Structure):  # CPython's Py_buffer
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


def _address(mv, writable):
    """Address of a contiguous memoryview's first byte, without copying (read-
    only buffers too). The memoryview, kept alive by the caller, pins it."""
    if not mv.contiguous:
        raise ValueError("buffer is not contiguous (describe its layout with Strided strides)")
    if writable and mv.readonly:
        raise ValueError("output buffer is read-only")
    if mv.nbytes == 0:
        raise ValueError("buffer is empty")
    if not mv.readonly:
        return ctypes.addressof((ctypes.c_char * mv.nbytes).from_buffer(mv))
    api = ctypes.pythonapi
    view = _BufAddr()
    api.PyObject_GetBuffer.argtypes = [ctypes.py_object, ctypes.POINTER(_BufAddr), ctypes.c_int]
    api.PyBuffer_Release.argtypes = [ctypes.POINTER(_BufAddr)]
    if api.PyObject_GetBuffer(mv, ctypes.byref(view), 0) != 0:  # PyBUF_SIMPLE
        raise ValueError("could not get the buffer's address")
    addr = view.buf
    api.PyBuffer_Release(ctypes.byref(view))
    return addr


def _fill(t, dtype, device, index, data, shape, strides):
    if len(shape) > _lib.MAX_DIMS:
        raise ValueError("%d dimensions (at most %d)" % (len(shape), _lib.MAX_DIMS))
    t.dtype, t.device, t.device_index, t.data = dtype, device, index, data
    t.ndim = len(shape)
    for i, (s, st) in enumerate(zip(shape, strides)):
        t.shape[i], t.strides[i] = s, st
    return t


def describe(obj, name="tensor", dtype=None, writable=False):
    """(kvs_abi_tensor, keep_alive) for obj. dtype overrides the element type
    of raw 16-bit storage (uint16 arrays holding f16 / bf16 bits). `name`
    prefixes error messages."""
    t = _lib.new(_lib.Tensor)
    if hasattr(obj, "data_ptr") and hasattr(obj, "stride") and hasattr(obj, "dtype"):  # torch
        dt = dtype_code(dtype) if dtype is not None else _TORCH.get(str(obj.dtype))
        if dt is None:
            raise ValueError("%s: torch dtype %s is not supported (float32, float16, bfloat16, "
                             "uint8, bool, int32, int64)" % (name, obj.dtype))
        dev = getattr(obj, "device", None)
        kind = getattr(dev, "type", "cpu")
        if kind not in ("cpu", "cuda"):
            raise ValueError("%s: device %s is not supported (cpu or cuda)" % (name, dev))
        index = getattr(dev, "index", None) or 0
        return _fill(t, dt, _lib.CUDA if kind == "cuda" else _lib.HOST, index, obj.data_ptr(),
                     tuple(obj.shape), tuple(obj.stride())), obj
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None:  # numpy and friends
        typestr = ai["typestr"]
        dt = dtype_code(dtype) if dtype is not None else _TYPESTR.get(typestr[1:])
        if dt is None:
            raise ValueError("%s: array typestr %s is not supported (pass dtype= for 16-bit "
                             "storage)" % (name, typestr))
        if typestr[0] == ">" and typestr[1:] not in ("u1", "b1"):
            raise ValueError("%s: big-endian arrays are not supported" % name)
        itemsize = int(typestr[2:])
        if itemsize != _lib.DTYPE_SIZES[dt]:
            raise ValueError("%s: item size %d does not match dtype %s"
                             % (name, itemsize, _lib.DTYPE_NAMES[dt]))
        data, readonly = ai["data"]
        if writable and readonly:
            raise ValueError("%s: output array is read-only" % name)
        shape = tuple(ai["shape"])
        if ai.get("strides") is None:
            strides, acc = [], 1
            for s in reversed(shape):
                strides.append(acc)
                acc *= s
            strides = tuple(reversed(strides))
        else:
            if any(s % itemsize for s in ai["strides"]):
                raise ValueError("%s: byte strides %r are not multiples of the item size %d"
                                 % (name, ai["strides"], itemsize))
            strides = tuple(s // itemsize for s in ai["strides"])
        return _fill(t, dt, _lib.HOST, 0, data, shape, strides), obj
    if not isinstance(obj, Strided):
        mv = memoryview(obj)
        obj = Strided(obj, (mv.nbytes // mv.itemsize,) if mv.ndim <= 1 else mv.shape, dtype=dtype)
    elif dtype is not None:
        obj = Strided(obj.buffer, obj.shape, dtype, obj.strides, obj.offset)
    mv = memoryview(obj.buffer).cast("B")
    es = _lib.DTYPE_SIZES[obj.dtype]
    n_elems = mv.nbytes // es
    if any(s == 0 for s in obj.shape):
        raise ValueError("%s: shape %r has a zero dimension" % (name, obj.shape))
    lo = obj.offset + sum(min(0, st) * (s - 1) for s, st in zip(obj.shape, obj.strides))
    hi = obj.offset + sum(max(0, st) * (s - 1) for s, st in zip(obj.shape, obj.strides))
    if lo < 0 or hi >= n_elems:
        raise ValueError("%s: shape %r with strides %r and offset %d reaches elements [%d, %d] of a "
                         "buffer of %d %s elements" % (name, obj.shape, obj.strides, obj.offset, lo,
                                                       hi, n_elems, _lib.DTYPE_NAMES[obj.dtype]))
    base = _address(mv, writable)
    return _fill(t, obj.dtype, _lib.HOST, 0, base + obj.offset * es, obj.shape, obj.strides), (obj, mv)
