"""ref_common.py -- what every method of the independent reference shares:
the cache dump reader (safetensors), the Cache with its float64 causal
attention, the per-layer budget and the water-filling allocation, the
top-k / recent-window selection helpers, SnapKV's window votes and 1-D
pooling, FlashCache's DCT deviation score and the Plan a method returns.

What this is: part of tests/reference/ (see ref_methods.py's header), written
from ../shared/spec/methods.md and docs/methods.md only, standard library only.
What this is not: a method; ref_methods.py and ref_presets_*.py hold those.
"""
import json
import math
import struct

TEXT = 0
VISUAL = (1, 2)     # KVS_MOD_IMAGE, KVS_MOD_VIDEO count as "image" (docs/methods.md)


# --------------------------------------------------------------------------
# safetensors
# --------------------------------------------------------------------------

def _decode(dtype, raw, count):
    if dtype == "F32":
        return list(struct.unpack("<%df" % count, raw))
    if dtype == "F16":
        return list(struct.unpack("<%de" % count, raw))
    if dtype == "BF16":
        halves = struct.unpack("<%dH" % count, raw)
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]
    if dtype == "U8":
        return list(raw)
    if dtype == "I32":
        return list(struct.unpack("<%di" % count, raw))
    raise ValueError("unsupported dtype %s" % dtype)


_SIZES = {"F32": 4, "F16": 2, "BF16": 2, "U8": 1, "I32": 4}


def load_safetensors(path):
    """name -> (dtype, shape, flat list of Python numbers)."""
    with open(path, "rb") as f:
        blob = f.read()
    (hlen,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    base = 8 + hlen
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        count = 1
        for s in t["shape"]:
            count *= s
        a, b = t["data_offsets"]
        assert b - a == count * _SIZES[t["dtype"]], "%s: %s size mismatch" % (path, name)
        out[name] = (t["dtype"], t["shape"], _decode(t["dtype"], blob[base + a:base + b], count))
    return out


def to_3d(flat, shape):
    """[H][N][d] nested lists from a flat row-major list."""
    H, N, d = shape
    return [[flat[(h * N + n) * d:(h * N + n + 1) * d] for n in range(N)] for h in range(H)]


class Cache:
    """One prompt's cache: K, V [L][Hkv][N][d], Q [L][Hq][Nq][d] or None, modality [N];
    when the dump has them, Wo [L][Hq][E][d] (layers.{l}.wo) and Recon [L][Hkv][N]
    (layers.{l}.recon), else None."""

    def __init__(self, path):
        t = load_safetensors(path)
        self.L = 0
        while "layers.%d.k" % self.L in t:
            self.L += 1
        self.K, self.V, self.Q = [], [], []
        for l in range(self.L):
            _, ks, kf = t["layers.%d.k" % l]
            _, vs, vf = t["layers.%d.v" % l]
            self.K.append(to_3d(kf, ks))
            self.V.append(to_3d(vf, vs))
            q = t.get("layers.%d.q" % l)
            self.Q.append(to_3d(q[2], q[1]) if q else None)
        wo = ["layers.%d.wo" % l in t for l in range(self.L)]
        self.Wo = [to_3d(t["layers.%d.wo" % l][2], t["layers.%d.wo" % l][1]) for l in range(self.L)] \
            if all(wo) else None
        rc = ["layers.%d.recon" % l in t for l in range(self.L)]
        if all(rc):
            self.Recon = []
            for l in range(self.L):
                _, (H, N), flat = t["layers.%d.recon" % l]
                self.Recon.append([flat[g * N:(g + 1) * N] for g in range(H)])
        else:
            self.Recon = None
        self.Hkv, self.N, self.d = ks
        self.Hq = len(self.Q[0]) if self.Q[0] is not None else 0
        self.Nq = len(self.Q[0][0]) if self.Q[0] is not None else 0
        self.G = self.Hq // self.Hkv if self.Hq else 0
        self.modality = t["modality"][2] if "modality" in t else [TEXT] * self.N
        self._probs = {}
        self.memo = {}  # per-method intermediate results that depend on the cache only

    def probs(self, l):
        """P[hq][i] = causal softmax row of query row i (position N - Nq + i), length p_i + 1."""
        if l not in self._probs:
            N, Nq, d = self.N, self.Nq, self.d
            inv = 1.0 / math.sqrt(d)
            P = []
            for h in range(self.Hq):
                K = self.K[l][h // self.G]
                rows = []
                for i in range(Nq):
                    q = self.Q[l][h][i]
                    p = N - Nq + i
                    s = [sum(a * b for a, b in zip(q, K[j])) * inv for j in range(p + 1)]
                    m = max(s)
                    e = [math.exp(x - m) for x in s]
                    z = sum(e)
                    rows.append([x / z for x in e])
                P.append(rows)
            self._probs[l] = P
        return self._probs[l]

    def colsum_gqa(self, l):
        """[Hkv][N]: (1/G) sum_{h in group} sum_i A_h[i][j]."""
        P = self.probs(l)
        out = [[0.0] * self.N for _ in range(self.Hkv)]
        for h in range(self.Hq):
            acc = out[h // self.G]
            for row in P[h]:
                for j, x in enumerate(row):
                    acc[j] += x
        return [[x / self.G for x in row] for row in out]


# --------------------------------------------------------------------------
# budgets
# --------------------------------------------------------------------------

def per_layer_budget(budget, N):
    kind, val = budget
    if kind == "ratio":
        B = math.floor(val * N + 1e-9 * max(1.0, val * N))
    else:
        B = int(val)
    return max(1, min(N, B))


def budget_min(N, B):
    return min(max(1, (N + 99) // 100), B)


def _snap(x):
    r = round(x)
    return float(r) if abs(x - r) < 1e-9 * max(1.0, abs(x)) else x


def allocate(weights, total, bmin, bmax):
    """Water-filling split of `total` over layers proportional to weights, each
    clamped to [bmin, bmax]: find lam with sum clamp(lam w_l) == total, then
    largest-remainder rounding (ties to the lower layer). Returns (budgets,
    real shares)."""
    L = len(weights)
    pos = [l for l in range(L) if weights[l] > 0]
    zero = [l for l in range(L) if weights[l] <= 0]
    if not pos:
        shares = [total / L] * L
    elif len(pos) * bmax + len(zero) * bmin <= total:
        shares = [float(bmax) if weights[l] > 0 else 0.0 for l in range(L)]
        for l in zero:
            shares[l] = (total - len(pos) * bmax) / len(zero)
    else:
        def f(lam):
            return sum(min(bmax, max(bmin, lam * weights[l])) for l in pos) + len(zero) * bmin
        lo, hi = 0.0, bmax / min(weights[l] for l in pos)
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if f(mid) < total:
                lo = mid
            else:
                hi = mid
        lam = 0.5 * (lo + hi)
        shares = [float(bmin)] * L
        free, fixed = [], len(zero) * bmin
        for l in pos:
            x = lam * weights[l]
            if x <= bmin * (1 + 1e-12):
                shares[l] = float(bmin)
                fixed += bmin
            elif x >= bmax * (1 - 1e-12):
                shares[l] = float(bmax)
                fixed += bmax
            else:
                free.append(l)
        wf = sum(weights[l] for l in free)
        for l in free:
            shares[l] = (total - fixed) * weights[l] / wf
    shares = [_snap(x) for x in shares]
    out = [int(math.floor(x)) for x in shares]
    rem = total - sum(out)
    order = sorted(range(L), key=lambda l: (-(shares[l] - out[l]), l))
    for l in order[:rem]:
        out[l] += 1
    assert sum(out) == total
    return out, shares


# --------------------------------------------------------------------------
# selection helpers
# --------------------------------------------------------------------------

class HeadSel:
    """One head's selection: kept indices, the forced ones, and the ranking scores.
    A reference whose scores only approximate the C's (leverage) also sets
    tol_rel, its relative tie margin at the top-k cut (else ref_methods' TIE_REL)."""

    def __init__(self, kept, forced, scores):
        self.kept = sorted(kept)
        self.forced = set(forced)
        self.scores = scores  # list over tokens or None


def top_by_score(scores, candidates, k):
    """k best of candidates by score (ties: lower index)."""
    if k <= 0:
        return []
    return sorted(candidates, key=lambda j: (-scores[j], j))[:k]


def select_recent_plus_top(scores, N, B, r):
    recent = list(range(N - r, N))
    rest = top_by_score(scores, range(0, N - r), B - r)
    return HeadSel(recent + rest, recent, scores)


class Plan:
    def __init__(self, budgets, heads, merge="none", shares=None, note="", ragged=False):
        self.budgets = budgets      # [L] kept tokens per head on average (sum over heads / Hkv)
        self.heads = heads          # [L][Hkv] HeadSel
        self.merge = merge
        self.shares = shares        # real-valued layer shares (re-allocating methods)
        self.note = note
        # head-adaptive (AdaKV-style) plans: one top-k over all heads of a layer, so the
        # heads' counts may differ; their scores must be comparable across the layer's heads
        self.ragged = ragged



# SnapKV's pooling along tokens (also used by the presets that vote with a window)
def pool1d(x, k, kind):
    n = len(x)
    lo_off = k // 2
    out = []
    for j in range(n):
        a = max(0, j - lo_off)
        b = min(n, j - lo_off + k)
        win = x[a:b]
        out.append(max(win) if kind == "max" else sum(win) / len(win))
    return out


def snapkv_votes(c, l, w):
    """[Hkv][N - w]: the last w query rows' attention on the prefix keys j < N - w,
    summed over the rows and averaged over each KV head's query group."""
    P = c.probs(l)
    npre = c.N - w
    votes = [[0.0] * npre for _ in range(c.Hkv)]
    for h in range(c.Hq):
        acc = votes[h // c.G]
        for row in P[h][c.Nq - w:]:
            for j in range(npre):
                acc[j] += row[j]
    return [[x / c.G for x in v] for v in votes]


# --------------------------------------------------------------------------
# FlashCache's DCT outlier score (docs/methods.md "flashcache")
# --------------------------------------------------------------------------

def dct_tables(N, omega):
    a = [math.sqrt(1.0 / N)] + [math.sqrt(2.0 / N)] * (N - 1)
    cosm = [[a[m] * math.cos(math.pi * (2 * n + 1) * m / (2 * N)) for n in range(N)]
            for m in range(omega)]
    return cosm


def flash_layer(X3, N, d, cosm):
    """For one tensor [H][N][d]: per head the squared residual mean over channels
    [H][N], plus low-band and total energies."""
    omega = len(cosm)
    dev = []
    low = tot = 0.0
    for head in X3:
        r2 = [0.0] * N
        for ch in range(d):
            x = [head[n][ch] for n in range(N)]
            X = [sum(cm[n] * x[n] for n in range(N)) for cm in cosm]  # m < omega
            low += sum(v * v for v in X)
            tot += sum(v * v for v in x)
            for n in range(N):
                base = sum(X[m] * cosm[m][n] for m in range(omega))
                r2[n] += (x[n] - base) ** 2
        dev.append([v / d for v in r2])
    return dev, low, tot


def flash_scores(c, gamma):
    """(devs [L][Hkv][N], R [L]): per head the K + V deviation from the DCT
    low-pass with omega = max(1, floor(gamma N + 0.5)) coefficients, and each
    layer's high-band energy share R_K + R_V (memoised on the cache)."""
    N, d = c.N, c.d
    omega = max(1, int(math.floor(gamma * N + 0.5)))
    key = ("flash", omega)
    if key not in c.memo:  # Dev and R depend on omega only
        cosm = dct_tables(N, omega)
        devs, R = [], []
        for l in range(c.L):
            dk, lk, tk = flash_layer(c.K[l], N, d, cosm)
            dv, lv, tv = flash_layer(c.V[l], N, d, cosm)
            devs.append([[a + b for a, b in zip(dk[h], dv[h])] for h in range(c.Hkv)])
            rk = (tk - lk) / tk if tk > 0 else 0.0
            rv = (tv - lv) / tv if tv > 0 else 0.0
            R.append(max(0.0, rk) + max(0.0, rv))
        c.memo[key] = (devs, R)
    return c.memo[key]
