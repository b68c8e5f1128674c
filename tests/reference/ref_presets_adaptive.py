"""ref_presets_adaptive.py -- the independent reference of the head-adaptive
presets (adakv, ada_pyramidkv, ada_flashcache) and of the K/V-only scorers
cur and leverage.

What this is: part of tests/reference/ (see ref_methods.py's header), written
from docs/methods.md's sections "adakv", "pyramidkv", "cur", "leverage",
`kvsieve methods` (defaults, compositions) and the papers / kvpress, without
the C. Standard library only, float64. Exports METHODS = {name: fn(cache, B,
params) -> Plan}; ref_methods.py merges it into its own.

What this is not: the C's arithmetic. leverage's sketch is reproduced draw
for draw (docs/methods.md "leverage" fixes the generator), but its leverages
are computed in double through a d x d solve instead of the C's k x k
Cholesky factorisation, so they agree to rounding, not bit for bit.
"""
import math
import struct

from ref_common import HeadSel, Plan, allocate, budget_min, flash_scores, pool1d, snapkv_votes, top_by_score


# --------------------------------------------------------------------------
# AdaKV's head allocator (docs/methods.md "adakv")
# --------------------------------------------------------------------------

def adakv_layer(scores, N, Bl, p, q, alpha):
    """One layer's ragged selection: the first p (sinks) and last q (window)
    tokens in every head (clamped to Bl in that order); of the rest, b = Bl - p - q
    per head on average, each head first takes its own best f = max(1, floor(alpha b)),
    then Hkv (b - f) slots go to the best remaining (head, token) pairs of the
    whole layer (ties: lower head, then lower token). scores [Hkv][N]."""
    Hkv = len(scores)
    p = min(p, Bl)
    q = min(q, Bl - p)
    forced = list(range(p)) + list(range(N - q, N))
    b = Bl - p - q
    if b == 0:
        return [HeadSel(forced, forced, sc) for sc in scores]
    cand = range(p, N - q)
    f = max(1, math.floor(alpha * b))
    own = [top_by_score(sc, cand, f) for sc in scores]
    taken = [set(o) for o in own]
    pool = [(h, j) for h in range(Hkv) for j in cand if j not in taken[h]]
    pool.sort(key=lambda hj: (-scores[hj[0]][hj[1]], hj[0], hj[1]))
    for h, j in pool[:Hkv * (b - f)]:
        own[h].append(j)
    return [HeadSel(forced + own[h], forced, scores[h]) for h in range(Hkv)]


def snapkv_scores(c, l, w, k, pool):
    """[Hkv][N]: SnapKV's pooled window votes on the prefix, 0 on the window
    (kept by the window rule anyway)."""
    votes = snapkv_votes(c, l, w)
    return [pool1d(v, k, pool) + [0.0] * w for v in votes]


def ada_snapkv(c, budgets, p, shares=None, note=""):
    w = min(int(p.get("window", 32)), c.N)  # a prompt shorter than the window is all window
    k = int(p.get("kernel", 7))
    pool = p.get("pool", "max")
    alpha = float(p.get("alpha", 0.2))
    heads = []
    for l in range(c.L):
        sc = snapkv_scores(c, l, w, k, pool) if budgets[l] > w else [[0.0] * c.N] * c.Hkv
        heads.append(adakv_layer(sc, c.N, budgets[l], 0, w, alpha))
    return Plan(budgets, heads, shares=shares, note=note, ragged=True)


def m_adakv(c, B, p):
    return ada_snapkv(c, [B] * c.L, p)


def pyramid_budgets(L, B, N, w, beta):
    """docs/methods.md "pyramidkv": X = B - w; the top layer (l = L - 1) gets
    X / beta, the bottom (l = 0) 2X - X / beta, a straight line between, each plus
    w; a bottom above N - w is set to N - w and the top to 2X - (N - w); one
    water-filling rounding with the exact sum L * B. With B <= w or L = 1 every
    layer gets B (docs/methods.md "adakv": nothing to shape)."""
    if L == 1 or B <= w:
        return [B] * L, None
    X = B - w
    top = X / beta
    bot = 2 * X - top
    if bot > N - w:
        bot = N - w
        top = 2 * X - (N - w)
    wts = [w + bot + (top - bot) * l / (L - 1) for l in range(L)]
    return allocate(wts, L * B, budget_min(N, B), N)


def m_ada_pyramidkv(c, B, p):
    p = dict(p)
    p.setdefault("window", "8")
    w = min(int(p["window"]), c.N)
    budgets, shares = pyramid_budgets(c.L, B, c.N, w, float(p.get("beta", 20)))
    return ada_snapkv(c, budgets, p, shares=shares, note="pyramid %s" % shares)


def m_ada_flashcache(c, B, p):
    devs, _ = flash_scores(c, float(p.get("gamma", 0.2)))
    alpha = float(p.get("alpha", 0.2))
    heads = [adakv_layer(devs[l], c.N, B, 0, 0, alpha) for l in range(c.L)]
    return Plan([B] * c.L, heads, ragged=True)


# --------------------------------------------------------------------------
# cur (docs/methods.md "cur"; CurDKV)
# --------------------------------------------------------------------------

def cur_scores(K, V, sinks, lw, how):
    """One KV head's CUR score [N]."""
    N = len(K)
    k2 = [sum(x * x for x in r) for r in K]
    v2 = [sum(x * x for x in r) for r in V]
    if lw > 0:
        for a in (k2, v2):
            for s in range(0, N, lw):
                tot = sum(a[s:s + lw])
                for j in range(s, min(N, s + lw)):
                    a[j] = a[j] / tot if tot > 0 else 0.0
    if how == "kv_product":
        x = [a * b for a, b in zip(k2, v2)]
    elif how == "key":
        x = k2
    elif how == "value":
        x = v2
    else:
        x = [(a + b) / 2 for a, b in zip(k2, v2)]
    tot = sum(x)
    x = [v / tot if tot > 0 else 0.0 for v in x]
    for j in range(min(sinks, N)):
        x[j] = 1.0
    return x


def m_cur(c, B, p):
    sinks = int(p.get("sinks", 4))
    lw = int(p.get("local_window", 16))
    how = p.get("leverage_type", "kv_product")
    forced = list(range(min(sinks, B)))
    heads = []
    for l in range(c.L):
        row = []
        for h in range(c.Hkv):
            sc = cur_scores(c.K[l][h], c.V[l][h], sinks, lw, how)
            row.append(HeadSel(forced + top_by_score(sc, range(len(forced), c.N), B - len(forced)), forced, sc))
        heads.append(row)
    return Plan([B] * c.L, heads)


# --------------------------------------------------------------------------
# leverage (docs/methods.md "leverage"; Compactor's LeverageScorePress)
# --------------------------------------------------------------------------

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
JITTER = 0.01     # docs/methods.md "leverage": c, the first try
LEV_TOL = 1e-5    # relative: the C rounds Y to fp32 and sums in another order


def splitmix_normals(state, n):
    """n standard normals from the splitmix64 stream that starts at `state`:
    Box-Muller on two uniforms (top 53 bits / 2^53), sqrt(-2 ln(1 - U1)) cos(2 pi U2)."""
    out = []
    for _ in range(2 * n):
        state = (state + GOLDEN) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        out.append(((z ^ (z >> 31)) >> 11) * (1.0 / 9007199254740992.0))
    return [math.sqrt(-2.0 * math.log(1.0 - out[2 * i])) * math.cos(6.283185307179586 * out[2 * i + 1])
            for i in range(n)]


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def solve(A, Bm):
    """A^-1 Bm for a small square A (Gauss-Jordan, partial pivoting)."""
    n = len(A)
    M = [A[i][:] + Bm[i][:] for i in range(n)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(M[r][col]))
        M[col], M[piv] = M[piv], M[col]
        for r in range(n):
            if r != col and M[r][col] != 0.0:
                f = M[r][col] / M[col][col]
                M[r] = [x - f * y for x, y in zip(M[r], M[col])]
    return [[x / M[i][i] for x in M[i][n:]] for i in range(n)]


def sketched_leverage(K, k, stream):
    """[N]: l_j = y_j' (Y'Y + c I)^-1 y_j with Y = X Phi, X the keys centred over
    the tokens and Phi [d][k] the seeded Gaussian / sqrt(k) rounded to fp32. Since
    Phi (Phi'A Phi + cI)^-1 Phi' = (cI + P A)^-1 P with P = Phi Phi' and A = X'X,
    l_j = x_j' M x_j with M from one d x d solve."""
    N, d = len(K), len(K[0])
    sc = 1.0 / math.sqrt(k)
    z = splitmix_normals(stream, d * k)
    Phi = [[f32(z[a * k + b] * sc) for b in range(k)] for a in range(d)]
    mu = [sum(r[ch] for r in K) / N for ch in range(d)]
    X = [[r[ch] - mu[ch] for ch in range(d)] for r in K]
    P = [[sum(Phi[a][t] * Phi[b][t] for t in range(k)) for b in range(d)] for a in range(d)]
    A = [[sum(x[a] * x[b] for x in X) for b in range(d)] for a in range(d)]
    PA = [[sum(P[a][t] * A[t][b] for t in range(d)) for b in range(d)] for a in range(d)]
    M = solve([[PA[a][b] + (JITTER if a == b else 0.0) for b in range(d)] for a in range(d)], P)
    return [max(0.0, sum(x[a] * sum(M[a][b] * x[b] for b in range(d)) for a in range(d))) for x in X]


def m_leverage(c, B, p):
    """Per KV head the top B by sketched leverage (no forced tokens); the
    layer's z-scoring is affine and does not change a head's ranking."""
    k = int(p.get("sketch_dimension", 48))
    seed = int(p.get("seed", 0))
    heads = []
    for l in range(c.L):
        row = []
        for hd in range(c.Hkv):
            stream = (seed + (l * c.Hkv + hd + 1) * GOLDEN) & MASK
            lev = sketched_leverage(c.K[l][hd], k, stream)
            sel = HeadSel(top_by_score(lev, range(c.N), B), [], lev)
            sel.tol_rel = LEV_TOL
            row.append(sel)
        heads.append(row)
    return Plan([B] * c.L, heads, note="sketched leverage, k=%d seed=%d" % (k, seed))


METHODS = {"adakv": m_adakv, "ada_pyramidkv": m_ada_pyramidkv, "ada_flashcache": m_ada_flashcache,
           "cur": m_cur, "leverage": m_leverage}
