/*
 * compose_json.c -- a method composed from a user's description (JSON), the
 * one entry point of the CLI, the HTTP API and Lua configs (kvs_parts.h).
 *
 * What it is: kvs_composed_from_cjson (check the description field by field,
 * look the parts up with close-name suggestions, build the parameter table
 * with kvs_compose_table, set the described values with core's parameter
 * parser and range checks, name the method by its canonical JSON),
 * kvs_composition_json (that canonical form) and the owner's free
 * (kvs_method_resolve, a name or a description, is methods/registry.c's).
 * Decisions: the canonical form always lists every field and every
 * parameter value (defaults included), so two descriptions of the same
 * composition ({"score":"knorm"} and {"score":"knorm","allocate":"uniform",
 * "pick":"topk"}) have one identity, and a later change of a part's default
 * does not silently change what a stored identity means. Keep rules keep the
 * order given (it is their priority when the budget is short). The label
 * (`name`) is not part of the identity.
 * What it is not: no run-time entry points (compose_dyn.c), no Lua (eval/).
 */
#include "kvs_parts.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvs_composed {
    kvs_method method; /* name: the canonical JSON */
    kvs_param_def defs[KVS_MAX_PARAMS];
    kvs_composition comp;
    char *canonical;
    char label[64];
    char summary[200];
};

const kvs_method *kvs_composed_method(const kvs_composed *c) { return c ? &c->method : NULL; }
const char *kvs_composed_label(const kvs_composed *c) { return c ? c->label : NULL; }

void kvs_composed_free(kvs_composed *c) {
    if (!c) return;
    free(c->canonical);
    free(c);
}

static cJSON *value_json(const kvs_param_def *d, double v) {
    char txt[64];
    switch (d->type) {
    case KVS_PARAM_BOOL: return cJSON_CreateBool(v != 0.0);
    case KVS_PARAM_ENUM: kvs_param_format(d, v, txt, sizeof txt); return cJSON_CreateString(txt);
    case KVS_PARAM_INT:
    case KVS_PARAM_FLOAT:
    default: return cJSON_CreateNumber(v);
    }
}

static int is_keep_param(const kvs_composition *comp, const char *name) {
    for (int i = 0; i < KVS_PARTS_MAX_KEEP && comp->keep[i]; i++)
        if (strcmp(comp->keep[i]->name, name) == 0) return 1;
    return 0;
}

char *kvs_composition_json(const kvs_composition *comp, const kvs_method *m, const kvs_params *p) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "score", comp->scorer->name);
    cJSON_AddStringToObject(o, "allocate", comp->allocator->name);
    if (comp->heads) /* absent when equal: older canonical names stay as they were */
        cJSON_AddStringToObject(o, "heads", comp->heads->name);
    cJSON *keep = cJSON_AddObjectToObject(o, "keep");
    for (int i = 0; keep && i < KVS_PARTS_MAX_KEEP && comp->keep[i]; i++) {
        const int j = kvs_param_index(m, comp->keep[i]->name);
        cJSON_AddItemToObject(keep, comp->keep[i]->name,
                              j >= 0 && j < p->n ? value_json(&m->params[j], p->v[j])
                                                 : cJSON_CreateTrue());
    }
    cJSON_AddStringToObject(o, "pick", comp->pick->name);
    cJSON_AddStringToObject(o, "merge", kvs_merge_name(comp->merge));
    if (comp->channels) /* absent when every channel is kept: older canonical names stay */
        cJSON_AddStringToObject(o, "channels", comp->channels->name);
    cJSON *params = cJSON_AddObjectToObject(o, "params");
    for (int j = 0; params && j < m->n_params && j < p->n; j++) {
        const char *nm = m->params[j].name;
        if (strcmp(nm, "parts") == 0 || is_keep_param(comp, nm)) continue;
        cJSON_AddItemToObject(params, nm, value_json(&m->params[j], p->v[j]));
    }
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

/* One parameter value given in the description, applied once the table
 * is known. */
typedef struct {
    char field[96];
    char name[48];
    const cJSON *value;
} assign;

static kvs_status part_field(const cJSON *o, const char *key, kvs_part_kind kind, const char *def,
                             const kvs_part_info **out, kvs_err *err) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it || cJSON_IsNull(it)) {
        if (!def) return kvs_errorf(err, KVS_ERR_INVALID, "%s: missing (required), e.g. \"%s\": "
                                    "\"snapkv\"", key, key);
        return kvs_part_lookup(kind, def, out, err);
    }
    if (!cJSON_IsString(it))
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: expected the name of a %s (a string)", key,
                          kvs_part_kind_name(kind));
    kvs_status rc = kvs_part_lookup(kind, it->valuestring, out, err);
    return rc ? kvs_err_prefix(err, "%s", key) : KVS_OK;
}

static kvs_status add_assign(assign *as, int *n, const char *field, const char *name,
                             const cJSON *v, kvs_err *err) {
    if (*n >= 32) return kvs_errorf(err, KVS_ERR_INVALID, "%s: too many parameter values", field);
    snprintf(as[*n].field, sizeof as[*n].field, "%s", field);
    snprintf(as[*n].name, sizeof as[*n].name, "%s", name);
    as[*n].value = v;
    (*n)++;
    return KVS_OK;
}

/* keep: {"sinks": 4, "window": {"recent_frac": 0.5}, ...} or ["sinks", ...] */
static kvs_status parse_keep(const cJSON *keep, kvs_composition *comp, assign *as, int *na,
                             kvs_err *err) {
    if (!keep || cJSON_IsNull(keep)) return KVS_OK;
    if (!cJSON_IsObject(keep) && !cJSON_IsArray(keep))
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "keep: expected an object {rule: value} or a list of rule names");
    int nk = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, keep) {
        const int is_list = cJSON_IsArray(keep);
        const char *rname = is_list ? (cJSON_IsString(it) ? it->valuestring : NULL) : it->string;
        char field[96];
        snprintf(field, sizeof field, "keep.%s", rname ? rname : "?");
        if (!rname) return kvs_errorf(err, KVS_ERR_INVALID, "keep: list entries must be rule names");
        if (!is_list && cJSON_IsFalse(it)) continue;
        const kvs_part_info *pi = NULL;
        kvs_status rc = kvs_part_lookup(KVS_PART_KEEP, rname, &pi, err);
        if (rc) return kvs_err_prefix(err, "keep");
        const kvs_keep_rule *r = pi->part;
        for (int i = 0; i < nk; i++) {
            if (comp->keep[i] == r)
                return kvs_errorf(err, KVS_ERR_INVALID, "%s: rule listed twice", field);
            if (comp->keep[i]->side == r->side)
                return kvs_errorf(err, KVS_ERR_INVALID,
                                  "%s: %s and %s both protect the %s of the prompt (at most one "
                                  "rule each side)",
                                  field, comp->keep[i]->name, r->name,
                                  r->side == KVS_KEEP_PREFIX   ? "start"
                                  : r->side == KVS_KEEP_SUFFIX ? "end"
                                                               : "span");
        }
        if (nk >= KVS_PARTS_MAX_KEEP)
            return kvs_errorf(err, KVS_ERR_INVALID, "keep: at most %d rules", KVS_PARTS_MAX_KEEP);
        comp->keep[nk++] = r;
        if (is_list || cJSON_IsTrue(it)) continue;
        if (cJSON_IsObject(it)) {
            const cJSON *pv;
            cJSON_ArrayForEach(pv, it) {
                char f2[160];
                snprintf(f2, sizeof f2, "%s.%s", field, pv->string);
                if ((rc = add_assign(as, na, f2, pv->string, pv, err))) return rc;
            }
        } else if ((rc = add_assign(as, na, field, rname, it, err))) {
            return rc;
        }
    }
    return KVS_OK;
}

int kvs_json_param_text(const struct cJSON *v, char *buf, size_t n) {
    if (cJSON_IsBool(v)) snprintf(buf, n, "%s", cJSON_IsTrue(v) ? "true" : "false");
    else if (cJSON_IsNumber(v)) snprintf(buf, n, "%.17g", v->valuedouble);
    else if (cJSON_IsString(v)) snprintf(buf, n, "%s", v->valuestring);
    else return -1;
    return 0;
}

/* Set one described value; errors name the field and the part that reads it. */
static kvs_status apply_assign(kvs_composed *c, const kvs_part_info **owner, kvs_params *p,
                               const assign *a, kvs_err *err) {
    const int j = kvs_param_index(&c->method, a->name);
    if (j == 0)
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: `parts` is fixed by the composition", a->field);
    if (j < 0) {
        char list[256] = "";
        const char *best = NULL;
        int bestd = 3;
        for (int i = 1; i < c->method.n_params; i++) {
            const int d = kvs_edit_distance(a->name, c->defs[i].name);
            if (d < bestd) bestd = d, best = c->defs[i].name;
            if (list[0]) strncat(list, ", ", sizeof list - strlen(list) - 1);
            strncat(list, c->defs[i].name, sizeof list - strlen(list) - 1);
        }
        if (best)
            return kvs_errorf(err, KVS_ERR_NOTFOUND,
                              "%s: no part of this composition reads '%s' (did you mean '%s'?); "
                              "parameters: %s",
                              a->field, a->name, best, list[0] ? list : "none");
        return kvs_errorf(err, KVS_ERR_NOTFOUND,
                          "%s: no part of this composition reads '%s'; parameters: %s", a->field,
                          a->name, list[0] ? list : "none");
    }
    char txt[128];
    if (kvs_json_param_text(a->value, txt, sizeof txt))
        return kvs_errorf(err, KVS_ERR_INVALID, "%s: expected a number, a boolean or a string",
                          a->field);
    kvs_err e2 = {0};
    if (kvs_params_set(&c->method, p, a->name, txt, &e2) != KVS_OK) {
        /* drop core's "method <canonical>: " lead: the method has no name yet */
        const char *msg = strstr(e2.msg, "parameter ");
        return kvs_errorf(err, e2.code, "%s: %s (read by %s %s)", a->field, msg ? msg : e2.msg,
                          kvs_part_kind_name(owner[j]->kind), owner[j]->name);
    }
    return KVS_OK;
}

/* Every part's name joined by '+' ("knorm+uniform+sinks+topk"): never a
 * registered method's name (those have no '+'), so a default label does not
 * pass for a preset in reports. */
static void short_label(const kvs_composition *comp, char *buf, size_t n) {
    int w = snprintf(buf, n, "%s+%s", comp->scorer->name, comp->allocator->name);
    for (int i = 0; i < KVS_PARTS_MAX_KEEP && comp->keep[i] && w >= 0 && (size_t)w < n; i++)
        w += snprintf(buf + w, n - (size_t)w, "+%s", comp->keep[i]->name);
    if (w >= 0 && (size_t)w < n) w += snprintf(buf + w, n - (size_t)w, "+%s", comp->pick->name);
    if (comp->heads && w >= 0 && (size_t)w < n)
        w += snprintf(buf + w, n - (size_t)w, "+%s", comp->heads->name);
    if (comp->channels && w >= 0 && (size_t)w < n)
        snprintf(buf + w, n - (size_t)w, "+%s", comp->channels->name);
}

kvs_status kvs_composed_from_cjson(const cJSON *o, kvs_composed **out, kvs_err *err) {
    *out = NULL;
    if (!cJSON_IsObject(o))
        return kvs_errorf(err, KVS_ERR_INVALID,
                          "a composed method is an object {score, allocate, keep, pick, merge, "
                          "params, name}");
    static const char *const known[] = {"name", "score", "allocate", "heads",  "keep",
                                        "pick", "merge", "params",   "channels", NULL};
    const cJSON *it;
    cJSON_ArrayForEach(it, o) {
        int ok = 0;
        for (int k = 0; known[k]; k++) ok |= strcmp(it->string, known[k]) == 0;
        if (!ok)
            return kvs_errorf(err, KVS_ERR_INVALID,
                              "%s: unknown field (known: name, score, allocate, heads, keep, pick, "
                              "merge, params, channels)",
                              it->string);
    }
    kvs_composed *c = calloc(1, sizeof *c);
    if (!c) return kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
    assign as[32];
    int na = 0;
    const kvs_part_info *s = NULL, *a = NULL, *pk = NULL, *hd = NULL, *ch = NULL;
    kvs_status rc = part_field(o, "score", KVS_PART_SCORER, NULL, &s, err);
    /* "allocate": "adakv" is short for uniform layers with AdaKV's heads (the
     * issue's spelling); "heads" composes a head allocator with any layer one */
    const cJSON *alloc = cJSON_GetObjectItemCaseSensitive(o, "allocate");
    const int ada_short = cJSON_IsString(alloc) && kvs_part_lookup(KVS_PART_HEADS, alloc->valuestring, &hd, NULL) == KVS_OK;
    if (!rc && ada_short && cJSON_GetObjectItemCaseSensitive(o, "heads"))
        rc = kvs_errorf(err, KVS_ERR_INVALID, "heads: given twice (\"allocate\": \"%s\" already chose the heads)",
                        alloc->valuestring);
    if (!rc && ada_short) rc = kvs_part_lookup(KVS_PART_ALLOCATOR, "uniform", &a, err);
    else if (!rc) rc = part_field(o, "allocate", KVS_PART_ALLOCATOR, "uniform", &a, err);
    const cJSON *heads = cJSON_GetObjectItemCaseSensitive(o, "heads");
    if (!rc && heads && !cJSON_IsNull(heads) &&
        !(cJSON_IsString(heads) && strcmp(heads->valuestring, "equal") == 0))
        rc = part_field(o, "heads", KVS_PART_HEADS, NULL, &hd, err);
    if (!rc) rc = part_field(o, "pick", KVS_PART_PICK, "topk", &pk, err);
    const cJSON *chans = cJSON_GetObjectItemCaseSensitive(o, "channels");
    if (!rc && chans && !cJSON_IsNull(chans) &&
        !(cJSON_IsString(chans) && strcmp(chans->valuestring, "all") == 0))
        rc = part_field(o, "channels", KVS_PART_CHANNELS, NULL, &ch, err);
    if (!rc) rc = parse_keep(cJSON_GetObjectItemCaseSensitive(o, "keep"), &c->comp, as, &na, err);
    /* merge: core's kvs_apply merges every evicted token into its most
     * key-similar kept token with the formula; "lookm" / "meda" name the
     * formula of those methods (pivotal / average) */
    kvs_merge mg = KVS_MERGE_NONE;
    const cJSON *merge = cJSON_GetObjectItemCaseSensitive(o, "merge");
    if (!rc && merge && !cJSON_IsNull(merge)) {
        static const struct {
            const char *name;
            kvs_merge m;
        } merges[] = {{"none", KVS_MERGE_NONE},       {"pivotal", KVS_MERGE_PIVOTAL},
                      {"average", KVS_MERGE_AVERAGE}, {"weighted", KVS_MERGE_WEIGHTED},
                      {"lookm", KVS_MERGE_PIVOTAL},   {"meda", KVS_MERGE_AVERAGE}};
        int found = 0;
        for (size_t i = 0; cJSON_IsString(merge) && i < sizeof merges / sizeof merges[0]; i++)
            if (strcmp(merge->valuestring, merges[i].name) == 0) mg = merges[i].m, found = 1;
        if (!found)
            rc = kvs_errorf(err, KVS_ERR_INVALID,
                            "merge: expected none, pivotal, average, weighted, lookm (= pivotal) "
                            "or meda (= average)");
    }
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(o, "params");
    if (!rc && params && !cJSON_IsNull(params)) {
        if (!cJSON_IsObject(params)) rc = kvs_errorf(err, KVS_ERR_INVALID, "params: expected an object {name: value}");
        cJSON_ArrayForEach(it, params) {
            if (rc) break;
            char f[96];
            snprintf(f, sizeof f, "params.%s", it->string);
            rc = add_assign(as, &na, f, it->string, it, err);
        }
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    if (!rc && name && !cJSON_IsNull(name)) {
        if (!cJSON_IsString(name) || !name->valuestring[0] ||
            strlen(name->valuestring) >= sizeof c->label || name->valuestring[0] == '{')
            rc = kvs_errorf(err, KVS_ERR_INVALID,
                            "name: expected a non-empty string of at most %d characters, not "
                            "starting with '{'",
                            (int)sizeof c->label - 1);
        else snprintf(c->label, sizeof c->label, "%s", name->valuestring);
    }
    if (rc) goto fail;
    c->comp.scorer = s->part;
    c->comp.allocator = a->part;
    c->comp.pick = pk->part;
    c->comp.heads = hd ? hd->part : NULL;
    c->comp.channels = ch ? ch->part : NULL;
    c->comp.merge = mg;
    const kvs_part_info *owner[KVS_MAX_PARAMS];
    int n = 0;
    if ((rc = kvs_compose_table(&c->comp, c->defs, owner, &n, err))) goto fail;
    if (!c->label[0]) short_label(&c->comp, c->label, sizeof c->label);
    snprintf(c->summary, sizeof c->summary, "composed: %s", c->label);
    c->method = kvs_compose_dyn;
    c->method.name = "composed";
    c->method.summary = c->summary;
    c->method.needs = c->comp.scorer->needs | c->comp.allocator->needs | c->comp.pick->needs |
                      (c->comp.channels ? c->comp.channels->needs : 0u);
    c->method.params = c->defs;
    c->method.n_params = n;
    kvs_params p;
    kvs_params_defaults(&c->method, &p);
    for (int i = 0; i < na && !rc; i++) rc = apply_assign(c, owner, &p, &as[i], err);
    if (rc) goto fail;
    for (int i = 0; i < n; i++) c->defs[i].def = p.v[i]; /* the description's values */
    c->canonical = kvs_composition_json(&c->comp, &c->method, &p);
    if (!c->canonical) {
        rc = kvs_errorf(err, KVS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    c->method.name = c->canonical;
    *out = c;
    return KVS_OK;
fail:
    kvs_composed_free(c);
    return rc;
}

kvs_status kvs_composed_from_json(const char *text, kvs_composed **out, kvs_err *err) {
    *out = NULL;
    cJSON *o = cJSON_Parse(text ? text : "");
    if (!o) {
        const char *at = cJSON_GetErrorPtr();
        return kvs_errorf(err, KVS_ERR_INVALID, "composed method: not valid JSON near '%.20s'",
                          at ? at : "");
    }
    kvs_status rc = kvs_composed_from_cjson(o, out, err);
    cJSON_Delete(o);
    return rc;
}
