/*
 * part_rows.c -- the row reductions the linear scorers share (knorm,
 * keydiff, cur; the overhead study's key-norm term).
 *
 * What it is: sums over one fp32 row of d channels in a fixed order that
 * the compiler vectorises: 8 partial sums (channel t goes to lane t mod 8;
 * a tail of d mod 8 channels to lane 0), combined as
 * ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)); the double ones take
 * 4 lanes, (l0 + l2) + (l1 + l3). The result depends only on the row, not
 * on the machine or the thread that ran it (C11 without contraction: no
 * FMA). Why: a single running sum is one dependent add per channel (its
 * latency, not the memory, set the scorers' speed).
 * What it is not: no conversion (kvs_view_rows_f32 does that) and no
 * compensated summation.
 */
#include "kvs_parts.h"

float kvs_part_sumsq(const float *r, int d) {
    float l[8] = {0};
    int t = 0;
    for (; t + 8 <= d; t += 8)
        for (int k = 0; k < 8; k++) l[k] += r[t + k] * r[t + k];
    for (; t < d; t++) l[0] += r[t] * r[t];
    return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

float kvs_part_dot(const float *a, const float *b, int d) {
    float l[8] = {0};
    int t = 0;
    for (; t + 8 <= d; t += 8)
        for (int k = 0; k < 8; k++) l[k] += a[t + k] * b[t + k];
    for (; t < d; t++) l[0] += a[t] * b[t];
    return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

double kvs_part_sumsq_f64(const float *r, int d) {
    double l[4] = {0};
    int t = 0;
    for (; t + 4 <= d; t += 4)
        for (int k = 0; k < 4; k++) l[k] += (double)r[t + k] * r[t + k];
    for (; t < d; t++) l[0] += (double)r[t] * r[t];
    return (l[0] + l[2]) + (l[1] + l[3]);
}
