#!/usr/bin/env python3
"""ref_methods.py -- an independent reference of the eight kvsieve methods
(and of the presets cake, simlayerkv, qfilters, compactor's attention half,
finch and think; ref_presets_scores.py adds knorm, tova, keydiff, chunkkv,
expected_attention, lagkv, pyramidkv and pyramid_tova, ref_presets_adaptive.py
adakv, ada_pyramidkv, ada_flashcache, cur and leverage, ref_presets_critical.py
criticalkv, criticaladakv and kvzip).

What this is: a slow, readable, pure-Python (standard library only, float64)
re-implementation of ../shared/spec/methods.md plus the decisions recorded in
docs/methods.md, written WITHOUT looking at methods/*.c or core/*.c. It reads a
cache dump (safetensors), computes every method's plan (layer budgets and
per-KV-head index sets) and, for merging methods, the merged K/V, and compares
them with what `kvsieve compress` wrote (plan JSON + compressed dump).

What this is not: a fast implementation, nor a second copy of the C code. It
materialises small N x N attention matrices (fine for N <= a few hundred; the
no-N x N rule is for the library), computes in float64 while the C side works
in fp32, and therefore treats near-equal scores at a top-k boundary as float
ties (reported, not failed). `random` is checked for counts / sortedness only:
its RNG stream is an implementation detail.

Usage (as check_methods.sh drives it):
  ref_methods.py MANIFEST
MANIFEST has one job per line, tab-separated:
  case  kv.safetensors  method  budget  params  plan.json  out.safetensors
budget is "ratio=R" or "tokens=T"; params is "-" or "name=value,name=value".
Prints one line per job (PASS / TIE / FAIL with details) and ends with
"N passed, M failed" (ties count as passed and are also counted separately);
exits 1 on any real mismatch.
"""
import json
import math
import sys

TIE_REL = 1e-6      # scores this close (relative) at a top-k cut are a float tie
MERGE_REL = 1e-4    # merged K/V tolerance (relative to the row's max magnitude), f32 dumps
# a dump written in a narrower type (compress keeps the input's dtype) also gets its half-ulp
ROUND_REL = {"F32": 0.0, "F16": 2.0 ** -11, "BF16": 2.0 ** -8}

from ref_common import (TEXT, VISUAL, Cache, HeadSel, Plan, allocate, budget_min, flash_scores,
                        load_safetensors, per_layer_budget, pool1d, select_recent_plus_top, snapkv_votes,
                        to_3d, top_by_score)
from ref_presets_adaptive import METHODS as ADAPTIVE_METHODS
from ref_presets_critical import METHODS as CRITICAL_METHODS
from ref_presets_scores import METHODS as SCORES_METHODS

# --------------------------------------------------------------------------
# the methods
# --------------------------------------------------------------------------

def m_full(c, B, p):
    return Plan([c.N] * c.L, [[HeadSel(range(c.N), range(c.N), None) for _ in range(c.Hkv)]
                              for _ in range(c.L)])


def m_streamingllm(c, B, p):
    S = int(p.get("sinks", 4))
    N = c.N
    if B <= S:
        kept = list(range(B))
    else:
        kept = list(range(S)) + list(range(N - (B - S), N))
    kept = sorted(set(kept))
    return Plan([B] * c.L, [[HeadSel(kept, kept, None) for _ in range(c.Hkv)] for _ in range(c.L)])


def h2o_scores(c, l, normalize):
    cs = c.colsum_gqa(l)
    if normalize:
        cs = [[x / (c.N - j) for j, x in enumerate(row)] for row in cs]
    return cs


def m_h2o(c, B, p):
    normalize = p.get("normalize", "false") == "true"
    frac = float(p.get("recent_frac", 0.5))
    r = math.floor(B * frac + 1e-9)
    heads = []
    for l in range(c.L):
        sc = h2o_scores(c, l, normalize)
        heads.append([select_recent_plus_top(sc[g], c.N, B, r) for g in range(c.Hkv)])
    return Plan([B] * c.L, heads)


def m_snapkv(c, B, p):
    w = int(p.get("window", 32))
    k = int(p.get("kernel", 7))
    pool = p.get("pool", "max")
    N = c.N
    w = min(w, N)  # a prompt shorter than the window is all window
    heads = []
    for l in range(c.L):
        if B <= w:
            kept = list(range(N - B, N))
            heads.append([HeadSel(kept, kept, None) for _ in range(c.Hkv)])
            continue
        npre = N - w
        votes = snapkv_votes(c, l, w)
        row_heads = []
        for g in range(c.Hkv):
            pooled = pool1d(votes[g], k, pool)
            window = list(range(npre, N))
            top = top_by_score(pooled, range(npre), B - w)
            row_heads.append(HeadSel(top + window, window, pooled + [0.0] * w))
        heads.append(row_heads)
    return Plan([B] * c.L, heads)


def textprior_select(c, l, B, frac):
    """LOOK-M selection in layer l: H2O scores, text + max(head score), recent floor(B*frac)."""
    N = c.N
    r = math.floor(B * frac + 1e-9)
    sc = h2o_scores(c, l, False)
    out = []
    for g in range(c.Hkv):
        s = sc[g]
        boost = max(s)
        boosted = [x + boost if c.modality[j] == TEXT else x for j, x in enumerate(s)]
        out.append(select_recent_plus_top(boosted, N, B, r))
    return out


def m_lookm(c, B, p):
    if p.get("text_policy", "budget") != "budget":
        raise ValueError("keep_all is refused by kvsieve")
    frac = float(p.get("recent_frac", 0.5))
    heads = [textprior_select(c, l, B, frac) for l in range(c.L)]
    return Plan([B] * c.L, heads, merge=p.get("merge", "pivotal"))


def entropy(ps):
    return -sum(x * math.log(x) for x in ps if x > 0)


def meda_layer_entropy(c, l):
    """(E, used_plain): E_TV + E_VT of the head-averaged attention, or the plain mean row entropy."""
    P = c.probs(l)
    N, Nq = c.N, c.Nq
    mod = c.modality
    tv, vt, plain = [], [], []
    for i in range(Nq):
        pi = N - Nq + i
        abar = [sum(P[h][i][j] for h in range(c.Hq)) / c.Hq for j in range(pi + 1)]
        plain.append(entropy(abar))
        if mod[pi] == TEXT:
            keys = [abar[j] for j in range(pi + 1) if mod[j] in VISUAL]
            dest = tv
        elif mod[pi] in VISUAL:
            keys = [abar[j] for j in range(pi + 1) if mod[j] == TEXT]
            dest = vt
        else:
            continue
        z = sum(keys)
        if not keys or z <= 0:
            continue
        dest.append(entropy([x / z for x in keys]))
    if not tv and not vt:
        return sum(plain) / len(plain), True
    e = (sum(tv) / len(tv) if tv else 0.0) + (sum(vt) / len(vt) if vt else 0.0)
    return e, False


def m_meda(c, B, p):
    frac = float(p.get("recent_frac", 0.5))
    E = []
    plain = False
    for l in range(c.L):
        e, pl = meda_layer_entropy(c, l)
        E.append(e)
        plain = plain or pl
    m = max(E)
    ex = [math.exp(x - m) for x in E]
    z = sum(ex)
    wts = [x / z for x in ex]
    budgets, shares = allocate(wts, c.L * B, budget_min(c.N, B), c.N)
    heads = [textprior_select(c, l, budgets[l], frac) for l in range(c.L)]
    return Plan(budgets, heads, merge=p.get("merge", "average"), shares=shares,
                note="E=" + ",".join("%.9g" % x for x in E) + (" (plain)" if plain else ""))


def m_flashcache(c, B, p):
    gamma = float(p.get("gamma", 0.2))
    dba = p.get("dba", "true") == "true"
    gran = p.get("granularity", "head")
    s = int(p.get("keep_sinks", 0))
    r = int(p.get("keep_recent", 0))
    N = c.N
    devs, R = flash_scores(c, gamma)
    if dba:
        budgets, shares = allocate(R, c.L * B, budget_min(N, B), N)
    else:
        budgets, shares = [B] * c.L, None
    heads = []
    for l in range(c.L):
        Bl = budgets[l]
        forced = list(range(min(s, Bl, N)))
        fs = set(forced)
        n = N - 1
        while n >= max(0, N - r) and len(forced) < Bl:
            if n not in fs:
                forced.append(n)
                fs.add(n)
            n -= 1
        cand = [j for j in range(N) if j not in fs]
        if gran == "layer":
            tot = [sum(devs[l][h][j] for h in range(c.Hkv)) for j in range(N)]
            sel = HeadSel(forced + top_by_score(tot, cand, Bl - len(forced)), forced, tot)
            heads.append([sel for _ in range(c.Hkv)])
        else:
            heads.append([HeadSel(forced + top_by_score(devs[l][h], cand, Bl - len(forced)),
                                  forced, devs[l][h]) for h in range(c.Hkv)])
    return Plan(budgets, heads, shares=shares, note="R=" + ",".join("%.9g" % x for x in R))


# --------------------------------------------------------------------------
# presets of parts: cake, simlayerkv, qfilters (docs/methods.md's sections)
# --------------------------------------------------------------------------

def keep_then_pick(N, Bl, sinks, window, scores):
    """A layer's selection: the first min(sinks, Bl), the last min(window, rest),
    then the best-scored of the tokens between (ties: lower index)."""
    if Bl >= N:
        return HeadSel(range(N), range(N), None)
    p = min(sinks, Bl)
    q = min(window, Bl - p)
    forced = list(range(p)) + list(range(N - q, N))
    top = top_by_score(scores, range(p, N - q), Bl - p - q)
    return HeadSel(forced + top, forced, scores)


def m_cake(c, B, p):
    """CAKE: per layer, the last w rows' softmax A; over prefix keys j < N - w the
    dispersion D = -sum A log A and shift V = sum_j var_i A (unbiased), summed over
    heads; preference D^(1/tau1) V^(1/tau2); layers keep w + their share of L (B - w).
    Key j: group mean of mean_i A + gamma var_i A, average-pooled (zero padding, / k)."""
    wpar = int(p.get("window", 32))
    kern = int(p.get("kernel", 5))
    gamma = float(p.get("cake_gamma", 200))
    tau1, tau2 = float(p.get("tau1", 1)), float(p.get("tau2", 1))
    N, L = c.N, c.L
    w = min(wpar, N - 1)
    wa = min(wpar, c.Nq, N - 1)
    npre = N - w
    pref, scores = [], []
    for l in range(L):
        if w < 2:
            pref.append(0.0)
            scores.append([[0.0] * npre + [math.inf] * w for _ in range(c.Hkv)])
            continue
        P = c.probs(l)
        D = V = 0.0
        ind = [[0.0] * npre for _ in range(c.Hkv)]
        for h in range(c.Hq):
            rows = P[h][c.Nq - w:]
            for r in rows:
                D -= sum(a * math.log(a) for a in r[:npre] if a > 0)
            for j in range(npre):
                col = [r[j] for r in rows]
                m = sum(col) / w
                var = sum((x - m) ** 2 for x in col) / (w - 1)
                V += var
                ind[h // c.G][j] += (m + gamma * var) / c.G
        pref.append(D ** (1 / tau1) * V ** (1 / tau2))
        lay = []
        for g in range(c.Hkv):
            x = ind[g]
            pooled = []
            for j in range(npre):
                a, b = max(0, j - kern // 2), min(npre, j - kern // 2 + kern)
                pooled.append(sum(x[a:b]) / kern)
            lay.append(pooled + [math.inf] * w)
        scores.append(lay)
    shares = None
    if wa < 2 or L == 1 or B <= wa:
        budgets = [B] * L
    else:
        tot = sum(pref)
        rest = L * (B - wa)
        wts = [wa + (rest * x / tot if tot > 0 else rest / L) for x in pref]
        budgets, shares = allocate(wts, L * B, budget_min(N, B), N)
    heads = [[keep_then_pick(N, budgets[l], 0, wpar, scores[l][g]) for g in range(c.Hkv)]
             for l in range(L)]
    return Plan(budgets, heads, shares=shares, note="pref %s" % pref)


def m_simlayerkv(c, B, p):
    """SimLayerKV: the last query's mass on the first `sinks` and last `recent` keys
    (mean over query heads) > lazy_threshold makes a layer lazy; lazy layers get
    min(sinks + recent, N, B), the others share the rest; lazy layers keep their
    sinks and newest tokens, the others pick by the last query's attention."""
    sinks, recent = int(p.get("sinks", 4)), int(p.get("recent", 1024))
    thr, window = float(p.get("lazy_threshold", 0.9)), int(p.get("window", 1))
    N, L = c.N, c.L
    s = min(sinks, N)
    r0 = max(N - recent, s)
    lazy, rows = [], []
    for l in range(L):
        P = c.probs(l)
        last = [P[h][c.Nq - 1] for h in range(c.Hq)]
        mass = sum(sum(a[:s]) + sum(a[r0:]) for a in last) / c.Hq
        lazy.append(mass > thr)
        rows.append([[sum(last[h][j] for h in range(g * c.G, (g + 1) * c.G)) / c.G for j in range(N)]
                     for g in range(c.Hkv)])
    n = sum(lazy)
    shares = None
    if n in (0, L):
        budgets = [B] * L
    else:
        bz = min(sinks + recent, N, B)
        rest = (L * B - n * bz) / (L - n)
        budgets, shares = allocate([bz if z else rest for z in lazy], L * B, budget_min(N, B), N)
    heads = []
    for l in range(L):
        sc = [[float(j) for j in range(N)] for _ in range(c.Hkv)] if lazy[l] else rows[l]
        heads.append([keep_then_pick(N, budgets[l], sinks, window, sc[g]) for g in range(c.Hkv)])
    return Plan(budgets, heads, shares=shares, note="lazy %s" % lazy)


def top_eigvec(M):
    """Largest eigenvalue and its unit eigenvector of a symmetric matrix (cyclic Jacobi)."""
    d = len(M)
    A = [row[:] for row in M]
    Vm = [[1.0 if i == j else 0.0 for j in range(d)] for i in range(d)]
    for _ in range(100):
        off = sum(A[i][j] ** 2 for i in range(d) for j in range(d) if i != j)
        if off <= 1e-30 * max(1e-300, sum(A[i][i] ** 2 for i in range(d))):
            break
        for i in range(d):
            for j in range(i + 1, d):
                if A[i][j] == 0.0:
                    continue
                th = (A[j][j] - A[i][i]) / (2 * A[i][j])
                t = (1.0 if th >= 0 else -1.0) / (abs(th) + math.sqrt(th * th + 1))
                cs = 1 / math.sqrt(t * t + 1)
                sn = t * cs
                for k in range(d):  # A <- J' A J, columns then rows
                    aki, akj = A[k][i], A[k][j]
                    A[k][i], A[k][j] = cs * aki - sn * akj, sn * aki + cs * akj
                for k in range(d):
                    aik, ajk = A[i][k], A[j][k]
                    A[i][k], A[j][k] = cs * aik - sn * ajk, sn * aik + cs * ajk
                for k in range(d):
                    vki, vkj = Vm[k][i], Vm[k][j]
                    Vm[k][i], Vm[k][j] = cs * vki - sn * vkj, sn * vki + cs * vkj
    top = max(range(d), key=lambda i: A[i][i])
    return A[top][top], [Vm[k][top] for k in range(d)]


def m_qfilters(c, B, p):
    """Q-Filters: per query head, v = the top right singular vector of its last
    n = min(svd_queries, Nq) query rows, oriented with its largest component
    positive; filter -sign v, sign = +1 if more than half the rows have <q, v> > 0;
    the KV head's filter is the group mean; key j scores -<f, k_j>."""
    nsvd, window = int(p.get("svd_queries", 3000)), int(p.get("window", 64))
    N, d = c.N, c.d
    n = min(nsvd, N, c.Nq)
    heads = []
    for l in range(c.L):
        filt = []
        for h in range(c.Hq):
            rows = c.Q[l][h][c.Nq - n:]
            M = [[sum(r[a] * r[b] for r in rows) for b in range(d)] for a in range(d)]
            lam, v = top_eigvec(M)
            if not lam > 0:
                filt.append([0.0] * d)
                continue
            big = max(range(d), key=lambda x: (abs(v[x]), -x))
            if v[big] < 0:
                v = [-x for x in v]
            pos = sum(1 for r in rows if sum(a * b for a, b in zip(r, v)) > 0)
            sign = 1.0 if 2 * pos > n else -1.0
            filt.append([-sign * x for x in v])
        lay = []
        for g in range(c.Hkv):
            f = [sum(filt[h][x] for h in range(g * c.G, (g + 1) * c.G)) / c.G for x in range(d)]
            sc = [-sum(a * b for a, b in zip(f, k)) for k in c.K[l][g]]
            lay.append(keep_then_pick(N, B, 0, window, sc))
        heads.append(lay)
    return Plan([B] * c.L, heads)


def m_compactor(c, B, p):
    """Compactor's attention half only (blending 0: the leverage half rests on a
    random sketch whose stream is an implementation detail): inner tokens
    [sinks, N - window) in chunks of attn_chunk; non-causal softmax of q.k (no
    1/sqrt d) within a chunk, column sums averaged over the group, times ||v||,
    pooled over 3 (zero padded, / 3), z-scored over the layer."""
    if float(p.get("blending", 0.75)) != 0.0:
        raise ValueError("the reference checks compactor with blending=0 only")
    sinks, window = int(p.get("sinks", 8)), int(p.get("window", 4))
    chunk = int(p.get("attn_chunk", 256))
    N = c.N
    s = min(sinks, N)
    e = min(window, N - s)
    n = N - s - e
    heads = []
    for l in range(c.L):
        att = [[0.0] * n for _ in range(c.Hkv)]
        for h in range(c.Hq):
            g = h // c.G
            K = c.K[l][g]
            for a in range(0, n, chunk):
                m = min(chunk, n - a)
                for i in range(m):
                    q = c.Q[l][h][s + a + i]
                    lg = [sum(x * y for x, y in zip(q, K[s + a + j])) for j in range(m)]
                    mx = max(lg)
                    ex = [math.exp(x - mx) for x in lg]
                    z = sum(ex)
                    for j in range(m):
                        att[g][a + j] += ex[j] / z / c.G
        vals = []
        for g in range(c.Hkv):
            x = [att[g][j] * math.sqrt(sum(v * v for v in c.V[l][g][s + j])) for j in range(n)]
            att[g] = [(x[j - 1] if j > 0 else 0.0) + x[j] + (x[j + 1] if j + 1 < n else 0.0)
                      for j in range(n)]
            att[g] = [v / 3 for v in att[g]]
            vals += att[g]
        if vals:
            mean = sum(vals) / len(vals)
            sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
            sd = max(sd, 1e-6)
        lay = []
        for g in range(c.Hkv):
            sc = [math.inf] * s + [(v - mean) / sd for v in att[g]] + [math.inf] * e
            lay.append(keep_then_pick(N, B, sinks, window, sc))
        heads.append(lay)
    return Plan([B] * c.L, heads)


# --------------------------------------------------------------------------
# presets of parts: finch, think (docs/methods.md's sections)
# --------------------------------------------------------------------------

def segment_split(k, n, cs):
    """finch's `segment` rule: per segment of cs tokens its share of k by length,
    the remainder by largest remainder (ties: lower segment). cs < 1 or > n: one."""
    if cs < 1 or cs > n:
        cs = n
    sizes = [min(cs, n - a) for a in range(0, n, cs)]
    share = [k * ns // n for ns in sizes]
    rem = sorted(range(len(sizes)), key=lambda s: (-(k * sizes[s] % n), s))
    for s in rem[:k - sum(share)]:
        share[s] += 1
    return sizes, share


def m_finch(c, B, p):
    """docs/methods.md "finch": the question (last w tokens) scores the context by
    the mean over its rows and the GQA group of p_i * A[i][j] (normalize_scores)."""
    w_keep = int(p.get("window", 32))
    w = min(w_keep, c.N)
    norm = str(p.get("normalize_scores", "true")) == "true"
    cs = int(p.get("chunk_length", 0))
    N = c.N
    heads = []
    for l in range(c.L):
        if B >= N:
            heads.append([HeadSel(range(N), range(N), None) for _ in range(c.Hkv)])
            continue
        q = min(w_keep, B)
        P = c.probs(l)
        npre = N - w
        acc = [[0.0] * N for _ in range(c.Hkv)]
        for h in range(c.Hq):
            for i in range(c.Nq - w, c.Nq):
                pos = N - c.Nq + i
                f = float(pos) if norm else 1.0
                row = P[h][i]
                for j in range(npre):
                    acc[h // c.G][j] += f * row[j]
        row_heads = []
        for g in range(c.Hkv):
            sc = [x / (c.G * w) for x in acc[g][:npre]] + [3.4028234663852886e38] * w
            forced = list(range(N - q, N))
            k, n = B - q, N - q
            kept = list(forced)
            if k > 0:
                sizes, share = segment_split(k, n, cs)
                a = 0
                for ns, ks in zip(sizes, share):
                    kept += top_by_score(sc, range(a, a + ns), ks)
                    a += ns
            row_heads.append(HeadSel(kept, forced, sc))
        heads.append(row_heads)
    return Plan([B] * c.L, heads)


def think_masks(c, p):
    """docs/methods.md "think": per KV head, channel c scores mean_{group, last w rows}
    q_c^2 x mean_j k_c^2; floor(ratio d) lowest pruned (ties: higher channel first).
    Returns ([L][Hkv] '0'/'1' strings, [L][Hkv] scores)."""
    w = min(int(p.get("window", 32)), c.N)
    ratio = float(p.get("key_channel_ratio", 0.5))
    n_pruned = int(math.floor(ratio * c.d + 1e-12))
    masks, scores = [], []
    for l in range(c.L):
        ml, sl = [], []
        for g in range(c.Hkv):
            qn = [0.0] * c.d
            for h in range(g * c.G, (g + 1) * c.G):
                for row in c.Q[l][h][c.Nq - w:]:
                    for ch in range(c.d):
                        qn[ch] += row[ch] * row[ch]
            kn = [sum(r[ch] * r[ch] for r in c.K[l][g]) / c.N for ch in range(c.d)]
            sc = [qn[ch] / (c.G * w) * kn[ch] for ch in range(c.d)]
            pruned = set(sorted(range(c.d), key=lambda ch: (sc[ch], -ch))[:n_pruned])
            ml.append("".join("0" if ch in pruned else "1" for ch in range(c.d)))
            sl.append(sc)
        masks.append(ml)
        scores.append(sl)
    return masks, scores


def m_think(c, B, p):
    """SnapKV's tokens (window, kernel, pool) plus think's key channel masks."""
    plan = m_snapkv(c, B, p)
    plan.kchan, plan.kchan_scores = think_masks(c, p)
    return plan


METHODS = {"full": m_full, "streamingllm": m_streamingllm, "h2o": m_h2o, "snapkv": m_snapkv,
           "lookm": m_lookm, "meda": m_meda, "flashcache": m_flashcache,
           "cake": m_cake, "simlayerkv": m_simlayerkv, "qfilters": m_qfilters,
           "compactor": m_compactor, "finch": m_finch, "think": m_think}
METHODS.update(SCORES_METHODS)  # knorm, tova, keydiff, chunkkv, expected_attention, lagkv, pyramid*
METHODS.update(ADAPTIVE_METHODS)  # adakv, ada_pyramidkv, ada_flashcache, cur, leverage
METHODS.update(CRITICAL_METHODS)  # criticalkv, criticaladakv, kvzip (W_o / recon dumps)


def compare_channels(ref, layers, tag, msgs):
    """key_channels of the C plan against the reference masks: 'ok', 'tie' or 'fail'."""
    want = getattr(ref, "kchan", None)
    status = "ok"
    for l, ly in enumerate(layers):
        got = ly.get("key_channels")
        if want is None:
            if got is not None:
                msgs.append("FAIL %s layer %d: key_channels in a plan without channel rule" % (tag, l))
                return "fail"
            continue
        if got is None or len(got) != len(want[l]):
            msgs.append("FAIL %s layer %d: key_channels %s" % (tag, l, got))
            return "fail"
        for h, (a, b) in enumerate(zip(got, want[l])):
            if a == b:
                continue
            sc = ref.kchan_scores[l][h]
            diff = [ch for ch in range(len(a)) if a[ch] != b[ch]]
            cut = max(sc[ch] for ch in range(len(b)) if b[ch] == "0") if "0" in b else 0.0
            if a.count("0") == b.count("0") and all(abs(sc[ch] - cut) <= TIE_REL * max(abs(cut), 1e-30)
                                                    for ch in diff):
                msgs.append("TIE  %s layer %d head %d: channels C %s vs reference %s" % (tag, l, h, a, b))
                status = "tie" if status == "ok" else status
            else:
                msgs.append("FAIL %s layer %d head %d: channels C %s vs reference %s (scores %s)" %
                            (tag, l, h, a, b, ["%.6g" % x for x in sc]))
                return "fail"
    return status


# --------------------------------------------------------------------------
# merging (apply)
# --------------------------------------------------------------------------

def cosine(a, b):
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(x * x for x in b))
    if na == 0 or nb == 0:
        return 0.0
    return sum(x * y for x, y in zip(a, b)) / (na * nb)


def merge_head(K, V, kept, how):
    """Merged kept rows ([B][d] keys, values) and the kept slots whose result
    depends on a near-tie in the assignment."""
    kept_set = set(kept)
    B = len(kept)
    d = len(K[0])
    groups = [[] for _ in range(B)]
    fragile = set()
    if how != "none":
        for e in range(len(K)):
            if e in kept_set:
                continue
            cs = [cosine(K[e], K[c]) for c in kept]
            best = 0
            for s in range(1, B):
                if cs[s] > cs[best]:
                    best = s
            groups[best].append((e, cs[best]))
            for s in range(B):
                # exactly equal cosines (a zero key: 0 with everything) follow the rule,
                # lower slot wins; only nearly equal ones are float ties
                if s != best and 0 < abs(cs[s] - cs[best]) <= TIE_REL * max(1e-12, abs(cs[best])):
                    fragile.update((s, best))
    outk, outv = [], []
    for s, c in enumerate(kept):
        kc, vc = K[c], V[c]
        n = len(groups[s])
        ak, av = list(kc), list(vc)
        for e, cs in groups[s]:
            for ch in range(d):
                if how == "pivotal":
                    ak[ch] += (K[e][ch] + kc[ch]) / 2
                    av[ch] += (V[e][ch] + vc[ch]) / 2
                elif how == "average":
                    ak[ch] += K[e][ch]
                    av[ch] += V[e][ch]
                elif how == "weighted":
                    ak[ch] += cs * K[e][ch]
                    av[ch] += cs * V[e][ch]
        outk.append([x / (n + 1) for x in ak])
        outv.append([x / (n + 1) for x in av])
    return outk, outv, fragile


# --------------------------------------------------------------------------
# comparison
# --------------------------------------------------------------------------

def parse_params(s):
    if s in ("", "-"):
        return {}
    return dict(kv.split("=", 1) for kv in s.split(","))


def fmt_scores(sc, toks):
    return ", ".join("%d:%.9g" % (t, sc[t]) if sc is not None else "%d:-" % t for t in sorted(toks))


def compare_head(ref, got, tag, msgs):
    """Returns 'ok', 'tie' or 'fail'."""
    gs = set(got)
    rs = set(ref.kept)
    if gs == rs:
        return "ok"
    only_c = sorted(gs - rs)
    only_r = sorted(rs - gs)
    sc = ref.scores
    forced_hit = [t for t in only_c + only_r if t in ref.forced]
    line = "%s: C keeps {%s}, reference keeps {%s}" % (tag, fmt_scores(sc, only_c), fmt_scores(sc, only_r))
    if sc is None or forced_hit or len(only_c) != len(only_r):
        msgs.append("FAIL " + line + (" (forced tokens %s)" % forced_hit if forced_hit else ""))
        return "fail"
    chosen = [j for j in ref.kept if j not in ref.forced]
    t = min(sc[j] for j in chosen)
    # a reference that approximates the C's scores (leverage) gives its own relative tolerance
    tol = getattr(ref, "tol_rel", TIE_REL) * max(abs(t), 1e-30)
    if all(sc[j] == t for j in only_c + only_r):
        # bit-equal reference scores come from the same inputs (e.g. max pooling picks the same
        # vote), so the C scores are equal too and the spec's rule decides: lower index wins
        msgs.append("FAIL " + line + " (exact tie at %.9g broken differently: lower index must win)" % t)
        return "fail"
    if all(abs(sc[j] - t) <= tol for j in only_c + only_r):
        msgs.append("TIE  " + line + " (cut %.9g)" % t)
        return "tie"
    msgs.append("FAIL " + line + " (reference cut score %.9g)" % t)
    return "fail"


def plan_shape_errors(layers, cache):
    """The plan JSON's own consistency: a layer without "counts" keeps `budget`
    tokens in every head; a ragged layer ("counts": [Hkv]) keeps counts[h] in
    head h, each in [1, N], summing to Hkv * budget. Indices sorted, unique, in
    range."""
    bad = []
    for l, ly in enumerate(layers):
        heads = ly["heads"]
        counts = ly.get("counts", [ly["budget"]] * cache.Hkv)
        if len(heads) != cache.Hkv or len(counts) != cache.Hkv:
            bad.append("layer %d: %d heads / %d counts, Hkv = %d" % (l, len(heads), len(counts), cache.Hkv))
            continue
        if "counts" in ly and (sum(counts) != cache.Hkv * ly["budget"] or
                               any(not 1 <= n <= cache.N for n in counts)):
            bad.append("layer %d: counts %s do not sum to Hkv x budget %d or leave [1, N]" %
                       (l, counts, ly["budget"]))
        for h, idx in enumerate(heads):
            if len(idx) != counts[h] or any(a >= b for a, b in zip(idx, idx[1:])) or \
                    any(not 0 <= i < cache.N for i in idx):
                bad.append("layer %d head %d: not %d sorted unique in-range indices" % (l, h, counts[h]))
    return bad


def compare_layer(ref_heads, got_heads, tag, msgs):
    """A head-adaptive layer: the kept (head, token) pairs of all heads as one
    set (a tie at the layer's one top-k cut may move a token from one head to
    another). Returns 'ok', 'tie' or 'fail'; the tie rule is compare_head's,
    over the layer's pairs."""
    gs = {(h, j) for h, idx in enumerate(got_heads) for j in idx}
    rs = {(h, j) for h, hs in enumerate(ref_heads) for j in hs.kept}
    if gs == rs:
        return "ok"
    only_c, only_r = sorted(gs - rs), sorted(rs - gs)

    def fmt(pairs):
        return ", ".join("h%d:%d%s" % (h, j, "" if ref_heads[h].scores is None else
                                       " (%.9g)" % ref_heads[h].scores[j]) for h, j in pairs)
    line = "%s: C keeps {%s}, reference keeps {%s}" % (tag, fmt(only_c), fmt(only_r))
    forced_hit = [(h, j) for h, j in only_c + only_r if j in ref_heads[h].forced]
    if any(hs.scores is None for hs in ref_heads) or forced_hit or len(only_c) != len(only_r):
        msgs.append("FAIL " + line + (" (forced %s)" % forced_hit if forced_hit else ""))
        return "fail"
    chosen = [hs.scores[j] for hs in ref_heads for j in hs.kept if j not in hs.forced]
    t = min(chosen)
    tol = TIE_REL * max(abs(t), 1e-30)
    if all(abs(ref_heads[h].scores[j] - t) <= tol for h, j in only_c + only_r):
        msgs.append("TIE  " + line + " (cut %.9g)" % t)
        return "tie"
    msgs.append("FAIL " + line + " (reference cut score %.9g)" % t)
    return "fail"


def budget_tie(ref_shares, ref_b, got_b):
    if ref_shares is None:
        return False
    for s, g in zip(ref_shares, got_b):
        if g not in (math.floor(s), math.ceil(s)):
            return False
    diff = [l for l in range(len(ref_b)) if ref_b[l] != got_b[l]]
    fr = [ref_shares[l] - math.floor(ref_shares[l]) for l in diff]
    scale = max(ref_shares)
    return max(fr) - min(fr) <= 1e-5 * scale or all(min(f, 1 - f) <= 1e-5 * scale for f in fr)


def check_job(cache, case, method, budget, params, plan_path, out_path):
    msgs = []
    with open(plan_path) as f:
        plan = json.load(f)
    tag = "%s %s %s %s" % (method, case, "%s=%g" % budget, ",".join("%s=%s" % kv for kv in params.items()) or "defaults")
    B = per_layer_budget(budget, cache.N)
    layers = plan["layers"]
    if plan.get("n_tokens") != cache.N or len(layers) != cache.L:
        return "fail", ["FAIL %s: plan shape n_tokens=%s layers=%d" % (tag, plan.get("n_tokens"), len(layers))]
    if method == "random":
        bad = ["layer %d budget %d != %d" % (l, ly["budget"], B) for l, ly in enumerate(layers)
               if ly["budget"] != B or "counts" in ly] + plan_shape_errors(layers, cache)
        if bad:
            return "fail", ["FAIL %s: %s" % (tag, "; ".join(bad))]
        return "ok", []
    ref = METHODS[method](cache, B, params)
    got_b = [ly["budget"] for ly in layers]
    status = "ok"
    if got_b != ref.budgets:
        if budget_tie(ref.shares, ref.budgets, got_b):
            msgs.append("TIE  %s: budgets C %s vs reference %s (shares %s)" %
                        (tag, got_b, ref.budgets, ["%.9g" % s for s in ref.shares]))
            status = "tie"
        else:
            msgs.append("FAIL %s: budgets C %s vs reference %s (shares %s; %s)" %
                        (tag, got_b, ref.budgets,
                         ["%.9g" % s for s in ref.shares] if ref.shares else "-", ref.note))
            return "fail", msgs
    if sum(got_b) != (cache.L * cache.N if method == "full" else cache.L * B):
        msgs.append("FAIL %s: global budget %d" % (tag, sum(got_b)))
        return "fail", msgs
    bad = plan_shape_errors(layers, cache)
    if bad:
        return "fail", ["FAIL %s: %s" % (tag, "; ".join(bad))]
    same = [[False] * cache.Hkv for _ in range(cache.L)]
    for l, ly in enumerate(layers):
        if got_b[l] != ref.budgets[l]:
            continue
        if ref.ragged:
            r = compare_layer(ref.heads[l], ly["heads"], "%s layer %d" % (tag, l), msgs)
            same[l] = [r == "ok"] * cache.Hkv
            if r == "fail":
                status = "fail"
            elif r == "tie" and status == "ok":
                status = "tie"
            continue
        for h in range(cache.Hkv):
            r = compare_head(ref.heads[l][h], ly["heads"][h], "%s layer %d head %d" % (tag, l, h), msgs)
            same[l][h] = r == "ok"
            if r == "fail":
                status = "fail"
            elif r == "tie" and status == "ok":
                status = "tie"
    st = compare_channels(ref, layers, tag, msgs)
    if st == "fail":
        return "fail", msgs
    if st == "tie" and status == "ok":
        status = "tie"
    if out_path and out_path != "-":
        st = check_dump(cache, ref, layers, same, out_path, tag, msgs)
        if st == "fail":
            status = "fail"
        elif st == "tie" and status == "ok":
            status = "tie"
    return status, msgs


def check_dump(cache, ref, layers, same, out_path, tag, msgs):
    """Compacted (and, for merging methods, merged) K/V against the reference."""
    t = load_safetensors(out_path)
    status = "ok"
    how = ref.merge
    for l, ly in enumerate(layers):
        Bl = ly["budget"]
        kk = to_3d(t["layers.%d.k" % l][2], t["layers.%d.k" % l][1])
        vv = to_3d(t["layers.%d.v" % l][2], t["layers.%d.v" % l][1])
        tol = MERGE_REL + ROUND_REL[t["layers.%d.k" % l][0]]
        if t["layers.%d.k" % l][1] != [cache.Hkv, Bl, cache.d]:
            msgs.append("FAIL %s layer %d: dump shape %s" % (tag, l, t["layers.%d.k" % l][1]))
            return "fail"
        for h in range(cache.Hkv):
            if not same[l][h]:
                continue  # index mismatch already reported; merge uses C's set below only if equal
            kept = ly["heads"][h]
            rk, rv, fragile = merge_head(cache.K[l][h], cache.V[l][h], kept, how)
            if ly.get("key_channels"):  # think: the plan's pruned key channels are stored as zeros
                m = ly["key_channels"][h]
                rk = [[x if m[ch] == "1" else 0.0 for ch, x in enumerate(r)] for r in rk]
            for s in range(Bl):
                for name, a, b in (("K", kk[h][s], rk[s]), ("V", vv[h][s], rv[s])):
                    scale = max(max(abs(x) for x in b), 1e-30)
                    err = max(abs(x - y) for x, y in zip(a, b)) / scale
                    if err > tol:
                        line = "%s layer %d head %d slot %d (token %d) %s: merged rel err %.3g" % (
                            tag, l, h, s, kept[s], name, err)
                        if s in fragile:
                            msgs.append("TIE  " + line + " (assignment near-tie)")
                            status = "tie" if status == "ok" else status
                        else:
                            msgs.append("FAIL " + line)
                            status = "fail"
    return status


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: ref_methods.py MANIFEST\n")
        return 2
    caches = {}
    npass = nfail = ntie = 0
    with open(argv[1]) as f:
        jobs = [ln.rstrip("\n").split("\t") for ln in f if ln.strip()]
    for case, kv, method, bud, par, plan_path, out_path in jobs:
        if kv not in caches:
            caches = {kv: Cache(kv)}  # jobs are grouped by cache; keep one
        kind, val = bud.split("=")
        budget = (kind, float(val))
        try:
            status, msgs = check_job(caches[kv], case, method, budget, parse_params(par),
                                     plan_path, out_path)
        except Exception as exc:  # a reference bug or unreadable file is a failure, never a pass
            status, msgs = "fail", ["FAIL %s %s %s: %s: %s" % (method, case, bud, type(exc).__name__, exc)]
        for m in msgs:
            print(m)
        if status == "fail":
            nfail += 1
        else:
            npass += 1
            ntie += status == "tie"
    print("reference: %d passed (%d with float ties), %d failed" % (npass, ntie, nfail))
    return 1 if nfail else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
