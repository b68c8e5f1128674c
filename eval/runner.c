/*
 * runner.c -- run a config's experiments against the store: skip finished
 * cells, run the rest, commit each cell as it finishes, show progress.
 *
 * What it is: the `fidelity` kind end to end (synthetic cache -> method ->
 * apply -> attention-output error of probe queries and planted-outlier
 * retention), the dry-run grid listing, the shard filter (--shard I/N:
 * kvs_shard_of of each cell key), progress and interruption; kind
 * `overhead` cells are timed and stored by overhead.c; each run's
 * accounting (wall and CPU seconds, cells, the prefill / compress / decode
 * clocks: kvs_run_account) around whichever kind ran.
 * What it is not: kind `task` (prompts over HTTP to a backend) is
 * eval/task.c, called from run_experiment; no HTTP here.
 *
 * Memory: one synthetic cache (the current shape/N/seed) is kept and reused
 * by every cell of that dataset instance; the grid is ordered so those cells
 * are adjacent. Beyond the cache, a cell holds its plan and the compressed
 * copy (at most the cache's size).
 */
#include "kvs_eval.h"
#include "kvs_formats.h"
#include "kvs_task.h"
#include "overhead.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* ---- progress ------------------------------------------------------------ */

typedef struct {
    const kvs_run_opts *o;
    double t0, last;
    int total, done;
    int line_open;
} progress;

static void fmt_eta(double s, char *buf, size_t n) {
    if (!(s >= 0) || s > 1e7) {
        snprintf(buf, n, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else
        snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
}

static void progress_show(progress *p, const char *what, int force) {
    if (!p->o->progress) return;
    double now = kvs_now_ms();
    double every = p->o->progress_tty ? 100.0
                   : (p->o->progress_every_s > 0 ? p->o->progress_every_s : 5.0) * 1000.0;
    if (!force && now - p->last < every) return;
    p->last = now;
    double el = (now - p->t0) / 1000.0;
    double rate = el > 0 ? p->done / el : 0;
    char eta[32];
    fmt_eta(rate > 0 ? (p->total - p->done) / rate : -1, eta, sizeof eta);
    if (p->o->progress_tty) {
        fprintf(p->o->progress, "\r\033[K[%d/%d] %.2f cells/s, ETA %s  %.60s", p->done, p->total,
                rate, eta, what);
        p->line_open = 1;
    } else {
        fprintf(p->o->progress, "[%d/%d] %.2f cells/s, ETA %s  %s\n", p->done, p->total, rate, eta,
                what);
    }
    fflush(p->o->progress);
}

static void progress_end(progress *p) {
    if (p->o->progress && p->line_open) fputc('\n', p->o->progress);
    p->line_open = 0;
}

/* ---- one dataset instance (shape, N, seed) ------------------------------- */

typedef struct {
    int shape, length, seed; /* which instance is loaded; -1 none */
    kvs_dense_cache cache;
    float **probes; /* [L] each [Hq][P][d] */
    int32_t *outliers;
    kvs_synth_config sc;
    kvs_cache_view view;
    kvs_layer *layers; /* [L] storage for view */
} instance;

static void instance_free(instance *in) {
    if (in->probes) {
        for (int l = 0; l < in->cache.n_layers; l++) free(in->probes[l]);
        free(in->probes);
    }
    free(in->outliers);
    free(in->layers);
    kvs_dense_cache_free(&in->cache);
    memset(in, 0, sizeof *in);
    in->shape = in->length = in->seed = -1;
}

static kvs_status instance_load(instance *in, const kvs_experiment *e, const kvs_cell *c,
                                kvs_err *err) {
    if (in->shape == c->shape && in->length == c->length && in->seed == c->seed) return KVS_OK;
    instance_free(in);
    kvs_status rc;
    const kvs_eval_shape *s = &e->shapes[c->shape];
    kvs_synth_config *sc = &in->sc;
    if (strncmp(s->name, "custom-", 7) == 0) {
        kvs_synth_defaults(sc);
        sc->n_layers = s->n_layers, sc->n_q_heads = s->n_q_heads;
        sc->n_kv_heads = s->n_kv_heads, sc->head_dim = s->head_dim;
    } else if ((rc = kvs_synth_preset(s->name, sc, err))) {
        return rc;
    }
    int N = e->lengths[c->length];
    sc->n_tokens = N;
    sc->seed = (uint64_t)e->seeds[c->seed];
    sc->n_queries = e->queries < 0 || e->queries > N ? N : e->queries;
    sc->n_probes = e->probes;
    if (e->outliers > 0) sc->n_outliers = e->outliers;
    if (e->sinks >= 0) sc->n_sinks = e->sinks;
    sc->image_frac = e->image_frac;
    if (sc->n_outliers <= 0) { /* resolve the generator's default here so M is known */
        int a = N / 256 > 4 ? N / 256 : 4;
        sc->n_outliers = a < N - sc->n_sinks ? a : N - sc->n_sinks;
    }
    if ((rc = kvs_synth_generate(sc, &in->cache, &in->probes, &in->outliers, err)))
        return kvs_err_prefix(err, "generating synthetic cache %s N=%d seed=%lld", s->name, N,
                              (long long)e->seeds[c->seed]);
    in->layers = calloc((size_t)in->cache.n_layers, sizeof *in->layers);
    if (!in->layers) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    if ((rc = kvs_dense_cache_view(&in->cache, &in->view, in->layers, err))) return rc;
    in->shape = c->shape, in->length = c->length, in->seed = c->seed;
    return KVS_OK;
}

/* ---- one fidelity cell ----------------------------------------------------- */

typedef struct {
    double mean_rel_err, max_rel_err, retention, kept_ratio, compress_ms, apply_ms;
    int64_t bytes_before, bytes_after;
    char note[256];
} fid_result;

static kvs_status run_fidelity_cell(const kvs_experiment *e, const kvs_cell *c, instance *in,
                                    int threads, fid_result *r, kvs_err *err) {
    kvs_status rc = KVS_OK;
    const kvs_variant *var = &e->variants[c->variant];
    const kvs_method *m = var->method;
    const int L = in->cache.n_layers, N = in->cache.n_tokens;
    kvs_plan plan;
    memset(&plan, 0, sizeof plan);
    kvs_dense_cache comp;
    memset(&comp, 0, sizeof comp);
    kvs_layer *work = calloc((size_t)L, sizeof *work); /* [L] the method's view of the layers */
    if (!work) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    memset(r, 0, sizeof *r);

    /* Queries: exactly what the method asks for, the last w of those
     * recorded, so a cell's result does not depend on how many were made. */
    int have = in->view.layers[0].q.data ? in->view.layers[0].q.n_tokens : 0;
    int want = 0;
    if (m->needs & KVS_NEED_Q_ALL)
        want = N;
    else if (m->queries_wanted)
        want = m->queries_wanted(&var->params, N);
    if (want > N) want = N;
    if (want > have) {
        rc = kvs_errorf(err, KVS_ERR_INVALID,
                        "method '%s' needs the queries of %d positions but the dataset records %d "
                        "(set dataset queries = \"all\")",
                        m->name, want, have);
        goto cleanup;
    }
    for (int l = 0; l < L; l++) {
        work[l] = in->view.layers[l];
        kvs_view *q = &work[l].q;
        if (want == 0) {
            q->data = NULL;
            q->n_tokens = 0;
        } else if (want < have) {
            q->data = (const float *)q->data + (size_t)(have - want) * (size_t)q->s_tok;
            q->n_tokens = want;
        }
    }
    kvs_cache_view cv = {L, work, in->view.modality};
    kvs_budget b = {1.0, 0};
    if (c->budget >= 0) b = e->budgets[c->budget];

    double t0 = kvs_now_ms();
    if ((rc = kvs_compress(m, &var->params, &cv, &b, threads, &plan, err))) goto cleanup;
    double t1 = kvs_now_ms();
    if ((rc = kvs_apply(&cv, &plan, &comp, err))) goto cleanup;
    double t2 = kvs_now_ms();
    r->compress_ms = t1 - t0;
    r->apply_ms = t2 - t1;

    double sum = 0, mx = 0;
    int64_t kept = 0;
    for (int l = 0; l < L; l++) {
        const kvs_layer *full = &in->view.layers[l];
        kvs_view pv = kvs_view_make(in->probes[l], KVS_F32, in->sc.n_q_heads, in->sc.n_probes,
                                    in->sc.head_dim);
        double mean_l = 0, max_l = 0;
        if ((rc = kvs_fidelity_layer(&pv, full, &comp.layers[l], &mean_l, &max_l, err))) {
            kvs_err_prefix(err, "layer %d", l);
            goto cleanup;
        }
        sum += mean_l;
        if (max_l > mx) mx = max_l;
        kept += comp.layers[l].n_tokens;
        r->bytes_after += 2 * (int64_t)comp.layers[l].n_kv_heads * comp.layers[l].n_tokens *
                          comp.layers[l].head_dim * (int64_t)sizeof(float);
        r->bytes_before += 2 * (int64_t)full->k.n_heads * full->k.n_tokens * full->k.head_dim *
                           (int64_t)sizeof(float);
    }
    r->mean_rel_err = sum / L;
    r->max_rel_err = mx;
    r->kept_ratio = (double)kept / ((double)L * N);
    r->retention = in->sc.n_outliers > 0 ? kvs_plan_retention(&plan, in->outliers, in->sc.n_outliers)
                                         : NAN;
    snprintf(r->note, sizeof r->note, "%s", plan.note);
cleanup:
    kvs_plan_free(&plan);
    kvs_dense_cache_free(&comp);
    free(work);
    return rc;
}

/* ---- describing cells -------------------------------------------------------- */

static void budget_label(const kvs_experiment *e, const kvs_cell *c, char *out, size_t n) {
    if (c->budget < 0)
        snprintf(out, n, "all");
    else if (e->budgets[c->budget].tokens > 0)
        snprintf(out, n, "%lld tok", (long long)e->budgets[c->budget].tokens);
    else
        snprintf(out, n, "%g", e->budgets[c->budget].ratio);
}

static void cell_label(const kvs_experiment *e, const kvs_cell *c, char *out, size_t n) {
    char bl[32];
    budget_label(e, c, bl, sizeof bl);
    if (n < 300) {
        snprintf(out, n, "?");
        return;
    }
    if (e->kind == KVS_KIND_TASK) {
        snprintf(out, n, "len=%d depth=%g #%d  %s  budget %s", e->lengths[c->length],
                 e->depths[c->seed / e->per_cell], c->seed % e->per_cell,
                 e->variants[c->variant].label, bl);
    } else if (e->kind == KVS_KIND_OVERHEAD) {
        kvs_overhead_label(e, c, bl, out, n);
    } else {
        snprintf(out, n, "%s N=%d seed=%lld  %s  budget %s", e->shapes[c->shape].name,
                 e->lengths[c->length], (long long)e->seeds[c->seed], e->variants[c->variant].label,
                 bl);
    }
}

static void print_dry_run(FILE *f, const kvs_experiment *e, const kvs_cell *cells, int n,
                          const unsigned char *done, int n_done) {
    fprintf(f, "experiment '%s' (kind %s, line %d)\n", e->name, kvs_exp_kind_name(e->kind), e->line);
    if (e->kind == KVS_KIND_TASK)
        fprintf(f, "  dataset  niah: %d lengths x %d depths x %d per cell\n", e->n_lengths,
                e->n_depths, e->per_cell);
    else if (e->kind == KVS_KIND_OVERHEAD)
        fprintf(f, "  dataset  synthetic: %d shapes x %d lengths x %d dtypes x %d devices x %d "
                   "thread counts; %d input sets rotated per cell; %d max_tokens limits\n",
                e->n_shapes, e->n_lengths, e->n_dtypes, e->n_devices, e->n_thread_counts,
                e->n_seeds, e->n_limits);
    else
        fprintf(f, "  dataset  synthetic: %d shapes x %d lengths x %d seeds\n", e->n_shapes,
                e->n_lengths, e->n_seeds);
    fprintf(f, "  variants %d (methods x params), budgets %d ('full' runs once per instance)\n",
            e->n_variants, e->n_budgets);
    fprintf(f, "  cells    %d total, %d already done, %d to run\n", n, n_done, n - n_done);
    int shown = 0;
    for (int i = 0; i < n; i++) {
        if (shown >= 200) {
            fprintf(f, "  ... %d more\n", n - i);
            break;
        }
        char lab[400];
        cell_label(e, &cells[i], lab, sizeof lab);
        fprintf(f, "  %s %.12s  %s\n", done[i] ? "done" : "todo", cells[i].key, lab);
        shown++;
    }
}

/* ---- the run loop ------------------------------------------------------------ */

static kvs_status store_fidelity(kvs_store *s, int64_t run_id, const kvs_experiment *e,
                                 const kvs_cell *c, const instance *in, const fid_result *r,
                                 kvs_err *err) {
    const kvs_variant *var = &e->variants[c->variant];
    char sample[64], dsver[64];
    snprintf(sample, sizeof sample, "seed=%lld", (long long)e->seeds[c->seed]);
    snprintf(dsver, sizeof dsver, "kvs_synth_generate v%s", KVS_SYNTH_VERSION);
    kvs_cell_row row = {0};
    row.key = c->key;
    row.experiment = e->name;
    row.kind = "fidelity";
    row.definition = c->def;
    row.dataset = "synthetic";
    row.dataset_version = dsver;
    row.sample_id = sample;
    row.shape = e->shapes[c->shape].name;
    row.n_tokens = e->lengths[c->length];
    row.seed = e->seeds[c->seed];
    row.method = var->method->name;
    row.label = var->label;
    row.params_json = var->params_json;
    if (c->budget < 0) {
        row.budget_ratio = 1.0;
    } else {
        row.budget_ratio = e->budgets[c->budget].ratio;
        row.budget_tokens = e->budgets[c->budget].tokens;
    }
    kvs_score sc[6];
    int ns = 0;
    sc[ns++] = (kvs_score){"mean_rel_err", r->mean_rel_err};
    sc[ns++] = (kvs_score){"max_rel_err", r->max_rel_err};
    if (!isnan(r->retention)) sc[ns++] = (kvs_score){"retention", r->retention};
    sc[ns++] = (kvs_score){"kept_ratio", r->kept_ratio};
    sc[ns++] = (kvs_score){"compress_ms", r->compress_ms};
    sc[ns++] = (kvs_score){"apply_ms", r->apply_ms};
    kvs_result_row res = {0};
    res.compress_ms = r->compress_ms + r->apply_ms;
    res.kv_bytes_before = r->bytes_before;
    res.kv_bytes_after = r->bytes_after;
    res.note = r->note;
    res.n_scores = ns;
    res.scores = sc;
    (void)in;
    return kvs_store_put(s, run_id, &row, &res, 1, err);
}

static kvs_status run_experiment(kvs_store *s, const kvs_config *cfg, const kvs_experiment *e,
                                 const kvs_run_opts *o, kvs_run_summary *sum, kvs_err *err) {
    if (e->kind == KVS_KIND_TASK) return kvs_task_run(s, cfg, e, o, sum, err); /* eval/task.c */
    kvs_status rc = KVS_OK;
    kvs_cell *cells = NULL;
    unsigned char *done = NULL;
    int n = 0, n_done = 0, n_new = 0;
    int64_t run_id = 0;
    instance in;
    memset(&in, 0, sizeof in);
    in.shape = in.length = in.seed = -1;
    kvs_overhead *oh = NULL;
    kvs_experiment eo; /* overhead: --threads replaces the thread axis (it defines the cells) */
    if (e->kind == KVS_KIND_OVERHEAD && o->threads_override > 0) {
        eo = *e;
        eo.n_thread_counts = 1;
        eo.thread_counts[0] = eo.threads = o->threads_override;
        e = &eo;
    }

    if ((rc = kvs_grid_expand(e, &cells, &n, err))) goto cleanup;
    if (o->shard_count > 1) { /* keep this shard's cells, in grid order (instances stay adjacent) */
        int k = 0;
        for (int i = 0; i < n; i++)
            if (kvs_shard_of(cells[i].key, o->shard_count) == o->shard_index) cells[k++] = cells[i];
        n = k;
    }
    done = calloc((size_t)(n > 0 ? n : 1), 1);
    if (!done) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    for (int i = 0; i < n; i++) {
        int d = 0;
        if ((rc = kvs_store_is_done(s, cells[i].key, &d, err))) goto cleanup;
        done[i] = (unsigned char)d;
        n_done += d;
    }
    sum->n_cells += n;
    sum->n_already += n_done;
    if (o->dry_run) {
        if (o->progress && o->shard_count > 1)
            fprintf(o->progress, "shard %d/%d of experiment '%s' (the cells below):\n",
                    o->shard_index, o->shard_count, e->name);
        if (o->progress) print_dry_run(o->progress, e, cells, n, done, n_done);
        goto cleanup;
    }
    if (n_done == n) {
        if (o->progress)
            fprintf(o->progress, "experiment '%s': all %d cells already done\n", e->name, n);
        goto cleanup;
    }
    if (e->kind == KVS_KIND_OVERHEAD &&
        (rc = kvs_overhead_begin(e, o->progress, o->progress_tty, &oh, err)))
        goto cleanup;
    kvs_run_info info = {e->name, kvs_exp_kind_name(e->kind), cfg->path, cfg->text, cfg->hash,
                         cfg->overrides, cfg->dir, n};
    char shard[32] = "";
    if (o->shard_count > 1) snprintf(shard, sizeof shard, "%d/%d", o->shard_index, o->shard_count);
    if ((rc = kvs_store_run_begin(s, &info, &run_id, err))) goto cleanup;
    if (shard[0] && (rc = kvs_store_run_shard(s, run_id, shard, err))) goto cleanup;
    sum->run_id = run_id;
    if (o->progress)
        fprintf(o->progress, "experiment '%s': %d cells%s%s, %d already done, run %lld\n", e->name,
                n, shard[0] ? " in shard " : "", shard, n_done,
                (long long)run_id);
    progress pr = {o, kvs_now_ms(), 0, n - n_done, 0, 0};
    int threads = o->threads_override > 0 ? o->threads_override : e->threads;
    int stopped = 0;
    for (int i = 0; i < n; i++) {
        if (done[i]) continue;
        if ((o->stop && *o->stop) || (o->max_cells > 0 && n_new >= o->max_cells)) {
            stopped = 1;
            break;
        }
        const kvs_cell *c = &cells[i];
        char lab[400];
        cell_label(e, c, lab, sizeof lab);
        progress_show(&pr, lab, 0);
        if (oh) {
            if ((rc = kvs_overhead_cell(oh, e, c, s, run_id, err))) {
                kvs_err_prefix(err, "experiment '%s': cell %.12s (%s)", e->name, c->key, lab);
                break;
            }
        } else {
            fid_result r;
            if ((rc = instance_load(&in, e, c, err)) ||
                (rc = run_fidelity_cell(e, c, &in, threads, &r, err))) {
                kvs_err_prefix(err, "experiment '%s': cell %.12s (%s)", e->name, c->key, lab);
                break;
            }
            if ((rc = store_fidelity(s, run_id, e, c, &in, &r, err))) break;
            sum->acct.compress_ms += r.compress_ms + r.apply_ms;
        }
        n_new++;
        pr.done++;
        progress_show(&pr, lab, pr.done == pr.total);
    }
    progress_end(&pr);
    sum->n_done += n_new;
    if (rc) {
        sum->n_failed++;
        kvs_err e2 = {0};
        kvs_store_run_end(s, run_id, "failed", n_new, err->msg, &e2);
    } else if (stopped) {
        sum->interrupted = 1;
        if ((rc = kvs_store_run_end(s, run_id, "interrupted", n_new, NULL, err))) goto cleanup;
        if (o->progress) {
            fprintf(o->progress, "stopped: %d new cells stored, %d of %d still to run\n", n_new,
                    n - n_done - n_new, n);
            if (o->resume_hint) fprintf(o->progress, "resume with: %s\n", o->resume_hint);
        }
    } else {
        rc = kvs_store_run_end(s, run_id, "done", n_new, NULL, err);
    }
cleanup:
    kvs_overhead_end(oh);
    instance_free(&in);
    free(cells);
    free(done);
    return rc;
}

/* ---- accounting ------------------------------------------------------------- */

/* User + system seconds of this process and of the children it has waited
 * for (the embedded server is waited for when its run stops); < 0 unknown. */
static double cpu_seconds(void) {
    struct rusage self, kids;
    if (getrusage(RUSAGE_SELF, &self) != 0 || getrusage(RUSAGE_CHILDREN, &kids) != 0) return -1;
    const struct timeval *tv[4] = {&self.ru_utime, &self.ru_stime, &kids.ru_utime, &kids.ru_stime};
    double t = 0;
    for (int i = 0; i < 4; i++) t += (double)tv[i]->tv_sec + (double)tv[i]->tv_usec * 1e-6;
    return t;
}

const char *kvs_run_cpu_scope(const kvs_experiment *e) {
    if (e->kind != KVS_KIND_TASK) return "kvsieve run (in-process)";
    return e->backend_embedded ? "kvsieve run and its embedded kvsieve serve"
                               : "kvsieve run only (the URL backend's CPU is not counted)";
}

void kvs_run_account_print(FILE *f, const kvs_run_account *a) {
    const double pf = a->prefill_ms / 1e3, cm = a->compress_ms / 1e3, dc = a->decode_ms / 1e3;
    const double tot = pf + cm + dc;
    fprintf(f, "accounting: %lld cells in %.1f s wall", (long long)a->cells, a->wall_s);
    if (a->cpu_s >= 0)
        fprintf(f, ", %.1f CPU-s (%s), %.3f cells per CPU-second", a->cpu_s,
                a->cpu_scope ? a->cpu_scope : "?", a->cpu_s > 0 ? (double)a->cells / a->cpu_s : 0.0);
    if (tot > 0)
        fprintf(f, "; prefill %.0f%%, compress %.0f%%, decode %.0f%% of %.1f s%s", 100 * pf / tot,
                100 * cm / tot, 100 * dc / tot, tot,
                a->requests > 0 ? " of server time (per request: one prefill, each variant's "
                                  "compression, the batch's longest decode)"
                                : "");
    fputc('\n', f);
}

/* Run one experiment and, when it started a run, store and add up where its
 * time went. */
static kvs_status run_accounted(kvs_store *s, const kvs_config *cfg, const kvs_experiment *e,
                                const kvs_run_opts *o, kvs_run_summary *sum, kvs_err *err) {
    const kvs_run_account before = sum->acct;
    const int64_t prev_run = sum->run_id;
    const int done0 = sum->n_done;
    sum->run_id = 0;
    const double t0 = kvs_now_ms(), c0 = cpu_seconds();
    kvs_status rc = run_experiment(s, cfg, e, o, sum, err);
    const double c1 = cpu_seconds();
    if (sum->run_id <= 0) { /* dry run, or nothing to do */
        sum->run_id = prev_run;
        return rc;
    }
    kvs_run_account a;
    memset(&a, 0, sizeof a);
    a.cells = sum->n_done - done0;
    a.requests = sum->acct.requests - before.requests;
    a.wall_s = (kvs_now_ms() - t0) / 1e3;
    a.cpu_s = c0 >= 0 && c1 >= 0 ? c1 - c0 : -1;
    a.cpu_scope = kvs_run_cpu_scope(e);
    a.prefill_ms = sum->acct.prefill_ms - before.prefill_ms;
    a.compress_ms = sum->acct.compress_ms - before.compress_ms;
    a.decode_ms = sum->acct.decode_ms - before.decode_ms;
    kvs_err e2 = {0};
    kvs_status r2 = kvs_store_run_account(s, sum->run_id, &a, &e2);
    if (!rc && r2) {
        rc = r2;
        *err = e2;
    }
    sum->acct.cells += a.cells;
    sum->acct.wall_s += a.wall_s;
    if (a.cpu_s >= 0 && sum->acct.cpu_s >= 0)
        sum->acct.cpu_s += a.cpu_s;
    else
        sum->acct.cpu_s = -1;
    sum->acct.cpu_scope = a.cpu_scope;
    return rc;
}

kvs_status kvs_run_config(kvs_store *s, const kvs_config *cfg, const kvs_run_opts *opts,
                          kvs_run_summary *sum, kvs_err *err) {
    memset(sum, 0, sizeof *sum);
    int found = 0;
    for (int i = 0; i < cfg->n_experiments; i++)
        found |= !opts->only_experiment || !strcmp(cfg->experiments[i].name, opts->only_experiment);
    if (!found) {
        char names[512] = "";
        for (int i = 0; i < cfg->n_experiments; i++) {
            size_t l = strlen(names);
            snprintf(names + l, sizeof names - l, "%s'%s'", i ? ", " : "", cfg->experiments[i].name);
        }
        return kvs_errorf(err, KVS_ERR_NOTFOUND, "%s: no experiment '%s' (it has %s)", cfg->path,
                          opts->only_experiment, names);
    }
    for (int i = 0; i < cfg->n_experiments; i++) {
        if (opts->only_experiment && strcmp(cfg->experiments[i].name, opts->only_experiment) != 0)
            continue;
        kvs_status rc = run_accounted(s, cfg, &cfg->experiments[i], opts, sum, err);
        if (rc) return rc;
        if (sum->interrupted) break;
    }
    return KVS_OK;
}
