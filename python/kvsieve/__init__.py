"""kvsieve -- Python binding of libkvsieve.so, kvsieve's C ABI (abi/kvsieve_abi.h).

Pure Python (ctypes); no compiled extension, no required dependency. Tensors
may be torch tensors (host or CUDA), numpy arrays, or any buffer wrapped in
Strided; neither torch nor numpy is imported by this package.

    import kvsieve
    with kvsieve.Context(threads=4) as ctx:
        ctx.set_cache([(k0, v0, q0), (k1, v1, q1)], modality=mask)
        plan = ctx.compress("snapkv", {"window": 32}, ratio=0.2)
        plan.budgets, plan.indices(0), plan.to_json()
        ctx.apply(plan, 0, k_out, v_out)

The library is found through KVSIEVE_LIBRARY, else next to this package,
else the checkout's build*/lib, else the system search path.
"""
from ._lib import (KvsError, abi_version, build_info, cuda_device_count, library_path, methods,
                   queries_wanted)
from ._tensor import Strided, describe
from ._context import Context, Plan
from . import safetensors

__all__ = ["KvsError", "abi_version", "build_info", "cuda_device_count", "library_path", "methods",
           "queries_wanted", "Strided", "describe", "Context", "Plan", "safetensors"]
