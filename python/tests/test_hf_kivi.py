"""test_hf_kivi.py -- kvsieve-hf's KIVI path (kvsieve/hf/kivi.py) against the C store.

What it checks: on random [T][d] keys and values (outlier channels, large
offsets, constant runs), for 2 and 4 bits, several G, R, T around the window's
boundaries, fp16 / bf16 / fp32 windows, flushed or not, the torch path's
dequantised cache equals the C store's (kernels/kivi.c, run through
tests/kernels/kivi_tool.c, KVSIEVE_KIVI_TOOL) element for element, and its byte
count equals the C store's; a [1][H][T][d] cache is quantised head by head.
What it is not: a model test.

Run: cd python && KVSIEVE_KIVI_TOOL=../build/tests/kernels/kivi_tool \
     ~/.cache/kvsieve/hf-venv/bin/python -m unittest tests.test_hf_kivi -v
"""
import os
import subprocess
import tempfile
import unittest

import numpy as np
import torch

from kvsieve.hf import kivi

WINDOW = {"f16": (torch.float16, 2), "bf16": (torch.bfloat16, 2), "f32": (torch.float32, 4)}


def tool():
    path = os.environ.get("KVSIEVE_KIVI_TOOL")
    if not path or not os.access(path, os.X_OK):
        raise RuntimeError("KVSIEVE_KIVI_TOOL (build/tests/kernels/kivi_tool) is not set or not "
                           "executable: %r" % path)
    return path


def run_c(k, v, kb, vb, G, R, win, flushed):
    """The C store's dequantised k, v ([T][d] fp32) and its (kq, vq, bytes)."""
    T, d = k.shape
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "in.f32"), os.path.join(tmp, "out.f32")
        np.concatenate([k.numpy().ravel(), v.numpy().ravel()]).astype(np.float32).tofile(src)
        out = subprocess.run([tool(), str(kb), str(vb), str(G), str(R), win, str(int(flushed)),
                              str(T), str(d), src, dst], capture_output=True, text=True)
        if out.returncode:
            raise AssertionError("kivi_tool failed: " + out.stderr)
        r = np.fromfile(dst, dtype=np.float32)
    kq, vq, nbytes = (int(x) for x in out.stdout.split())
    return torch.from_numpy(r[:T * d].reshape(T, d)), torch.from_numpy(r[T * d:].reshape(T, d)), \
        (kq, vq, nbytes)


def data(T, d, kind, gen):
    x = torch.randn(T, d, generator=gen)
    if kind == 1:
        x[:, 3::7] = x[:, 3::7] * 20 + 50
    elif kind == 2:
        x = 1000 + 0.01 * x
    elif kind == 3:
        x = ((torch.arange(T) // 5) % 3 - 1).float().unsqueeze(1).expand(T, d).clone()
    return x


class KiviMatchesC(unittest.TestCase):
    def test_elementwise(self):
        gen = torch.Generator().manual_seed(7)
        cases = 0
        for kb, vb in ((2, 2), (4, 4), (2, 4)):
            for G, R in ((32, 128), (4, 8), (1, 3)):
                for T in (1, R - 1, R, R + 1, 2 * R + 5, 300):
                    if T < 1:
                        continue
                    for d, win, flushed, kind in ((128, "f16", True, 1), (5, "f32", False, 2),
                                                  (64, "bf16", True, 0), (16, "f32", True, 3)):
                        k, v = data(T, d, kind, gen), data(T, d, (kind + 1) % 4, gen)
                        ck, cv, (kq, vq, nbytes) = run_c(k, v, kb, vb, G, R, win, flushed)
                        wdt, wb = WINDOW[win]
                        tk, tv = kivi.quantize_dequantize(k, v, kb, vb, G, R, wdt, flushed)
                        what = "bits %d/%d G %d R %d T %d d %d %s flushed %s kind %d" % (
                            kb, vb, G, R, T, d, win, flushed, kind)
                        self.assertEqual((kq, vq), kivi.quantized_prefix(T, R, flushed), what)
                        self.assertTrue(torch.equal(tk, ck), what + ": K differs, max %g" %
                                        float((tk - ck).abs().max()))
                        self.assertTrue(torch.equal(tv, cv), what + ": V differs, max %g" %
                                        float((tv - cv).abs().max()))
                        self.assertEqual(kivi.kivi_bytes(T, d, kb, vb, G, R, wb, flushed), nbytes, what)
                        cases += 1
        print("torch path == C store on %d cases" % cases)

    def test_cache_layout(self):
        """[1][H][T][d] in bf16: each head as its own store; output in bf16."""
        gen = torch.Generator().manual_seed(3)
        H, T, d = 3, 200, 64
        k = data(H * T, d, 1, gen).reshape(1, H, T, d).to(torch.bfloat16)
        v = data(H * T, d, 0, gen).reshape(1, H, T, d).to(torch.bfloat16)
        qk, qv = kivi.quantize_dequantize(k, v, 2, 2, window_dtype=torch.bfloat16)
        self.assertEqual(qk.dtype, torch.bfloat16)
        for h in range(H):
            ck, cv, _ = run_c(k[0, h].float(), v[0, h].float(), 2, 2, 32, 128, "bf16", True)
            self.assertTrue(torch.equal(qk[0, h], ck.to(torch.bfloat16)), "head %d K" % h)
            self.assertTrue(torch.equal(qv[0, h], cv.to(torch.bfloat16)), "head %d V" % h)
        # the window (last T mod R keys, last R values) is the input itself
        self.assertTrue(torch.equal(qk[..., 128:, :], k[..., 128:, :]))
        self.assertTrue(torch.equal(qv[..., T - 128:, :], v[..., T - 128:, :]))
        self.assertFalse(torch.equal(qk[..., :128, :], k[..., :128, :]))

    def test_errors(self):
        k = torch.zeros(4, 8)
        with self.assertRaisesRegex(ValueError, "bits must be 2 or 4"):
            kivi.quantize_dequantize(k, k, 3, 2)
        with self.assertRaisesRegex(ValueError, "multiple of group"):
            kivi.quantize_dequantize(k, k, 2, 2, group=4, residual=6)
        bad = k.clone()
        bad[1, 2] = 70000.0
        with self.assertRaisesRegex(ValueError, "V holds NaN"):
            kivi.quantize_dequantize(k, bad, 2, 2, window_dtype=torch.float32)


if __name__ == "__main__":
    unittest.main()
