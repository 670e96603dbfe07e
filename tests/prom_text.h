/*
 * prom_text.h — a strict reader of the Prometheus text exposition format 0.0.4
 * for the metrics tests: it accepts exactly what the library may emit and fails,
 * naming the line, on anything else.
 *
 * Checked: every line is a "# HELP", "# TYPE" or sample line (no blank lines or
 * other comments, a final newline); each family has one HELP immediately
 * followed by one TYPE, before its samples, and its samples are contiguous;
 * metric and label names are valid, label values use only the \\, \" and \n
 * escapes; values parse as floats in full; no sample repeats (name and labels);
 * counters end in _total; a histogram has only _bucket{le}, _sum and _count
 * samples, its le bounds strictly ascending and ending at +Inf, its buckets
 * cumulative, and _count equal to the +Inf bucket.
 */
#ifndef PKV_TEST_PROM_TEXT_H
#define PKV_TEST_PROM_TEXT_H

#include <stdbool.h>
#include <stddef.h>

typedef struct pm_sample {
    char name[128];
    char labels[512]; /* "k=v,k2=v2" with values unescaped, or "" */
    double v;
} pm_sample;

typedef struct pm_doc {
    pm_sample *s;
    size_t n, cap;
    size_t families;
    char err[512]; /* why pm_parse failed */
} pm_doc;

/* 0 when `text` is valid (doc filled; free with pm_free), else -1 with doc->err. */
int pm_parse(const char *text, pm_doc *doc);
void pm_free(pm_doc *doc);
/* The sample with this name and labels ("" or NULL: none), or NULL. */
const pm_sample *pm_find(const pm_doc *doc, const char *name, const char *labels);

#endif
