/*
 * report_plot.c -- `kvsieve report --plot`: score vs budget (mean, 95% CI)
 * of the first experiment's primary metric, overhead vs N on log-log axes
 * when latency rows exist, the needle depth x length heatmap of a needle
 * experiment, and the decode study's plot (report_decode.c). gnuplot runs as
 * a child process on a script and data written to a temporary folder.
 *
 * What it is not: no tables (report.c), no statistics (stats.c).
 */
#include "kvs_eval.h"
#include "gnuplot.h"
#include "report_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static kvs_status run_gnuplot(const char *script, const char *logf, const char *out, kvs_err *err) {
    pid_t pid = fork();
    if (pid < 0) return kvs_errorf(err, KVS_ERR_IO, "plot: fork failed: %s", strerror(errno));
    if (pid == 0) {
        FILE *lf = freopen(logf, "w", stderr);
        (void)lf;
        execlp("gnuplot", "gnuplot", script, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return kvs_errorf(err, KVS_ERR_IO, "plot: waitpid: %s", strerror(errno));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char msg[300] = "";
        FILE *lf = fopen(logf, "r");
        if (lf) {
            size_t k = fread(msg, 1, sizeof msg - 1, lf);
            msg[k] = '\0';
            fclose(lf);
        }
        return kvs_errorf(err, KVS_ERR_IO, "plot: gnuplot failed (status %d) writing %s: %s",
                          WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, msg);
    }
    struct stat sb;
    if (stat(out, &sb) != 0 || sb.st_size == 0)
        return kvs_errorf(err, KVS_ERR_IO, "plot: gnuplot wrote no output to %s", out);
    return KVS_OK;
}

static void terminal_line(FILE *g, int png, const char *out) {
    fprintf(g, "set terminal %s size 900,560\nset output ", png ? "png" : "svg");
    kvs_gp_quote(g, out);
    fprintf(g, "\nset grid\nset key outside right\n");
}

/* ---- needle heatmaps ------------------------------------------------------------- */

/* Needle samples are keyed "L<length>-D<depth>-S<index>" (datasets/needle.c:
 * the configured prompt length and needle depth of the grid); 1 when s is. */
static int needle_key(const char *s, double *len, double *depth) {
    long long L;
    int k, used = 0;
    if (sscanf(s, "L%lld-D%lf-S%d%n", &L, depth, &k, &used) != 3 || s[used] != '\0') return 0;
    *len = (double)L;
    return 1;
}

static int find_value(const double *v, int n, double x) {
    for (int i = 0; i < n; i++)
        if (v[i] == x) return i;
    return -1;
}

static void sort_values(double *v, int n) { qsort(v, (size_t)n, sizeof *v, cmp_double); }

/* The first experiment (of those reported) whose every sample of the
 * primary metric is a needle key: -1 when none. */
static int needle_experiment(const dataset *d, int *primary) {
    for (int e = 0; e < d->exps.n; e++) {
        layout_t t;
        if (kvs_rpt_layout(d, e, &t, NULL)) return -1;
        const int m = t.n_metrics ? t.metrics[0] : -1;
        kvs_rpt_layout_free(&t);
        if (m < 0) continue;
        int any = 0, all = 1;
        for (int i = 0; i < d->n_groups && all; i++) {
            const group *g = &d->g[i];
            if (g->exp != e || g->metric != m) continue;
            for (int j = 0; j < g->n && all; j++) {
                double L, D;
                all = needle_key(d->samples.v.v[g->sid[j]], &L, &D);
                any = 1;
            }
        }
        if (any && all) {
            *primary = m;
            return e;
        }
    }
    return -1;
}

/* One panel per variant and budget (`full` once): the mean score per
 * (length, depth) cell, colour-coded, depth 0 at the top, the value printed
 * in the cell. Written to `target` through gnuplot's multiplot. */
static kvs_status plot_heatmap(const dataset *d, int e, int m, int png, const char *data,
                               const char *script, const char *logf, const char *target,
                               kvs_err *err) {
    kvs_status rc = KVS_OK;
    layout_t t;
    if ((rc = kvs_rpt_layout(d, e, &t, err))) return rc;
    int cap = 0, nL = 0, nD = 0;
    for (int i = 0; i < d->n_groups; i++)
        if (d->g[i].exp == e && d->g[i].metric == m) cap += d->g[i].n;
    double *lens = malloc(sizeof(double) * (size_t)(cap + 1));
    double *deps = malloc(sizeof(double) * (size_t)(cap + 1));
    int *panel_g = malloc(sizeof(int) * (size_t)(t.n_labels * (t.n_budgets + 1) + 1));
    FILE *df = NULL, *g = NULL;
    double *sum = NULL, *cnt = NULL;
    if (!lens || !deps || !panel_g) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "plot: out of memory");
        goto done;
    }
    double vmin = INFINITY, vmax = -INFINITY;
    for (int i = 0; i < d->n_groups; i++) {
        const group *gr = &d->g[i];
        if (gr->exp != e || gr->metric != m) continue;
        for (int j = 0; j < gr->n; j++) {
            double L, D;
            needle_key(d->samples.v.v[gr->sid[j]], &L, &D);
            if (find_value(lens, nL, L) < 0) lens[nL++] = L;
            if (find_value(deps, nD, D) < 0) deps[nD++] = D;
            vmin = fmin(vmin, gr->x[j]);
            vmax = fmax(vmax, gr->x[j]);
        }
    }
    sort_values(lens, nL);
    sort_values(deps, nD);
    /* panels: labels in table order, full once, others per budget */
    int np = 0;
    for (int i = 0; i < t.n_labels; i++) {
        const int l = t.labels[i];
        for (int bi = 0; bi < t.n_budgets; bi++) {
            const int gi = kvs_rpt_is_full(d, l) ? kvs_rpt_cell_group(d, e, t.budgets[bi], l, m)
                                         : kvs_rpt_find_group(d, e, t.budgets[bi], l, m);
            if (gi < 0) continue;
            panel_g[np++] = gi;
            if (kvs_rpt_is_full(d, l)) break;
        }
    }
    if (np == 0 || nL == 0 || nD == 0) {
        rc = kvs_errorf(err, KVS_ERR_NOTFOUND, "--plot: no needle cells to plot");
        goto done;
    }
    sum = calloc((size_t)nL * (size_t)nD, sizeof *sum);
    cnt = calloc((size_t)nL * (size_t)nD, sizeof *cnt);
    df = fopen(data, "w");
    g = fopen(script, "w");
    if (!sum || !cnt || !df || !g) {
        rc = kvs_errorf(err, KVS_ERR_IO, "plot: cannot write the heatmap's files");
        goto done;
    }
    for (int k = 0; k < np; k++) {
        const group *gr = &d->g[panel_g[k]];
        memset(sum, 0, sizeof *sum * (size_t)nL * (size_t)nD);
        memset(cnt, 0, sizeof *cnt * (size_t)nL * (size_t)nD);
        for (int j = 0; j < gr->n; j++) {
            double L, D;
            needle_key(d->samples.v.v[gr->sid[j]], &L, &D);
            const int c = find_value(deps, nD, D) * nL + find_value(lens, nL, L);
            sum[c] += gr->x[j];
            cnt[c] += 1;
        }
        for (int y = 0; y < nD; y++) {
            for (int x = 0; x < nL; x++) {
                const int c = y * nL + x;
                if (cnt[c] > 0)
                    fprintf(df, "%d %d %.17g\n", x, y, sum[c] / cnt[c]);
                else
                    fprintf(df, "%d %d NaN\n", x, y);
            }
            fputc('\n', df);
        }
        fprintf(df, "\n");
    }
    const int cols = np < 3 ? np : (np <= 4 ? 2 : 3), rows = (np + cols - 1) / cols;
    fprintf(g, "set terminal %s size %d,%d\nset output ", png ? "png" : "svg", 380 * cols,
            300 * rows + 40);
    kvs_gp_quote(g, target);
    char title[300];
    snprintf(title, sizeof title, "%s: %s by needle depth and prompt length (mean per cell)",
             d->exps.v[e], d->metrics.v[m]);
    fprintf(g, "\nset datafile missing 'NaN'\nset multiplot layout %d,%d title ", rows, cols);
    kvs_gp_quote(g, title);
    fprintf(g, " noenhanced\nset palette defined (0 '#d73027', 0.5 '#fee08b', 1 '#1a9850')\n");
    if (vmin >= 0 && vmax <= 1)
        fprintf(g, "set cbrange [0:1]\n");
    fprintf(g, "set xrange [-0.5:%g]\nset yrange [%g:-0.5]\nset xlabel 'prompt length (tokens)'\n"
               "set ylabel 'needle depth'\nset xtics (",
            nL - 0.5, nD - 0.5);
    for (int x = 0; x < nL; x++) fprintf(g, "%s'%.0f' %d", x ? ", " : "", lens[x], x);
    fprintf(g, ")\nset ytics (");
    for (int y = 0; y < nD; y++) fprintf(g, "%s'%g' %d", y ? ", " : "", deps[y], y);
    fprintf(g, ")\nunset key\nset tics scale 0\n");
    for (int k = 0; k < np; k++) {
        const group *gr = &d->g[panel_g[k]];
        char pt[300], bt[64];
        kvs_rpt_budget_title(&d->budgets[gr->budget], bt, sizeof bt);
        if (kvs_rpt_is_full(d, gr->label))
            snprintf(pt, sizeof pt, "%s", d->labels.v[gr->label]);
        else
            snprintf(pt, sizeof pt, "%s @ %s", d->labels.v[gr->label], bt);
        fprintf(g, "set title ");
        kvs_gp_quote(g, pt);
        fprintf(g, " noenhanced\nplot ");
        kvs_gp_quote(g, data);
        fprintf(g, " index %d using 1:2:3 with image, '' index %d using 1:2:(sprintf('%%.2f', "
                   "$3)) with labels\n", k, k);
    }
    fprintf(g, "unset multiplot\n");
    fclose(df);
    fclose(g);
    df = g = NULL;
    rc = run_gnuplot(script, logf, target, err);
done:
    if (df) fclose(df);
    if (g) fclose(g);
    free(lens), free(deps), free(panel_g), free(sum), free(cnt);
    kvs_rpt_layout_free(&t);
    return rc;
}

kvs_status kvs_report_plot(kvs_store *s, const kvs_report_opts *o, const char *path, kvs_err *err) {
    kvs_status rc = KVS_OK;
    size_t pl = strlen(path);
    int png = pl > 4 && strcmp(path + pl - 4, ".png") == 0;
    int svg = pl > 4 && strcmp(path + pl - 4, ".svg") == 0;
    if (!png && !svg)
        return kvs_errorf(err, KVS_ERR_INVALID, "--plot %s: the file must end in .svg or .png", path);
    if (!kvs_gp_on_path("gnuplot"))
        return kvs_errorf(err, KVS_ERR_UNSUPPORTED,
                          "--plot: gnuplot is not installed (Debian: apt-get install gnuplot-nox)");
    dataset d;
    memset(&d, 0, sizeof d);
    lat_row *lat = NULL;
    int n_lat = 0;
    char dir[] = "/tmp/kvsieve-plot-XXXXXX";
    char data[64], script[64], logf[64], out2[1100], out3[1100];
    int have_dir = 0, files = 0;
    if ((rc = kvs_rpt_gather(kvs_store_db(s), o, &d, err))) goto cleanup;
    if ((rc = kvs_rpt_gather_latency(kvs_store_db(s), o, &lat, &n_lat, err))) goto cleanup;
    kvs_rpt_compute(&d, o);
    if (d.n_groups == 0 && n_lat == 0) {
        rc = kvs_errorf(err, KVS_ERR_NOTFOUND, "--plot: no results to plot");
        goto cleanup;
    }
    if (!mkdtemp(dir)) {
        rc = kvs_errorf(err, KVS_ERR_IO, "plot: cannot create a temporary folder: %s", strerror(errno));
        goto cleanup;
    }
    have_dir = 1;
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(script, sizeof script, "%s/plot.gp", dir);
    snprintf(logf, sizeof logf, "%s/log", dir);
    if (d.n_groups > 0) {
        /* score vs budget: the first experiment's primary metric, ratio budgets */
        layout_t t;
        if ((rc = kvs_rpt_layout(&d, 0, &t, err))) goto cleanup;
        int primary = t.metrics[0];
        FILE *df = fopen(data, "w"), *g = fopen(script, "w");
        files = 1;
        if (!df || !g) {
            if (df) fclose(df);
            if (g) fclose(g);
            kvs_rpt_layout_free(&t);
            rc = kvs_errorf(err, KVS_ERR_IO, "plot: cannot write in %s", dir);
            goto cleanup;
        }
        terminal_line(g, png, path);
        fprintf(g, "set title ");
        char title[200];
        snprintf(title, sizeof title, "%s: %s vs budget (mean, 95%% CI)", d.exps.v[0],
                 d.metrics.v[primary]);
        kvs_gp_quote(g, title);
        fprintf(g, " noenhanced\nset xlabel 'budget (kept ratio)'\nset ylabel ");
        kvs_gp_quote(g, d.metrics.v[primary]);
        fprintf(g, " noenhanced\nplot ");
        int block = 0;
        for (int i = 0; i < t.n_labels; i++) {
            int l = t.labels[i], rows = 0;
            for (int bi = 0; bi < t.n_budgets; bi++) {
                int b = t.budgets[bi];
                if (d.budgets[b].tokens > 0) continue;
                int gi = kvs_rpt_cell_group(&d, 0, b, l, primary);
                if (gi < 0) continue;
                fprintf(df, "%.17g %.17g %.17g %.17g\n", d.budgets[b].ratio, d.g[gi].mean,
                        d.g[gi].lo, d.g[gi].hi);
                rows++;
            }
            if (!rows) continue;
            fprintf(df, "\n\n");
            fprintf(g, "%s'%s' index %d using 1:2:3:4 with yerrorlines title ", block ? ", " : "",
                    data, block);
            kvs_gp_quote(g, d.labels.v[l]);
            fprintf(g, " noenhanced");
            block++;
        }
        fputc('\n', g);
        fclose(df);
        fclose(g);
        kvs_rpt_layout_free(&t);
        if (block == 0) {
            rc = kvs_errorf(err, KVS_ERR_NOTFOUND, "--plot: no ratio budgets to plot");
            goto cleanup;
        }
        if ((rc = run_gnuplot(script, logf, path, err))) goto cleanup;
    }
    if (n_lat > 0) {
        /* overhead vs N, log-log, first shape/device/dtype block */
        const char *target = path;
        if (d.n_groups > 0) {
            snprintf(out2, sizeof out2, "%.*s-overhead%s", (int)(pl - 4), path, path + pl - 4);
            target = out2;
        }
        FILE *df = fopen(data, "w"), *g = fopen(script, "w");
        files = 1;
        if (!df || !g) {
            if (df) fclose(df);
            if (g) fclose(g);
            rc = kvs_errorf(err, KVS_ERR_IO, "plot: cannot write in %s", dir);
            goto cleanup;
        }
        terminal_line(g, png, target);
        char title[200];
        snprintf(title, sizeof title, "compression overhead: %s, %s, %s", lat[0].shape,
                 lat[0].device, lat[0].dtype);
        fprintf(g, "set title ");
        kvs_gp_quote(g, title);
        fprintf(g, " noenhanced\nset logscale xy\nset xlabel 'N (tokens)'\nset ylabel 'ms "
                   "(median, p10-p90)'\nplot ");
        int block = 0;
        for (int i = 0; i < n_lat; i++) {
            if (strcmp(lat[i].shape, lat[0].shape) || strcmp(lat[i].device, lat[0].device) ||
                strcmp(lat[i].dtype, lat[0].dtype))
                continue;
            int first = 1;
            for (int k = 0; k < i; k++)
                if (!strcmp(lat[k].label, lat[i].label) && !strcmp(lat[k].shape, lat[0].shape) &&
                    !strcmp(lat[k].device, lat[0].device) && !strcmp(lat[k].dtype, lat[0].dtype))
                    first = 0;
            if (!first) continue;
            for (int k = i; k < n_lat; k++)
                if (!strcmp(lat[k].label, lat[i].label) && !strcmp(lat[k].shape, lat[0].shape) &&
                    !strcmp(lat[k].device, lat[0].device) && !strcmp(lat[k].dtype, lat[0].dtype))
                    fprintf(df, "%lld %.17g %.17g %.17g\n", (long long)lat[k].n, lat[k].med,
                            isnan(lat[k].p10) ? lat[k].med : lat[k].p10,
                            isnan(lat[k].p90) ? lat[k].med : lat[k].p90);
            fprintf(df, "\n\n");
            fprintf(g, "%s'%s' index %d using 1:2:3:4 with yerrorlines title ", block ? ", " : "",
                    data, block);
            kvs_gp_quote(g, lat[i].label);
            fprintf(g, " noenhanced");
            block++;
        }
        fputc('\n', g);
        fclose(df);
        fclose(g);
        if ((rc = run_gnuplot(script, logf, target, err))) goto cleanup;
    }
    int hm_metric = -1;
    const int hm_exp = d.n_groups > 0 ? needle_experiment(&d, &hm_metric) : -1;
    if (hm_exp >= 0) {
        /* needle experiments: the depth x length heatmap per variant */
        snprintf(out3, sizeof out3, "%.*s-heatmap%s", (int)(pl - 4), path, path + pl - 4);
        files = 1;
        if ((rc = plot_heatmap(&d, hm_exp, hm_metric, png, data, script, logf, out3, err)))
            goto cleanup;
    }
    if ((rc = kvs_report_decode_plot(s, o, path, NULL, err))) goto cleanup; /* F-<experiment>.svg */
cleanup:
    if (have_dir) {
        if (files) {
            unlink(data);
            unlink(script);
        }
        unlink(logf);
        rmdir(dir);
    }
    kvs_rpt_dataset_free(&d);
    free(lat);
    return rc;
}
