/*
 * cli.h -- the `kvsieve` command: one function per subcommand.
 *
 * Each subcommand lives in its own cmd_<name>.c, parses its own arguments,
 * prints errors to stderr and returns a process exit code (0 ok, 1 failure,
 * 2 usage error). Only cli/ may exit; libraries return kvs_status.
 */
#ifndef KVS_CLI_H
#define KVS_CLI_H

#include "kvsieve.h"

typedef int (*kvs_cmd_fn)(int argc, char **argv); /* argv[0] is the subcommand */

typedef struct {
    const char *name;
    kvs_cmd_fn fn;
    const char *summary;
} kvs_cli_command;

/* Subcommands (argv[0] = subcommand name). */
int kvs_cmd_methods(int argc, char **argv);
int kvs_cmd_synth(int argc, char **argv);
int kvs_cmd_compress(int argc, char **argv);
int kvs_cmd_fidelity(int argc, char **argv);
int kvs_cmd_demo(int argc, char **argv);
/* kernels/: cmd_devices.c */
int kvs_cmd_devices(int argc, char **argv);
/* eval/ (issue: runner): cmd_run.c, cmd_report.c */
int kvs_cmd_run(int argc, char **argv);
int kvs_cmd_report(int argc, char **argv);
int kvs_cmd_merge(int argc, char **argv); /* cmd_merge.c */
/* backend/: cmd_serve.c, cmd_generate.c, cmd_bench.c, cmd_models.c */
int kvs_cmd_serve(int argc, char **argv);
int kvs_cmd_generate(int argc, char **argv);
int kvs_cmd_bench(int argc, char **argv);
int kvs_cmd_models(int argc, char **argv); /* cmd_models.c: the model registry */

/* Shared argument helpers (cli/args.c). Each prints a clear message naming
 * the flag and returns non-zero on bad input. */
int kvs_arg_int(const char *flag, const char *text, long lo, long hi, long *out);
int kvs_arg_double(const char *flag, const char *text, double lo, double hi, double *out);
/* Value of `--flag VALUE` at argv[*i]; advances *i. NULL + message if absent. */
const char *kvs_arg_value(int argc, char **argv, int *i);
/* cache_args.c (builds with the backend). The KV cache type flags at argv[*i]: --cache-type T (K and V), --cache-type-k
 * / -ctk T, --cache-type-v / -ctv T (llama.cpp's; the other keeps its type).
 * *ctk as kvs_session_opts.cache_type, *ctv as its cache_type_v. Returns -1
 * if argv[*i] is none of them, 0 when parsed (advances *i), 2 after a message. */
int kvs_arg_cache_type(const char *cmd, int argc, char **argv, int *i, int *ctk, int *ctv);
struct kvs_session;
/* --kivi-group N / --kivi-residual N at argv[*i] into kivi[0] / kivi[1]: -1 if
 * neither, 0 when parsed (advances *i), 2 after a message. */
int kvs_arg_kivi(int argc, char **argv, int *i, long kivi[2]);
/* Sets G and R (kivi; 0: KIVI's) of a new session whose K cache type is ctk,
 * where that is kivi2 / kivi4; nothing otherwise. */
kvs_status kvs_kivi_apply(struct kvs_session *s, int ctk, const long kivi[2], kvs_err *err);
/* "q8_0", or "q8_0/q4_0" (K/V) where they differ, into buf[32]. */
const char *kvs_cache_types_str(int ctk, int ctv, char *buf);
/* flag is "--ratio" or "--tokens": parse into b and mark which was given
 * (the range check is core's: kvs_budget_per_layer). */
int kvs_arg_budget(const char *flag, const char *text, kvs_budget *b, int *ratio_given, int *tokens_given);
/* "f32" | "f16" | "bf16" -> dtype; prints an error and returns 1 otherwise. */
int kvs_parse_dtype(const char *s, kvs_dtype *out);
/* Print j indented on stdout, then delete it (cli/util.c). */
struct cJSON;
void kvs_cli_print_json(struct cJSON *j);
/* Peak resident set size of this process so far, in MiB. */
double kvs_peak_rss_mib(void);

/* One method with its parameter values, as a row of a comparison. */
typedef struct {
    const kvs_method *method;
    kvs_params params;
    struct kvs_composed *owned; /* a method composed from JSON, or NULL */
} kvs_cli_variant;

/* Fidelity of each variant on one prompt's cache: compress (timed), apply,
 * attention-output error of the probe queries ([L] views, data may be NULL:
 * then the last <= 16 recorded queries stand in, and the table says so) and
 * retention of the planted outliers. Prints a Markdown table to stdout.
 * Returns 0 if every variant ran or was skipped with a stated reason. */
int kvs_cli_fidelity_table(const kvs_cache_view *c, const kvs_view *probes, const int32_t *outliers,
                           int n_outliers, const kvs_cli_variant *v, int n_variants, const kvs_budget *b,
                           int threads);
/* Variants from "all" or "m1,m2" (an entry may be a composed method's JSON
 * object, commas inside it allowed) plus "method.name=value" parameter
 * settings; prints errors. out holds up to 64. */
int kvs_cli_parse_variants(const char *list, const char *const *pkv, int n_pkv, kvs_cli_variant *out,
                           int *n_out);
/* Frees the composed methods of variants. */
void kvs_cli_variants_free(kvs_cli_variant *v, int n);

#endif
