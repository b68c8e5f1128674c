/*
 * gnuplot.h -- the two helpers every report plot needs (report.c, report_decode.c).
 * Internal to eval/; not part of the public API (kvs_eval.h). The plots run
 * gnuplot as a child process; nothing here draws.
 */
#ifndef KVS_EVAL_GNUPLOT_H
#define KVS_EVAL_GNUPLOT_H

#include <stdio.h>

/* 1 when an executable `name` is found on $PATH. */
int kvs_gp_on_path(const char *name);
/* Write s as a gnuplot single-quoted string (a ' doubles). */
void kvs_gp_quote(FILE *f, const char *s);

#endif
