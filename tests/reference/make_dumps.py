#!/usr/bin/env python3
"""make_dumps.py DIR -- hand-shaped cache dumps for check_methods.sh.

What this is: a writer of small F32 safetensors caches whose layers differ on
purpose, so that the layer-budget allocation of flashcache (DBA) and meda hits
its clamps and water-filling, and the rarely exercised rules get a case:
  dba_clamp.safetensors   L=4, no queries: an all-zero layer (R = 0, Dev = 0
                          everywhere: top-k ties broken by the lower index), a
                          smooth layer (R ~ 0), a noise layer, a mixed layer.
  dba_wide.safetensors    N=300 (B_min = 3), L=3: smooth, noise, mixed layers, so
                          the smooth layer is clamped to B_min (or to a lowered
                          B_min when floor(rho N) < 3).
  meda_skew.safetensors   L=3 with all queries and a modality mask holding
                          text, image, video and audio spans; queries scaled 0,
                          1 and 6 per layer so the entropies (and budgets) differ
                          strongly; three zero keys in head 0 (merging: cosine 0
                          with everything, so they go to the lowest kept slot).
  meda_audio.safetensors  a long audio span (audio takes part in neither
                          cross-modal term, and gets no text boost): budgets
                          move if audio were counted as image or text.
  meda_imgfirst.safetensors  image span first, then text: only text rows have
                          cross-modal keys (E_VT has no rows).
What this is not: a model of real caches (kvsieve synth does that). Standard
library only; deterministic (random.Random with fixed seeds).
"""
import json
import math
import os
import random
import struct
import sys


def write_safetensors(path, tensors):
    """tensors: name -> (dtype, shape, flat list); F32 and U8 only."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, flat = tensors[name]
        raw = struct.pack("<%df" % len(flat), *flat) if dtype == "F32" else bytes(flat)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def block(rng, H, N, d, smooth, noise):
    """[H][N][d] flat: smooth low-frequency cosines times `smooth` plus gaussian noise."""
    out = []
    for h in range(H):
        for n in range(N):
            for c in range(d):
                s = math.cos(math.pi * (c % 3 + 1) * (n + 0.5) / N + 0.7 * h + 0.3 * c)
                out.append(smooth * s + noise * rng.gauss(0.0, 1.0))
    return out


def dba_clamp(path, N=40, H=2, d=8, layers=((0.0, 0.0), (1.0, 1e-3), (0.0, 1.0), (1.0, 0.4))):
    rng = random.Random(11)
    t = {}
    for l, (smooth, noise) in enumerate(layers):
        t["layers.%d.k" % l] = ("F32", [H, N, d], block(rng, H, N, d, smooth, noise))
        t["layers.%d.v" % l] = ("F32", [H, N, d], block(rng, H, N, d, smooth, noise))
    write_safetensors(path, t)


def meda_dump(path, modality, seed, qscale, zero_keys=()):
    rng = random.Random(seed)
    L, Hq, H, N, d = len(qscale), 4, 2, len(modality), 8
    t = {"modality": ("U8", [N], modality)}
    for l in range(L):
        k = block(rng, H, N, d, 0.5, 1.0)
        for n in zero_keys:  # head 0: cosine 0 with every key, merged into the first kept slot
            k[n * d:(n + 1) * d] = [0.0] * d
        t["layers.%d.k" % l] = ("F32", [H, N, d], k)
        t["layers.%d.v" % l] = ("F32", [H, N, d], block(rng, H, N, d, 0.0, 1.0))
        t["layers.%d.q" % l] = ("F32", [Hq, N, d], [qscale[l] * x for x in block(rng, Hq, N, d, 0.0, 1.0)])
    write_safetensors(path, t)


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: make_dumps.py DIR\n")
        return 2
    out = argv[1]
    dba_clamp(os.path.join(out, "dba_clamp.safetensors"))
    dba_clamp(os.path.join(out, "dba_wide.safetensors"), N=300, H=1, d=4,
              layers=((1.0, 1e-3), (0.0, 1.0), (1.0, 0.05)))
    mod = [0] * 8 + [1] * 14 + [0] * 6 + [2] * 6 + [3] * 4 + [0] * 10
    meda_dump(os.path.join(out, "meda_skew.safetensors"), mod, 12, [0.0, 1.0, 6.0], zero_keys=(20, 30, 33))
    mod = [0] * 6 + [1] * 8 + [3] * 24 + [0] * 10
    meda_dump(os.path.join(out, "meda_audio.safetensors"), mod, 12, [3.0, 0.3, 1.0])
    mod = [1] * 12 + [0] * 24
    meda_dump(os.path.join(out, "meda_imgfirst.safetensors"), mod, 13, [2.0, 0.5, 1.0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
