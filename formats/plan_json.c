/*
 * plan_json.c -- plans to and from JSON text.
 *
 * What it is: the JSON form of a kvs_plan (layout in kvs_formats.h), with
 * the method's parameters written by name through the method's own
 * declarations, and a strict reader whose errors name the JSON field
 * ("plan: layers[2].heads[1][5]: index 300 out of range [0, 256)").
 * What it is not: no plan logic; kvs_plan_check is the final word on
 * invariants. The index lists are written with a plain string builder (a
 * cJSON node per index would cost ~64 bytes each); the reader uses cJSON.
 */
#include "kvs_formats.h"
#include "kvsieve_methods.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *s;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *t, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->len + n + 1) c *= 2;
        char *s = realloc(b->s, c);
        if (!s) {
            b->oom = 1;
            return;
        }
        b->s = s;
        b->cap = c;
    }
    memcpy(b->s + b->len, t, n);
    b->len += n;
    b->s[b->len] = 0;
}

static void sb_str(sbuf *b, const char *t) { sb_put(b, t, strlen(t)); }

static void sb_int(sbuf *b, long long v) {
    char t[24];
    int n = snprintf(t, sizeof t, "%lld", v);
    sb_put(b, t, (size_t)n);
}

/* Text that is a complete, finite JSON number. */
static int is_json_number(const char *s) {
    cJSON *j = cJSON_Parse(s);
    int ok = cJSON_IsNumber(j) && isfinite(j->valuedouble);
    cJSON_Delete(j);
    return ok;
}

char *kvs_plan_to_json(const kvs_plan *p, const kvs_method *m, const kvs_params *params) {
    assert(p);
    cJSON *root = cJSON_CreateObject();
    char *head = NULL, *out = NULL;
    sbuf lay = {0};
    if (!root) return NULL;
    if (!cJSON_AddStringToObject(root, "method", p->method)) goto cleanup;
    cJSON *jp = cJSON_AddObjectToObject(root, "params");
    if (!jp) goto cleanup;
    if (m) {
        kvs_params defs;
        if (!params) {
            kvs_params_defaults(m, &defs);
            params = &defs;
        }
        for (int i = 0; i < m->n_params && i < params->n; i++) {
            const kvs_param_def *d = &m->params[i];
            char buf[64];
            kvs_param_format(d, params->v[i], buf, sizeof buf);
            cJSON *v;
            if (d->type == KVS_PARAM_BOOL) v = cJSON_CreateBool(params->v[i] != 0);
            else if (d->type == KVS_PARAM_ENUM || !is_json_number(buf)) v = cJSON_CreateString(buf);
            else v = cJSON_CreateRaw(buf);
            if (!v) goto cleanup;
            cJSON_AddItemToObject(jp, d->name, v);
        }
    }
    if (!cJSON_AddNumberToObject(root, "n_tokens", p->n_tokens)) goto cleanup;
    if (!cJSON_AddStringToObject(root, "merge", kvs_merge_name(p->merge))) goto cleanup;
    if (p->note[0] && !cJSON_AddStringToObject(root, "note", p->note)) goto cleanup;
    head = cJSON_PrintUnformatted(root);
    if (!head) goto cleanup;
    /* Replace the closing brace by the layers array. */
    size_t hl = strlen(head);
    assert(hl >= 2 && head[hl - 1] == '}');
    sb_put(&lay, head, hl - 1);
    sb_str(&lay, ",\"layers\":[");
    for (int l = 0; l < p->n_layers; l++) {
        const kvs_plan_layer *pl = &p->layers[l];
        sb_str(&lay, l ? ",\n{\"budget\":" : "\n{\"budget\":");
        sb_int(&lay, pl->budget);
        if (pl->counts) { /* ragged layer: each head's count */
            sb_str(&lay, ",\"counts\":[");
            for (int h = 0; h < p->n_kv_heads; h++) {
                if (h) sb_put(&lay, ",", 1);
                sb_int(&lay, pl->counts[h]);
            }
            sb_str(&lay, "]");
        }
        sb_str(&lay, ",\"heads\":[");
        for (int h = 0; h < p->n_kv_heads; h++) {
            int Bh;
            const int32_t *row = kvs_plan_head(p, l, h, &Bh);
            sb_str(&lay, h ? ",[" : "[");
            for (int i = 0; i < Bh; i++) {
                if (i) sb_put(&lay, ",", 1);
                sb_int(&lay, row[i]);
            }
            sb_str(&lay, "]");
        }
        sb_str(&lay, "]");
        if (p->kchan) { /* key channels kept per head (ThinK), "1" kept, "0" pruned */
            sb_str(&lay, ",\"key_channels\":[");
            for (int h = 0; h < p->n_kv_heads; h++) {
                const uint8_t *mk = p->kchan + ((size_t)l * p->n_kv_heads + h) * (size_t)p->kchan_dim;
                sb_str(&lay, h ? ",\"" : "\"");
                for (int c = 0; c < p->kchan_dim; c++) sb_put(&lay, mk[c] ? "1" : "0", 1);
                sb_str(&lay, "\"");
            }
            sb_str(&lay, "]");
        }
        sb_str(&lay, "}");
    }
    sb_str(&lay, "]}\n");
    if (!lay.oom) {
        out = lay.s;
        lay.s = NULL;
    }
cleanup:
    free(lay.s);
    if (head) cJSON_free(head);
    cJSON_Delete(root);
    return out;
}

/* An exact integer within [lo, hi]; 0 if not. */
static int json_int(const cJSON *j, long long lo, long long hi, long long *out) {
    if (!cJSON_IsNumber(j)) return 0;
    double v = j->valuedouble;
    if (!(v >= (double)lo && v <= (double)hi) || v != floor(v)) return 0;
    *out = (long long)v;
    return 1;
}

/* Layer l's optional "key_channels" (one string of '0' / '1' per head, all
 * of one length d): every layer has them or none (layer 0 decides). */
static kvs_status read_key_channels(const cJSON *ly, int l, kvs_plan *p, kvs_err *err) {
    const cJSON *jk = cJSON_GetObjectItemCaseSensitive(ly, "key_channels");
    if (!jk) {
        if (p->kchan)
            return kvs_errorf(err, KVS_ERR_FORMAT, "plan: layers[%d]: no key_channels (layer 0 has them)", l);
        return KVS_OK;
    }
    if (l > 0 && !p->kchan)
        return kvs_errorf(err, KVS_ERR_FORMAT, "plan: layers[%d].key_channels: layer 0 has none", l);
    if (!cJSON_IsArray(jk) || cJSON_GetArraySize(jk) != p->n_kv_heads)
        return kvs_errorf(err, KVS_ERR_FORMAT, "plan: layers[%d].key_channels: must be an array of %d strings",
                          l, p->n_kv_heads);
    int h = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, jk) {
        const size_t d = cJSON_IsString(x) ? strlen(x->valuestring) : 0;
        if (!p->kchan && d > 0 && d <= 65536) {
            kvs_status st = kvs_plan_kchan_init(p, (int)d, err);
            if (st) return st;
        }
        if (d == 0 || d != (size_t)p->kchan_dim)
            return kvs_errorf(err, KVS_ERR_FORMAT,
                              "plan: layers[%d].key_channels[%d]: must be a string of %d '0' / '1'", l, h,
                              p->kchan_dim ? p->kchan_dim : 1);
        uint8_t *m = p->kchan + ((size_t)l * p->n_kv_heads + h) * d;
        for (size_t c = 0; c < d; c++) {
            if (x->valuestring[c] != '0' && x->valuestring[c] != '1')
                return kvs_errorf(err, KVS_ERR_FORMAT, "plan: layers[%d].key_channels[%d][%zu]: not '0' or '1'",
                                  l, h, c);
            m[c] = x->valuestring[c] == '1';
        }
        h++;
    }
    return KVS_OK;
}

kvs_status kvs_plan_from_json(const char *text, kvs_plan *p, kvs_err *err) {
    assert(p);
    memset(p, 0, sizeof *p);
    kvs_status st = KVS_OK;
    int *budgets = NULL, *counts = NULL;
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        long off = (text && at && at >= text && at <= text + strlen(text)) ? (long)(at - text) : -1;
        return kvs_errorf(err, KVS_ERR_FORMAT, "plan: not valid JSON (error near byte %ld)", off);
    }
    if (!cJSON_IsObject(root)) {
        st = kvs_errorf(err, KVS_ERR_FORMAT, "plan: top level is not a JSON object");
        goto cleanup;
    }
    const cJSON *jm = cJSON_GetObjectItemCaseSensitive(root, "method");
    const cJSON *jn = cJSON_GetObjectItemCaseSensitive(root, "n_tokens");
    const cJSON *jg = cJSON_GetObjectItemCaseSensitive(root, "merge");
    const cJSON *jl = cJSON_GetObjectItemCaseSensitive(root, "layers");
    const cJSON *jp = cJSON_GetObjectItemCaseSensitive(root, "params");
    const cJSON *jt = cJSON_GetObjectItemCaseSensitive(root, "note");
    if (!cJSON_IsString(jm) || !jm->valuestring[0] || strlen(jm->valuestring) >= sizeof p->method) {
        st = kvs_errorf(err, KVS_ERR_FORMAT, "plan: method: %s",
                        !jm ? "missing" : cJSON_IsString(jm) ? "must be 1..31 characters" : "not a string");
        goto cleanup;
    }
    long long N;
    if (!jn) {
        st = kvs_errorf(err, KVS_ERR_FORMAT, "plan: n_tokens: missing");
        goto cleanup;
    }
    if (!json_int(jn, 1, 0x7fffffff, &N)) {
        st = kvs_errorf(err, KVS_ERR_FORMAT, "plan: n_tokens: must be an integer >= 1");
        goto cleanup;
    }
    kvs_merge merge = KVS_MERGE_NONE;
    if (jg) {
        int found = 0;
        if (cJSON_IsString(jg))
            for (int mi = KVS_MERGE_NONE; mi <= KVS_MERGE_WEIGHTED; mi++)
                if (strcmp(jg->valuestring, kvs_merge_name((kvs_merge)mi)) == 0) {
                    merge = (kvs_merge)mi;
                    found = 1;
                }
        if (!found) {
            st = kvs_errorf(err, KVS_ERR_FORMAT,
                            "plan: merge: '%s' is not one of none, pivotal, average, weighted",
                            cJSON_IsString(jg) ? jg->valuestring : "(not a string)");
            goto cleanup;
        }
    }
    if (jt && !cJSON_IsString(jt)) {
        st = kvs_errorf(err, KVS_ERR_FORMAT, "plan: note: not a string");
        goto cleanup;
    }
    if (jp) {
        if (!cJSON_IsObject(jp)) {
            st = kvs_errorf(err, KVS_ERR_FORMAT, "plan: params: not an object");
            goto cleanup;
        }
        /* For a registered method the parameters must be valid for it. */
        const kvs_method *m = kvs_method_find(jm->valuestring);
        if (m) {
            kvs_params pv;
            kvs_params_defaults(m, &pv);
            const cJSON *e;
            cJSON_ArrayForEach(e, jp) {
                char buf[64];
                if (cJSON_IsBool(e)) snprintf(buf, sizeof buf, "%s", cJSON_IsTrue(e) ? "true" : "false");
                else if (cJSON_IsString(e)) snprintf(buf, sizeof buf, "%s", e->valuestring);
                else if (cJSON_IsNumber(e)) snprintf(buf, sizeof buf, "%.17g", e->valuedouble);
                else {
                    st = kvs_errorf(err, KVS_ERR_FORMAT, "plan: params.%s: not a number, bool or string",
                                    e->string);
                    goto cleanup;
                }
                kvs_err sub;
                kvs_err_clear(&sub);
                if (kvs_params_set(m, &pv, e->string, buf, &sub) != KVS_OK) {
                    st = kvs_errorf(err, KVS_ERR_FORMAT, "plan: params.%s: %s", e->string, sub.msg);
                    goto cleanup;
                }
            }
        }
    }
    if (!jl) {
        st = kvs_errorf(err, KVS_ERR_FORMAT, "plan: layers: missing");
        goto cleanup;
    }
    if (!cJSON_IsArray(jl) || cJSON_GetArraySize(jl) < 1) {
        st = kvs_errorf(err, KVS_ERR_FORMAT, "plan: layers: must be a non-empty array");
        goto cleanup;
    }
    int L = cJSON_GetArraySize(jl), Hkv = -1;
    budgets = calloc((size_t)L, sizeof *budgets);
    if (!budgets) {
        st = kvs_errorf(err, KVS_ERR_NOMEM, "plan: out of memory for %d layers", L);
        goto cleanup;
    }
    int l = 0;
    const cJSON *ly;
    cJSON_ArrayForEach(ly, jl) {
        if (!cJSON_IsObject(ly)) {
            st = kvs_errorf(err, KVS_ERR_FORMAT, "plan: layers[%d]: not an object", l);
            goto cleanup;
        }
        const cJSON *jb = cJSON_GetObjectItemCaseSensitive(ly, "budget");
        const cJSON *jh = cJSON_GetObjectItemCaseSensitive(ly, "heads");
        long long B;
        if (!jb || !json_int(jb, 1, N, &B)) {
            if (!jb) st = kvs_errorf(err, KVS_ERR_FORMAT, "plan: layers[%d].budget: missing", l);
            else if (cJSON_IsNumber(jb))
                st = kvs_errorf(err, KVS_ERR_FORMAT,
                                "plan: layers[%d].budget: %g is not an integer in [1, n_tokens = %lld]", l,
                                jb->valuedouble, N);
            else
                st = kvs_errorf(err, KVS_ERR_FORMAT, "plan: layers[%d].budget: not a number", l);
            goto cleanup;
        }
        if (!jh || !cJSON_IsArray(jh) || cJSON_GetArraySize(jh) < 1) {
            st = kvs_errorf(err, KVS_ERR_FORMAT, "plan: layers[%d].heads: %s", l,
                            jh ? "must be a non-empty array of index arrays" : "missing");
            goto cleanup;
        }
        int nh = cJSON_GetArraySize(jh);
        if (Hkv < 0) Hkv = nh;
        else if (nh != Hkv) {
            st = kvs_errorf(err, KVS_ERR_FORMAT, "plan: layers[%d].heads: %d heads but layers[0] has %d",
                            l, nh, Hkv);
            goto cleanup;
        }
        budgets[l] = (int)B;
        if (!counts) {
            counts = malloc(sizeof(int) * (size_t)L * (size_t)Hkv); /* [L][Hkv] */
            if (!counts) {
                st = kvs_errorf(err, KVS_ERR_NOMEM, "plan: out of memory for %d x %d counts", L, Hkv);
                goto cleanup;
            }
        }
        int *cl = counts + (size_t)l * Hkv;
        const cJSON *jc = cJSON_GetObjectItemCaseSensitive(ly, "counts");
        if (!jc)
            for (int h = 0; h < Hkv; h++) cl[h] = (int)B; /* dense layer (and every older file) */
        else {
            if (!cJSON_IsArray(jc) || cJSON_GetArraySize(jc) != Hkv) {
                st = kvs_errorf(err, KVS_ERR_FORMAT, "plan: layers[%d].counts: must be an array of %d counts",
                                l, Hkv);
                goto cleanup;
            }
            long long sum = 0;
            int h = 0;
            const cJSON *x;
            cJSON_ArrayForEach(x, jc) {
                long long c;
                if (!json_int(x, 1, N, &c)) {
                    st = kvs_errorf(err, KVS_ERR_FORMAT,
                                    "plan: layers[%d].counts[%d]: not an integer in [1, n_tokens = %lld]", l, h,
                                    N);
                    goto cleanup;
                }
                cl[h++] = (int)c;
                sum += c;
            }
            if (sum != (long long)Hkv * B) {
                st = kvs_errorf(err, KVS_ERR_FORMAT,
                                "plan: layers[%d].counts: sum %lld is not heads x budget = %d x %lld", l, sum,
                                Hkv, B);
                goto cleanup;
            }
        }
        l++;
    }
    st = kvs_plan_init_ragged(p, jm->valuestring, L, Hkv, (int)N, counts, err);
    if (st) {
        kvs_err_prefix(err, "plan");
        goto cleanup;
    }
    p->merge = merge;
    if (jt) snprintf(p->note, sizeof p->note, "%s", jt->valuestring);
    l = 0;
    cJSON_ArrayForEach(ly, jl) {
        const cJSON *jh = cJSON_GetObjectItemCaseSensitive(ly, "heads");
        int h = 0;
        const cJSON *row;
        cJSON_ArrayForEach(row, jh) {
            int B;
            int32_t *dst = kvs_plan_head(p, l, h, &B);
            if (!cJSON_IsArray(row) || cJSON_GetArraySize(row) != B) {
                st = kvs_errorf(err, KVS_ERR_FORMAT,
                                "plan: layers[%d].heads[%d]: must be an array of %s = %d indices (has %d)",
                                l, h, p->layers[l].counts ? "counts[h]" : "budget", B,
                                cJSON_IsArray(row) ? cJSON_GetArraySize(row) : -1);
                goto cleanup;
            }
            int i = 0;
            const cJSON *x;
            cJSON_ArrayForEach(x, row) {
                long long v;
                if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble)) {
                    st = kvs_errorf(err, KVS_ERR_FORMAT, "plan: layers[%d].heads[%d][%d]: not an integer",
                                    l, h, i);
                    goto cleanup;
                }
                if (!json_int(x, 0, N - 1, &v)) {
                    st = kvs_errorf(err, KVS_ERR_FORMAT,
                                    "plan: layers[%d].heads[%d][%d]: index %.0f out of range [0, %lld)", l,
                                    h, i, x->valuedouble, N);
                    goto cleanup;
                }
                if (i > 0 && v <= dst[i - 1]) {
                    st = kvs_errorf(err, KVS_ERR_FORMAT,
                                    "plan: layers[%d].heads[%d][%d]: index %lld after %d (must be sorted ascending, unique)",
                                    l, h, i, v, dst[i - 1]);
                    goto cleanup;
                }
                dst[i++] = (int32_t)v;
            }
            h++;
        }
        if ((st = read_key_channels(ly, l, p, err))) goto cleanup;
        l++;
    }
    st = kvs_plan_check(p, err);
    if (st) kvs_err_prefix(err, "plan");

cleanup:
    free(budgets);
    free(counts);
    cJSON_Delete(root);
    if (st && p->layers) kvs_plan_free(p);
    if (st) memset(p, 0, sizeof *p);
    return st;
}
