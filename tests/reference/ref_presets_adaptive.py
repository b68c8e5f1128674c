"""ref_presets_adaptive.py -- the independent reference of the head-adaptive
presets (adakv, ada_pyramidkv, ada_flashcache) and of the K/V-only scorers
cur and leverage.

What this is: part of tests/reference/ (see ref_methods.py's header), written
from docs/methods.md's sections "adakv", "pyramidkv", "cur", "leverage",
`kvsieve methods` (defaults, compositions) and the papers / kvpress, without
the C. Standard library only, float64. Exports METHODS = {name: fn(cache, B,
params) -> Plan}; ref_methods.py merges it into its own.

What this is not: a check of leverage's random sketch. docs/methods.md names
the generator (splitmix64 per (layer, head)) but not how its draws become
Gaussians, so leverage is checked against the exact leverage of the centred
keys (see m_leverage): the ranking within a tolerance that the sketch's
known error bounds, and only counts where that bound says nothing.
"""
import math

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

def cholesky(A):
    n = len(A)
    Lm = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1):
            s = A[i][j] - sum(Lm[i][t] * Lm[j][t] for t in range(j))
            if i == j:
                if s <= 0:
                    return None
                Lm[i][i] = math.sqrt(s)
            else:
                Lm[i][j] = s / Lm[j][j]
    return Lm


def forward(Lm, y):
    z = []
    for i in range(len(y)):
        z.append((y[i] - sum(Lm[i][t] * z[t] for t in range(i))) / Lm[i][i])
    return z


def exact_leverage(K):
    """(h [N], lam_min): the exact leverage of the centred keys, h_j = x_j' (X'X)^-1 x_j,
    and the smallest eigenvalue of X'X; None when X'X is (numerically) singular."""
    N, d = len(K), len(K[0])
    mu = [sum(r[ch] for r in K) / N for ch in range(d)]
    X = [[r[ch] - mu[ch] for ch in range(d)] for r in K]
    G = [[sum(x[a] * x[b] for x in X) for b in range(d)] for a in range(d)]
    Lm = cholesky(G)
    if Lm is None:
        return None
    h = []
    for x in X:
        z = forward(Lm, x)
        h.append(sum(v * v for v in z))
    # lam_max of G^-1 by power iteration on solves: v <- G^-1 v
    v = [1.0 / math.sqrt(d)] * d
    mu_max = 0.0
    for _ in range(300):
        z = forward(Lm, v)
        # back substitution: L' u = z
        u = [0.0] * d
        for i in reversed(range(d)):
            u[i] = (z[i] - sum(Lm[t][i] * u[t] for t in range(i + 1, d))) / Lm[i][i]
        nrm = math.sqrt(sum(a * a for a in u))
        mu_max = nrm
        v = [a / nrm for a in u]
    lam_min = 1.0 / mu_max
    if lam_min <= 1e-9 * sum(G[i][i] for i in range(d)):
        return None
    return h, lam_min


JITTER = 0.01  # docs/methods.md "leverage": c, the first try
DS_T = 2.0     # Davidson-Szarek deviation (in units of 1/sqrt(k)) the bound allows
RHO_MAX = 0.02  # a looser bound would call most near pairs ties: counts only


def m_leverage(c, B, p):
    """Exact leverage stands in for the sketched one. With Y = X Phi / sqrt(k)
    (X [N][d] the centred keys of rank d, Phi [d][k] Gaussian, k >= d, Phi of
    rank d), Y has X's column space, so with Y = U S W' the sketched score is
    l_j = sum_i u_ji^2 s_i^2 / (s_i^2 + c) and the exact one h_j = sum_i u_ji^2:
    h_j (1 - rho) <= l_j <= h_j, rho = c / (s_min^2 + c), s_min^2 >= sigma^2 lam_min(X'X),
    sigma = sigma_min(Phi / sqrt(k)) >= 1 - sqrt(d / k) - t / sqrt(k) except with
    probability exp(-t^2 / 2) (Davidson-Szarek; t = DS_T). A kept set that is
    top-B by l then differs from top-B by h only among tokens whose h is within
    rho / (1 - rho) (relative) of the cut: the tolerance given to compare_head.
    The z-scoring over the layer's heads is affine, so it does not change a
    head's ranking. Where the bound is void or too loose to mean anything
    (rho > RHO_MAX: k too small for d, X'X near singular) only the head's count
    and the plan's shape are checked."""
    k = int(p.get("sketch_dimension", 48))
    heads = []
    for l in range(c.L):
        row = []
        for hd in range(c.Hkv):
            K = c.K[l][hd]
            d = len(K[0])
            sig = 1 - math.sqrt(d / k) - DS_T / math.sqrt(k)
            key = ("leverage", l, hd)
            if key not in c.memo:
                c.memo[key] = exact_leverage(K)
            ex = c.memo[key] if sig > 0 else None
            rho = JITTER / (sig * sig * ex[1] + JITTER) if ex else 1.0
            if rho > RHO_MAX:
                row.append(None)  # counts only
                continue
            h = ex[0]
            sel = HeadSel(top_by_score(h, range(c.N), B), [], h)
            sel.tol_rel = rho / (1 - rho)
            row.append(sel)
        heads.append(row)
    return Plan([B] * c.L, heads, note="exact leverage, sketch k=%d" % k)


METHODS = {"adakv": m_adakv, "ada_pyramidkv": m_ada_pyramidkv, "ada_flashcache": m_ada_flashcache,
           "cur": m_cur, "leverage": m_leverage}
