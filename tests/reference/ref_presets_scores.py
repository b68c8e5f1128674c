"""ref_presets_scores.py -- the independent reference of eight presets of parts:
knorm, tova, keydiff, chunkkv, expected_attention, lagkv, pyramidkv and
pyramid_tova.

What this is: part of tests/reference/ (see ref_methods.py's header). Each
preset is written from its section under "Methods as parts" in
docs/methods.md, the composition `kvsieve methods` prints (score, allocate,
keep, pick, defaults) and the papers / kvpress the sections name, WITHOUT
reading methods/ or core/. Standard library only, float64. Exports
METHODS = {preset: fn(cache, B, params) -> Plan}, merged by ref_methods.py.
What this is not: a reference of the parts in every composition (only these
presets' defaults and the parameters `kvsieve methods` lists for them).
"""
import math

from ref_common import HeadSel, Plan, allocate, budget_min, pool1d, snapkv_votes, top_by_score

INF = math.inf


def _int(p, name, default):
    return int(p.get(name, default))


def _bool(p, name, default):
    return str(p.get(name, default)).lower() == "true"


# --------------------------------------------------------------------------
# keep rules and pick rules ("Methods as parts")
# --------------------------------------------------------------------------

def keep_rules(N, Bl, sinks, window):
    """Keep rules in the order given, each clamped to what the layer budget has
    left: the first min(sinks, Bl) tokens, then the last min(window, rest).
    Returns (protected tokens, the unprotected range [a, b))."""
    p = min(sinks, Bl)
    q = min(window, Bl - p)
    return list(range(p)) + list(range(N - q, N)), p, N - q


def pick_topk(N, Bl, sinks, window, scores):
    """keep rules + pick `topk`: the best-scored unprotected tokens (ties: lower index)."""
    if Bl >= N:
        return HeadSel(range(N), range(N), None)
    forced, a, b = keep_rules(N, Bl, sinks, window)
    return HeadSel(forced + top_by_score(scores, range(a, b), Bl - len(forced)), forced, scores)


def pick_chunk(N, Bl, sinks, window, scores, c):
    """keep rules + pick `chunk` (docs/methods.md "chunkkv"): the unprotected tokens
    in chunks of c from the first unprotected one, ranked by the sum of their
    scores (ties: lower chunk); whole chunks while they fit, then the first chunk
    that does not fit gives its best tokens (ties: lower index)."""
    if Bl >= N:
        return HeadSel(range(N), range(N), None)
    forced, a, b = keep_rules(N, Bl, sinks, window)
    chunks = [list(range(s, min(s + c, b))) for s in range(a, b, c)]
    order = sorted(range(len(chunks)), key=lambda k: (-sum(scores[j] for j in chunks[k]), k))
    left = Bl - len(forced)
    kept = list(forced)
    for k in order:
        if len(chunks[k]) <= left:
            kept += chunks[k]
            left -= len(chunks[k])
        else:
            kept += top_by_score(scores, chunks[k], left)
            break
    return HeadSel(kept, forced, scores)


# --------------------------------------------------------------------------
# allocator `pyramid` (docs/methods.md "pyramidkv")
# --------------------------------------------------------------------------

def pyramid_budgets(c, B, w, beta):
    """X = B - w; the top layer X / beta, the bottom 2X - X / beta, a straight line
    between, each plus w; a bottom above N - w is set to N - w and the top to
    2X - (N - w); one rounding with the exact sum L * B (ref_common.allocate).
    Returns (budgets, real shares); one layer or no room beyond the window
    (B <= w): every layer B."""
    L, N = c.L, c.N
    if L == 1 or B <= w:
        return [B] * L, None
    X = B - w
    top, bot = X / beta, 2 * X - X / beta
    if bot > N - w:
        bot, top = N - w, 2 * X - (N - w)
    weights = [bot + (top - bot) * l / (L - 1) + w for l in range(L)]
    return allocate(weights, L * B, budget_min(N, B), N)


# --------------------------------------------------------------------------
# scorers (one score per token and KV head, higher = keep)
# --------------------------------------------------------------------------

def snapkv_scores(c, l, w, k, pool):
    """SnapKV votes (spec "SnapKV", docs "snapkv"): the last w query rows'
    softmax over prefix keys j < N - w, summed over rows, GQA mean, pooled;
    window tokens score +inf (they are kept by the window rule)."""
    key = ("snapkv+window", l, w, k, pool)  # not ref_presets_critical's ("snapkv", ...) entry
    if key not in c.memo:
        w = min(w, c.N)
        c.memo[key] = [pool1d(v, k, pool) + [INF] * w for v in snapkv_votes(c, l, w)]
    return c.memo[key]


def tova_scores(c, l):
    """docs "tova": the last prompt query's softmax over all N keys, GQA mean."""
    key = ("tova", l)
    if key not in c.memo:
        P = c.probs(l)
        out = [[0.0] * c.N for _ in range(c.Hkv)]
        for h in range(c.Hq):
            for j, x in enumerate(P[h][c.Nq - 1]):
                out[h // c.G][j] += x / c.G
        c.memo[key] = out
    return c.memo[key]


def _norm(x):
    return math.sqrt(sum(a * a for a in x))


def knorm_scores(c, l):
    """docs "knorm": minus the L2 norm of the key (not its square)."""
    return [[-_norm(k) for k in c.K[l][g]] for g in range(c.Hkv)]


def keydiff_scores(c, l, anchor):
    """docs "keydiff": minus cos(k_j, anchor); anchor = mean of the head's
    L2-normalised keys (`normalized`) or of the raw keys (`raw`); a zero key or
    a zero anchor has cosine 0."""
    out = []
    for g in range(c.Hkv):
        K = c.K[l][g]
        norms = [_norm(k) for k in K]
        if anchor == "raw":
            rows = K
        else:
            rows = [[x / n for x in k] if n > 0 else [0.0] * c.d for k, n in zip(K, norms)]
        a = [sum(r[ch] for r in rows) / c.N for ch in range(c.d)]
        na = _norm(a)
        sc = []
        for k, n in zip(K, norms):
            cos = sum(x * y for x, y in zip(k, a)) / (n * na) if n > 0 and na > 0 else 0.0
            sc.append(-cos)
        out.append(sc)
    return out


def expected_attention_scores(c, l, sinks, use_cov, use_vnorm, eps):
    """docs "expected_attention": per query head the mean mu and population
    covariance S of its query rows at positions >= sinks (all rows if none);
    logits mu.k / sqrt d + k'Sk / (2d) over keys j >= sinks, softmaxed there,
    GQA mean, then (score + eps) * ||v_j||; sink keys get the head's maximum."""
    N, d = c.N, c.d
    out = [[0.0] * N for _ in range(c.Hkv)]
    for h in range(c.Hq):
        g = h // c.G
        rows = [q for i, q in enumerate(c.Q[l][h]) if N - c.Nq + i >= sinks] or c.Q[l][h]
        n = len(rows)
        mu = [sum(r[a] for r in rows) / n for a in range(d)]
        S = [[sum((r[a] - mu[a]) * (r[b] - mu[b]) for r in rows) / n for b in range(d)]
             for a in range(d)]
        logit = []
        for j in range(sinks, N):
            k = c.K[l][g][j]
            x = sum(m * y for m, y in zip(mu, k)) / math.sqrt(d)
            if use_cov:
                x += sum(k[a] * S[a][b] * k[b] for a in range(d) for b in range(d)) / (2 * d)
            logit.append(x)
        if not logit:
            continue
        m = max(logit)
        e = [math.exp(x - m) for x in logit]
        z = sum(e)
        for j, x in zip(range(sinks, N), e):
            out[g][j] += x / z / c.G
    for g in range(c.Hkv):
        sc = out[g]
        if use_vnorm:
            for j in range(sinks, N):
                sc[j] = (sc[j] + eps) * _norm(c.V[l][g][j])
        top = max(sc[sinks:]) if N > sinks else 0.0
        for j in range(min(sinks, N)):
            sc[j] = top
    return out


def _lag_stat(X, part, ref):
    """LagKV's statistic of one tensor: per token of `part`, the unbiased std over
    channels of (x - min_ref) / (max_ref - min_ref) (a constant reference channel
    contributes 0; d = 1 gives 0), softmaxed over the partition."""
    d = len(X[0])
    lo = [min(X[j][ch] for j in ref) for ch in range(d)]
    hi = [max(X[j][ch] for j in ref) for ch in range(d)]
    stat = []
    for j in part:
        z = [(X[j][ch] - lo[ch]) / (hi[ch] - lo[ch]) if hi[ch] > lo[ch] else 0.0 for ch in range(d)]
        if d < 2:
            stat.append(0.0)
            continue
        m = sum(z) / d
        stat.append(math.sqrt(sum((x - m) ** 2 for x in z) / (d - 1)))
    mx = max(stat)
    e = [math.exp(s - mx) for s in stat]
    tot = sum(e)
    return [x / tot for x in e]


def lagkv_scores(c, l, sinks, lag, cross):
    """docs "lagkv": after `sinks`, partitions of `lag` tokens, each scored against
    the next; K and V statistics averaged; the score is the token's rank in its
    partition / lag (equal values: the lower index ranks lower), or the average
    itself with cross_scoring. Sinks, the last partition and the remainder score
    1. N < sinks + 2 lag: sinks 1, then (j - sinks) / (N - sinks)."""
    N = c.N
    if N < sinks + 2 * lag:
        row = [1.0 if j < sinks else (j - sinks) / (N - sinks) for j in range(N)]
        return [list(row) for _ in range(c.Hkv)]
    nparts = (N - sinks) // lag
    out = []
    for g in range(c.Hkv):
        sc = [1.0] * N
        for p in range(nparts - 1):
            part = range(sinks + p * lag, sinks + (p + 1) * lag)
            ref = range(sinks + (p + 1) * lag, sinks + (p + 2) * lag)
            sk = _lag_stat(c.K[l][g], part, ref)
            sv = _lag_stat(c.V[l][g], part, ref)
            avg = [(a + b) / 2 for a, b in zip(sk, sv)]
            if cross:
                vals = avg
            else:
                order = sorted(range(lag), key=lambda i: (avg[i], i))
                vals = [0.0] * lag
                for rank, i in enumerate(order):
                    vals[i] = rank / lag
            for i, j in enumerate(part):
                sc[j] = vals[i]
        out.append(sc)
    return out


# --------------------------------------------------------------------------
# the presets (compositions as `kvsieve methods` prints them)
# --------------------------------------------------------------------------

def _uniform(c, B, sinks, window, scores_of):
    heads = []
    for l in range(c.L):
        sc = scores_of(l)
        heads.append([pick_topk(c.N, B, sinks, window, sc[g]) for g in range(c.Hkv)])
    return Plan([B] * c.L, heads)


def m_knorm(c, B, p):
    """knorm + uniform + sinks (0) + window (0) + topk."""
    return _uniform(c, B, _int(p, "sinks", 0), _int(p, "window", 0), lambda l: knorm_scores(c, l))


def m_keydiff(c, B, p):
    """keydiff (anchor normalized) + uniform + sinks (0) + window (0) + topk."""
    anchor = p.get("anchor", "normalized")
    return _uniform(c, B, _int(p, "sinks", 0), _int(p, "window", 0),
                    lambda l: keydiff_scores(c, l, anchor))


def m_tova(c, B, p):
    """tova + uniform + window (1) + topk."""
    return _uniform(c, B, 0, _int(p, "window", 1), lambda l: tova_scores(c, l))


def m_lagkv(c, B, p):
    """lagkv (lag 128, cross_scoring false) + uniform + sinks (4) + topk."""
    s = _int(p, "sinks", 4)
    lag, cross = _int(p, "lag", 128), _bool(p, "cross_scoring", "false")
    return _uniform(c, B, s, 0, lambda l: lagkv_scores(c, l, s, lag, cross))


def m_expected_attention(c, B, p):
    """expected_attention (covariance, value norm, epsilon 0) + uniform + sinks (4) + topk."""
    s = _int(p, "sinks", 4)
    cov, vn = _bool(p, "use_covariance", "true"), _bool(p, "use_vnorm", "true")
    eps = float(p.get("epsilon", 0))
    return _uniform(c, B, s, 0, lambda l: expected_attention_scores(c, l, s, cov, vn, eps))


def m_chunkkv(c, B, p):
    """snapkv (window 8, kernel 7, max) + uniform + window + pick chunk (10)."""
    w, k, pool = _int(p, "window", 8), _int(p, "kernel", 7), p.get("pool", "max")
    ch = _int(p, "chunk", 10)
    heads = []
    for l in range(c.L):
        sc = snapkv_scores(c, l, w, k, pool)
        heads.append([pick_chunk(c.N, B, 0, w, sc[g], ch) for g in range(c.Hkv)])
    return Plan([B] * c.L, heads)


def _pyramid(c, B, w, beta, scores_of):
    budgets, shares = pyramid_budgets(c, B, w, beta)
    heads = []
    for l in range(c.L):
        sc = scores_of(l)
        heads.append([pick_topk(c.N, budgets[l], 0, w, sc[g]) for g in range(c.Hkv)])
    return Plan(budgets, heads, shares=shares, note="pyramid w=%d beta=%g" % (w, beta))


def m_pyramidkv(c, B, p):
    """snapkv (window 8, kernel 7, max) + pyramid (beta 20) + window + topk."""
    w, k, pool = _int(p, "window", 8), _int(p, "kernel", 7), p.get("pool", "max")
    return _pyramid(c, B, w, float(p.get("beta", 20)), lambda l: snapkv_scores(c, l, w, k, pool))


def m_pyramid_tova(c, B, p):
    """tova + pyramid (beta 20) + window (1) + topk."""
    return _pyramid(c, B, _int(p, "window", 1), float(p.get("beta", 20)), lambda l: tova_scores(c, l))


METHODS = {"knorm": m_knorm, "tova": m_tova, "keydiff": m_keydiff, "chunkkv": m_chunkkv,
           "expected_attention": m_expected_attention, "lagkv": m_lagkv,
           "pyramidkv": m_pyramidkv, "pyramid_tova": m_pyramid_tova}
