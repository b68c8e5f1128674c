"""bench_abi.py -- what handing a cache to libkvsieve through the Python
binding costs: feed (descriptors only, copies counted), compress per method,
apply (gather / merge of every layer into fresh host buffers), in ms.

usage: python3 python/bench_abi.py --kv DUMP.safetensors [--threads T] [--ratio R] [--reps K]
       (a dump from `kvsieve synth` or any recorder; PYTHONPATH=python, KVSIEVE_LIBRARY as for the binding)
It prints numbers; it asserts nothing. Not a CTest test.
"""
import argparse
import statistics
import time

import kvsieve


def ms(f, reps):
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        r = f()
        out.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(out), r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kv", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ratio", type=float, default=0.2)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    f = kvsieve.safetensors.load(a.kv)
    L = len([n for n in f.tensors if n.endswith(".k")])
    layers = [tuple(f[n] for n in ("layers.%d.k" % l, "layers.%d.v" % l, "layers.%d.q" % l) if n in f)
              for l in range(L)]
    H, N, d = f["layers.0.k"].shape
    nq = f["layers.0.q"].shape[1] if "layers.0.q" in f else 0
    print("%s: L %d, Hkv %d, N %d, d %d, Nq %d, %s; libkvsieve %s; %d thread(s)"
          % (a.kv, L, H, N, d, nq, f.header["layers.0.k"]["dtype"], kvsieve.build_info(), a.threads))
    with kvsieve.Context(threads=a.threads) as ctx:
        mod = f["modality"] if "modality" in f else None
        t, _ = ms(lambda: ctx.set_cache(layers, mod), a.reps)
        st = ctx.stats()
        print("feed: %.3f ms for %d tensors (%d copied, %d bytes)"
              % (t, st["tensors_fed"] // a.reps, st["tensors_copied"], st["bytes_copied"]))
        print("%-13s %12s %12s %10s" % ("method", "compress ms", "apply ms", "kept"))
        for m in kvsieve.methods():
            want = kvsieve.queries_wanted(m["name"], None, N)
            if want > nq:
                print("%-13s needs %d query rows, the dump has %d: skipped" % (m["name"], want, nq))
                continue
            tc, plan = ms(lambda: ctx.compress(m["name"], ratio=a.ratio), a.reps)
            dt = f["layers.0.k"].dtype
            ta, _ = ms(lambda: [ctx.apply_lists(plan, l, dt) for l in range(L)], a.reps)
            print("%-13s %12.2f %12.2f %10d" % (m["name"], tc, ta, plan.info()["total_kept"]))


if __name__ == "__main__":
    main()
