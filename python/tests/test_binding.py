"""test_binding.py -- the Python binding (python/kvsieve) of libkvsieve.so.

What it checks: the library's facts (version = the header's, SONAME with
the major version, only kvs_abi_* exported, the method list); plans of
every method on caches made in pure Python (sorted unique in-range indices,
exact budget, thread-count independence); plans and applied caches equal
to the `kvsieve compress` CLI's on the same dump (read here with
kvsieve.safetensors); layouts (strided views without copies, copies
counted); duck-typed torch / numpy objects (stand-ins, and the real
packages when installed); error messages naming layer and field.
Run by CTest (tests/abi) with PYTHONPATH, KVSIEVE_LIBRARY, KVSIEVE_CLI and
KVSIEVE_ABI_HEADER set.
"""
import array
import ctypes
import json
import os
import random
import re
import shutil
import subprocess
import tempfile
import unittest

import kvsieve
from kvsieve import KvsError, Strided

CLI = os.environ.get("KVSIEVE_CLI")
HEADER = os.environ.get("KVSIEVE_ABI_HEADER")
METHODS = ["full", "random", "streamingllm", "h2o", "snapkv", "lookm", "meda", "flashcache",
           "knorm", "tova", "keydiff", "pyramidkv", "chunkkv", "expected_attention", "pyramid_tova",
           "adakv", "ada_pyramidkv", "ada_flashcache", "lagkv", "criticalkv", "criticaladakv", "cur", "leverage",
           "cake", "simlayerkv", "qfilters", "compactor", "finch", "think", "kvzip"]
RAGGED = {"adakv", "ada_pyramidkv", "ada_flashcache", "criticaladakv"}  # head-adaptive: per-head counts
W_O = {"criticalkv", "criticaladakv"}  # need each layer's output projection, which the ABI does not take
RECON = {"kvzip"}  # needs the model's context-reconstruction pass, which a context cannot hold


def synth(L=2, Hkv=2, Hq=4, N=48, Nq=48, d=8, seed=1):
    """A cache in pure Python: smooth keys with a few loud tokens, as flat
    array('f') blocks [H][N][d] per layer; modality marks a middle span as image."""
    rng = random.Random(seed)
    loud = set(rng.sample(range(N), 4))
    layers = []
    for _ in range(L):
        k, v, q = array.array("f"), array.array("f"), array.array("f")
        for _h in range(Hkv):
            phase = rng.random() * 6.28
            for n in range(N):
                amp = 4.0 if n in loud else 1.0
                for c in range(d):
                    k.append(amp * (0.5 * ((n * (c + 1) * 0.05 + phase) % 2 - 1) + rng.gauss(0, 0.2)))
                    v.append(amp * rng.gauss(0, 1))
        for _h in range(Hq):
            for _n in range(Nq):
                for _c in range(d):
                    q.append(rng.gauss(0, 1))
        layers.append((Strided(k, (Hkv, N, d)), Strided(v, (Hkv, N, d)), Strided(q, (Hq, Nq, d))))
    modality = [1 if N // 3 <= n < 2 * N // 3 else 0 for n in range(N)]
    return layers, modality


def check_invariants(test, plan, L, N, per_layer, keeps_all):
    budgets = plan.budgets
    test.assertEqual(len(budgets), L)
    test.assertEqual(sum(budgets), L * (N if keeps_all else per_layer))
    for l, B in enumerate(budgets):
        test.assertTrue(1 <= B <= N)
        rows = plan.indices(l)
        counts = plan.head_counts(l)  # ragged layers (adakv): each head its own count, summing to Hkv * B
        test.assertEqual(len(rows), plan.info()["n_kv_heads"])
        test.assertEqual(sum(counts), len(rows) * B)
        for row, c in zip(rows, counts):
            test.assertEqual(len(row), c)
            test.assertEqual(row, sorted(set(row)), "layer %d: not sorted and unique" % l)
            test.assertTrue(0 <= row[0] and row[-1] < N)


class TestLibrary(unittest.TestCase):
    def test_version_is_the_headers(self):
        with open(HEADER) as f:
            text = f.read()
        want = tuple(int(re.search(r"#define KVS_ABI_VERSION_%s (\d+)" % p, text).group(1))
                     for p in ("MAJOR", "MINOR", "PATCH"))
        self.assertEqual(kvsieve.abi_version(), want)
        self.assertTrue(kvsieve.build_info().startswith("%d.%d.%d (kvsieve " % want))

    def test_soname_and_exports(self):
        path = os.path.realpath(kvsieve.library_path())
        dyn = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
        self.assertIn("Library soname: [libkvsieve.so.%d]" % kvsieve.abi_version()[0], dyn)
        syms = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True,
                              check=True).stdout.split("\n")
        exported = [s.split()[-1] for s in syms if len(s.split()) == 3 and s.split()[1] in "TDBRW"]
        self.assertGreater(len(exported), 15)
        bad = [s for s in exported if not s.startswith("kvs_abi_")]
        self.assertEqual(bad, [], "symbols exported beyond the ABI")

    def test_methods(self):
        ms = kvsieve.methods()
        self.assertEqual([m["name"] for m in ms], METHODS)
        by = {m["name"]: m for m in ms}
        self.assertIn("q_window", by["snapkv"]["needs"])
        self.assertIn("q_all", by["h2o"]["needs"])
        self.assertTrue(by["full"]["keeps_all"])
        gamma = [p for p in by["flashcache"]["params"] if p["name"] == "gamma"][0]
        self.assertEqual(gamma["type"], "float")
        self.assertEqual(gamma["default"], "0.2")
        self.assertEqual(kvsieve.queries_wanted("snapkv", {"window": 8}, 100), 8)
        self.assertEqual(kvsieve.queries_wanted("h2o", None, 100), 100)
        self.assertEqual(kvsieve.queries_wanted("flashcache", None, 100), 0)
        with self.assertRaises(KvsError) as e:
            kvsieve.queries_wanted("snapk", None, 100)
        self.assertEqual(e.exception.status_name, "notfound")
        self.assertIn("did you mean 'snapkv'", str(e.exception))

    def test_cuda_devices(self):
        if "cuda: no" in kvsieve.build_info():
            with self.assertRaises(KvsError) as e:
                kvsieve.cuda_device_count()
            self.assertEqual(e.exception.status_name, "unsupported")
            self.assertIn("built without CUDA", str(e.exception))
        else:
            try:
                self.assertGreaterEqual(kvsieve.cuda_device_count(), 1)
            except KvsError as e:
                self.assertIn("no CUDA device", str(e))


class TestPurePython(unittest.TestCase):
    def test_every_method_invariants(self):
        layers, modality = synth()
        L, N = 2, 48
        with kvsieve.Context() as ctx, kvsieve.Context(threads=3) as ctx3:
            ctx.set_cache(layers, modality)
            ctx3.set_cache(layers, modality)
            refused = 0
            for m in kvsieve.methods():
                if "w_o" in m["needs"]:  # a context carries no W_o: refused, by name
                    with self.assertRaises(KvsError) as e:
                        ctx.compress(m["name"], ratio=0.25)
                    self.assertEqual(e.exception.status_name, "invalid")
                    self.assertIn("output projection W_o", str(e.exception))
                    self.assertIn(m["name"], str(e.exception))
                    refused += 1
                    continue
                if "recon" in m["needs"]:  # nor KVzip's reconstruction statistic: refused, by name
                    with self.assertRaises(KvsError) as e:
                        ctx.compress(m["name"], ratio=0.25)
                    self.assertEqual(e.exception.status_name, "invalid")
                    self.assertIn("context-reconstruction statistic", str(e.exception))
                    self.assertIn(m["name"], str(e.exception))
                    refused += 1
                    continue
                for budget in ({"ratio": 0.25}, {"tokens": 10}):
                    plan = ctx.compress(m["name"], **budget)
                    per_layer = int(0.25 * N) if "ratio" in budget else 10
                    check_invariants(self, plan, L, N, per_layer, m["keeps_all"])
                    self.assertEqual(plan.method, m["name"])
                    self.assertEqual(plan.info()["n_tokens"], N)
                    # the thread count does not change the plan
                    self.assertEqual(ctx3.compress(m["name"], **budget).to_dict(), plan.to_dict())
            st = ctx.stats()
            self.assertEqual(st["tensors_fed"], 3 * L)
            self.assertEqual(st["tensors_copied"], 0)
            self.assertEqual(refused, len(W_O) + len(RECON))
            self.assertEqual(st["compress_calls"], 2 * (len(METHODS) - len(W_O) - len(RECON)))

    def test_params_and_merge(self):
        layers, modality = synth(seed=4)
        with kvsieve.Context() as ctx:
            ctx.set_cache(layers, modality)
            p = ctx.compress("flashcache", {"granularity": "layer", "dba": False}, ratio=0.5)
            self.assertEqual(p.budgets, [24, 24])
            lk = ctx.compress("lookm", ratio=0.25)
            self.assertNotEqual(lk.merge, "none")
            mp = lk.merge_map(0, 1)
            kept = lk.indices(0)[1]
            self.assertEqual([i for i, x in enumerate(mp) if x == -1], kept)
            self.assertTrue(all(0 <= x < len(kept) for x in mp if x != -1))
            sn = ctx.compress("snapkv", {"window": 8}, ratio=0.25)
            self.assertEqual(sn.merge, "none")
            self.assertEqual(sorted(set(sn.merge_map(1, 0))), [-2, -1])

    def test_apply_is_a_gather(self):
        layers, modality = synth(seed=9)
        H, N, d = 2, 48, 8
        with kvsieve.Context() as ctx:
            ctx.set_cache(layers, modality)
            plan = ctx.compress("snapkv", {"window": 8}, ratio=0.25)
            for l in range(2):
                k, v = ctx.apply_lists(plan, l)
                src_k, src_v = layers[l][0].buffer, layers[l][1].buffer
                B = plan.budgets[l]
                for h, row in enumerate(plan.indices(l)):
                    for b, n in enumerate(row):
                        o, s = (h * B + b) * d, (h * N + n) * d
                        self.assertEqual(list(k[o:o + d]), list(src_k[s:s + d]))
                        self.assertEqual(list(v[o:o + d]), list(src_v[s:s + d]))
            self.assertEqual(ctx.stats()["apply_calls"], 2)


@unittest.skipUnless(CLI and os.path.exists(CLI), "KVSIEVE_CLI (the kvsieve binary) is not set")
class TestAgainstCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kvsieve-abi-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_cli(self, *args):
        r = subprocess.run([CLI] + [str(a) for a in args], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, "kvsieve %s: %s" % (" ".join(map(str, args)), r.stderr))
        return r.stdout

    def feed_dump(self, ctx, path):
        f = kvsieve.safetensors.load(path)
        L = len([n for n in f.tensors if n.endswith(".k")])
        layers = []
        for l in range(L):
            ly = (f["layers.%d.k" % l], f["layers.%d.v" % l])
            if "layers.%d.q" % l in f:
                ly += (f["layers.%d.q" % l],)
            layers.append(ly)
        ctx.set_cache(layers, f["modality"] if "modality" in f else None)
        return f, L

    def compare_dump(self, dtype, seed, budgets):
        dump = os.path.join(self.tmp, "c-%s.safetensors" % dtype)
        self.run_cli("synth", "--preset", "tiny", "--tokens", 96, "--queries", 96, "--image-frac", 0.3,
                     "--dtype", dtype, "--seed", seed, "--out", dump)
        with kvsieve.Context() as ctx:
            f, L = self.feed_dump(ctx, dump)
            self.assertEqual(ctx.stats()["tensors_copied"], 0)
            for m in METHODS:
                if m in W_O or m in RECON:  # neither the dump nor the context has W_o / the pass (refusals: above)
                    continue
                for flag, value in budgets:
                    pj = os.path.join(self.tmp, "p.json")
                    out = os.path.join(self.tmp, "out.safetensors")
                    # ragged plans (per-head counts): the [Hkv, B, d] dump cannot hold them
                    self.run_cli("compress", "--kv", dump, "--method", m, flag, value, "--plan", pj,
                                 *(() if m in RAGGED else ("--out", out)), "--quiet")
                    plan = ctx.compress(m, **{flag[2:]: float(value) if flag == "--ratio" else int(value)})
                    with open(pj) as fh:
                        cli_text = fh.read()
                    self.assertEqual(plan.to_dict(), json.loads(cli_text), "%s %s %s" % (m, flag, value))
                    self.assertEqual(plan.to_json().strip(), cli_text.strip())
                    if m in RAGGED:
                        self.check_ragged(ctx, plan, f, L, dtype, json.loads(cli_text))
                        continue
                    # apply in the dump's dtype equals the CLI's compressed dump, byte for byte
                    comp = kvsieve.safetensors.load(out)
                    for l in range(L):
                        ck = comp["layers.%d.k" % l]
                        H, B, d = ck.shape
                        self.assertEqual(B, plan.budgets[l])
                        es = 4 if dtype == "f32" else 2
                        kb, vb = bytearray(H * B * d * es), bytearray(H * B * d * es)
                        ctx.apply(plan, l, Strided(kb, (H, B, d), dtype), Strided(vb, (H, B, d), dtype))
                        self.assertEqual(bytes(kb), bytes(ck.buffer), "%s layer %d: K" % (m, l))
                        self.assertEqual(bytes(vb), bytes(comp["layers.%d.v" % l].buffer))

    def check_ragged(self, ctx, plan, f, L, dtype, cli):
        """Per-head counts and indices as the CLI's JSON; apply_head of a
        non-merging plan is the kept rows' bytes of the input."""
        es = 4 if dtype == "f32" else 2
        ragged = 0
        for l in range(L):
            counts = plan.head_counts(l)
            self.assertEqual(counts, cli["layers"][l].get("counts", counts))
            ragged += "counts" in cli["layers"][l]
            k_in = f["layers.%d.k" % l]
            H, N, d = k_in.shape
            for h in range(H):
                rows = plan.head_indices(l, h)
                self.assertEqual(rows, cli["layers"][l]["heads"][h])
                kb, vb = bytearray(len(rows) * d * es), bytearray(len(rows) * d * es)
                ctx.apply_head(plan, l, h, Strided(kb, (len(rows), d), dtype), Strided(vb, (len(rows), d), dtype))
                src = bytes(k_in.buffer)
                want = b"".join(src[((h * N + t) * d) * es:((h * N + t + 1) * d) * es] for t in rows)
                self.assertEqual(bytes(kb), want, "%s layer %d head %d: K" % (plan.method, l, h))
        if plan.method == "ada_pyramidkv":  # window 8 < budget here (adakv's 32 covers the whole budget at N = 96)
            self.assertGreater(ragged, 0, "%s: no ragged layer" % plan.method)

    def test_f16_ratio(self):
        self.compare_dump("f16", 3, [("--ratio", "0.25")])

    def test_bf16_tokens(self):
        self.compare_dump("bf16", 5, [("--tokens", "20")])


class TestLayouts(unittest.TestCase):
    def test_strided_views_are_read_in_place(self):
        layers, modality = synth(seed=2)
        L, H, N, d = 2, 2, 48, 8
        # the same values stored token-major ([N][H][d], transformers' [B][N][H][d]) and as [H][d][N]
        tok, chan = [], []
        for k, v, q in layers:
            kt, vt = array.array("f", bytes(4 * H * N * d)), array.array("f", bytes(4 * H * N * d))
            kc = array.array("f", bytes(4 * H * N * d))
            for h in range(H):
                for n in range(N):
                    for c in range(d):
                        kt[(n * H + h) * d + c] = k.buffer[(h * N + n) * d + c]
                        vt[(n * H + h) * d + c] = v.buffer[(h * N + n) * d + c]
                        kc[(h * d + c) * N + n] = k.buffer[(h * N + n) * d + c]
            tok.append((Strided(kt, (H, N, d), strides=(d, H * d, 1)),
                        Strided(vt, (1, H, N, d), strides=(0, d, H * d, 1)), q))
            chan.append((Strided(kc, (H, N, d), strides=(d * N, 1, N)), v, q))
        with kvsieve.Context() as a, kvsieve.Context() as b, kvsieve.Context() as c:
            a.set_cache(layers, modality)
            b.set_cache(tok, modality)
            c.set_cache(chan, modality)
            for m in ("snapkv", "h2o", "flashcache", "meda"):
                want = a.compress(m, ratio=0.3).to_dict()
                self.assertEqual(b.compress(m, ratio=0.3).to_dict(), want, m)
                self.assertEqual(c.compress(m, ratio=0.3).to_dict(), want, m)
            self.assertEqual(b.stats()["tensors_copied"], 0)
            self.assertEqual(c.stats()["tensors_copied"], L)
            self.assertEqual(c.stats()["bytes_copied"], L * H * N * d * 4)

    def test_read_only_buffers(self):
        layers, modality = synth(seed=3)
        ro = [tuple(Strided(bytes(t.buffer), t.shape, "f32") for t in ly) for ly in layers]
        with kvsieve.Context() as a, kvsieve.Context() as b:
            a.set_cache(layers, modality)
            b.set_cache(ro, bytes(modality))
            self.assertEqual(b.compress("lookm", ratio=0.3).to_dict(), a.compress("lookm", ratio=0.3).to_dict())


class _Dev:
    def __init__(self, kind, index=None):
        self.type, self.index = kind, index


class _DType:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return self.name


class FakeTorch:
    """What the binding reads of a torch tensor, over an array.array."""

    def __init__(self, buf, shape, strides, dtype, device="cpu", index=None):
        self.buf, self.shape, self._strides = buf, tuple(shape), tuple(strides)
        self.dtype, self.device = _DType(dtype), _Dev(device, index)

    def data_ptr(self):
        return self.buf.buffer_info()[0]

    def stride(self):
        return self._strides

    def cpu(self):
        return self


class FakeNumpy:
    def __init__(self, buf, shape, typestr, byte_strides=None):
        self.buf = buf
        self.__array_interface__ = {"data": (buf.buffer_info()[0], False), "shape": tuple(shape),
                                    "typestr": typestr, "strides": byte_strides, "version": 3}


def to_f16(values):
    """Floats to f16 bit patterns (struct's 'e' rounds to nearest even)."""
    import struct
    return array.array("H", struct.unpack("<%dH" % len(values), struct.pack("<%de" % len(values), *values)))


class TestDuckTyping(unittest.TestCase):
    def test_torch_and_numpy_like(self):
        layers, modality = synth(seed=6)
        H, Hq, N, d = 2, 4, 48, 8
        torchy, numpyish, ref = [], [], []
        for k, v, q in layers:
            k16, v16, q16 = to_f16(k.buffer), to_f16(v.buffer), to_f16(q.buffer)
            ref.append(tuple(Strided(b, s.shape, "f16") for b, s in ((k16, k), (v16, v), (q16, q))))
            torchy.append((FakeTorch(k16, (1, H, N, d), (H * N * d, N * d, d, 1), "torch.float16"),
                           FakeTorch(v16, (1, H, N, d), (H * N * d, N * d, d, 1), "torch.float16"),
                           FakeTorch(q16, (1, Hq, N, d), (Hq * N * d, N * d, d, 1), "torch.float16")))
            numpyish.append((FakeNumpy(k16, (H, N, d), "<f2"),
                             FakeNumpy(v16, (H, N, d), "<f2", (N * d * 2, d * 2, 2)),
                             FakeNumpy(q16, (Hq, N, d), "<f2")))
        mask = array.array("B", modality)
        with kvsieve.Context() as a, kvsieve.Context() as b, kvsieve.Context() as c:
            a.set_cache(ref, modality)
            b.set_cache(torchy, FakeTorch(mask, (1, N), (N, 1), "torch.bool"))
            c.set_cache(numpyish, FakeNumpy(mask, (N,), "|u1"))
            kc, _ = c.apply_lists(c.compress("snapkv", ratio=0.25), 1, "f16")  # d known from the descriptor
            ka, _ = a.apply_lists(a.compress("snapkv", ratio=0.25), 1, "f16")
            self.assertEqual(kc.tobytes(), ka.tobytes())
            for m in ("meda", "lookm", "snapkv"):
                want = a.compress(m, ratio=0.25)
                pb = b.compress(m, ratio=0.25)
                self.assertEqual(pb.to_dict(), want.to_dict(), m)
                self.assertEqual(c.compress(m, ratio=0.25).to_dict(), want.to_dict(), m)
                # indices into a torch-like int64 [1][H][B] tensor, apply into f16 [1][H][B][d]
                B = pb.budgets[0]
                idx = FakeTorch(array.array("q", bytes(8 * H * B)), (1, H, B), (H * B, B, 1), "torch.int64")
                pb.indices(0, out=idx)
                self.assertEqual([list(idx.buf[h * B:(h + 1) * B]) for h in range(H)], want.indices(0))
                ko = FakeTorch(array.array("H", bytes(2 * H * B * d)), (1, H, B, d), (H * B * d, B * d, d, 1),
                               "torch.float16")
                vo = FakeTorch(array.array("H", bytes(2 * H * B * d)), (1, H, B, d), (H * B * d, B * d, d, 1),
                               "torch.float16")
                b.apply(pb, 0, ko, vo)
                kr, vr = bytearray(2 * H * B * d), bytearray(2 * H * B * d)
                a.apply(want, 0, Strided(kr, (H, B, d), "f16"), Strided(vr, (H, B, d), "f16"))
                self.assertEqual(ko.buf.tobytes(), bytes(kr))
                self.assertEqual(vo.buf.tobytes(), bytes(vr))

    def test_cuda_tensor(self):
        buf = array.array("f", bytes(4 * 2 * 8 * 4))
        k = FakeTorch(buf, (2, 8, 4), (32, 4, 1), "torch.float32", "cuda", 0)
        with kvsieve.Context() as ctx:
            ctx.begin(1)
            if "cuda: no" in kvsieve.build_info():
                with self.assertRaises(KvsError) as e:
                    ctx.set_layer(0, k, k)
                self.assertEqual(e.exception.status_name, "unsupported")
                self.assertIn("layer 0: k: CUDA tensor (device 0), but libkvsieve was built without CUDA",
                              str(e.exception))
            # a CUDA tensor next to a host one is refused in any build
            host = Strided(buf, (2, 8, 4))
            with self.assertRaises(KvsError):
                ctx.set_layer(0, host, k)

    @unittest.skipUnless(__import__("importlib").util.find_spec("numpy"), "numpy is not installed")
    def test_real_numpy(self):
        import numpy as np
        layers, modality = synth(seed=8)
        arrs = [tuple(np.frombuffer(t.buffer, dtype=np.float32).reshape(t.shape) for t in ly) for ly in layers]
        # a transposed (token-major) copy, passed as a strided view
        arrs_t = [(np.ascontiguousarray(k.transpose(1, 0, 2)).transpose(1, 0, 2), v, q) for k, v, q in arrs]
        with kvsieve.Context() as a, kvsieve.Context() as b:
            a.set_cache(layers, modality)
            b.set_cache(arrs_t, np.array(modality, dtype=np.uint8))
            self.assertEqual(b.compress("snapkv", ratio=0.3).to_dict(), a.compress("snapkv", ratio=0.3).to_dict())
            self.assertEqual(b.stats()["tensors_copied"], 0)

    @unittest.skipUnless(__import__("importlib").util.find_spec("torch"), "torch is not installed")
    def test_real_torch(self):
        import torch
        layers, modality = synth(seed=8)
        ts = [tuple(torch.tensor(list(t.buffer), dtype=torch.float32).reshape(t.shape).to(torch.bfloat16)
                    for t in ly) for ly in layers]
        with kvsieve.Context() as ctx:
            ctx.set_cache(ts, torch.tensor(modality, dtype=torch.bool))
            plan = ctx.compress("meda", ratio=0.3)
            B = plan.budgets[0]
            ko = torch.empty((1, 2, B, 8), dtype=torch.bfloat16)
            vo = torch.empty((1, 2, B, 8), dtype=torch.bfloat16)
            ctx.apply(plan, 0, ko, vo)
            idx = plan.indices(0, out=torch.empty((2, B), dtype=torch.int64))
            self.assertEqual(idx.tolist(), plan.indices(0))


class TestErrors(unittest.TestCase):
    def setUp(self):
        self.layers, self.modality = synth(seed=7)
        self.ctx = kvsieve.Context()

    def tearDown(self):
        self.ctx.close()

    def expect(self, status, needle, fn, *args, **kw):
        with self.assertRaises(KvsError) as e:
            fn(*args, **kw)
        self.assertEqual(e.exception.status_name, status, str(e.exception))
        self.assertIn(needle, str(e.exception))

    def test_tensor_errors(self):
        k, v, q = self.layers[0]
        self.ctx.begin(2)
        wrong = Strided(array.array("i", k.buffer.tobytes()), k.shape, "i32")
        self.expect("invalid", "layer 1: k: dtype I32 (need F32, F16 or BF16)", self.ctx.set_layer, 1, wrong, v)
        short = Strided(v.buffer, (2, 47, 8))
        self.expect("invalid", "layer 0: v: shape [2][47][8] differs from k's [2][48][8]",
                    self.ctx.set_layer, 0, k, short)
        self.expect("invalid", "layer 0: q: head_dim 4 differs from k's 8", self.ctx.set_layer, 0, k, v,
                    Strided(q.buffer, (4, 96, 4)))
        self.expect("invalid", "layer 0: k: shape [2][2][48][4] has batch 2", self.ctx.set_layer, 0,
                    Strided(k.buffer, (2, 2, 48, 4)), v)
        with self.assertRaises(ValueError) as e:  # caught in Python: reaches past the buffer
            self.ctx.set_layer(0, Strided(k.buffer, (2, 49, 8)), v)
        self.assertIn("reaches elements", str(e.exception))
        with self.assertRaises(ValueError):
            Strided(array.array("H", [0, 1]), (2,))  # 16-bit storage needs a dtype name

    def test_cache_and_method_errors(self):
        ctx = self.ctx
        ctx.begin(2)
        ctx.set_layer(0, *self.layers[0])
        self.expect("invalid", "layer 1 of 2 was not set", ctx.compress, "snapkv", ratio=0.2)
        ctx.set_layer(1, *self.layers[1])
        ctx.set_modality([0] * 10)
        self.expect("invalid", "modality: length 10, but the cache has N = 48", ctx.compress, "meda", ratio=0.2)
        self.expect("invalid", "modality: value 9 at position 2", ctx.set_modality, [0, 0, 9])
        ctx.set_modality(self.modality)
        self.expect("notfound", "did you mean 'snapkv'", ctx.compress, "snapkvv", ratio=0.2)
        self.expect("notfound", "gamma", ctx.compress, "flashcache", {"gama": 0.1}, ratio=0.2)
        self.expect("invalid", "gamma", ctx.compress, "flashcache", {"gamma": 3}, ratio=0.2)
        self.expect("invalid", "ratio", ctx.compress, "snapkv", ratio=1.5)
        self.expect("invalid", "neither ratio nor tokens", ctx.compress, "snapkv")
        plan = ctx.compress("snapkv", {"window": 8}, ratio=0.25)
        B = plan.budgets[0]
        bad = Strided(bytearray(4 * 2 * (B + 1) * 8), (2, B + 1, 8), "f32")
        good = Strided(bytearray(4 * 2 * B * 8), (2, B, 8), "f32")
        self.expect("invalid", "layer 0: k_out: shape [2][%d][8] (need [2][%d][8]" % (B + 1, B),
                    ctx.apply, plan, 0, bad, good)
        self.expect("invalid", "layer 3 outside [0, 2)", ctx.apply, plan, 3, good, good)
        with self.assertRaises(ValueError):  # outputs must be writable
            ctx.apply(plan, 0, Strided(bytes(4 * 2 * B * 8), (2, B, 8), "f32"), good)
        with kvsieve.Context() as other:
            self.expect("invalid", "made by another context", other.apply, plan, 0, good, good)
        ctx.begin(2)
        self.expect("invalid", "made from an earlier cache", ctx.apply, plan, 0, good, good)
        self.assertEqual(plan.budgets[0], B)  # the plan stays readable


if __name__ == "__main__":
    unittest.main()
