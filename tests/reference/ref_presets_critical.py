"""ref_presets_critical.py -- the independent reference of the presets that
need what only a model has: criticalkv and criticaladakv (the layer's output
projection W_o, dump tensor layers.{l}.wo) and kvzip (the context-reconstruction
statistic, layers.{l}.recon).

What this is: part of tests/reference/ (see ref_methods.py's header), written
from docs/methods.md's sections "criticalkv, criticaladakv", "adakv" and
"kvzip", the compositions `kvsieve methods --json` prints, and the CriticalKV
(arXiv 2502.03805) and KVzip (arXiv 2505.23416) papers with kvpress's presses,
WITHOUT reading methods/*.c or core/*.c. Standard library only, float64.
Exports METHODS = {name: fn(cache, B, params) -> ref_common.Plan}.
What this is not: a second copy of the C; the SnapKV votes are re-derived here
(this module imports ref_common only, never ref_methods.py).

The compositions:
  criticalkv     snapkv scorer + uniform + keep window + pick critical
  criticaladakv  the same + head allocator adakv (alpha 0.2): ragged plans
  kvzip          kvzip scorer + allocator global + adakv (alpha 0) + keep sinks + topk
"""
import math

from ref_common import HeadSel, Plan, allocate, budget_min, pool1d, snapkv_votes, top_by_score


# --------------------------------------------------------------------------
# shared pieces
# --------------------------------------------------------------------------

def snapkv_scores(c, l, w, kernel, pool):
    """[Hkv][N - w]: the last w query rows' attention on each prefix key, summed over
    the rows, averaged over the GQA group, pooled along the prefix (SnapKV)."""
    key = ("snapkv", l, w, kernel, pool)
    if key not in c.memo:
        if c.Nq < w:
            raise ValueError("cache has Nq = %d < window %d" % (c.Nq, w))
        c.memo[key] = [pool1d(v, kernel, pool) for v in snapkv_votes(c, l, w)]
    return c.memo[key]


def wo_value_norms(c, l):
    """[Hkv][N]: w_j = mean over the group's query heads i of ||W_o^i v_j||_1 (the L1
    norm over the hidden size E of head i's [E][d] slice times the value)."""
    key = ("wov", l)
    if key not in c.memo:
        if c.Wo is None:
            raise ValueError("the dump has no layers.{l}.wo")
        Wo = c.Wo[l]
        Hq = len(Wo)
        G = Hq // c.Hkv
        out = []
        for g in range(c.Hkv):
            row = []
            for v in c.V[l][g]:
                tot = 0.0
                for i in range(g * G, (g + 1) * G):
                    tot += sum(abs(sum(a * b for a, b in zip(we, v))) for we in Wo[i])
                row.append(tot / G)
            out.append(row)
        c.memo[key] = out
    return c.memo[key]


def critical_pick(scores, wv, cands, k, fsr, eps):
    """CriticalKV's two stages over the candidate tokens: the best k1 = floor(fsr k)
    (at least 1 when fsr > 0) by score, then the other k - k1 by (score + eps) * w_j;
    ties to the lower index in both. Returns (picked, rank scores): a stage-1 token
    ranks +inf, any other its stage-2 product (what the tie rule compares)."""
    k = min(k, len(cands))
    if k <= 0:
        return [], {}
    k1 = math.floor(fsr * k)
    if fsr > 0:
        k1 = max(1, k1)
    k1 = min(k1, k)
    first = top_by_score(scores, cands, k1)
    taken = set(first)
    rest = [j for j in cands if j not in taken]
    prod = {j: (scores[j] + eps) * wv[j] for j in rest}
    second = sorted(rest, key=lambda j: (-prod[j], j))[:k - k1]
    rank = dict(prod)
    for j in first:
        rank[j] = math.inf
    return first + second, rank


def adakv_counts(scores, cands, b, alpha):
    """AdaKV's split of a layer's Hkv * b pick slots: each head its own best
    f = max(1, floor(alpha b)) (at most b), the other Hkv (b - f) to the best remaining
    (head, token) pairs of all heads together (ties: lower head, then lower token).
    scores [Hkv][N]; cands: the unprotected tokens. Returns ([Hkv] counts, [Hkv] sets)."""
    H = len(scores)
    if b <= 0:
        return [0] * H, [[] for _ in range(H)]
    f = min(b, max(1, math.floor(alpha * b)))
    own = [top_by_score(scores[g], cands, f) for g in range(H)]
    taken = [set(o) for o in own]
    pool = [(g, j) for g in range(H) for j in cands if j not in taken[g]]
    won = sorted(pool, key=lambda gj: (-scores[gj[0]][gj[1]], gj[0], gj[1]))[:H * (b - f)]
    sets = [list(o) for o in own]
    for g, j in won:
        sets[g].append(j)
    return [len(s) for s in sets], sets


def fparam(p, name, default):
    return float(p.get(name, default))


# --------------------------------------------------------------------------
# criticalkv, criticaladakv
# --------------------------------------------------------------------------

def _critical(c, B, p, ada):
    wpar = int(p.get("window", 32))
    kernel = int(p.get("kernel", 7))
    pool = p.get("pool", "max")
    fsr = fparam(p, "first_stage_ratio", 0.5)
    eps = fparam(p, "critical_epsilon", 1e-4)
    alpha = fparam(p, "alpha", 0.2)
    N = c.N
    w = min(wpar, N)            # a prompt shorter than the window is all window
    heads = []
    for l in range(c.L):
        q = min(w, B)            # the kept window, clamped to the layer budget
        window = list(range(N - q, N))
        b = B - q                # pick budget per head (the candidates are the prefix)
        if b <= 0:
            heads.append([HeadSel(window, window, None) for _ in range(c.Hkv)])
            continue
        sc = [s + [0.0] * w for s in snapkv_scores(c, l, w, kernel, pool)]
        wv = wo_value_norms(c, l)
        cands = range(N - w)
        counts = adakv_counts(sc, cands, b, alpha)[0] if ada else [b] * c.Hkv
        row = []
        for g in range(c.Hkv):
            picked, rank = critical_pick(sc[g], wv[g], cands, counts[g], fsr, eps)
            rs = [rank.get(j, 0.0) for j in range(N)]
            row.append(HeadSel(picked + window, window, rs))
        heads.append(row)
    return Plan([B] * c.L, heads, ragged=ada)


def m_criticalkv(c, B, p):
    return _critical(c, B, p, False)


def m_criticaladakv(c, B, p):
    return _critical(c, B, p, True)


# --------------------------------------------------------------------------
# kvzip
# --------------------------------------------------------------------------

def m_kvzip(c, B, p):
    """Scores: the reconstruction maxima, the first `sinks` tokens 1. Allocator global:
    one top-k of L Hkv B over all (layer, head, token) triples (ties: lower layer, head,
    token), layer l's budget in proportion to the pairs it won (the water-filling
    rounding, clamped to [B_min, N]). Each layer: the sinks in every head, then AdaKV
    (alpha 0) over the rest."""
    if c.Recon is None:
        raise ValueError("the dump has no layers.{l}.recon")
    S = int(p.get("sinks", 4))
    alpha = fparam(p, "alpha", 0.0)
    N, L, H = c.N, c.L, c.Hkv
    sc = [[[1.0 if j < S else float(c.Recon[l][g][j]) for j in range(N)] for g in range(H)]
          for l in range(L)]
    triples = [(l, g, j) for l in range(L) for g in range(H) for j in range(N)]
    triples.sort(key=lambda t: (-sc[t[0]][t[1]][t[2]], t[0], t[1], t[2]))
    won = [0] * L
    for l, _, _ in triples[:L * H * B]:
        won[l] += 1
    budgets, shares = allocate([float(x) for x in won], L * B, budget_min(N, B), N)
    heads = []
    for l in range(L):
        Bl = budgets[l]
        ps = min(S, Bl)
        sinks = list(range(ps))
        cands = range(ps, N)
        _, sets = adakv_counts(sc[l], cands, Bl - ps, alpha)
        heads.append([HeadSel(sinks + sets[g], sinks, sc[l][g]) for g in range(H)])
    return Plan(budgets, heads, shares=shares, note="won %s" % won, ragged=True)


METHODS = {"criticalkv": m_criticalkv, "criticaladakv": m_criticaladakv, "kvzip": m_kvzip}
