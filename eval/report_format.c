/*
 * report_format.c -- the text of single values in the report's output
 * formats: numbers in tables, LaTeX escapes, CSV fields, JSON strings and
 * numbers. What it is not: no layout of a table or a document (report.c,
 * report_paired.c, report_perf.c).
 */
#include "kvs_eval.h"
#include "report_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void kvs_rpt_fmt_num(double v, char *out, size_t n) {
    if (isnan(v))
        snprintf(out, n, "-");
    else
        snprintf(out, n, "%.4g", v);
}

void kvs_rpt_tex_escape(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '_' || *s == '%' || *s == '&' || *s == '#' || *s == '$')
            fprintf(f, "\\%c", *s);
        else
            fputc(*s, f);
    }
}

void kvs_rpt_csv_field(FILE *f, const char *s) {
    if (strpbrk(s, ",\"\n")) {
        fputc('"', f);
        for (; *s; s++) {
            if (*s == '"') fputc('"', f);
            fputc(*s, f);
        }
        fputc('"', f);
    } else {
        fputs(s, f);
    }
}

void kvs_rpt_json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

void kvs_rpt_json_num(FILE *f, double v) {
    if (isnan(v) || isinf(v))
        fputs("null", f);
    else
        fprintf(f, "%.12g", v);
}
