/*
 * score_qfilter.c -- scorer `qfilter`: Q-Filters, the keys' projection on
 * the principal direction of the head's queries.
 *
 * Paper: Q-Filters, "Leveraging QK Geometry for Efficient KV Cache
 * Compression", arXiv 2503.02812; official code NathanGodey/qfilters (read
 * at commit cda5c38: make_filters.py, the calibration; src/hf_cache.py,
 * QFiltersCache, the eviction); kvpress QFilterPress (qfilter_press.py,
 * kvpress 0.5.5), which loads the published filters.
 * Formula, per layer: for each query head h, v_h is the first right
 * singular vector of its post-RoPE queries (rows [n][d]): the top
 * eigenvector of their d x d Gram matrix Q'Q (dsyrk, then LAPACK dsyevr for
 * the largest eigenpair only; the same vector as an SVD's, at d^2 n / 2 +
 * O(d^3) instead of dgesvd's O(n d^2) with a larger constant);
 * its sign is arbitrary, so it is fixed by the queries: sign_h = +1 when
 * more than half of the rows have <q, v_h> > 0, else -1, and the filter is
 * f_h = -sign_h v_h. A KV head's filter is the mean of its G query heads'
 * filters (not renormalised), and key j scores -<f, k_j>: keys pointing
 * where the queries mostly point draw the most attention and are kept.
 * Parameters: svd_queries (absent 3000: the official num_svd_samples).
 * Where we differ from the paper (decisions):
 *   - The paper computes the filters once per model, offline, from a
 *     calibration set (make_filters.py: 3000 rows drawn at random from the
 *     post-RoPE queries of 20 sequences of 2048 tokens); kvpress downloads
 *     those. Here they are computed per prompt from the queries the cache
 *     view carries: the last min(svd_queries, Nq) rows (Nq >= 1; the method
 *     asks for the last min(svd_queries, N)), so no trained artefact is
 *     needed and the direction is the prompt's own.
 *   - Before the majority rule, v is oriented with its largest-magnitude
 *     component positive (ties: the lower channel): the rule alone leaves a
 *     tie (exactly half the rows positive) to LAPACK's arbitrary sign.
 *   - All-zero queries (singular value 0) give a zero filter: every key
 *     scores 0 (ties go to the lower index).
 *   - Gram matrix and eigenvector in double from fp32 rows; scores as a
 *     double dot product.
 * Cost per layer Hq * (n d^2 / 2 + O(d^3)) + Hkv * N * d; memory n * d +
 * d * d doubles + the dsyevr workspace.
 */
#include "kvs_parts.h"

#include <cblas.h>

#include <math.h>
#include <stdlib.h>

/* LAPACK (the OpenBLAS build the project links carries it): selected
 * eigenvalues and eigenvectors of a symmetric column-major n x n matrix (MRRR);
 * the trailing arguments are the hidden lengths of the three character
 * arguments (gfortran's calling convention). */
extern void dsyevr_(const char *jobz, const char *range, const char *uplo, const int *n, double *a,
                    const int *lda, const double *vl, const double *vu, const int *il, const int *iu,
                    const double *abstol, int *m, double *w, double *z, const int *ldz, int *isuppz,
                    double *work, const int *lwork, int *iwork, const int *liwork, int *info,
                    size_t lj, size_t lr, size_t lu);

/* dsyevr of the d x d Gram matrix g (destroyed) for its largest eigenpair:
 * the eigenvalue in w[0] (w [d]: dsyevr writes all d), the eigenvector in z
 * [d]; lwork = liwork = -1 asks for the workspace sizes instead. */
static int top_eig(double *g, int d, double *w, double *z, double *work, int lwork, int *iwork,
                   int liwork) {
    const double vl = 0, vu = 0, abstol = 0;
    int m = 0, info = 0, isuppz[2];
    dsyevr_("V", "I", "U", &d, g, &d, &vl, &vu, &d, &d, &abstol, &m, w, z, &d, isuppz, work, &lwork,
            iwork, &liwork, &info, 1, 1, 1);
    return info != 0 || (lwork != -1 && m != 1) ? -1 : 0;
}

int kvs_qfilter_lwork(int n, int d) {
    (void)n; /* the rows only enter the Gram matrix */
    double w = 0, z = 0, q = 0;
    int iq = 0;
    if (d < 1 || top_eig(NULL, d, &w, &z, &q, -1, &iq, -1)) return -1;
    /* [d] the eigenvector, [d] the eigenvalues (dsyevr uses all d), then
     * LAPACK's double workspace */
    return 2 * d + (int)q + 1;
}

kvs_status kvs_qfilter_head(const float *rows, int n, int d, double *a, double *u, double *work,
                            int lwork, float *filter, kvs_err *err) {
    if (n < 1 || d < 1 || lwork < 2 * d + 1)
        return kvs_errorf(err, KVS_ERR_INVALID, "qfilter: n=%d rows of d=%d (lwork %d)", n, d, lwork);
    for (size_t i = 0; i < (size_t)n * d; i++) a[i] = rows[i];
    /* u = Q'Q (lower triangle, row-major: LAPACK's upper, column-major) */
    cblas_dsyrk(CblasRowMajor, CblasLower, CblasTrans, d, n, 1.0, a, d, 0.0, u, d);
    double tr = 0.0; /* the diagonal holds each channel's sum of squares */
    for (int c = 0; c < d; c++) tr += u[(size_t)c * d + c];
    if (!(tr > 0.0)) { /* all-zero queries: no direction */
        for (int c = 0; c < d; c++) filter[c] = 0.0f;
        return KVS_OK;
    }
    int *iwork = malloc(sizeof(int) * (size_t)10 * d); /* dsyevr wants 10 d */
    if (!iwork) return kvs_errorf(err, KVS_ERR_NOMEM, "qfilter: out of memory (d=%d)", d);
    const int bad = top_eig(u, d, work + d, work, work + 2 * d, lwork - 2 * d, iwork, 10 * d);
    const double lam = work[d];
    free(iwork);
    if (bad)
        return kvs_errorf(err, KVS_ERR_NUMERIC,
                          "qfilter: dsyevr of the %d x %d Gram matrix of %d rows failed", d, d, n);
    if (!(lam > 0.0)) { /* all-zero queries: no direction */
        for (int c = 0; c < d; c++) filter[c] = 0.0f;
        return KVS_OK;
    }
    const double *v = work; /* the top eigenvector: [d] */
    int big = 0;
    for (int c = 1; c < d; c++)
        if (fabs(v[c]) > fabs(v[big])) big = c;
    const double orient = v[big] < 0 ? -1.0 : 1.0;
    int pos = 0;
    for (int i = 0; i < n; i++) {
        double t = 0.0;
        for (int c = 0; c < d; c++) t += (double)rows[(size_t)i * d + c] * v[c];
        pos += orient * t > 0.0;
    }
    const double sign = 2 * pos > n ? 1.0 : -1.0;
    for (int c = 0; c < d; c++) filter[c] = (float)(-sign * orient * v[c]);
    return KVS_OK;
}

typedef struct {
    const kvs_part_ctx *c;
    int nmax;        /* rows the scratch holds: min(svd_queries, N, Nq of the shape) */
    int lwork;       /* for nmax rows */
    float *rows;     /* [nmax][d] one head's queries, then [N][d] one KV head's keys */
    double *a, *u;   /* [nmax][d], [d][d] */
    double *work;    /* [lwork] */
    float *filt;     /* [Hq][d] */
    double *fkv;     /* [d] one KV head's filter */
} qf_state;

static int qf_queries(const kvs_method *m, const kvs_params *p, int N) {
    const double q = kvs_part_param(m, p, "svd_queries", 3000);
    return q < N ? (int)q : N;
}

static void qf_destroy(void *state) {
    qf_state *st = state;
    if (!st) return;
    free(st->rows);
    free(st->a);
    free(st->u);
    free(st->work);
    free(st->filt);
    free(st->fkv);
    free(st);
}

static kvs_status qf_create(const kvs_part_ctx *c, void **state, kvs_err *err) {
    const int N = c->shape.n_tokens, d = c->shape.head_dim, Hq = c->shape.n_q_heads;
    int nmax = qf_queries(c->m, c->p, N);
    if (c->shape.n_queries > 0 && nmax > c->shape.n_queries) nmax = c->shape.n_queries;
    if (nmax < 1) nmax = 1;
    const int rmax = nmax > N ? nmax : N;
    qf_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    st->c = c;
    st->nmax = nmax;
    st->lwork = kvs_qfilter_lwork(nmax, d);
    st->rows = malloc(sizeof(float) * (size_t)rmax * d);
    st->a = malloc(sizeof(double) * (size_t)nmax * d);
    st->u = malloc(sizeof(double) * (size_t)d * d);
    st->work = malloc(sizeof(double) * (size_t)(st->lwork > 0 ? st->lwork : 1));
    st->filt = malloc(sizeof(float) * (size_t)(Hq > 0 ? Hq : 1) * d);
    st->fkv = malloc(sizeof(double) * (size_t)d);
    if (st->lwork < 1 || !st->rows || !st->a || !st->u || !st->work || !st->filt || !st->fkv) {
        qf_destroy(st);
        return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory for the Gram matrix of %d x %d queries", nmax, d);
    }
    *state = st;
    return KVS_OK;
}

static kvs_status qf_score(void *state, int layer, const kvs_layer *in, float *scores,
                           kvs_err *err) {
    qf_state *st = state;
    const kvs_part_ctx *c = st->c;
    const char *mn = c->m->name;
    const int N = c->shape.n_tokens, H = c->shape.n_kv_heads, d = c->shape.head_dim;
    const int Hq = c->shape.n_q_heads;
    if (!in->q.data || in->q.n_tokens < 1 || in->q.n_heads != Hq || in->q.head_dim != d)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "%s: layer %d: needs the prompt's queries (Nq >= 1, Hq = %d) but got "
                          "Nq=%d",
                          mn, layer, Hq, in->q.data ? in->q.n_tokens : 0);
    int n = qf_queries(c->m, c->p, N);
    if (n > in->q.n_tokens) n = in->q.n_tokens;
    if (n > st->nmax || kvs_qfilter_lwork(n, d) > st->lwork)
        return kvs_errorf(err, KVS_ERR_INTERNAL, "%s: layer %d: %d query rows exceed the %d planned",
                          mn, layer, n, c->shape.n_queries);
    for (int h = 0; h < Hq; h++) {
        kvs_view_rows_f32(&in->q, h, in->q.n_tokens - n, n, st->rows);
        kvs_status rc = kvs_qfilter_head(st->rows, n, d, st->a, st->u, st->work, st->lwork,
                                         st->filt + (size_t)h * d, err);
        if (rc) return kvs_err_prefix(err, "%s: layer %d: query head %d", mn, layer, h);
    }
    const int G = Hq / H;
    for (int g = 0; g < H; g++) {
        double *fd = st->fkv; /* [d] */
        for (int x = 0; x < d; x++) {
            double t = 0.0;
            for (int i = 0; i < G; i++) t += st->filt[(size_t)(g * G + i) * d + x];
            fd[x] = t / G;
        }
        kvs_view_rows_f32(&in->k, g, 0, N, st->rows);
        for (int j = 0; j < N; j++) {
            const float *kj = st->rows + (size_t)j * d;
            double t = 0.0;
            for (int x = 0; x < d; x++) t += fd[x] * kj[x];
            if (!isfinite(t))
                return kvs_errorf(err, KVS_ERR_NUMERIC, "%s: layer %d: KV head %d: token %d: "
                                  "projection is not finite", mn, layer, g, j);
            scores[(size_t)g * N + j] = (float)(-t);
        }
    }
    return KVS_OK;
}

const kvs_scorer kvs_scorer_qfilter = {
    .name = "qfilter",
    .needs = KVS_NEED_Q_WINDOW,
    .queries_wanted = qf_queries,
    .create = qf_create,
    .score = qf_score,
    .destroy = qf_destroy,
};
