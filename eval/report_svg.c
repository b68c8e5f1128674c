/*
 * report_svg.c -- the leaderboard's two plots as plain SVG text:
 *   leaderboard.svg  RULER average against kept ratio, one line per method
 *                    (full as a dashed level line), one panel per setting,
 *                    in the manner of kvpress's leaderboard plot
 *   tasks.svg        a method x task heat map of the mean score at the kept
 *                    ratio nearest 0.25, one panel per setting
 * Written here rather than through gnuplot so the files are the same bytes
 * on every machine (the golden test compares them) and need no tool.
 * What it is not: no data (report_board.c builds the board).
 */
#include "kvs_eval.h"
#include "report_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* 20 distinguishable colours (Tableau 20 order: dark, light alternating). */
static const char *const palette[20] = {
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896",
    "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5"};
/* line styles cycle after the colours, so 40 methods stay apart */
static const char *const dashes[2] = {"", " stroke-dasharray=\"6,3\""};

static void xml_text(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else fputc(*s, f);
    }
}

#define PW 420 /* panel plot area */
#define PH 300
#define ML 60  /* margins */
#define MT 50
#define GAP 90
#define LEGEND 190

static double px(double ratio, int x0) { return x0 + ratio * PW; }
static double py(double v, int y0) { return y0 + PH - v * PH; }

static void axes(FILE *f, int x0, int y0, const char *title, const char *xlabel, const char *ylabel) {
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#333\"/>\n", x0,
            y0, PW, PH);
    for (int i = 0; i <= 10; i += 2) { /* y grid: 0 .. 1 */
        const double v = i / 10.0;
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x0, py(v, y0),
                x0 + PW, py(v, y0));
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.1f</text>\n", x0 - 6, py(v, y0) + 4, v);
    }
    static const double xt[] = {0.125, 0.25, 0.5, 0.75, 1.0};
    for (size_t i = 0; i < sizeof xt / sizeof xt[0]; i++) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/>\n", px(xt[i], x0), y0,
                px(xt[i], x0), y0 + PH);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n", px(xt[i], x0), y0 + PH + 16,
                xt[i]);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-weight=\"bold\">", x0 + PW / 2, y0 - 12);
    xml_text(f, title);
    fprintf(f, "</text>\n<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">", x0 + PW / 2, y0 + PH + 36);
    xml_text(f, xlabel);
    fprintf(f, "</text>\n<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 %d %d)\">",
            x0 - 42, y0 + PH / 2, x0 - 42, y0 + PH / 2);
    xml_text(f, ylabel);
    fprintf(f, "</text>\n");
}

void kvs_rpt_svg_leaderboard(const board *bd, const board_meta *mt, FILE *f) {
    const dataset *d = bd->d;
    const int panels = bd->n_set > 0 ? bd->n_set : 1;
    int W = ML + panels * PW + (panels - 1) * GAP + 30 + LEGEND;
    const int H = MT + PH + 60;
    if (W < 900) W = 900; /* room for the title */
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n"
               "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n",
            W, H + 20, W, H + 20, W, H + 20);
    fprintf(f, "<text x=\"%d\" y=\"18\" font-size=\"14\" font-weight=\"bold\">RULER average vs kept ratio: ", ML);
    xml_text(f, mt->model);
    fprintf(f, " (%d samples, %d tasks)</text>\n", mt->n_samples, bd->n_tasks);
    for (int s = 0; s < bd->n_set; s++) {
        const int x0 = ML + s * (PW + GAP), y0 = MT;
        axes(f, x0, y0, bd->set[s], "kept ratio (1 - kvpress's compression ratio)", "average score");
        int ci = 0;
        for (int i = 0; i < bd->n_rows[s]; i++) {
            const int l = bd->rows[s][i];
            const int full = kvs_rpt_is_full(d, l);
            const int gf = full && bd->full_b >= 0 ? kvs_rpt_board_group(bd, l, bd->full_b, bd->m_avg) : -1;
            char name[200];
            kvs_rpt_board_name(d->labels.v[l], name, sizeof name);
            if (full) {
                if (gf < 0) continue;
                const double y = py(d->g[gf].mean, y0);
                fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"black\" "
                           "stroke-width=\"1.5\" stroke-dasharray=\"2,3\"><title>full %.3f</title></line>\n",
                        x0, y, x0 + PW, y, d->g[gf].mean);
                continue;
            }
            const char *c = palette[ci % 20], *ds = dashes[(ci / 20) % 2];
            ci++;
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\"%s points=\"", c, ds);
            int np = 0;
            for (int k = 0; k < bd->n_budgets; k++) {
                const int g = kvs_rpt_find_group(d, bd->e, bd->budgets[k], l, bd->m_avg);
                if (g < 0) continue;
                fprintf(f, "%s%.1f,%.1f", np++ ? " " : "", px(d->budgets[bd->budgets[k]].ratio, x0),
                        py(d->g[g].mean, y0));
            }
            fprintf(f, "\"><title>");
            xml_text(f, name);
            fprintf(f, "</title></polyline>\n");
            for (int k = 0; k < bd->n_budgets; k++) {
                const int g = kvs_rpt_find_group(d, bd->e, bd->budgets[k], l, bd->m_avg);
                if (g < 0) continue;
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"><title>", 
                        px(d->budgets[bd->budgets[k]].ratio, x0), py(d->g[g].mean, y0), c);
                xml_text(f, name);
                fprintf(f, " %g: %.3f [%.3f, %.3f]</title></circle>\n", d->budgets[bd->budgets[k]].ratio,
                        d->g[g].mean, d->g[g].lo, d->g[g].hi);
            }
        }
    }
    /* legend: the first setting's methods (every setting has the same) */
    const int lx = ML + panels * PW + (panels - 1) * GAP + 30;
    int ci = 0, row = 0;
    for (int i = 0; bd->n_set > 0 && i < bd->n_rows[0]; i++) {
        const int l = bd->rows[0][i];
        char name[200];
        kvs_rpt_board_name(d->labels.v[l], name, sizeof name);
        const int y = MT + 6 + 15 * row++;
        if (kvs_rpt_is_full(d, l)) {
            fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\" stroke-width=\"1.5\" "
                       "stroke-dasharray=\"2,3\"/>\n", lx, y, lx + 24, y);
        } else {
            fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"1.8\"%s/>\n", lx,
                    y, lx + 24, y, palette[ci % 20], dashes[(ci / 20) % 2]);
            ci++;
        }
        fprintf(f, "<text x=\"%d\" y=\"%d\">", lx + 30, y + 4);
        xml_text(f, name);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</svg>\n");
}

/* White (0) to dark blue (1). */
static void heat_colour(double v, char *out, size_t n) {
    if (isnan(v)) {
        snprintf(out, n, "#eeeeee");
        return;
    }
    if (v < 0) v = 0;
    if (v > 1) v = 1;
    const int r = (int)lround(247 - v * (247 - 8)), g = (int)lround(251 - v * (251 - 48)),
              b = (int)lround(255 - v * (255 - 107));
    snprintf(out, n, "#%02x%02x%02x", r, g, b);
}

void kvs_rpt_svg_tasks(const board *bd, const board_meta *mt, FILE *f) {
    const dataset *d = bd->d;
    const int cw = 52, ch = 18, left = 150, top = 120;
    const int nt = bd->n_tasks, panel_w = left + nt * cw + 30;
    int rows = 0;
    for (int s = 0; s < bd->n_set; s++) rows = bd->n_rows[s] > rows ? bd->n_rows[s] : rows;
    int W = (bd->n_set > 0 ? bd->n_set : 1) * panel_w + 20;
    const int H = top + rows * ch + 40;
    if (W < 600) W = 600; /* room for the title */
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\">\n"
               "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n",
            W, H, W, H, W, H);
    fprintf(f, "<text x=\"10\" y=\"18\" font-size=\"14\" font-weight=\"bold\">Score per task at kept ");
    if (bd->b_task >= 0)
        fprintf(f, "%g", d->budgets[bd->b_task].ratio);
    else
        fputs("-", f);
    fputs(": ", f);
    xml_text(f, mt->model);
    fprintf(f, "</text>\n");
    for (int s = 0; s < bd->n_set && bd->b_task >= 0; s++) {
        const int x0 = s * panel_w + 10;
        fprintf(f, "<text x=\"%d\" y=\"40\" font-weight=\"bold\">", x0);
        xml_text(f, bd->set[s]);
        fprintf(f, "</text>\n");
        for (int t = 0; t < nt; t++) {
            const int cx = x0 + left + t * cw + cw / 2;
            fprintf(f, "<text x=\"%d\" y=\"%d\" transform=\"rotate(-50 %d %d)\">", cx, top - 6, cx, top - 6);
            xml_text(f, d->metrics.v[bd->tasks[t]]);
            fprintf(f, "</text>\n");
        }
        for (int i = 0; i < bd->n_rows[s]; i++) {
            const int l = bd->rows[s][i], y = top + i * ch;
            char name[200];
            kvs_rpt_board_name(d->labels.v[l], name, sizeof name);
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">", x0 + left - 6, y + 13);
            xml_text(f, name);
            fprintf(f, "</text>\n");
            for (int t = 0; t < nt; t++) {
                const int g = kvs_rpt_board_group(bd, l, bd->b_task, bd->tasks[t]);
                const double v = g >= 0 ? d->g[g].mean : NAN;
                char col[16];
                heat_colour(v, col, sizeof col);
                fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\" stroke=\"white\"/>",
                        x0 + left + t * cw, y, cw, ch, col);
                if (!isnan(v))
                    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"%s\">%.2f</text>",
                            x0 + left + t * cw + cw / 2, y + 13, v > 0.55 ? "white" : "black", v);
                fputc('\n', f);
            }
        }
    }
    fprintf(f, "</svg>\n");
}
