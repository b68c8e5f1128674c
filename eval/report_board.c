/*
 * report_board.c -- `kvsieve report --board DIR`: the leaderboard files of
 * one task experiment (experiments/leaderboard.lua) in a folder:
 *   scores.csv       one row per (method variant, setting, kept ratio, task
 *                    or "average"): n, mean, 95% bootstrap CI, KV kept,
 *                    compress time, decode rate
 *   summary.md       the average per method x kept ratio per setting (best
 *                    compressed value of each column in bold), the per-task
 *                    table at the ratio nearest 0.25, the paired comparisons
 *                    (vs full, vs the best other; Holm-adjusted p, MDE), the
 *                    power of the board (MDE of the average, the n an MDE of
 *                    0.05 needs), FlashCache's paper claims
 *   leaderboard.svg  average vs kept ratio, one line per method, one panel
 *                    per setting (report_svg.c)
 *   tasks.svg        method x task heat map at the ratio nearest 0.25
 *   provenance.json  runs, command, revisions, machine, model hashes,
 *                    dataset version, counts, wall time and its shares
 * Everything comes from the database, deterministically (seeded bootstraps),
 * so the files are golden-testable.
 * What it is not: no running, no gathering of scores (report_data.c), no
 * statistics of its own (stats.c), no board shape (report_board_data.c), no
 * drawing (report_svg.c), no provenance SQL (report_prov.c).
 */
#include "kvs_eval.h"
#include "report_internal.h"

#include <errno.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define BOARD_ALPHA 0.05
#define BOARD_POWER 0.8
#define BOARD_TARGET_MDE 0.05

static int find_name(const names *t, const char *s) {
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->v[i], s)) return i;
    return -1;
}

/* ---- pairing --------------------------------------------------------------------- */

/* Values of groups ga, gb paired by sample, keeping samples whose id starts
 * with prefix (NULL: all): x[i], y[i], i < returned n. */
static int pair_groups(const dataset *d, const group *ga, const group *gb, const char *prefix,
                       double *x, double *y) {
    int n = 0;
    for (int i = 0; i < ga->n; i++) {
        const char *sid = d->samples.v.v[ga->sid[i]];
        if (prefix && strncmp(sid, prefix, strlen(prefix)) != 0) continue;
        for (int j = 0; j < gb->n; j++)
            if (gb->sid[j] == ga->sid[i]) {
                x[n] = ga->x[i];
                y[n] = gb->x[j];
                n++;
                break;
            }
    }
    return n;
}

typedef struct {
    int n;
    double delta, lo, hi, p, sd;
} paired;

static paired compare(const dataset *d, int ga, int gb, const char *prefix, int B, uint64_t seed) {
    paired r = {0, NAN, NAN, NAN, NAN, NAN};
    if (ga < 0 || gb < 0) return r;
    const int cap = d->g[ga].n > 0 ? d->g[ga].n : 1;
    double *x = malloc(sizeof *x * (size_t)cap), *y = malloc(sizeof *y * (size_t)cap);
    double *dd = malloc(sizeof *dd * (size_t)cap);
    if (!x || !y || !dd) {
        free(x), free(y), free(dd);
        return r;
    }
    r.n = pair_groups(d, &d->g[ga], &d->g[gb], prefix, x, y);
    if (r.n > 0) {
        int binary = 1;
        int64_t b = 0, c = 0;
        double mean = 0, ss = 0;
        for (int i = 0; i < r.n; i++) {
            binary &= (x[i] == 0 || x[i] == 1) && (y[i] == 0 || y[i] == 1);
            b += x[i] > y[i], c += x[i] < y[i];
            dd[i] = x[i] - y[i];
            mean += dd[i];
        }
        mean /= r.n;
        for (int i = 0; i < r.n; i++) ss += (dd[i] - mean) * (dd[i] - mean);
        r.sd = r.n > 1 ? sqrt(ss / (r.n - 1)) : NAN;
        kvs_paired_bootstrap_ci(x, y, r.n, B, seed, &r.delta, &r.lo, &r.hi);
        r.p = binary ? kvs_mcnemar_exact_p(b, c) : kvs_signflip_p(dd, r.n, B < 1000 ? 1000 : B, seed ^ 0x5bd1e995ULL);
    }
    free(x), free(y), free(dd);
    return r;
}

/* ---- scores.csv ------------------------------------------------------------------ */

static double group_mean(const board *bd, int l, int b, const char *metric) {
    const int m = find_name(&bd->d->metrics, metric);
    const int g = m >= 0 ? kvs_rpt_board_group(bd, l, b, m) : -1;
    return g >= 0 ? bd->d->g[g].mean : NAN;
}

static void csv_num(FILE *f, double v) {
    if (!isnan(v)) fprintf(f, "%.6g", v);
}

static void csv_row(const board *bd, const board_meta *mt, int l, int b, int m, const char *task, FILE *f) {
    const dataset *d = bd->d;
    const int g = kvs_rpt_board_group(bd, l, b, m);
    if (g < 0) return;
    char name[200], set[32];
    kvs_rpt_board_name(d->labels.v[l], name, sizeof name);
    kvs_rpt_board_setting(d->labels.v[l], set, sizeof set);
    kvs_rpt_csv_field(f, mt->model);
    fputc(',', f);
    kvs_rpt_csv_field(f, d->methods.v[d->label_method[l]]);
    fputc(',', f);
    kvs_rpt_csv_field(f, name);
    fputc(',', f);
    kvs_rpt_csv_field(f, kvs_rpt_board_params(mt, d->labels.v[l]));
    fprintf(f, ",%s,%.6g,%s,%d,%.6g,%.6g,%.6g,", set, d->budgets[b].ratio, task, d->g[g].n,
            d->g[g].mean, d->g[g].lo, d->g[g].hi);
    csv_num(f, group_mean(bd, l, b, "kv_kept_mb"));
    fputc(',', f);
    csv_num(f, group_mean(bd, l, b, "compress_ms"));
    fputc(',', f);
    csv_num(f, group_mean(bd, l, b, "decode_tok_s"));
    fputc('\n', f);
}

static void write_csv(const board *bd, const board_meta *mt, FILE *f) {
    fprintf(f, "model,method,variant,params,setting,kept_ratio,task,n,mean,ci_lo,ci_hi,kv_kept_mb,"
               "compress_ms,decode_tok_s\n");
    for (int s = 0; s < bd->n_set; s++)
        for (int i = 0; i < bd->n_rows[s]; i++) {
            const int l = bd->rows[s][i];
            const int full = kvs_rpt_is_full(bd->d, l);
            const int nb = full ? 1 : bd->n_budgets;
            for (int k = 0; k < nb; k++) {
                const int b = full ? bd->full_b : bd->budgets[k];
                if (b < 0) continue;
                csv_row(bd, mt, l, b, bd->m_avg, "average", f);
                for (int t = 0; t < bd->n_tasks; t++)
                    csv_row(bd, mt, l, b, bd->tasks[t], bd->d->metrics.v[bd->tasks[t]], f);
            }
        }
}

/* ---- summary.md ------------------------------------------------------------------ */

static void cell_text(const board *bd, int g, char *out, size_t n) {
    if (g < 0) {
        snprintf(out, n, "-");
        return;
    }
    const group *x = &bd->d->g[g];
    snprintf(out, n, "%.3f [%.3f, %.3f]", x->mean, x->lo, x->hi);
}

static void write_average_table(const board *bd, int s, FILE *f) {
    const dataset *d = bd->d;
    fprintf(f, "### RULER average, %s\n\n| method |", bd->set[s]);
    for (int k = 0; k < bd->n_budgets; k++) fprintf(f, " kept %g |", d->budgets[bd->budgets[k]].ratio);
    fprintf(f, "\n|---|");
    for (int k = 0; k < bd->n_budgets; k++) fprintf(f, "---:|");
    fputc('\n', f);
    for (int i = 0; i < bd->n_rows[s]; i++) {
        const int l = bd->rows[s][i];
        char name[200];
        kvs_rpt_board_name(d->labels.v[l], name, sizeof name);
        fprintf(f, "| %s |", name);
        for (int k = 0; k < bd->n_budgets; k++) {
            const int b = bd->budgets[k];
            const int g = kvs_rpt_board_group(bd, l, b, bd->m_avg);
            char txt[80];
            cell_text(bd, g, txt, sizeof txt);
            /* best compressed mean of the column within this setting */
            double best = NAN;
            for (int j = 0; j < bd->n_rows[s]; j++) {
                const int o = bd->rows[s][j];
                if (kvs_rpt_is_full(d, o)) continue;
                const int go = kvs_rpt_find_group(d, bd->e, b, o, bd->m_avg);
                if (go >= 0 && (isnan(best) || d->g[go].mean > best)) best = d->g[go].mean;
            }
            const int bold = g >= 0 && !kvs_rpt_is_full(d, l) && d->g[g].mean == best;
            fprintf(f, " %s%s%s |", bold ? "**" : "", txt, bold ? "**" : "");
        }
        fputc('\n', f);
    }
    fputc('\n', f);
}

static void write_task_table(const board *bd, int s, FILE *f) {
    const dataset *d = bd->d;
    if (bd->b_task < 0 || bd->n_tasks == 0) return;
    fprintf(f, "### Per task at kept %g, %s\n\n| method |", d->budgets[bd->b_task].ratio, bd->set[s]);
    for (int t = 0; t < bd->n_tasks; t++) fprintf(f, " %s |", d->metrics.v[bd->tasks[t]]);
    fprintf(f, "\n|---|");
    for (int t = 0; t < bd->n_tasks; t++) fprintf(f, "---:|");
    fputc('\n', f);
    for (int i = 0; i < bd->n_rows[s]; i++) {
        const int l = bd->rows[s][i];
        char name[200];
        kvs_rpt_board_name(d->labels.v[l], name, sizeof name);
        fprintf(f, "| %s |", name);
        for (int t = 0; t < bd->n_tasks; t++) {
            const int g = kvs_rpt_board_group(bd, l, bd->b_task, bd->tasks[t]);
            if (g < 0)
                fprintf(f, " - |");
            else
                fprintf(f, " %.2f |", d->g[g].mean);
        }
        fputc('\n', f);
    }
    fprintf(f, "\n(means over the task's samples; their CIs are in scores.csv)\n\n");
}

/* The board's power: per setting, the sd of the paired differences of the
 * average against full over every compressed variant and ratio (median over
 * those with sd > 0), the MDE it gives at the board's n and the n an MDE of
 * 0.05 needs. */
static void write_power(const board *bd, const kvs_report_opts *o, FILE *f) {
    const dataset *d = bd->d;
    const double z = kvs_power_z(BOARD_ALPHA, BOARD_POWER);
    fprintf(f, "## Power\n\n");
    fprintf(f, "| setting | comparisons | pairs n | median sd(Δ) | MDE at n | n for MDE %.2f | per task |\n"
               "|---|---:|---:|---:|---:|---:|---:|\n", BOARD_TARGET_MDE);
    for (int s = 0; s < bd->n_set; s++) {
        int cap = bd->n_rows[s] * (bd->n_budgets + 1) + 1, k = 0, nmin = 0;
        double *sds = malloc(sizeof *sds * (size_t)cap);
        if (!sds) return;
        int full = -1;
        for (int i = 0; i < bd->n_rows[s]; i++)
            if (kvs_rpt_is_full(d, bd->rows[s][i])) full = bd->rows[s][i];
        for (int i = 0; i < bd->n_rows[s] && full >= 0; i++) {
            const int l = bd->rows[s][i];
            if (l == full) continue;
            for (int j = 0; j < bd->n_budgets; j++) {
                const int b = bd->budgets[j];
                paired p = compare(d, kvs_rpt_find_group(d, bd->e, b, l, bd->m_avg),
                                   kvs_rpt_board_group(bd, full, b, bd->m_avg), NULL, 2, o->seed);
                if (p.n > 1 && p.sd > 0) {
                    sds[k++] = p.sd;
                    if (nmin == 0 || p.n < nmin) nmin = p.n;
                }
            }
        }
        for (int i = 1; i < k; i++) /* sort for the median */
            for (int j = i; j > 0 && sds[j - 1] > sds[j]; j--) {
                double t = sds[j];
                sds[j] = sds[j - 1];
                sds[j - 1] = t;
            }
        if (k == 0) {
            fprintf(f, "| %s | 0 | - | - | - | - | - |\n", bd->set[s]);
        } else {
            const double sd = k % 2 ? sds[k / 2] : 0.5 * (sds[k / 2 - 1] + sds[k / 2]);
            const double mde = kvs_mde_paired_mean(nmin, sd, BOARD_ALPHA, BOARD_POWER);
            const double need = ceil((z * sd / BOARD_TARGET_MDE) * (z * sd / BOARD_TARGET_MDE));
            const int nt = bd->n_tasks > 0 ? bd->n_tasks : 1;
            fprintf(f, "| %s | %d | %d | %.3f | %.3f | %.0f | %.0f |\n", bd->set[s], k, nmin, sd, mde, need,
                    ceil(need / nt));
        }
        free(sds);
    }
    fprintf(f, "\nsd(Δ): the standard deviation over samples of a variant's score minus full's on the "
               "same sample (the RULER average's per-sample score), for every compressed variant and "
               "kept ratio that differs from full somewhere; the median of those. MDE = (z₀.₉₇₅ + "
               "z₀.₈) sd(Δ) / √n (%.0f%% power, two-sided α = %.2g, normal approximation); n for an "
               "MDE of %.2f = ((z₀.₉₇₅ + z₀.₈) sd(Δ) / %.2f)², and per task that over the %d tasks.\n\n",
            100 * BOARD_POWER, BOARD_ALPHA, BOARD_TARGET_MDE, BOARD_TARGET_MDE, bd->n_tasks);
}

static int label_of(const board *bd, int s, const char *method) {
    for (int i = 0; i < bd->n_rows[s]; i++) {
        const int l = bd->rows[s][i];
        if (!strcmp(bd->d->methods.v[bd->d->label_method[l]], method)) return l;
    }
    return -1;
}

static void verdict(const paired *p, char *out, size_t n) {
    if (p->n == 0 || isnan(p->p))
        snprintf(out, n, "no pairs");
    else if (p->p < BOARD_ALPHA)
        snprintf(out, n, "%s (p < %.2g)", p->delta > 0 ? "FlashCache better" : "FlashCache worse", BOARD_ALPHA);
    else
        snprintf(out, n, "no detectable difference");
}

/* FlashCache's claims (better than SnapKV and H2O, near full) at the kept
 * ratio nearest its paper's 0.2, on the needle tasks and on the average. */
static void write_claims(const board *bd, const kvs_report_opts *o, FILE *f) {
    const dataset *d = bd->d;
    int b = -1;
    for (int i = 0; i < bd->n_budgets; i++)
        if (b < 0 || fabs(d->budgets[bd->budgets[i]].ratio - 0.2) < fabs(d->budgets[b].ratio - 0.2))
            b = bd->budgets[i];
    if (b < 0) return;
    int any = 0;
    for (int s = 0; s < bd->n_set; s++) any |= label_of(bd, s, "flashcache") >= 0;
    if (!any) return;
    fprintf(f, "## FlashCache's claims at kept %g\n\n"
               "| setting | vs | samples | n | Δ FlashCache − vs [95%% CI] | p | verdict |\n"
               "|---|---|---|---:|---:|---:|---|\n", d->budgets[b].ratio);
    static const char *const vs[] = {"full", "snapkv", "h2o"};
    static const char *const subsets[2] = {"niah", NULL};
    for (int s = 0; s < bd->n_set; s++) {
        const int fc = label_of(bd, s, "flashcache");
        if (fc < 0) continue;
        for (int v = 0; v < 3; v++) {
            const int ol = label_of(bd, s, vs[v]);
            if (ol < 0) continue;
            for (int k = 0; k < 2; k++) {
                paired p = compare(d, kvs_rpt_find_group(d, bd->e, b, fc, bd->m_avg),
                                   kvs_rpt_board_group(bd, ol, b, bd->m_avg), subsets[k], o->bootstrap,
                                   o->seed ^ (uint64_t)(31 * v + k + 1));
                if (p.n == 0) continue;
                char pv[32], vd[64];
                if (p.p < 1e-4)
                    snprintf(pv, sizeof pv, "%.1e", p.p);
                else
                    snprintf(pv, sizeof pv, "%.4f", p.p);
                verdict(&p, vd, sizeof vd);
                fprintf(f, "| %s | %s | %s | %d | %+.3f [%+.3f, %+.3f] | %s | %s |\n", bd->set[s], vs[v],
                        k == 0 ? "needle tasks (niah_*)" : "all (the average)", p.n, p.delta, p.lo, p.hi,
                        pv, vd);
            }
        }
    }
    fprintf(f, "\nThe paper (FlashCache) reports it keeps full's accuracy and beats SnapKV and H2O at a "
               "20%% budget. Paired by sample; p: exact McNemar test when every score is 0 or 1, else "
               "a paired sign-flip permutation test; not adjusted for the %d comparisons of this table. "
               "\"No detectable difference\" is not evidence of equality: see the MDE above.\n\n",
            6 * bd->n_set);
}

static void write_summary(const board *bd, const board_meta *mt, const kvs_report_opts *o, FILE *f) {
    const dataset *d = bd->d;
    fprintf(f, "# Leaderboard: %s\n\n", d->exps.v[bd->e]);
    const char *hash = strncmp(mt->model_hash, "sha256:", 7) ? mt->model_hash : mt->model_hash + 7;
    fprintf(f, "Model: %s (file sha256 %.16s…). Dataset: %s, version %s. ", mt->model, hash, mt->dataset,
            mt->dataset_version);
    int n_methods = 0;
    for (int i = 0; i < bd->n_rows[0]; i++) n_methods++;
    fprintf(f, "%d tasks, %d samples in all (per task:", bd->n_tasks, mt->n_samples);
    for (int t = 0; t < bd->n_tasks; t++) {
        const int g = kvs_rpt_board_group(bd, bd->rows[0][0], bd->full_b >= 0 ? bd->full_b : bd->budgets[0],
                                           bd->tasks[t]);
        fprintf(f, "%s %s %d", t ? "," : "", d->metrics.v[bd->tasks[t]], g >= 0 ? d->g[g].n : 0);
    }
    fprintf(f, "); %d method variants per setting, kept ratios", n_methods);
    for (int k = 0; k < bd->n_budgets; k++) fprintf(f, "%s %g", k ? "," : "", d->budgets[bd->budgets[k]].ratio);
    fprintf(f, " (and full); settings:");
    for (int s = 0; s < bd->n_set; s++) fprintf(f, "%s %s", s ? "," : "", bd->set[s]);
    fprintf(f, ". %lld cells.\n\n", (long long)mt->n_cells);
    if (mt->note[0]) fprintf(f, "%s\n\n", mt->note);
    fprintf(f, "Scores: RULER's metric per sample (string_match_all for NIAH, VT, CWE, FWE; "
               "string_match_part for QA); the average is over all samples (RULER's average over the "
               "tasks when every task has the same n). Cells: mean [95%% percentile-bootstrap CI, %d "
               "resamples, seed %llu]; the best compressed value of each column in bold; `full` keeps "
               "everything (the same value in every column). Plot: leaderboard.svg; heat map: "
               "tasks.svg; every number: scores.csv; how it was made: provenance.json.\n\n",
            o->bootstrap, (unsigned long long)o->seed);
    for (int s = 0; s < bd->n_set; s++) write_average_table(bd, s, f);
    for (int s = 0; s < bd->n_set; s++) write_task_table(bd, s, f);
    write_power(bd, o, f);
    write_claims(bd, o, f);
    fprintf(f, "## Paired comparisons\n\n");
    layout_t t;
    if (kvs_rpt_layout(d, bd->e, &t, NULL) == KVS_OK) {
        for (int k = 0; k < bd->n_budgets; k++)
            kvs_rpt_write_paired(d, bd->e, bd->budgets[k], &t, bd->m_avg, f, KVS_REPORT_MD, o->bootstrap,
                                 o->seed);
        kvs_rpt_layout_free(&t);
    }
}

/* ---- the files ------------------------------------------------------------------- */

static kvs_status open_out(const char *dir, const char *name, FILE **f, char *path, size_t n,
                           kvs_err *err) {
    snprintf(path, n, "%s/%s", dir, name);
    *f = fopen(path, "w");
    if (!*f) return kvs_errorf(err, KVS_ERR_IO, "report --board: cannot write %s: %s", path, strerror(errno));
    return KVS_OK;
}

static kvs_status close_out(FILE *f, const char *path, kvs_err *err) {
    if (fclose(f) != 0) return kvs_errorf(err, KVS_ERR_IO, "report --board: cannot write %s", path);
    return KVS_OK;
}

static kvs_status make_dirs(const char *dir, kvs_err *err) {
    char p[1024];
    snprintf(p, sizeof p, "%s", dir);
    for (char *c = p + 1; *c; c++) {
        if (*c != '/') continue;
        *c = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            return kvs_errorf(err, KVS_ERR_IO, "report --board: cannot create %s: %s", p, strerror(errno));
        *c = '/';
    }
    if (mkdir(p, 0777) != 0 && errno != EEXIST)
        return kvs_errorf(err, KVS_ERR_IO, "report --board: cannot create %s: %s", p, strerror(errno));
    return KVS_OK;
}

kvs_status kvs_report_board(kvs_store *s, const kvs_report_opts *opts, const char *dir, const char *note,
                            kvs_err *err) {
    if (!opts->experiment)
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "report --board: name the experiment (--experiment leaderboard-MODEL): the "
                          "board is one experiment's");
    kvs_report_opts o = *opts;
    if (o.bootstrap <= 0) o.bootstrap = 1000;
    if (!o.seed) o.seed = 20260;
    sqlite3 *db = kvs_store_db(s);
    dataset d;
    memset(&d, 0, sizeof d);
    board bd;
    memset(&bd, 0, sizeof bd);
    board_meta mt;
    memset(&mt, 0, sizeof mt);
    snprintf(mt.note, sizeof mt.note, "%s", note ? note : "");
    kvs_status rc = kvs_rpt_gather(db, &o, &d, err);
    if (rc) goto done;
    if (d.exps.n == 0) {
        rc = kvs_errorf(err, KVS_ERR_NOTFOUND, "report --board: no scores for experiment '%s'", o.experiment);
        goto done;
    }
    kvs_rpt_compute(&d, &o);
    if ((rc = kvs_rpt_board_build(&d, 0, &bd, err))) goto done;
    if ((rc = kvs_rpt_board_meta(db, &o, &mt, err))) goto done;
    if ((rc = make_dirs(dir, err))) goto done;
    char path[1200];
    FILE *f = NULL;
    if ((rc = open_out(dir, "scores.csv", &f, path, sizeof path, err))) goto done;
    write_csv(&bd, &mt, f);
    if ((rc = close_out(f, path, err))) goto done;
    if ((rc = open_out(dir, "summary.md", &f, path, sizeof path, err))) goto done;
    write_summary(&bd, &mt, &o, f);
    if ((rc = close_out(f, path, err))) goto done;
    if ((rc = open_out(dir, "leaderboard.svg", &f, path, sizeof path, err))) goto done;
    kvs_rpt_svg_leaderboard(&bd, &mt, f);
    if ((rc = close_out(f, path, err))) goto done;
    if ((rc = open_out(dir, "tasks.svg", &f, path, sizeof path, err))) goto done;
    kvs_rpt_svg_tasks(&bd, &mt, f);
    if ((rc = close_out(f, path, err))) goto done;
    if ((rc = open_out(dir, "provenance.json", &f, path, sizeof path, err))) goto done;
    rc = kvs_rpt_board_provenance(db, &o, &bd, &mt, f, err);
    kvs_status rc2 = close_out(f, path, err);
    if (!rc) rc = rc2;
done:
    kvs_rpt_board_meta_free(&mt);
    kvs_rpt_board_free(&bd);
    kvs_rpt_dataset_free(&d);
    return rc;
}
