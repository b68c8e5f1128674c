/*
 * report_paired.c -- the paired comparisons under each task table: every
 * compressed variant against its `full` and against the best other one,
 * paired by sample id, with a paired bootstrap CI of the difference, an
 * exact McNemar or sign-flip p-value, Holm-Bonferroni across the table and
 * the table's minimum detectable difference; as Markdown / LaTeX under the
 * table, or as CSV / JSON rows.
 *
 * What it is: the pairing of two groups' samples and the writing. What it is
 * not: the statistics themselves (stats.c), the gathering (report_data.c).
 */
#include "kvs_eval.h"
#include "report_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One row of a table's paired comparisons: variant l against o (full, or the
 * best other compressed variant of the same setting at this budget) on the
 * table's primary metric, over the samples both have. */
typedef struct {
    int l, o, vs_full;
    int test;      /* index of the distinct test (l vs o and o vs l are one) */
    int n, binary; /* pairs; 1 when every paired value is 0 or 1 */
    int64_t b, c;  /* binary: pairs with only l right (b), only o right (c) */
    double delta, lo, hi, p, padj, mde, sd;
} cmp_row;

enum { PAIRED_RESAMPLES_MIN = 1000 };
#define PAIRED_ALPHA 0.05
#define PAIRED_POWER 0.8

/* The best compressed variant other than l with l's bracketed tag at budget
 * b on metric m (higher or lower by direction); -1 when none or unranked. */
static int best_other(const dataset *d, int e, int b, const layout_t *t, int m, int l) {
    const int dir = kvs_rpt_direction(d->metrics.v[m]);
    const char *tag = strrchr(d->labels.v[l], '[');
    int best = -1;
    double bv = NAN;
    if (dir == 0) return -1;
    for (int i = 0; i < t->n_labels; i++) {
        const int o = t->labels[i];
        if (o == l || kvs_rpt_is_full(d, o)) continue;
        const char *ot = strrchr(d->labels.v[o], '[');
        if (tag ? !(ot && !strcmp(tag, ot)) : ot != NULL) continue;
        const int gi = kvs_rpt_find_group(d, e, b, o, m);
        if (gi < 0 || isnan(d->g[gi].mean)) continue;
        const double v = d->g[gi].mean;
        if (best < 0 || (dir < 0 ? v < bv : v > bv)) best = o, bv = v;
    }
    return best;
}

/* Pairs of groups ga (x) and gb (y) by sample: x[i], y[i], i < returned n.
 * pos is scratch [samples] filled with -1 and left so. */
static int pair_up(const dataset *d, const group *ga, const group *gb, int *pos, double *x,
                   double *y) {
    int n = 0;
    for (int i = gb->n - 1; i >= 0; i--) pos[gb->sid[i]] = i; /* first occurrence wins */
    for (int i = 0; i < ga->n; i++) {
        const int j = pos[ga->sid[i]];
        if (j < 0) continue;
        x[n] = ga->x[i];
        y[n] = gb->x[j];
        n++;
    }
    for (int i = 0; i < gb->n; i++) pos[gb->sid[i]] = -1;
    (void)d;
    return n;
}

static uint64_t pair_seed(const dataset *d, int e, int b, int l, int o, uint64_t seed) {
    const char *a = d->labels.v[l], *c = d->labels.v[o];
    if (strcmp(a, c) > 0) { /* one seed per unordered pair: mirrored rows agree */
        const char *t = a;
        a = c, c = t;
    }
    char bt[64];
    snprintf(bt, sizeof bt, "|paired|%.17g|%lld|", d->budgets[b].ratio,
             (long long)d->budgets[b].tokens);
    uint64_t h = kvs_rpt_fnv1a(d->exps.v[e], 0xcbf29ce484222325ULL);
    h = kvs_rpt_fnv1a(bt, h);
    h = kvs_rpt_fnv1a(a, h);
    h = kvs_rpt_fnv1a("|", h);
    h = kvs_rpt_fnv1a(c, h);
    return seed ^ h;
}

/* The comparisons of one table (experiment e, budget b, metric m): every
 * compressed variant vs its `full` and vs the best other one; p-values
 * Holm-adjusted across the table's distinct tests. *rows is malloc'd
 * (caller frees); returns the count, -1 out of memory. */
static int paired_rows(const dataset *d, int e, int b, const layout_t *t, int m, int B,
                       uint64_t seed, cmp_row **rows) {
    *rows = NULL;
    int n_rows = 0, cap = 2 * t->n_labels + 1, n_tests = 0, maxn = 1;
    cmp_row *r = calloc((size_t)cap, sizeof *r);
    int *pos = malloc(sizeof(int) * (size_t)(d->samples.v.n + 1));
    for (int i = 0; i < d->n_groups; i++) maxn = d->g[i].n > maxn ? d->g[i].n : maxn;
    double *x = malloc(sizeof(double) * (size_t)maxn), *y = malloc(sizeof(double) * (size_t)maxn);
    double *dd = malloc(sizeof(double) * (size_t)maxn);
    double *tp = calloc((size_t)cap, sizeof(double)), *ta = calloc((size_t)cap, sizeof(double));
    if (!r || !pos || !x || !y || !dd || !tp || !ta) {
        free(r), free(pos), free(x), free(y), free(dd), free(tp), free(ta);
        return -1;
    }
    for (int i = 0; i <= d->samples.v.n; i++) pos[i] = -1;
    for (int i = 0; i < t->n_labels; i++) {
        const int l = t->labels[i];
        if (kvs_rpt_is_full(d, l) || kvs_rpt_find_group(d, e, b, l, m) < 0) continue;
        const int others[2] = {kvs_rpt_full_for(d, t->labels, t->n_labels, l),
                               best_other(d, e, b, t, m, l)};
        for (int k = 0; k < 2; k++) {
            const int o = others[k];
            if (o < 0) continue;
            const int ga = kvs_rpt_find_group(d, e, b, l, m), gb = kvs_rpt_cell_group(d, e, b, o, m);
            if (gb < 0) continue;
            cmp_row *c = &r[n_rows];
            memset(c, 0, sizeof *c);
            c->l = l, c->o = o, c->vs_full = k == 0;
            c->n = pair_up(d, &d->g[ga], &d->g[gb], pos, x, y);
            if (c->n == 0) continue;
            c->binary = 1;
            double sd = 0, mean = 0;
            for (int j = 0; j < c->n; j++) {
                c->binary &= (x[j] == 0 || x[j] == 1) && (y[j] == 0 || y[j] == 1);
                dd[j] = x[j] - y[j];
                mean += dd[j];
            }
            mean /= c->n;
            for (int j = 0; j < c->n; j++) sd += (dd[j] - mean) * (dd[j] - mean);
            c->sd = c->n > 1 ? sqrt(sd / (c->n - 1)) : NAN;
            const uint64_t ps = pair_seed(d, e, b, l, o, seed);
            kvs_paired_bootstrap_ci(x, y, c->n, B, ps, &c->delta, &c->lo, &c->hi);
            if (c->binary) {
                for (int j = 0; j < c->n; j++) c->b += x[j] > y[j], c->c += x[j] < y[j];
                c->p = kvs_mcnemar_exact_p(c->b, c->c);
                c->mde = kvs_mde_paired_binary(c->n, (double)(c->b + c->c) / c->n, PAIRED_ALPHA,
                                               PAIRED_POWER);
            } else {
                c->p = kvs_signflip_p(dd, c->n, B > PAIRED_RESAMPLES_MIN ? B : PAIRED_RESAMPLES_MIN,
                                      ps ^ 0x5bd1e995ULL);
                c->mde = kvs_mde_paired_mean(c->n, c->sd, PAIRED_ALPHA, PAIRED_POWER);
            }
            /* one test per unordered pair */
            c->test = -1;
            for (int q = 0; q < n_rows && c->test < 0; q++)
                if (r[q].l == o && r[q].o == l) c->test = r[q].test;
            if (c->test < 0) {
                c->test = n_tests;
                tp[n_tests++] = c->p;
            }
            n_rows++;
        }
    }
    kvs_holm_adjust(tp, n_tests, ta);
    for (int i = 0; i < n_rows; i++) r[i].padj = ta[r[i].test];
    free(pos), free(x), free(y), free(dd), free(tp), free(ta);
    *rows = r;
    return n_rows;
}

static int n_tests_of(const cmp_row *r, int n) {
    int t = 0;
    for (int i = 0; i < n; i++) t = r[i].test + 1 > t ? r[i].test + 1 : t;
    return t;
}

/* The table's own detectable difference: at its mean discordance rate
 * (binary) or mean sd of the differences (otherwise), and its fewest pairs. */
static double table_mde(const cmp_row *r, int n, int *binary, double *rate, int *n_min) {
    double s = 0;
    int k = 0, bin = 1;
    *n_min = 0;
    for (int i = 0; i < n; i++) bin &= r[i].binary;
    for (int i = 0; i < n; i++) {
        if (*n_min == 0 || r[i].n < *n_min) *n_min = r[i].n;
        const double v = bin ? (double)(r[i].b + r[i].c) / r[i].n : r[i].sd;
        if (!isnan(v)) s += v, k++;
    }
    *binary = bin;
    *rate = k ? s / k : NAN;
    return bin ? kvs_mde_paired_binary(*n_min, *rate, PAIRED_ALPHA, PAIRED_POWER)
               : kvs_mde_paired_mean(*n_min, *rate, PAIRED_ALPHA, PAIRED_POWER);
}

static void fmt_p(double p, char *out, size_t n) {
    if (isnan(p))
        snprintf(out, n, "-");
    else if (p < 1e-4)
        snprintf(out, n, "%.1e", p);
    else
        snprintf(out, n, "%.4f", p);
}

/* Markdown / LaTeX: the comparisons of one budget's table, under it. */
void kvs_rpt_write_paired(const dataset *d, int e, int b, const layout_t *t, int m, FILE *f,
                          kvs_report_format fmt, int B, uint64_t seed) {
    cmp_row *r = NULL;
    const int n = paired_rows(d, e, b, t, m, B, seed, &r);
    if (n <= 0) {
        free(r);
        return;
    }
    const int md = fmt == KVS_REPORT_MD;
    const char *pm = d->metrics.v[m];
    if (md) {
        fprintf(f, "Paired differences in %s (budget ", pm);
        char bt[64];
        kvs_rpt_budget_title(&d->budgets[b], bt, sizeof bt);
        fprintf(f, "%s):\n\n| method | vs | pairs | Δ [95%% CI] | b / c | p | p Holm | MDE |\n"
                   "|---|---|---:|---:|---:|---:|---:|---:|\n", bt);
    } else {
        fprintf(f, "\\begin{table}[t]\n\\centering\n\\caption{");
        kvs_rpt_tex_escape(f, d->exps.v[e]);
        char bt[64];
        kvs_rpt_budget_title(&d->budgets[b], bt, sizeof bt);
        fprintf(f, ", budget %s: paired differences in ", bt);
        kvs_rpt_tex_escape(f, pm);
        fprintf(f, "}\n\\begin{tabular}{llrrrrrr}\n\\toprule\nmethod & vs & pairs & $\\Delta$ "
                   "[95\\%% CI] & $b/c$ & $p$ & $p_{\\mathrm{Holm}}$ & MDE \\\\\n\\midrule\n");
    }
    for (int i = 0; i < n; i++) {
        const cmp_row *c = &r[i];
        char a[32], lo[32], hi[32], p[32], pa[32], mde[32], bc[48];
        snprintf(a, sizeof a, "%+.4g", c->delta);
        snprintf(lo, sizeof lo, "%+.4g", c->lo);
        snprintf(hi, sizeof hi, "%+.4g", c->hi);
        fmt_p(c->p, p, sizeof p);
        fmt_p(c->padj, pa, sizeof pa);
        kvs_rpt_fmt_num(c->mde, mde, sizeof mde);
        if (c->binary)
            snprintf(bc, sizeof bc, "%lld / %lld", (long long)c->b, (long long)c->c);
        else
            snprintf(bc, sizeof bc, "-");
        const int sig = !isnan(c->padj) && c->padj <= PAIRED_ALPHA;
        char vs[200];
        snprintf(vs, sizeof vs, "%s%s", c->vs_full ? "" : "best other: ", d->labels.v[c->o]);
        if (md) {
            fprintf(f, "| %s | %s | %d | %s [%s, %s]%s | %s | %s | %s%s | %s |\n", d->labels.v[c->l],
                    vs, c->n, a, lo, hi, sig ? " *" : "", bc, p, pa, sig ? " *" : "", mde);
        } else {
            kvs_rpt_tex_escape(f, d->labels.v[c->l]);
            fprintf(f, " & ");
            kvs_rpt_tex_escape(f, vs);
            fprintf(f, " & %d & %s [%s, %s]%s & %s & %s & %s & %s \\\\\n", c->n, a, lo, hi,
                    sig ? "$^*$" : "", bc, p, pa, mde);
        }
    }
    int bin, n_min;
    double rate;
    const double tm = table_mde(r, n, &bin, &rate, &n_min);
    char tms[32], rs[32];
    kvs_rpt_fmt_num(tm, tms, sizeof tms);
    kvs_rpt_fmt_num(rate, rs, sizeof rs);
    const int K = n_tests_of(r, n);
    if (md) {
        fprintf(f, "\nΔ = method − vs, the mean over the samples both were run on (paired by "
                   "sample id); 95%% paired percentile-bootstrap CI (%d resamples of the samples, the "
                   "same resample for both; seed %llu; per comparison, not adjusted). ",
                B, (unsigned long long)seed);
        fprintf(f, "p: two-sided exact McNemar test on the discordant pairs (b: only the method "
                   "right, c: only vs right) for 0/1 scores, a paired sign-flip permutation test "
                   "otherwise. *: significant at %.2g after Holm–Bonferroni across this table's %d "
                   "distinct comparisons (p Holm is the adjusted p). ",
                PAIRED_ALPHA, K);
        if (bin)
            fprintf(f, "MDE: the smallest difference detectable with %.0f%% power by a two-sided "
                       "test at α = %.2g, normal approximation to McNemar's test, (z₀.₉₇₅ + z₀.₈) "
                       "√(p_d / n) with p_d = (b + c) / n the observed discordance rate. This "
                       "table at its mean p_d = %s and n = %d: **MDE = %s**.\n\n",
                    100 * PAIRED_POWER, PAIRED_ALPHA, rs, n_min, tms);
        else
            fprintf(f, "MDE: the smallest difference detectable with %.0f%% power by a two-sided "
                       "test at α = %.2g, normal approximation, (z₀.₉₇₅ + z₀.₈) sd(Δ) / √n. This "
                       "table at its mean sd(Δ) = %s and n = %d: **MDE = %s**.\n\n",
                    100 * PAIRED_POWER, PAIRED_ALPHA, rs, n_min, tms);
    } else {
        fprintf(f, "\\bottomrule\n\\end{tabular}\n\\par\\footnotesize $\\Delta$: paired mean "
                   "difference, 95\\%% paired bootstrap CI (%d resamples, seed %llu; not adjusted); "
                   "$p$: %s; "
                   "$^*$: significant at %.2g after Holm--Bonferroni over %d comparisons; MDE at "
                   "%.0f\\%% power, $\\alpha = %.2g$ two-sided, normal approximation: %s. Table: "
                   "MDE %s at %s, $n = %d$.\n\\end{table}\n\n",
                B, (unsigned long long)seed,
                bin ? "exact McNemar" : "paired sign-flip permutation test", PAIRED_ALPHA, K,
                100 * PAIRED_POWER, PAIRED_ALPHA,
                bin ? "$(z_{0.975} + z_{0.8})\\sqrt{p_d / n}$, $p_d = (b + c)/n$"
                    : "$(z_{0.975} + z_{0.8})\\,\\mathrm{sd}(\\Delta)/\\sqrt{n}$",
                tms, bin ? "mean $p_d$" : "mean sd", n_min);
        (void)rs;
    }
    free(r);
}

/* CSV (a block of its own) and JSON ("paired": [...]): every comparison of
 * every task table. Returns the rows written. */
int kvs_rpt_write_paired_long(const dataset *d, FILE *f, kvs_report_format fmt, int B,
                              uint64_t seed) {
    int written = 0;
    for (int e = 0; e < d->exps.n; e++) {
        if (strcmp(d->kinds.v[d->exp_kind[e]], "task")) continue;
        layout_t t;
        if (kvs_rpt_layout(d, e, &t, NULL)) return written;
        const int m = t.n_metrics ? t.metrics[0] : -1;
        for (int bi = 0; bi < t.n_budgets && m >= 0; bi++) {
            const int b = t.budgets[bi];
            cmp_row *r = NULL;
            const int n = paired_rows(d, e, b, &t, m, B, seed, &r);
            int bin = 0, n_min = 0;
            double rate = NAN, tm = n > 0 ? table_mde(r, n, &bin, &rate, &n_min) : NAN;
            for (int i = 0; i < n; i++) {
                const cmp_row *c = &r[i];
                const bkey *bk = &d->budgets[b];
                if (fmt == KVS_REPORT_CSV) {
                    if (written == 0)
                        fprintf(f, "\nexperiment,budget_ratio,budget_tokens,metric,variant,vs,"
                                   "vs_kind,pairs,binary,delta,ci_lo,ci_hi,b,c,p,p_holm,"
                                   "significant,mde,table_mde\n");
                    kvs_rpt_csv_field(f, d->exps.v[e]);
                    fprintf(f, ",%.12g,%lld,", bk->ratio, (long long)bk->tokens);
                    kvs_rpt_csv_field(f, d->metrics.v[m]);
                    fputc(',', f);
                    kvs_rpt_csv_field(f, d->labels.v[c->l]);
                    fputc(',', f);
                    kvs_rpt_csv_field(f, d->labels.v[c->o]);
                    fprintf(f, ",%s,%d,%d,%.12g,%.12g,%.12g,", c->vs_full ? "full" : "best_other",
                            c->n, c->binary, c->delta, c->lo, c->hi);
                    if (c->binary)
                        fprintf(f, "%lld,%lld,", (long long)c->b, (long long)c->c);
                    else
                        fprintf(f, ",,");
                    fprintf(f, "%.12g,%.12g,%d,", c->p, c->padj, c->padj <= PAIRED_ALPHA);
                    if (!isnan(c->mde)) fprintf(f, "%.12g", c->mde);
                    fputc(',', f);
                    if (!isnan(tm)) fprintf(f, "%.12g", tm);
                    fputc('\n', f);
                } else {
                    fprintf(f, "%s\n  {\"experiment\": ", written ? "," : "");
                    kvs_rpt_json_str(f, d->exps.v[e]);
                    fprintf(f, ", \"budget_ratio\": ");
                    kvs_rpt_json_num(f, bk->ratio);
                    fprintf(f, ", \"budget_tokens\": %lld, \"metric\": ", (long long)bk->tokens);
                    kvs_rpt_json_str(f, d->metrics.v[m]);
                    fprintf(f, ", \"variant\": ");
                    kvs_rpt_json_str(f, d->labels.v[c->l]);
                    fprintf(f, ", \"vs\": ");
                    kvs_rpt_json_str(f, d->labels.v[c->o]);
                    fprintf(f, ", \"vs_kind\": \"%s\", \"pairs\": %d, \"binary\": %s, \"delta\": ",
                            c->vs_full ? "full" : "best_other", c->n, c->binary ? "true" : "false");
                    kvs_rpt_json_num(f, c->delta);
                    fprintf(f, ", \"ci_lo\": ");
                    kvs_rpt_json_num(f, c->lo);
                    fprintf(f, ", \"ci_hi\": ");
                    kvs_rpt_json_num(f, c->hi);
                    if (c->binary)
                        fprintf(f, ", \"b\": %lld, \"c\": %lld", (long long)c->b, (long long)c->c);
                    fprintf(f, ", \"p\": ");
                    kvs_rpt_json_num(f, c->p);
                    fprintf(f, ", \"p_holm\": ");
                    kvs_rpt_json_num(f, c->padj);
                    fprintf(f, ", \"significant\": %s, \"mde\": ",
                            c->padj <= PAIRED_ALPHA ? "true" : "false");
                    kvs_rpt_json_num(f, c->mde);
                    fprintf(f, ", \"table_mde\": ");
                    kvs_rpt_json_num(f, tm);
                    fputc('}', f);
                }
                written++;
            }
            free(r);
        }
        kvs_rpt_layout_free(&t);
    }
    return written;
}
