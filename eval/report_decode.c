/*
 * report_decode.c -- the decode-speed study's table and plot
 * (experiments/decode.lua): decode tokens/s against kept ratio and prompt
 * length, the measured speed-up against `full` next to the speed-up
 * predicted from the bytes a decode step must read.
 *
 * What it is: SQL over the task cells decoded to a fixed length (their
 * definition says ignore_eos=1: only then are decode times comparable), one
 * row per (experiment, model, prompt-length class, budget): samples, mean
 * prompt tokens, mean kept KV, tokens/s (total tokens / total decode time),
 * the speed-up paired per prompt (rate / the rate of `full` on the same
 * prompt and mode; mean and percentile-bootstrap 95% CI) and the predicted
 * one, (W + KV_full) / (W + KV_kept) with W the weight bytes a decode step
 * reads (cells.model_bytes: the server's step_bytes, every tensor less an
 * untied embedding table; the file's size from servers that do not say) and KV the cache bytes after compression
 * (results.kv_bytes_after), averaged over the same prompts. The cache grows
 * by n_predict tokens during the decode; that is left out of both KV terms
 * (at most n_predict tokens' bytes, under 0.5% of W at n_predict 64 on the
 * study's models). Length classes: the prompt's token count rounded to the
 * nearest power of two (2K, 4K, ... for the study's doubling lengths).
 * Cache types: cells of a KV cache type other than the default f16 (the
 * " kv_cache=T" of their definition) make a table of their own per type,
 * compared with the f16 `full` on the same prompt where there is one (else
 * their own type's): speed-up and prediction then read what fewer bytes per
 * row buy (KV_full the f16 cache's bytes, KV_kept the quantised one's).
 * What it is not: no timing of its own, no other experiment's tables
 * (report.c), no statistics beyond the bootstrap CI of the speed-up.
 */
#include "kvs_eval.h"
#include "gnuplot.h"
#include "report_internal.h"

#include <errno.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    char exp[64], model[128], sample[160], cache[16]; /* cache "": the default f16 */
    int agnostic;
    int64_t n_tokens, decode_tokens, kv_after, model_bytes;
    double decode_ms, ratio;
    int64_t budget_tokens;
    int full;
} drow;

typedef struct {
    char exp[64], model[128], cache[16];
    int length_class; /* log2 of the rounded prompt length */
    double ratio;     /* 1 for full */
    int64_t budget_tokens;
    int n;
    double tokens_mean, kv_mb, tok_s, speedup, lo, hi, predicted, weights_mb;
} dgroup;

static kvs_status sql_fail(sqlite3 *db, kvs_err *err, const char *what) {
    return kvs_errorf(err, KVS_ERR_IO, "decode report: %s: %s", what, sqlite3_errmsg(db));
}

static int length_class(int64_t n) { return n > 0 ? (int)lround(log2((double)n)) : 0; }

static kvs_status gather(sqlite3 *db, const kvs_report_opts *o, drow **rows, int *n, kvs_err *err) {
    *rows = NULL;
    *n = 0;
    sqlite3_stmt *st = NULL;
    const char *sql =
        "SELECT c.experiment, coalesce(c.model, ''), c.sample_id,"
        " c.definition LIKE '%mode=query_agnostic%', c.n_tokens, r.decode_tokens, r.decode_ms,"
        " r.kv_bytes_after, coalesce(c.model_bytes, 0), c.budget_ratio, c.budget_tokens,"
        " c.method = 'full', " KVS_RPT_SQL_KV_CACHE " FROM cells c JOIN results r ON r.cell_key = c.key"
        " WHERE c.kind = 'task' AND c.definition LIKE '%ignore_eos=1%'"
        " AND (?1 IS NULL OR c.experiment = ?1) AND (?2 <= 0 OR r.run_id = ?2)"
        " ORDER BY c.experiment, c.model, c.sample_id, c.key";
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
        return sql_fail(db, err, "preparing the query");
    if (o->experiment)
        sqlite3_bind_text(st, 1, o->experiment, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 1);
    sqlite3_bind_int64(st, 2, o->run_id);
    int cap = 0, r;
    kvs_status rc = KVS_OK;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        if (*n == cap) {
            int nc = cap ? 2 * cap : 256;
            drow *p = realloc(*rows, sizeof *p * (size_t)nc);
            if (!p) {
                rc = kvs_errorf(err, KVS_ERR_NOMEM, "decode report: out of memory");
                break;
            }
            *rows = p;
            cap = nc;
        }
        drow *d = &(*rows)[(*n)++];
        memset(d, 0, sizeof *d);
        snprintf(d->exp, sizeof d->exp, "%s", (const char *)sqlite3_column_text(st, 0));
        snprintf(d->model, sizeof d->model, "%s", (const char *)sqlite3_column_text(st, 1));
        snprintf(d->sample, sizeof d->sample, "%s", (const char *)sqlite3_column_text(st, 2));
        d->agnostic = sqlite3_column_int(st, 3);
        d->n_tokens = sqlite3_column_int64(st, 4);
        d->decode_tokens = sqlite3_column_int64(st, 5);
        d->decode_ms = sqlite3_column_double(st, 6);
        d->kv_after = sqlite3_column_int64(st, 7);
        d->model_bytes = sqlite3_column_int64(st, 8);
        d->ratio = sqlite3_column_double(st, 9);
        d->budget_tokens = sqlite3_column_int64(st, 10);
        d->full = sqlite3_column_int(st, 11);
        const char *kv = (const char *)sqlite3_column_text(st, 12);
        snprintf(d->cache, sizeof d->cache, "%s", kv ? kv : "");
    }
    if (!rc && r != SQLITE_DONE) rc = sql_fail(db, err, "reading cells");
    sqlite3_finalize(st);
    if (rc) {
        free(*rows);
        *rows = NULL;
        *n = 0;
    }
    return rc;
}

/* The `full` of x's prompt: of the default cache type, else of x's own. */
static const drow *full_of(const drow *rows, int n, const drow *x) {
    const drow *own = NULL;
    for (int i = 0; i < n; i++)
        if (rows[i].full && !strcmp(rows[i].exp, x->exp) && !strcmp(rows[i].model, x->model) &&
            !strcmp(rows[i].sample, x->sample) && rows[i].agnostic == x->agnostic) {
            if (!rows[i].cache[0]) return &rows[i];
            if (!own && !strcmp(rows[i].cache, x->cache)) own = &rows[i];
        }
    return own;
}

static int same_group(const dgroup *g, const drow *x, int lc) {
    double ratio = x->full ? 1.0 : x->ratio;
    int64_t bt = x->full ? 0 : x->budget_tokens;
    return !strcmp(g->exp, x->exp) && !strcmp(g->model, x->model) && !strcmp(g->cache, x->cache) &&
           g->length_class == lc && g->ratio == ratio && g->budget_tokens == bt;
}

static int cmp_group(const void *a, const void *b) {
    const dgroup *x = a, *y = b;
    int c = strcmp(x->exp, y->exp);
    if (!c) c = strcmp(x->model, y->model);
    if (!c) c = strcmp(x->cache, y->cache); /* "" (f16) first: a table per cache type */
    if (!c) c = (x->length_class > y->length_class) - (x->length_class < y->length_class);
    if (!c) c = (x->budget_tokens > y->budget_tokens) - (x->budget_tokens < y->budget_tokens);
    if (!c) c = (x->ratio < y->ratio) - (x->ratio > y->ratio); /* 1 first, then smaller */
    return c;
}

/* Rows -> groups. A row without its `full` on the same prompt, or without a
 * decode time, takes no part (it has nothing to be compared with). */
static kvs_status compute(const drow *rows, int n, const kvs_report_opts *o, dgroup **out,
                          int *n_out, kvs_err *err) {
    *out = NULL;
    *n_out = 0;
    if (n == 0) return KVS_OK;
    dgroup *g = calloc((size_t)n, sizeof *g);
    int *member = malloc(sizeof *member * (size_t)n);
    double *s = malloc(sizeof *s * (size_t)n);
    if (!g || !member || !s) {
        free(g), free(member), free(s);
        return kvs_errorf(err, KVS_ERR_NOMEM, "decode report: out of memory");
    }
    int ng = 0;
    for (int i = 0; i < n; i++) {
        const drow *x = &rows[i];
        const drow *f = full_of(rows, n, x);
        member[i] = -1;
        if (!f || !(x->decode_ms > 0) || x->decode_tokens <= 0 || !(f->decode_ms > 0) ||
            f->decode_tokens <= 0)
            continue;
        int lc = length_class(f->n_tokens);
        int k = 0;
        while (k < ng && !same_group(&g[k], x, lc)) k++;
        if (k == ng) {
            dgroup *y = &g[ng++];
            snprintf(y->exp, sizeof y->exp, "%s", x->exp);
            snprintf(y->model, sizeof y->model, "%s", x->model);
            snprintf(y->cache, sizeof y->cache, "%s", x->cache);
            y->length_class = lc;
            y->ratio = x->full ? 1.0 : x->ratio;
            y->budget_tokens = x->full ? 0 : x->budget_tokens;
        }
        member[i] = k;
    }
    int B = o->bootstrap > 0 ? o->bootstrap : 1000;
    uint64_t seed = o->seed ? o->seed : 20260;
    for (int k = 0; k < ng; k++) {
        dgroup *y = &g[k];
        int m = 0;
        double tok = 0, ms = 0, ntok = 0, kv = 0, pred = 0, w = 0;
        int have_w = 1;
        for (int i = 0; i < n; i++) {
            if (member[i] != k) continue;
            const drow *x = &rows[i], *f = full_of(rows, n, x);
            double rate = 1e3 * (double)x->decode_tokens / x->decode_ms;
            double frate = 1e3 * (double)f->decode_tokens / f->decode_ms;
            s[m++] = rate / frate;
            tok += (double)x->decode_tokens;
            ms += x->decode_ms;
            ntok += (double)x->n_tokens;
            kv += (double)x->kv_after;
            if (x->model_bytes > 0) {
                double W = (double)x->model_bytes;
                pred += (W + (double)f->kv_after) / (W + (double)x->kv_after);
                w += W;
            } else {
                have_w = 0;
            }
        }
        y->n = m;
        y->tokens_mean = ntok / m;
        y->kv_mb = kv / m / (1024.0 * 1024.0);
        y->tok_s = 1e3 * tok / ms;
        kvs_bootstrap_ci(s, m, B, seed, &y->speedup, &y->lo, &y->hi);
        y->predicted = have_w ? pred / m : NAN;
        y->weights_mb = have_w ? w / m / (1024.0 * 1024.0) : NAN;
    }
    qsort(g, (size_t)ng, sizeof *g, cmp_group);
    free(member);
    free(s);
    *out = g;
    *n_out = ng;
    return KVS_OK;
}

static void fmt(double v, const char *f, char *out, size_t n) {
    if (isnan(v))
        snprintf(out, n, "-");
    else
        snprintf(out, n, f, v);
}

static void budget_name(const dgroup *g, char *out, size_t n) {
    if (g->budget_tokens > 0)
        snprintf(out, n, "%lld tok", (long long)g->budget_tokens);
    else if (g->ratio == 1.0)
        snprintf(out, n, "1 (full)");
    else
        snprintf(out, n, "%g", g->ratio);
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", *s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double v) {
    if (isnan(v) || isinf(v))
        fprintf(f, "null");
    else
        fprintf(f, "%.17g", v);
}

static void write_groups(const dgroup *g, int ng, FILE *f, kvs_report_format fmtk) {
    if (fmtk == KVS_REPORT_JSON) {
        fprintf(f, ", \"decode\": [");
        for (int k = 0; k < ng; k++) {
            const dgroup *y = &g[k];
            fprintf(f, "%s\n  {\"experiment\": ", k ? "," : "");
            json_str(f, y->exp);
            fprintf(f, ", \"model\": ");
            json_str(f, y->model);
            fprintf(f, ", \"cache_type\": ");
            json_str(f, y->cache[0] ? y->cache : "f16");
            fprintf(f, ", \"length_class\": %d, \"prompt_tokens\": ", 1 << y->length_class);
            json_num(f, y->tokens_mean);
            fprintf(f, ", \"budget_ratio\": ");
            json_num(f, y->ratio);
            fprintf(f, ", \"budget_tokens\": %lld, \"n\": %d, \"kv_kept_mb\": ",
                    (long long)y->budget_tokens, y->n);
            json_num(f, y->kv_mb);
            fprintf(f, ", \"weights_mb\": ");
            json_num(f, y->weights_mb);
            fprintf(f, ", \"decode_tok_s\": ");
            json_num(f, y->tok_s);
            fprintf(f, ", \"speedup\": ");
            json_num(f, y->speedup);
            fprintf(f, ", \"speedup_lo\": ");
            json_num(f, y->lo);
            fprintf(f, ", \"speedup_hi\": ");
            json_num(f, y->hi);
            fprintf(f, ", \"speedup_predicted\": ");
            json_num(f, y->predicted);
            fputc('}', f);
        }
        fprintf(f, "\n]");
        return;
    }
    int md = fmtk == KVS_REPORT_MD;
    for (int k = 0; k < ng; k++) {
        const dgroup *y = &g[k];
        int head = k == 0 || strcmp(g[k - 1].exp, y->exp) || strcmp(g[k - 1].model, y->model) ||
                   strcmp(g[k - 1].cache, y->cache);
        if (head) {
            if (k && !md) fprintf(f, "\\bottomrule\n\\end{tabular}\n\\end{table}\n\n");
            char wb[32], ct[40] = "";
            fmt(y->weights_mb, "%.1f", wb, sizeof wb);
            if (y->cache[0]) snprintf(ct, sizeof ct, "KV cache %s; ", y->cache);
            if (md)
                fprintf(f, "## decode speed: %s (%s; %sweights %s MiB)\n\n"
                           "| prompt | tokens | kept | n | KV kept MiB | decode tok/s | speed-up "
                           "[95%% CI] | predicted | measured / predicted |\n"
                           "|---|---|---|---|---|---|---|---|---|\n",
                        y->exp, y->model, ct, wb);
            else
                fprintf(f, "%% decode speed: %s (%s; %sweights %s MiB)\n\\begin{table}[t]\n"
                           "\\centering\n\\begin{tabular}{rrrrrrrrr}\n\\toprule\nprompt & tokens & "
                           "kept & n & KV MiB & tok/s & speed-up & predicted & meas./pred. \\\\\n"
                           "\\midrule\n",
                        y->exp, y->model, ct, wb);
        }
        char bn[32], tk[32], kv[32], ts[32], sp[64], pr[32], rt[32];
        budget_name(y, bn, sizeof bn);
        fmt(y->tokens_mean, "%.0f", tk, sizeof tk);
        fmt(y->kv_mb, "%.2f", kv, sizeof kv);
        fmt(y->tok_s, "%.1f", ts, sizeof ts);
        snprintf(sp, sizeof sp, "%.3f [%.3f, %.3f]", y->speedup, y->lo, y->hi);
        fmt(y->predicted, "%.3f", pr, sizeof pr);
        fmt(isnan(y->predicted) ? NAN : y->speedup / y->predicted, "%.3f", rt, sizeof rt);
        int len = 1 << y->length_class;
        char lab[16];
        if (len >= 1024)
            snprintf(lab, sizeof lab, "%dK", len / 1024);
        else
            snprintf(lab, sizeof lab, "%d", len);
        if (md)
            fprintf(f, "| %s | %s | %s | %d | %s | %s | %s | %s | %s |\n", lab, tk, bn, y->n, kv, ts,
                    sp, pr, rt);
        else
            fprintf(f, "%s & %s & %s & %d & %s & %s & %s & %s & %s \\\\\n", lab, tk, bn, y->n, kv,
                    ts, sp, pr, rt);
        int last = k == ng - 1 || strcmp(g[k + 1].exp, y->exp) || strcmp(g[k + 1].model, y->model) ||
                   strcmp(g[k + 1].cache, y->cache);
        if (last && md)
            fprintf(f, "\nDecode tok/s: tokens / decode time (each variant decoded alone, exactly "
                       "n_predict tokens). Speed-up: rate / the rate of `full` on the same prompt, "
                       "mean [95%% percentile-bootstrap CI] over prompts. Predicted: (W + KV_full) / "
                       "(W + KV_kept), the bytes a decode step reads (W: the weights a step reads, the server's step_bytes: "
                       "every tensor less an untied embedding table).%s\n\n",
                    y->cache[0] ? " Against the f16 cache's `full` where the prompt has one: KV_full is "
                                  "its bytes, KV_kept this cache type's." : "");
    }
    if (ng > 0 && !md) fprintf(f, "\\bottomrule\n\\end{tabular}\n\\end{table}\n\n");
}

kvs_status kvs_report_decode(kvs_store *s, const kvs_report_opts *o, FILE *f, int *n_rows,
                             kvs_err *err) {
    drow *rows = NULL;
    dgroup *g = NULL;
    int n = 0, ng = 0;
    if (n_rows) *n_rows = 0;
    kvs_status rc = gather(kvs_store_db(s), o, &rows, &n, err);
    if (!rc) rc = compute(rows, n, o, &g, &ng, err);
    if (!rc && ng > 0 && o->format != KVS_REPORT_CSV) write_groups(g, ng, f, o->format);
    if (!rc && n_rows) *n_rows = ng;
    if (!rc && ferror(f)) rc = kvs_errorf(err, KVS_ERR_IO, "decode report: write failed");
    free(rows);
    free(g);
    return rc;
}

/* ---- plot ------------------------------------------------------------------------------------ */

/* One plot: speed-up (measured with CI, and predicted) vs kept ratio, a
 * pair of lines per length class, of the groups [a, b) (one experiment and
 * cache type). */
static kvs_status plot_one(const dgroup *g, int a, int b, const char *out, int png, kvs_err *err) {
    /* gnuplot reads the script from a pipe; the data are inline blocks */
    FILE *p = popen("gnuplot 1>&2", "w");
    if (!p) return kvs_errorf(err, KVS_ERR_IO, "decode plot: cannot start gnuplot: %s", strerror(errno));
    fprintf(p, "set terminal %s size 900,560\nset output ", png ? "png" : "svg");
    kvs_gp_quote(p, out);
    char title[300];
    snprintf(title, sizeof title, "decode speed-up vs kept ratio: %s (%s%s%s)", g[a].exp, g[a].model,
             g[a].cache[0] ? ", KV cache " : "", g[a].cache);
    fprintf(p, "\nset grid\nset key outside right\nset title ");
    kvs_gp_quote(p, title);
    fprintf(p, " noenhanced\nset xlabel 'kept ratio'\nset ylabel 'decode speed-up vs full'\n"
               "set xrange [0:1.05]\n");
    int classes[64], nc = 0;
    for (int k = a; k < b; k++) {
        if (g[k].budget_tokens > 0) continue;
        int seen = 0;
        for (int c = 0; c < nc; c++) seen |= classes[c] == g[k].length_class;
        if (!seen && nc < 64) classes[nc++] = g[k].length_class;
    }
    for (int c = 0; c < nc; c++) { /* $d<c>: ratio, measured, lo, hi, predicted */
        fprintf(p, "$d%d << EOD\n", c);
        for (int k = a; k < b; k++)
            if (g[k].length_class == classes[c] && g[k].budget_tokens == 0)
                fprintf(p, "%.17g %.17g %.17g %.17g %.17g\n", g[k].ratio, g[k].speedup, g[k].lo,
                        g[k].hi, g[k].predicted); /* "nan": a gap */
        fprintf(p, "EOD\n");
    }
    fprintf(p, "plot ");
    for (int c = 0; c < nc; c++) {
        int len = 1 << classes[c];
        char lab[32];
        snprintf(lab, sizeof lab, len >= 1024 ? "%dK" : "%d", len >= 1024 ? len / 1024 : len);
        fprintf(p, "%s$d%d using 1:2:3:4 with yerrorlines lc %d title '%s measured', "
                   "$d%d using 1:5 with lines dt 2 lc %d title '%s predicted'",
                c ? ", " : "", c, c + 1, lab, c, c + 1, lab);
    }
    fprintf(p, "\n");
    int st = pclose(p);
    struct stat sb;
    if (st != 0 || stat(out, &sb) != 0 || sb.st_size == 0)
        return kvs_errorf(err, KVS_ERR_IO, "decode plot: gnuplot failed writing %s (status %d)", out,
                          st);
    return KVS_OK;
}

kvs_status kvs_report_decode_plot(kvs_store *s, const kvs_report_opts *o, const char *path,
                                  int *n_files, kvs_err *err) {
    if (n_files) *n_files = 0;
    size_t pl = strlen(path);
    int png = pl > 4 && !strcmp(path + pl - 4, ".png");
    if (!png && !(pl > 4 && !strcmp(path + pl - 4, ".svg")))
        return kvs_errorf(err, KVS_ERR_INVALID, "--plot %s: the file must end in .svg or .png", path);
    drow *rows = NULL;
    dgroup *g = NULL;
    int n = 0, ng = 0;
    kvs_status rc = gather(kvs_store_db(s), o, &rows, &n, err);
    if (!rc) rc = compute(rows, n, o, &g, &ng, err);
    if (!rc && ng > 0 && !kvs_gp_on_path("gnuplot"))
        rc = kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                        "--plot: gnuplot is not installed (Debian: apt-get install gnuplot-nox)");
    for (int a = 0; !rc && a < ng;) {
        int b = a + 1;
        while (b < ng && !strcmp(g[b].exp, g[a].exp) && !strcmp(g[b].model, g[a].model) &&
               !strcmp(g[b].cache, g[a].cache))
            b++;
        char out[1400];
        snprintf(out, sizeof out, "%.*s-%s%s%s%s", (int)(pl - 4), path, g[a].exp, g[a].cache[0] ? "-" : "",
                 g[a].cache, path + pl - 4);
        rc = plot_one(g, a, b, out, png, err);
        if (!rc && n_files) (*n_files)++;
        a = b;
    }
    free(rows);
    free(g);
    return rc;
}
